"""On-policy trajectory states: the drafts the ``jacobi`` proposer really verifies in vLLM.

Noise states (:mod:`.trajectories`) replace the end of a block with tokens drawn from the
context; in a real verify step the draft after a rejection is the model's own prediction
behind a *plausible* wrong token, which the model takes seriously. This module runs the model
with ``jacobi`` in vLLM (batched, the fast path), records every draft it verifies, and pairs
it with the fixed point — the greedy tokens vLLM then committed at those positions (greedy
``jacobi`` output is plain greedy output, so the answer is the model's own). Each record is a
:class:`~.records.TrajectoryRecord` whose context ends where the draft starts, so the
packed training row (:mod:`.packing`) shows the student exactly what inference shows it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from vllm_cllm.training.records import TrajectoryRecord, done_prompt_ids

#: (internal request id, committed tokens before the draft, draft tokens)
Draft = tuple[str, int, list[int]]


def record_drafts(llm: Any) -> list[Draft]:
    """Wrap the in-process engine's ``jacobi`` proposer so that every draft it returns is
    appended to the returned list (read, then clear it, after each ``generate``)."""
    from vllm_cllm.runtime.engine import drafter_of

    drafter = drafter_of(llm)
    original = drafter.propose
    drafts: list[Draft] = []

    def recording(sampled: list[list[int]], num_tokens_no_spec: np.ndarray, *args: Any,
                  **kwargs: Any) -> list[list[int]]:
        predictions = drafter.predictions  # read before propose() consumes it
        out = original(sampled, num_tokens_no_spec, *args, **kwargs)
        if predictions is not None:
            drafts.extend((predictions.req_ids[i], int(num_tokens_no_spec[i]), d)
                          for i, d in enumerate(out) if d)
        return out

    drafter.propose = recording
    return drafts


def _external_id(internal: str) -> str:
    """vLLM appends ``-<8 hex>`` to the caller's request id inside the engine."""
    return internal.rsplit("-", 1)[0]


def onpolicy_records(outputs: list[Any], drafts: list[Draft], n: int, max_per_prompt: int,
                     seed: int) -> Iterator[TrajectoryRecord]:
    """One record per recorded draft that has a full n-token fixed point and differs from
    it; at most ``max_per_prompt`` per prompt (seeded choice, kept in decoding order)."""
    rng = np.random.default_rng(seed)
    by_request: dict[str, list[tuple[int, list[int]]]] = {}
    for request, start, draft in drafts:
        by_request.setdefault(_external_id(request), []).append((start, draft))
    for pid, out in enumerate(outputs):
        yield from prompt_records(pid, list(out.prompt_token_ids),
                                  list(out.outputs[0].token_ids),
                                  by_request.get(out.request_id, []), n, max_per_prompt, rng)


def prompt_records(pid: int, prompt: list[int], answer: list[int],
                   drafts: list[tuple[int, list[int]]], n: int, max_per_prompt: int,
                   rng: np.random.Generator) -> list[TrajectoryRecord]:
    """One prompt's records from its drafts, each (committed tokens before it, draft tokens),
    in decoding order: drafts without a full n-token fixed point, or equal to it, are
    dropped; above ``max_per_prompt``, a choice by ``rng`` of that many is kept in order."""
    clean = prompt + answer
    records = []
    for step, (start, draft) in enumerate(drafts):
        fixed = clean[start:start + n]
        if start < len(prompt) or len(fixed) < n:
            continue
        state = (draft + fixed[len(draft):])[:n]  # positions not drafted: as committed
        if state != fixed:
            records.append(TrajectoryRecord(pid, step, len(prompt), clean[:start], fixed,
                                            [state], answer))
    if len(records) > max_per_prompt:
        keep = np.sort(rng.choice(len(records), max_per_prompt, replace=False))
        records = [records[i] for i in keep]
    return records


def write_onpolicy(path: Path, model: str, prompts: list[str], *, n: int, k: int,
                   max_new_tokens: int, max_per_prompt: int, seed: int,
                   chunk_size: int = 32, fill: str = "tail") -> int:
    """Record drafts for the prompts not yet in ``path`` and append their records, one chunk
    of prompts at a time on one engine (an interrupted build resumes at the next chunk).

    ``jacobi`` runs with ``fill`` (``tail``: the drafts are pure Jacobi iterates, the states
    consistency training is about; ``hybrid``: the drafts the shipped proposer verifies —
    lookups of the request's n-grams, earlier answers and recent iterates, and the tail —
    behind whose rejected tokens the model must still predict the fixed point).
    """
    from tqdm import tqdm
    from vllm import SamplingParams

    from vllm_cllm.runtime.engine import with_engine

    path.parent.mkdir(parents=True, exist_ok=True)
    done = done_prompt_ids(path)
    todo = [i for i in range(len(prompts)) if i not in done]
    chunks = [todo[i:i + chunk_size] for i in range(0, len(todo), chunk_size)]
    if not chunks:
        return 0
    params = SamplingParams(temperature=0.0, max_tokens=max_new_tokens)

    def run(llm: Any) -> int:
        drafts, written = record_drafts(llm), 0
        with path.open("a") as f:
            for ids in tqdm(chunks, desc="trajectories/onpolicy"):
                drafts.clear()
                outputs = llm.generate([prompts[i] for i in ids], params, use_tqdm=False)
                for record in onpolicy_records(outputs, drafts, n, max_per_prompt,
                                               seed + ids[0]):
                    record.prompt_id = ids[record.prompt_id]
                    f.write(json.dumps(asdict(record)) + "\n")
                    written += 1
                f.flush()
        return written

    spec = {"method": "jacobi", "num_speculative_tokens": k, "fill": fill}
    return with_engine(model, spec, run)
