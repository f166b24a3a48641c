"""The demo CLLM's recipe (`examples/recipes/cllm_gsm_demo.sh`) run against stub tools: its
defaults are the demo's recipe, and bad settings are refused before anything runs."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ("cllm_gsm_demo.sh", "onpolicy_round.sh")
#: Stands in for `.venv/bin/vllm-cllm` and `.venv/bin/python`: records its arguments, one call
#: a line, and succeeds without doing anything.
STUB = '#!/usr/bin/env bash\necho "$(basename "$0") $*" >> "$(dirname "$0")/../../calls.txt"\n'


def _run_recipe(tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    """The recipe in a copy of the tree whose tools are stubs: its exit and the calls it made."""
    (tmp_path / "examples/recipes").mkdir(parents=True)
    for name in RECIPES:
        shutil.copy(ROOT / "examples/recipes" / name, tmp_path / "examples/recipes" / name)
    (tmp_path / ".venv/bin").mkdir(parents=True)
    for tool in ("vllm-cllm", "python"):
        (tmp_path / ".venv/bin" / tool).write_text(STUB)
        (tmp_path / ".venv/bin" / tool).chmod(0o755)
    proc = subprocess.run(["bash", str(tmp_path / "examples/recipes/cllm_gsm_demo.sh")],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, **env})
    calls = tmp_path / "calls.txt"
    return proc, calls.read_text().splitlines() if calls.exists() else []


def _flag(call: str, name: str) -> str:
    """The value of the last ``name`` flag in a recorded call (a later flag wins)."""
    words = call.split()
    last = max(i for i, word in enumerate(words) if word == name)
    return words[last + 1]


def test_defaults_make_the_demo(tmp_path):
    proc, calls = _run_recipe(tmp_path)
    assert proc.returncode == 0, proc.stderr
    trains = [c for c in calls if c.startswith("vllm-cllm train cllm")]
    assert [_flag(c, "--out") for c in trains] == [
        "results/cllm-gsm/round1", "results/cllm-gsm/round2", "results/cllm-gsm/round3",
        "results/cllm-gsm/round3_2", "results/cllm-gsm/round3_3"]
    assert {_flag(c, "--learning-rate") for c in trains} == {"2e-3"}
    held = trains[2:]
    assert [_flag(c, "--seed") for c in held] == ["4", "14", "24"]
    assert {_flag(c, "--ar-weight") for c in held} == {"20"}
    assert {_flag(c, "--init-adapter") for c in held} == {"results/cllm-gsm/round2/adapter"}
    pools = [c for c in calls if "round3-pool.jsonl" in c and "trajectories" in c]
    assert len(pools) == 1 and _flag(pools[0], "--prompt-format") == "both"
    average = [c for c in calls if c.startswith("vllm-cllm train average")]
    assert len(average) == 1 and average[0].endswith(
        " ".join(f"results/cllm-gsm/{r}/adapter" for r in ("round3", "round3_2", "round3_3")))
    export = calls[-1]
    assert export.startswith("python -m vllm_cllm.training.artifact results/cllm-gsm/held/adapter"
                             " vllm_cllm/artifacts/smollm2-135m-cllm-gsm")
    assert _flag(export, "--max-rank") == "64"


def test_one_held_round_and_full_rank(tmp_path):
    proc, calls = _run_recipe(tmp_path, HELD_RUNS="1", ARTIFACT_MAX_RANK="")
    assert proc.returncode == 0, proc.stderr
    assert not any("train average" in c or "round3_2" in c for c in calls)
    assert calls[-1].startswith("python -m vllm_cllm.training.artifact "
                                "results/cllm-gsm/round3/adapter")
    assert "--max-rank" not in calls[-1]


@pytest.mark.parametrize("setting", [{"HELD_RUNS": "0"}, {"ARTIFACT_MAX_RANK": "x"},
                                     {"SEED": "-1"}])
def test_bad_settings_refused_before_anything_runs(tmp_path, setting):
    proc, calls = _run_recipe(tmp_path, **setting)
    name = next(iter(setting))
    assert proc.returncode == 2 and name in proc.stderr
    assert calls == []
