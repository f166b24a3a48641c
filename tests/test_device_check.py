"""``vllm-cllm device-check`` without CUDA: the CPU parts run and pass, the GPU parts say so,
nothing of vLLM is imported, and a failed part fails the command."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from vllm_cllm.bench import device_check

ROOT = Path(__file__).resolve().parents[1]


def test_runs_from_a_checkout_with_torch_only(tmp_path):
    done = subprocess.run([sys.executable, "-m", "vllm_cllm.bench.device_check", "--out",
                           str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((tmp_path / "device_check.json").read_text())
    assert not report["imports_vllm"]
    parts = report["parts"]
    assert parts["kernel torch vs reference"]["status"] == "passed"
    assert parts["capture device vs host (cpu tensors)"]["status"] == "passed"
    assert parts["capture device vs host (cpu tensors)"]["steps"] == 50
    gpu = [name for name in parts if "cuda" in name or "time" in name or "compiles" in name]
    assert len(gpu) == 4
    assert all(parts[name]["status"] == device_check.NO_CUDA for name in gpu)
    table = (tmp_path / "device_check.md").read_text()
    assert table.count(device_check.NO_CUDA) == 4 and "| passed |" in table


def test_a_failed_part_is_reported_and_fails_the_command(tmp_path, monkeypatch):
    def broken() -> None:
        raise AssertionError("argmax differs")

    monkeypatch.setattr(device_check, "kernel_against_reference", broken)
    monkeypatch.delitem(sys.modules, "vllm", raising=False)  # other tests import it here
    assert device_check.main(["--out", str(tmp_path)]) == 1
    part = json.loads((tmp_path / "device_check.json").read_text())["parts"][
        "kernel torch vs reference"]
    assert part["status"] == "failed" and "argmax differs" in part["error"]
