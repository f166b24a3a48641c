"""The demo SPACE checkpoint (`smollm2-135m-space-gsm`): rebuilt from the git artifact,
lossless in vLLM, and the paper-layout reference agrees with plain greedy decoding.

Speed and quality on 40 problems are `benchmarks/space_gsm.py`; here a few unseen problems.
"""

from __future__ import annotations

import pytest

from conftest import gsm_test_prompts, plain_and_speculative_runs
from vllm_cllm.bench.lossless import compare

pytestmark = pytest.mark.engine

SPACE = {"method": "space", "num_speculative_tokens": 5}


@pytest.fixture(scope="module")
def space_path():
    from vllm_cllm.runtime.checkpoints import model_path

    return str(model_path("smollm2-135m-space-gsm"))


@pytest.fixture(scope="module")
def prompts(space_path):
    return gsm_test_prompts(space_path)


@pytest.fixture(scope="module")
def runs(space_path, prompts):
    return plain_and_speculative_runs(space_path, SPACE, prompts)


def test_artifact_is_small_and_carries_the_mask_token(space_path):
    import json
    from pathlib import Path

    from vllm_cllm.runtime.checkpoints import ARTIFACTS

    artifact = ARTIFACTS / "smollm2-135m-space-gsm"
    assert sum(p.stat().st_size for p in artifact.iterdir()) < 50 * 2**20
    config = json.loads((Path(space_path) / "config.json").read_text())
    mask = json.loads((artifact / "mask_token.json").read_text())
    assert config["mask_token_id"] == mask["mask_token_id"] == config["vocab_size"] - 1


@pytest.mark.parametrize("mode", ["batched", "single"])
def test_space_greedy_identical_to_plain(runs, mode):
    mismatches = compare(runs["plain"][mode], runs["spec"][mode])
    assert not mismatches, f"{mode}: first mismatch {mismatches[0]}"


def test_space_accepts_several_tokens_per_step(runs):
    assert runs["spec"]["tpf"] > 1.4  # docs/results.md has the 40-problem figure


def test_paper_layout_reference_is_lossless(space_path, prompts, runs):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from vllm_cllm.bench.space_reference import space_generate

    model = AutoModelForCausalLM.from_pretrained(space_path, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(space_path)
    ids = tokenizer(prompts[0], add_special_tokens=False)["input_ids"]
    result = space_generate(model, ids, model.config.mask_token_id, 5, 96,
                            tokenizer.eos_token_id)
    assert result.tokens == runs["plain"]["batched"][0]
    assert result.tokens_per_step > 1.4
