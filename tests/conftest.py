"""Shared fixtures: CPU engine environment, prepared checkpoints, one engine at a time."""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator
from typing import Any

import pytest

from vllm_cllm.runtime.engine import DTYPE_ENV, apply_cpu_env

# Before anything imports vLLM: in-process engine on both cores, 1 GiB of KV cache; and
# float32 engines on every platform (and in every subprocess): the tests assert token identity.
apply_cpu_env({"VLLM_CPU_KVCACHE_SPACE": "1"})
os.environ.setdefault(DTYPE_ENV, "float32")


@pytest.fixture(scope="session")
def smollm2_path() -> str:
    from vllm_cllm.runtime.checkpoints import model_path

    return str(model_path("smollm2-135m-instruct"))


@pytest.fixture(scope="session")
def tiny_path() -> str:
    from vllm_cllm.runtime.checkpoints import model_path

    return str(model_path("tiny-random-llama"))


def module_engine(model: str, speculative_config: dict[str, Any] | None) -> Iterator[Any]:
    """Body of a module-scoped engine fixture: yields a proxy, frees the engine at teardown.

    pytest keeps fixture values alive until after finalizers run, and a late-collected
    in-process engine tears down the global state of the next one; so tests get a proxy and
    the engine itself is released here, explicitly.
    """
    from vllm_cllm.runtime.engine import create_llm

    holder = {"llm": create_llm(model, speculative_config)}
    yield EngineProxy(holder)
    holder.clear()
    gc.collect()


class EngineProxy:
    """Forwards attribute access to the engine held by :func:`module_engine`."""

    def __init__(self, holder: dict[str, Any]) -> None:
        self._holder = holder

    def __getattr__(self, name: str) -> Any:
        return getattr(self._holder["llm"], name)


def gsm_test_prompts(model: str, count: int = 6, seed: int = 2024) -> list[str]:
    """Chat prompts of gsm_symbolic problems from the tests' seed (never used in training)."""
    from transformers import AutoTokenizer

    from vllm_cllm.training.gsm import chat_prompt, gsm_problems

    tokenizer = AutoTokenizer.from_pretrained(model)
    return [chat_prompt(tokenizer, p["question"]) for p in gsm_problems(count, seed=seed)]


def plain_and_speculative_runs(model: str, spec: dict[str, Any], prompts: list[str],
                               max_tokens: int = 96) -> dict[str, dict[str, Any]]:
    """Greedy tokens without and with ``spec`` (all prompts batched, the first two one at a
    time) and the tokens per verify step, one engine at a time."""
    from vllm import SamplingParams

    from vllm_cllm.bench.lossless import generate_tokens
    from vllm_cllm.runtime.engine import mean_acceptance_length, spec_metrics, with_engine

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)

    def run(llm):
        before = spec_metrics(llm)
        out = {"batched": generate_tokens(llm, prompts, params),
               "single": generate_tokens(llm, prompts[:2], params, one_at_a_time=True)}
        out["tpf"] = mean_acceptance_length(before, spec_metrics(llm))
        return out

    return {"plain": with_engine(model, None, run), "spec": with_engine(model, spec, run)}


def check_aborts_leave_no_state(llm: Any, prompts: list[str], prefix: str) -> None:
    """Four requests run a few steps, two are aborted, then the rest: the proposer holds
    state for exactly the live ones at every point, and nothing at the end."""
    from vllm import SamplingParams

    from vllm_cllm.runtime.engine import drafter_of

    engine = llm.llm_engine
    drafter = drafter_of(llm)
    ids = [f"{prefix}-{i}" for i in range(4)]
    for rid, prompt in zip(ids, prompts, strict=False):
        engine.add_request(rid, prompt, SamplingParams(temperature=0.0, max_tokens=200))
    for _ in range(6):
        engine.step()
    assert len(drafter.tracked_requests()) == len(ids)  # per-request state while running
    engine.abort_request(ids[:2])
    for _ in range(2):
        engine.step()
    assert len(drafter.tracked_requests()) == 2  # the two aborted ones are gone at once
    engine.abort_request(ids[2:])
    for _ in range(3):
        engine.step()
    assert not engine.has_unfinished_requests()
    assert drafter.tracked_requests() == set()
