"""The examples run as users run them (subprocesses), and do what they say."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.engine]
ROOT = Path(__file__).resolve().parents[1]


def _run_example(name: str, *args: str) -> dict:
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / name), *args],
                          capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines()[::-1] if x.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT "))


def test_offline_example(smollm2_path):
    result = _run_example("offline_jacobi.py", "--model", smollm2_path, "--max-tokens", "32")
    assert all(result["texts"]) and result["counters"]["vllm:spec_decode_num_drafts"] > 0
    assert result["mean_acceptance_length"] >= 1.0


@pytest.mark.server
def test_serve_example_with_legacy_spelling(smollm2_path, tmp_path):
    result = _run_example("serve_openai.py", "--model", smollm2_path,
                          "--log", str(tmp_path / "server.log"))
    assert result["completion"] and result["chat"]
    drafts = [v for k, v in result["metrics"].items()
              if k.startswith("vllm:spec_decode_num_drafts_total")]
    assert sum(drafts) > 0
