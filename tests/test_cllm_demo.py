"""The demo CLLM (`smollm2-135m-cllm-gsm`): rebuilt from the git artifact, lossless in vLLM.

Speed and collapse figures on 40 problems are `benchmarks/cllm_gsm.py`; here a few unseen
gsm_symbolic problems check that the CLLM's greedy output with `jacobi` equals its own output
without, batched and one at a time, and that its drafts are accepted far more than once per step.
"""

from __future__ import annotations

import pytest

from conftest import gsm_test_prompts, plain_and_speculative_runs
from vllm_cllm.bench.lossless import compare

pytestmark = pytest.mark.engine

JACOBI = {"method": "jacobi", "num_speculative_tokens": 15}


@pytest.fixture(scope="module")
def cllm_path():
    from vllm_cllm.runtime.checkpoints import model_path

    return str(model_path("smollm2-135m-cllm-gsm"))


@pytest.fixture(scope="module")
def runs(cllm_path):
    return plain_and_speculative_runs(cllm_path, JACOBI, gsm_test_prompts(cllm_path))


def test_artifact_is_small_and_rebuilds_a_full_checkpoint(cllm_path):
    from pathlib import Path

    from vllm_cllm.runtime.checkpoints import ARTIFACTS

    artifact = sum(p.stat().st_size for p in (ARTIFACTS / "smollm2-135m-cllm-gsm").iterdir())
    assert artifact < 50 * 2**20
    assert (Path(cllm_path) / "config.json").exists()
    assert (Path(cllm_path) / "tokenizer.json").exists()


@pytest.mark.parametrize("mode", ["batched", "single"])
def test_cllm_greedy_identical_with_jacobi(runs, mode):
    mismatches = compare(runs["plain"][mode], runs["spec"][mode])
    assert not mismatches, f"{mode}: first mismatch {mismatches[0]}"


def test_cllm_accepts_several_tokens_per_step(runs):
    assert runs["spec"]["tpf"] > 2.0
