"""Lossless under preemption: a KV cache too small for the batch makes vLLM preempt running
requests (and recompute them later) while they draft; every greedy output still equals the
same engine's without speculation, no request is lost, and the proposer holds no state at
the end.

The cache is ``BLOCKS`` blocks of 32 tokens (``num_gpu_blocks_override``, ``block_size``): the
prompts (94-202 tokens) fit four or five at a time, and each request's ``MAX_TOKENS`` new tokens
need at least one more block, so running requests are preempted.
"""

from __future__ import annotations

import time

import pytest

from conftest import gsm_test_prompts
from vllm_cllm.bench.lossless import compare
from vllm_cllm.runtime.engine import drafter_of, spec_metrics, with_engine

pytestmark = pytest.mark.engine

REQUESTS = 24
MAX_TOKENS = 40
BLOCKS = 24
CONFIGS = {
    "jacobi": {"method": "jacobi", "num_speculative_tokens": 15},  # default: adaptive hybrid
    "jacobi-k8-fixed": {"method": "jacobi", "num_speculative_tokens": 8, "adaptive": False},
    "space": {"method": "space", "num_speculative_tokens": 5},
}
SMALL_CACHE = {"num_gpu_blocks_override": BLOCKS, "block_size": 32, "max_model_len": 512}


def _counter(llm, name: str) -> float:
    return sum(getattr(m, "value", 0) or 0 for m in llm.get_metrics() if m.name == name)


def _run(llm, prompts, speculative: bool):
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - start
    result = {
        "tokens": [list(o.outputs[0].token_ids) for o in outputs],
        "finished": [o.finished and o.outputs[0].finish_reason in ("length", "stop")
                     for o in outputs],
        "preemptions": _counter(llm, "vllm:num_preemptions"),
        "drafts": spec_metrics(llm).get("num_draft_tokens") or 0,
        "unfinished": llm.llm_engine.has_unfinished_requests(),
        "seconds": seconds,
    }
    if speculative:
        # vLLM tells the model runner which requests finished in the step after; until then
        # they are still in its input batch, and the proposer may hold them too.
        result["held_at_end"] = set(drafter_of(llm).tracked_requests())
        result["in_batch_at_end"] = set(_runner(llm).input_batch.req_ids)
        llm.llm_engine.step()  # the step that hands the last finished ids to the runner
        result["tracked"] = set(drafter_of(llm).tracked_requests())
        result["in_batch"] = set(_runner(llm).input_batch.req_ids)
    return result


def _runner(llm):
    worker = llm.llm_engine.model_executor.driver_worker
    return getattr(worker, "worker", worker).model_runner


@pytest.fixture(scope="module")
def space_path():
    from vllm_cllm.runtime.checkpoints import model_path

    return str(model_path("smollm2-135m-space-gsm"))


@pytest.fixture(scope="module")
def runs(space_path):
    """One plain engine and one per config, on the SPACE demo (a SmolLM2-135M fine-tune, so
    ``jacobi`` runs on it as on any causal LM), all with the same small cache."""
    prompts = gsm_test_prompts(space_path, count=REQUESTS)
    out = {"plain": with_engine(space_path, None, lambda llm: _run(llm, prompts, False),
                                **SMALL_CACHE)}
    for name, spec in CONFIGS.items():
        out[name] = with_engine(space_path, spec, lambda llm: _run(llm, prompts, True),
                                **SMALL_CACHE)
    return out


@pytest.mark.parametrize("config", list(CONFIGS))
def test_preempted_outputs_identical_to_plain(runs, config):
    run = runs[config]
    assert run["preemptions"] > 0, f"{config}: the cache was large enough, nothing preempted"
    assert len(run["tokens"]) == REQUESTS and all(run["finished"]) and not run["unfinished"]
    mismatches = compare(runs["plain"]["tokens"], run["tokens"])
    assert not mismatches, f"{config}: first mismatch {mismatches[0]}"
    assert run["held_at_end"] <= run["in_batch_at_end"], f"{config}: {run['held_at_end']}"
    assert run["in_batch"] == set() and run["tracked"] == set(), \
        f"{config}: proposer still holds {run['tracked']}"


def test_fixed_k_and_space_draft_while_preempted(runs):
    for name, run in runs.items():
        print(f"{name}: {run['preemptions']:.0f} preemptions, {len(run['tokens'])} requests, "
              f"{sum(map(len, run['tokens']))} tokens, {run['drafts']} draft tokens, "
              f"{run['seconds']:.1f} s")
    """The preemptions hit requests that draft (the default drafts as its cost model says)."""
    assert runs["jacobi-k8-fixed"]["drafts"] > 0 and runs["space"]["drafts"] > 0
    assert runs["plain"]["preemptions"] > 0 and all(runs["plain"]["finished"])
