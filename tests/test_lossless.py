"""Lossless on the real model: greedy tokens with ``jacobi`` equal the engine without it.

One engine at a time: the plain engine makes the reference, then one ``jacobi`` engine per
configuration; all generation happens in the module fixture, the tests compare.
The full set (164 HumanEval + chat prompts, k = 4 and 15) is ``benchmarks/lossless.py``.
"""

from __future__ import annotations

import pytest

from vllm_cllm.bench.datasets import IMMEDIATE_EOS_PROMPT, chat_prompts, humaneval_prompts
from vllm_cllm.bench.lossless import compare, generate_tokens
from vllm_cllm.patches.greedy_verify import VERIFIED
from vllm_cllm.runtime.engine import (
    drafter_of,
    mean_acceptance_length,
    runner_of,
    spec_metrics,
    with_engine,
)

pytestmark = pytest.mark.engine

CONFIGS = {
    "k4-default": {"method": "jacobi", "num_speculative_tokens": 4},  # adaptive hybrid
    "k15-tail": {"method": "jacobi", "num_speculative_tokens": 15, "fill": "tail"},
    "k8-fixed": {"method": "jacobi", "num_speculative_tokens": 8, "adaptive": False},
}
MAX_TOKENS = 48


def _mixed_batch():
    """Different max_tokens, stop strings and a prompt answered by EOS at once, in one batch."""
    from vllm import SamplingParams

    prompts = humaneval_prompts(3) + [IMMEDIATE_EOS_PROMPT, "The capital of France is"]
    params = [
        SamplingParams(temperature=0.0, max_tokens=7),
        SamplingParams(temperature=0.0, max_tokens=60, stop=["return"]),
        SamplingParams(temperature=0.0, max_tokens=33, stop=["\n\n"]),
        SamplingParams(temperature=0.0, max_tokens=40),
        SamplingParams(temperature=0.0, max_tokens=25, stop=["."], include_stop_str_in_output=True),
    ]
    return prompts, params


def _run(llm, prompts):
    from vllm import SamplingParams

    greedy = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    mixed_prompts, mixed_params = _mixed_batch()
    outputs = llm.generate(mixed_prompts, mixed_params, use_tqdm=False)
    return {
        "batched": generate_tokens(llm, prompts, greedy),
        "single": generate_tokens(llm, prompts, greedy, one_at_a_time=True),
        "mixed": [list(o.outputs[0].token_ids) for o in outputs],
        "mixed_text": [o.outputs[0].text for o in outputs],
    }


def _measured_run(llm, prompts):
    before = spec_metrics(llm)
    result = _run(llm, prompts)
    result["tpf"] = mean_acceptance_length(before, spec_metrics(llm))
    result["captured_steps"] = drafter_of(llm).captured_steps
    result["verified_steps"] = getattr(runner_of(llm).rejection_sampler, VERIFIED, 0)
    return result


@pytest.fixture(scope="module")
def runs(smollm2_path):
    from transformers import AutoTokenizer

    prompts = humaneval_prompts(6) + chat_prompts(AutoTokenizer.from_pretrained(smollm2_path), 4)
    results = {"plain": with_engine(smollm2_path, None, lambda llm: _run(llm, prompts))}
    for name, spec in CONFIGS.items():
        results[name] = with_engine(smollm2_path, spec, lambda llm: _measured_run(llm, prompts))
    return results


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("mode", ["batched", "single", "mixed"])
def test_greedy_tokens_identical(runs, config, mode):
    mismatches = compare(runs["plain"][mode], runs[config][mode])
    assert not mismatches, f"{config}/{mode}: first mismatch {mismatches[0]}"


def test_mixed_batch_honours_each_request(runs):
    tokens, text = runs["plain"]["mixed"], runs["plain"]["mixed_text"]
    assert len(tokens[0]) == 7
    assert tokens[3] == [] or tokens[3] == [2]  # the immediate-EOS prompt
    assert "return" not in text[1] and "\n\n" not in text[2]
    assert text[4].endswith(".") and text[4].count(".") == 1


@pytest.mark.parametrize("config", list(CONFIGS))
def test_speculation_actually_happened(runs, config):
    # Lossless is only meaningful if drafts were accepted at all.
    assert runs[config]["tpf"] > 1.0


@pytest.mark.parametrize("config", list(CONFIGS))
def test_drafts_come_from_the_captured_verify_steps(runs, config):
    # The capture takes the verify step's predictions every step (on this CPU the argmax on
    # the host; the device step, torch or Triton, on a GPU: tests/test_kernels.py).
    assert runs[config]["captured_steps"] > 0


@pytest.mark.parametrize("config", list(CONFIGS))
def test_greedy_steps_are_verified_from_the_captured_argmax(runs, config):
    # On the CPU platform the capture's argmax verifies the all-greedy steps
    # (patches/greedy_verify.py): the identity above holds with it.
    assert runs[config]["verified_steps"] > 0
