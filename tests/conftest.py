"""Shared fixtures: CPU engine environment, prepared checkpoints, one engine at a time."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import pytest

from vllm_cllm.runtime import apply_cpu_env

# Before anything imports vLLM: in-process engine on both cores, 1 GiB of KV cache.
apply_cpu_env({"VLLM_CPU_KVCACHE_SPACE": "1"})


@pytest.fixture(scope="session")
def smollm2_path() -> str:
    from vllm_cllm.models import model_path

    return str(model_path("smollm2-135m-instruct"))


@pytest.fixture(scope="session")
def tiny_path() -> str:
    from vllm_cllm.models import model_path

    return str(model_path("tiny-random-llama"))


def module_engine(model: str, speculative_config: dict[str, Any] | None) -> Iterator[Any]:
    """Body of a module-scoped engine fixture: yields a proxy, frees the engine at teardown.

    pytest keeps fixture values alive until after finalizers run, and a late-collected
    in-process engine tears down the global state of the next one; so tests get a proxy and
    the engine itself is released here, explicitly.
    """
    from vllm_cllm.runtime import create_llm

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
