"""benchmarks/vllm_compat.py: the plugin's probes, patches and front end against vLLM builds.

The default run checks the probe step against the installed vLLM (no engine, no install);
``-m compat`` installs the GPU build of every admitted release into throwaway environments
(several GiB each, minutes) and requires every check of the plugin to pass on each.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from scripts import load_script

ROOT = Path(__file__).resolve().parents[1]


def _compat():
    return load_script("benchmarks/vllm_compat.py")


def test_probe_step_passes_on_the_installed_vllm(tmp_path):
    """The same checks in a fresh process of this environment: every one passes."""
    compat = _compat()
    out = tmp_path / "probe.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks/vllm_compat.py"), "--probe",
         "--models", json.dumps(compat.model_dirs()), "--result", str(out)],
        capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    table = compat.rows(result)
    assert not compat.failed(result), {n: table[n] for n in compat.failed(result)}
    assert not result["vllm_limits"]  # the CPU build parses its CLI without a GPU
    assert sum(name.startswith("refused before the engine") for name in table) >= 3
    assert {g for g in result["groups"]} >= {"speculative_config", "verify_capture",
                                             "undrafted_step", "cpu_expand_dtype"}


@pytest.mark.compat
def test_every_admitted_gpu_release(tmp_path, request):
    # A -m given on the command line replaces pytest.ini's "not compat": run only when asked.
    if "compat" not in (request.config.option.markexpr or ""):
        pytest.skip("installs GPU builds of vLLM (GiBs): run with -m compat")
    compat = _compat()
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks/vllm_compat.py"),
                           "--out", str(tmp_path)], capture_output=True, text=True)
    results = json.loads((tmp_path / "results.json").read_text())
    assert set(results) == set(compat.RELEASES)
    for release, result in results.items():
        assert result["import"].get("ok"), (release, result["import"])
        assert not compat.failed(result), (release, compat.failed(result))
    assert done.returncode == 0, done.stdout[-3000:]
