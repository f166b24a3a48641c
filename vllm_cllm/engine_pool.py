"""Several engines alive at once, each in its own process, taking turns on the same prompts.

Comparing configurations run minutes apart mixes their difference with this shared machine's
drift (±5–10 % between sittings). Here every configuration keeps its engine loaded and they
run one group of prompts after another — the same prompts, in an order that alternates from
round to round (A B, then B A) — so that each ratio is taken between runs seconds apart.
Only one engine computes at a time: the others wait on their pipe, with their threads asleep.
"""

from __future__ import annotations

import multiprocessing as mp
import os
from typing import Any

from vllm_cllm.benchmarking import Group

#: KV cache per engine (GiB): several engines share this machine's 24 GiB; ample for
#: batch 16 at the bench's lengths (SmolLM2-135M: ~46 KiB per token in fp32).
KV_CACHE_GIB = "1"


def _serve(conn: Any, model: str, spec: dict[str, Any] | None) -> None:
    """Worker: build the engine, then measure each group sent until ``None`` arrives."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", KV_CACHE_GIB)
    from vllm_cllm.benchmarking import measure_group
    from vllm_cllm.runtime import with_engine

    def loop(llm: Any) -> None:
        warm_up(llm)
        conn.send("ready")
        while (group := conn.recv()) is not None:
            conn.send(measure_group(llm, group["group"], group["max_tokens"]))

    try:
        with_engine(model, spec, loop)
    except Exception as exc:  # reported to the parent, which raises it
        conn.send(f"error: {exc!r}")
        raise


def warm_up(llm: Any) -> None:
    """A batch of 16 prompts of different lengths, unmeasured: the CPU backend builds its
    matmul kernels per shape on first use, and a configuration measured first at some shape
    would otherwise pay that inside its timing."""
    from vllm import SamplingParams

    from vllm_cllm.benchmarking import WARMUP_PROMPT

    prompts = [" ".join([WARMUP_PROMPT] * (1 + i)) for i in range(16)]
    llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=32), use_tqdm=False)


class EnginePool:
    """One process and engine per configuration name; :meth:`measure` runs a group on one.

    Use as a context manager: the engines are stopped on exit. Engines start one after
    another (a start takes both cores).
    """

    def __init__(self, configs: dict[str, tuple[str, dict[str, Any] | None]]) -> None:
        self.configs = configs
        self._conns: dict[str, Any] = {}
        self._procs: list[Any] = []

    def __enter__(self) -> EnginePool:
        ctx = mp.get_context("spawn")
        for name, (model, spec) in self.configs.items():
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_serve, args=(child, model, spec), daemon=True)
            proc.start()
            self._procs.append(proc)
            self._conns[name] = parent
            self._reply(name)
        return self

    def _reply(self, name: str) -> Any:
        try:
            reply = self._conns[name].recv()
        except EOFError as exc:  # the worker died without a word (e.g. out of memory)
            raise RuntimeError(f"engine {name!r} exited; see its log above") from exc
        if isinstance(reply, str) and reply.startswith("error"):
            raise RuntimeError(f"engine {name!r} failed: {reply}")
        return reply

    def measure(self, name: str, group: Group, max_tokens: int) -> dict[str, Any]:
        """One group of prompts on engine ``name`` (see :func:`measure_group`)."""
        self._conns[name].send({"group": group, "max_tokens": max_tokens})
        return self._reply(name)

    def __exit__(self, *exc: Any) -> None:
        for conn in self._conns.values():
            try:
                conn.send(None)
            except (BrokenPipeError, OSError):
                pass
        for proc in self._procs:
            proc.join(timeout=60)
            if proc.is_alive():
                proc.kill()


def turn_order(names: list[str], round_index: int) -> list[str]:
    """The order the engines run in a round: rotated by the round, reversed every other
    round, so that no configuration always runs first or right after the same one."""
    shift = (round_index // 2) % len(names)
    order = names[shift:] + names[:shift]
    return order[::-1] if round_index % 2 else order
