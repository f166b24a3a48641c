"""Measure one engine configuration: tokens per verify step and output tokens/s.

Each configuration runs in its own process (``python -m vllm_cllm.bench.measure``): engines
then never share memory or global state, and vLLM's ``ngram`` (which imports numba) cannot
disturb the engines measured after it. Timings add up the engine steps' wall-clock
times after a warm-up; compare configurations only within one run on one machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

from vllm_cllm.bench.oracle import log_size, oracle_of_log
from vllm_cllm.policies.candidate_log import CANDIDATE_LOG_ENV
from vllm_cllm.runtime.engine import StepCounter, spec_metrics, with_engine

#: The default warm-up prompt: none of the measured ones. Proposers that remember earlier
#: requests (``hybrid``'s history of outputs, vLLM's ``suffix``) would otherwise draft the
#: start of a measured answer from its own warm-up.
WARMUP_PROMPT = "Write one sentence about the weather today."


def _measure_batch_size(llm: Any, prompts: list[str], batch_size: int, max_tokens: int,
                        warmup: list[str] | None = None) -> dict[str, Any]:
    """``warmup`` (default: :data:`WARMUP_PROMPT`, a batch of it; ``[]``: none) runs first,
    unmeasured."""
    batch = SteppedMeasurement(llm, prompts, batch_size, max_tokens, warmup)
    while batch.advance(sys.maxsize):
        pass
    return batch.row()


class SteppedMeasurement:
    """Prompts run ``batch_size`` at a time on one engine, a few engine steps per call of
    :meth:`advance`, timing only its own steps. Between calls the machine may run another
    engine (:class:`vllm_cllm.bench.engine_pool.EnginePool` alternates engines every few steps),
    so that engines compared with each other see the same machine, milliseconds apart."""

    def __init__(self, llm: Any, prompts: list[str], batch_size: int, max_tokens: int,
                 warmup: list[str] | None = None) -> None:
        from vllm import SamplingParams

        self.llm, self.prompts, self.batch_size = llm, prompts, batch_size
        self.params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
        warmup = [WARMUP_PROMPT] * batch_size if warmup is None else warmup
        if warmup:
            llm.generate(warmup, SamplingParams(temperature=0.0, max_tokens=16), use_tqdm=False)
        self.before = spec_metrics(llm)
        self.tokens: list[list[int]] = []
        self.steps: list[int] = []
        self.ids: list[str] = []
        self.prompt_tokens: list[list[int]] = []
        #: the proposer's candidate log, where one is kept: the row gets its oracle
        self.log = os.environ.get(CANDIDATE_LOG_ENV) or None
        self.log_start = log_size(self.log) if self.log else 0
        self.seconds = 0.0
        self.next_batch = 0
        self.current: StepCounter | None = None

    def advance(self, max_steps: int) -> bool:
        """Run up to ``max_steps`` engine steps (starting the next batch when one ends);
        False once every prompt is done."""
        for _ in range(max_steps):
            start = time.perf_counter()
            if self.current is None:
                if self.next_batch >= len(self.prompts):
                    return False
                chunk = self.prompts[self.next_batch:self.next_batch + self.batch_size]
                self.next_batch += self.batch_size
                self.current = StepCounter(self.llm, chunk, self.params)
            if not self.current.step():
                counted = self.current.result()
                self.tokens += counted.tokens
                self.steps += counted.steps
                self.ids += self.current.ids
                self.prompt_tokens += counted.prompt_tokens
                self.current = None
            self.seconds += time.perf_counter() - start
        return self.current is not None or self.next_batch < len(self.prompts)

    def row(self) -> dict[str, Any]:
        """The measured row (:func:`measured_row`) once :meth:`advance` has returned False,
        with the oracle fields (:mod:`vllm_cllm.bench.oracle`) where a candidate log is kept."""
        after = spec_metrics(self.llm)

        def delta(key: str) -> int:
            return (after.get(key) or 0) - (self.before.get(key) or 0)

        per_pos_before = self.before.get("num_accepted_tokens_per_pos") or []
        per_pos = [a - (per_pos_before[i] if i < len(per_pos_before) else 0)
                   for i, a in enumerate(after.get("num_accepted_tokens_per_pos") or [])]
        oracle = oracle_of_log(self.log, self.log_start, self.ids, self.prompt_tokens,
                               self.tokens, self.steps) if self.log else {}
        return {**measured_row(self.batch_size, self.tokens, self.steps, self.seconds,
                               delta("num_drafts"), delta("num_accepted_tokens"), per_pos),
                "num_draft_tokens": delta("num_draft_tokens"), **oracle}


def measured_row(batch_size: int, tokens: list[list[int]], steps: list[int], seconds: float,
         drafts: int, accepted: int, accepted_by_position: list[int]) -> dict[str, Any]:
    """A measured row from its raw counts (vLLM's spec-decode counters over the run)."""
    generated, total_steps = sum(len(t) for t in tokens), sum(steps)
    return {
        "batch_size": batch_size, "num_prompts": len(tokens), "output_tokens": generated,
        "seconds": seconds, "tokens_per_s": generated / seconds,
        "tpf": 1.0 + accepted / drafts if drafts else 1.0,
        "tokens_per_step": generated / total_steps if total_steps else 1.0,
        "tokens_per_verify_step": tokens_per_verify_step(tokens, steps),
        "steps": steps,
        "num_drafts": drafts,
        "num_accepted": accepted,
        "accepted_by_position": accepted_by_position,
        "acceptance_by_position": [p / drafts for p in accepted_by_position] if drafts else [],
        "tokens": tokens,
    }


def tokens_per_verify_step(tokens: list[list[int]], steps: list[int]) -> float:
    """Output tokens per decode step: each request's first token and the prefill step that
    gave it are left out, since that step verified no draft (1.0 without decode steps)."""
    decoded = sum(len(t) - 1 for t, s in zip(tokens, steps, strict=True) if s > 1)
    decode_steps = sum(s - 1 for s in steps if s > 1)
    return decoded / decode_steps if decode_steps else 1.0


#: {"batch_size": int, "prompts": [str], "tags": {...}, "warmup": [str]}; tags, warmup optional
Group = dict[str, Any]


def measure_group(llm: Any, group: Group, max_tokens: int) -> dict[str, Any]:
    """One group of prompts on a running engine: its row, with the group's tags."""
    return {**group.get("tags", {}), **_measure_batch_size(
        llm, group["prompts"], group["batch_size"], max_tokens, group.get("warmup"))}


def measure(model: str, spec: dict[str, Any] | None, groups: list[Group], max_tokens: int,
            **engine_overrides: Any) -> list[dict[str, Any]]:
    """One engine, every group of prompts in turn; each row carries its group's tags."""
    return with_engine(model, spec, lambda llm: [measure_group(llm, g, max_tokens)
                                                 for g in groups], **engine_overrides)


def by_batch(prompts_by_batch: dict[int, list[str]]) -> list[Group]:
    """Groups from ``{batch size: prompts}``, smallest batch first."""
    return [{"batch_size": bs, "prompts": p} for bs, p in sorted(prompts_by_batch.items())]


def measure_in_subprocess(model: str, spec: dict[str, Any] | None,
                          prompts_by_batch: dict[int, list[str]] | list[Group], max_tokens: int,
                          *, engine_overrides: dict[str, Any] | None = None,
                          env: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """:func:`measure` in a fresh interpreter; returns its rows.

    ``prompts_by_batch`` is ``{batch size: prompts}`` or a list of groups (see ``Group``);
    ``engine_overrides`` go to ``vllm.LLM`` (e.g. ``tensor_parallel_size``); ``env`` is added
    to the worker's environment (e.g. per-rank CPU thread binding). Each batch size of a
    ``{batch size: prompts}`` gets an interpreter of its own: they usually share prompts, and
    a proposer that remembers earlier outputs would draft one batch size's answers from the
    other's (groups given as a list share one engine and should not share prompts).
    """
    if isinstance(prompts_by_batch, dict):
        return [row for group in by_batch(prompts_by_batch)
                for row in measure_in_subprocess(model, spec, [group], max_tokens,
                                                 engine_overrides=engine_overrides, env=env)]
    payload = json.dumps({"model": model, "spec": spec, "max_tokens": max_tokens,
                          "groups": prompts_by_batch, "engine_overrides": engine_overrides or {}})
    proc = subprocess.run([sys.executable, "-m", "vllm_cllm.bench.measure"], input=payload,
                          capture_output=True, text=True, env={**os.environ, **(env or {})})
    if proc.returncode != 0:
        raise RuntimeError(f"benchmark worker failed for {spec}:\n{proc.stderr[-4000:]}")
    line = next(x for x in proc.stdout.splitlines()[::-1] if x.startswith("ROWS "))
    return json.loads(line.removeprefix("ROWS "))


def against_baseline(row: dict[str, Any], baseline: dict[str, Any]) -> dict[str, Any]:
    """Add ``row``'s speed-up over ``baseline`` (no speculation, same prompts and batch size)
    and whether its tokens are identical to the baseline's (the lossless check)."""
    row.update(speedup=row["tokens_per_s"] / baseline["tokens_per_s"],
               identical=row["tokens"] == baseline["tokens"])
    return row


def write_json(path: str | None, result: Any) -> None:
    """A benchmark script's ``--out``: its result as indented JSON, folders made (no path:
    nothing written)."""
    if path:
        from pathlib import Path

        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(result, indent=1))


def speedup_bars(ax: Any, labels: list[str], speedups: list[float], title: str) -> None:
    """Horizontal speed-up bars with the no-speculation line at 1.0 (matplotlib axes)."""
    ax.barh(labels, speedups)
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_title(title)
    ax.invert_yaxis()


def jacobi_row(model: str, prompts: list[str], k: int, max_tokens: int,
               fill: str = "hybrid") -> dict[str, Any]:
    """The measured row (:func:`measured_row`, answers included) of ``model`` with ``jacobi``
    drafting k tokens with ``fill``, all prompts in one batch; "tail" is pure Jacobi."""
    spec = {"method": "jacobi", "num_speculative_tokens": k, "adaptive": False, "fill": fill}
    return measure_in_subprocess(model, spec, {len(prompts): prompts}, max_tokens)[0]


def jacobi_tpf(model: str, prompts: list[str], k: int, max_tokens: int,
               fill: str = "hybrid") -> float:
    """Tokens per step of :func:`jacobi_row`, steps counted."""
    return jacobi_row(model, prompts, k, max_tokens, fill)["tokens_per_step"]


def main() -> int:
    argparse.ArgumentParser(description="internal: reads a JSON job on stdin").parse_args()
    job = json.loads(sys.stdin.read())
    rows = measure(job["model"], job["spec"], job["groups"], job["max_tokens"],
                   **job.get("engine_overrides", {}))
    print("ROWS " + json.dumps(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
