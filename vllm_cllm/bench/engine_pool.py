"""Several engines alive at once, each in its own process, taking turns on the same prompts.

Comparing configurations run minutes apart mixes their difference with this shared machine's
drift (several per cent between runs, and as much between runs seconds apart). Here every
configuration keeps its engine loaded and all of them run the same batch of prompts in lock
step: a few engine steps on one engine, then a few on the next, in an order that changes from
turn to turn, each engine timing only its own steps. Every engine thus sees the machine as it
was a fraction of a second ago for the others, and the ratio of their tokens/s is the
configurations' difference, not the machine's. Only one engine computes at a time: the others
wait on their pipe, with their threads asleep.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import tempfile
from collections.abc import Callable
from typing import Any

from vllm_cllm.bench.measure import Group
from vllm_cllm.policies.candidate_log import CANDIDATE_LOG_ENV

#: KV cache per engine (GiB): several engines share this machine's 24 GiB; ample for
#: batch 16 at the bench's lengths (SmolLM2-135M: ~46 KiB per token in fp32).
KV_CACHE_GIB = "1"


#: Engine steps an engine runs before the next one takes over (a batch-1 step takes ~20 ms
#: here, a batch-16 one ~100 ms: turns of a tenth of a second to half a second).
STEPS_PER_TURN = 4


def _serve(conn: Any, model: str, spec: dict[str, Any] | None,
           setup: Callable[[], None] | None = None) -> None:
    """Worker: run ``setup`` (if any), build the engine, then obey the parent
    (:class:`EnginePool`) until ``None``: ``start`` a group of prompts, ``advance`` it a few
    steps, send its ``row``. A ``jacobi`` engine keeps a candidate log in a file of its own,
    for its rows' oracle (:mod:`vllm_cllm.bench.oracle`); no other engine keeps one."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", KV_CACHE_GIB)
    if setup is not None:
        setup()
    log = None
    if spec is not None and spec.get("method") == "jacobi":
        handle, log = tempfile.mkstemp(prefix="vllm-cllm-candidates-", suffix=".jsonl")
        os.close(handle)
        os.environ[CANDIDATE_LOG_ENV] = log
    else:
        os.environ.pop(CANDIDATE_LOG_ENV, None)
    from vllm_cllm.bench.measure import SteppedMeasurement
    from vllm_cllm.runtime.engine import with_engine

    def loop(llm: Any) -> None:
        warm_up(llm)
        conn.send("ready")
        batch, tags = None, {}
        while (command := conn.recv()) is not None:
            if "start" in command:
                group = command["start"]
                tags = group.get("tags", {})
                batch = SteppedMeasurement(llm, group["prompts"], group["batch_size"],
                                           command["max_tokens"], group.get("warmup"))
                conn.send("started")
            elif "advance" in command:
                conn.send(batch.advance(command["advance"]))
            elif "row" in command:
                conn.send({**tags, **batch.row()})
            else:  # reported to the parent below, rather than leaving it waiting for a reply
                raise ValueError(f"engine pool: unknown command {command!r}")

    try:
        with_engine(model, spec, loop)
    except Exception as exc:  # reported to the parent, which raises it
        conn.send(f"error: {exc!r}")
        raise
    finally:
        if log is not None:
            os.unlink(log)


def warm_up(llm: Any) -> None:
    """A batch of 16 prompts of different lengths, unmeasured: the CPU backend builds its
    matmul kernels per shape on first use, and a configuration measured first at some shape
    would otherwise pay that inside its timing."""
    from vllm import SamplingParams

    from vllm_cllm.bench.measure import WARMUP_PROMPT

    prompts = [" ".join([WARMUP_PROMPT] * (1 + i)) for i in range(16)]
    llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=32), use_tqdm=False)


class EnginePool:
    """One process and engine per configuration name; :meth:`measure` runs a group on one.

    Use as a context manager: the engines are stopped on exit. Engines start one after
    another (a start takes both cores). ``setups`` maps a name to a module-level function its
    worker runs before building the engine (a study's change of a constant, for one engine).
    """

    def __init__(self, configs: dict[str, tuple[str, dict[str, Any] | None]],
                 setups: dict[str, Callable[[], None]] | None = None) -> None:
        self.configs = configs
        self.setups = setups or {}
        self._conns: dict[str, Any] = {}
        self._procs: list[Any] = []

    def __enter__(self) -> EnginePool:
        ctx = mp.get_context("spawn")
        for name, (model, spec) in self.configs.items():
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_serve, args=(child, model, spec, self.setups.get(name)),
                               daemon=True)
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

    def _ask(self, name: str, command: dict[str, Any]) -> Any:
        self._conns[name].send(command)
        return self._reply(name)

    def measure(self, group: Group, max_tokens: int) -> dict[str, dict[str, Any]]:
        """One group of prompts on every engine in lock step: each takes
        :data:`STEPS_PER_TURN` engine steps in turn until all are done. Returns each engine's
        row (:func:`vllm_cllm.bench.measure.measured_row`, with the group's tags) by name."""
        for name in self.configs:
            self._ask(name, {"start": group, "max_tokens": max_tokens})
        running, turn = list(self.configs), 0
        while running:
            for name in turn_order(running, turn):
                if not self._ask(name, {"advance": STEPS_PER_TURN}):
                    running.remove(name)
            turn += 1
        return {name: self._ask(name, {"row": True}) for name in self.configs}

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
