"""The ``space`` proposer inside vLLM (tiny model with an untrained mask token).

Mechanics, not speed: greedy output equals the same checkpoint without speculation, batched
and one request at a time; MASK is never emitted; mask slots are never accepted; aborted
requests leave nothing behind. The trained demo is checked in ``test_space_demo.py``.
"""

from __future__ import annotations

import pytest

from conftest import check_aborts_leave_no_state, module_engine
from vllm_cllm.bench.lossless import compare, generate_tokens
from vllm_cllm.runtime.engine import drafter_of, spec_metrics, with_engine

pytestmark = pytest.mark.engine

PROMPTS = ["def add(a, b):", "Once upon a time", "The list of numbers is 1, 2, 3,",
           "import numpy as np\n", "Hello, my name is", "SELECT * FROM"]
K = 3


@pytest.fixture(scope="module")
def space_path() -> str:
    from vllm_cllm.runtime.checkpoints import model_path

    return str(model_path("tiny-random-space"))


@pytest.fixture(scope="module")
def reference(space_path):
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=40)
    return with_engine(space_path, None, lambda llm: {
        "batched": generate_tokens(llm, PROMPTS, params),
        "single": generate_tokens(llm, PROMPTS[:3], params, one_at_a_time=True)})


@pytest.fixture(scope="module")
def llm(space_path, reference):
    yield from module_engine(space_path, {"method": "space", "num_speculative_tokens": K})


@pytest.mark.parametrize("mode", ["batched", "single"])
def test_greedy_identical_to_plain(llm, reference, mode):
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=40)
    prompts = PROMPTS if mode == "batched" else PROMPTS[:3]
    tokens = generate_tokens(llm, prompts, params, one_at_a_time=mode == "single")
    mismatches = compare(reference[mode], tokens)
    assert not mismatches, f"{mode}: first mismatch {mismatches[0]}"


def test_mask_never_emitted_and_mask_slots_never_accepted(llm):
    from vllm import SamplingParams

    drafter = drafter_of(llm)
    before = spec_metrics(llm)
    greedy = generate_tokens(llm, PROMPTS, SamplingParams(temperature=0.0, max_tokens=40))
    sampled = generate_tokens(llm, PROMPTS, SamplingParams(temperature=1.0, max_tokens=40,
                                                           seed=3))
    after = spec_metrics(llm)
    assert all(drafter.mask_id not in t for t in greedy + sampled)
    per_position = [a - b for a, b in zip(after["num_accepted_tokens_per_pos"],
                                          before["num_accepted_tokens_per_pos"], strict=True)]
    # vLLM sees 2k slots (candidates, then masks in the slots left); a mask slot is never
    # accepted, since an accepted draft is emitted and MASK never is (checked above)
    assert len(per_position) == 2 * K
    assert after["num_drafts"] > before["num_drafts"]


def test_aborted_requests_leave_no_state(llm):
    check_aborts_leave_no_state(llm, PROMPTS, "space-abort")
