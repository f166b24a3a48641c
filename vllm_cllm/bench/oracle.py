"""The oracle of a ``jacobi`` row: how many tokens per verify step the step's best candidate
would have given, from the proposer's candidate log (:mod:`vllm_cllm.policies.candidate_log`).

Greedy output is fixed, so once a request has finished every candidate's accepted length at
every step is known: its common prefix with the output from that step's position (at most
the tokens the request still had to give, less the step's own token). Per verify step:

* **full length** (``oracle_tpf``): 1 + the most any candidate of the step would have had
  accepted, drafted whole;
* **under the cost model** (``oracle_cost_tpf``): the best candidate at the best length as the
  adaptive rule prices a step (:func:`vllm_cllm.policies.cost_model.step_cost` with the
  policy's knee and floor at that step and the spec-decode overhead, over the whole batch as
  :func:`~vllm_cllm.policies.cost_model.draft_lengths_grid` prices it, without its margins:
  the oracle knows what is accepted). Knowing that, a candidate is worth drafting exactly as
  far as it is accepted, and since tokens of value 1 raise the rate (B + T) / step_cost(B ·
  (1 + overhead) + T) as T grows, the step drafts every request's best or nothing, whichever
  prices better. At batch 1 with a knee of 1/4 token or more this is the full-length oracle;
  at batch 16 a step whose requests would have had only a few tokens accepted drafts nothing.

Both are averaged over the steps ``tokens_per_verify_step`` counts (every decode step of a
request; the prefill step left out): a step without a log line (no candidates: not drafting)
keeps the tokens it gave, so each oracle is the row's tokens per verify step plus the tokens
its choices would have added, over the same steps. ``oracle_cost_speedup`` prices both: the
cost-model oracle's tokens per step cost over the row's own (what it drafted, priced by the
same model), over the steps with a cost model in the log — how much faster than the row the
best candidates at the best lengths would run, as far as the cost model tells the machine's
time; times the row's ratio to another proposer, it bounds what these sources can reach
against it. ``selection_efficiency`` is the row's
tokens per verify step over the cost-model oracle (over the full-length one where no policy
priced the steps: ``jacobi fixed``). ``oracle_gap_*`` split the full-length oracle's lead
over the row into selection (the best candidate at full length over the drafted one at full
length), sizing (the drafted candidate at full length over what was drafted) and undrafted
(steps that drafted nothing), in tokens per verify step. ``acceptance_calibration`` is the
draft tokens accepted over those the policy expected accepted when it drafted them (the sum
of its values, :mod:`vllm_cllm.policies.acceptance`): below 1 its estimates run high.

The oracle is taken at the steps the row took, not along a path another policy could follow:
a row that drafts little steps on every position and meets a long acceptable run once per
position, so its oracle reads higher than that of a row drafting every step in the same cell.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np

from vllm_cllm.core.tokens import matched_prefix
from vllm_cllm.policies.cost_model import SPEC_STEP_OVERHEAD_PER_REQUEST, step_cost

#: The row fields this module adds (None where the row has no candidate log).
ORACLE_FIELDS = ("oracle_tpf", "oracle_cost_tpf", "selection_efficiency",
                 "oracle_cost_speedup", "oracle_coverage",
                 "oracle_chain_breaks", "oracle_gap_selection", "oracle_gap_sizing",
                 "oracle_gap_undrafted", "acceptance_calibration")


def read_log(path: str, start: int = 0) -> list[dict[str, Any]]:
    """The log's complete lines from byte ``start`` on."""
    with open(path, "rb") as file:
        file.seek(start)
        data = file.read()
    data = data[:data.rfind(b"\n") + 1]
    return [json.loads(line) for line in data.splitlines() if line.strip()]


def log_size(path: str) -> int:
    """Where a reader of the log starts to see only what comes next."""
    try:
        with open(path, "rb") as file:
            return file.seek(0, 2)
    except FileNotFoundError:
        return 0


def _external(engine_id: str, known: set[str]) -> str | None:
    """The id a request was added under, from vLLM's engine-core id: vLLM 0.32 appends
    ``-`` and 8 random characters (``InputProcessor.assign_request_id``) unless
    ``VLLM_DISABLE_REQUEST_ID_RANDOMIZATION`` is set."""
    if engine_id in known:
        return engine_id
    base = engine_id.rsplit("-", 1)[0]
    return base if base in known else None


def _prefix(candidate: Sequence[int], output: Sequence[int], start: int, most: int) -> int:
    """Leading tokens of ``candidate`` equal to ``output[start:]``, at most ``most``."""
    return matched_prefix(np.asarray(candidate[:most], dtype=np.int64),
                          output[start:start + most])


def oracle_fields(records: list[dict[str, Any]], ids: Sequence[str],
                  prompt_tokens: Sequence[Sequence[int]], tokens: Sequence[Sequence[int]],
                  steps: Sequence[int]) -> dict[str, Any]:
    """The oracle fields (:data:`ORACLE_FIELDS`) of requests ``ids`` (their prompt tokens,
    output tokens and engine steps, as the bench counted them) from the log lines
    ``records``; all None when no line names one of them."""
    requests = {rid: (len(p), list(t)) for rid, p, t in zip(ids, prompt_tokens, tokens,
                                                            strict=True)}
    known = set(requests)
    #: per request, per output position: [best, drafted's, drafted one whole, best as
    #: priced, priced at all, drafted nothing]
    found: dict[str, dict[int, list[Any]]] = defaultdict(dict)
    by_step: dict[int, list[tuple[dict[str, Any], dict[str, Any]]]] = defaultdict(list)
    for line in records:
        for request in line["requests"]:
            by_step[line["step"]].append((line, request))
    priced_any = False
    #: over the priced steps: the row's tokens and cost, the cost-model oracle's
    row_tokens = row_cost = best_tokens = best_cost = 0.0
    expected = realized = 0.0  # the drafted tokens the policy expected accepted, and were
    for pairs in by_step.values():
        entries = []
        for line, request in pairs:
            rid = _external(request["id"], known) if request["id"] is not None else None
            if rid is None:
                continue
            prompt, output = requests[rid]
            position = request["num_tokens"] - prompt
            if not 0 < position < len(output):  # a prefill, or after the request's end
                continue
            most = len(output) - position - 1  # the step's own token comes on top
            accepted = {name: _prefix(c, output, position, most)
                        for name, c in request["candidates"].items()}
            best = max(accepted.values(), default=0)
            drafted = request["drafted"]
            actual = _prefix(drafted, output, position, most)
            whole = max((a for name, a in accepted.items() if drafted and
                         request["candidates"][name][:len(drafted)] == drafted), default=actual)
            if drafted and request.get("expected") is not None:
                expected, realized = expected + request["expected"], realized + actual
            entry = [best, actual, whole, best, line["knee"] is not None, not drafted,
                     len(drafted)]
            found[rid][position] = entry
            entries.append((entry, line))
        priced = [(entry, line) for entry, line in entries if entry[4]]
        if priced:  # the batch drafts every best, or nothing, whichever prices better
            priced_any = True
            line = priced[0][1]
            batch, knee, floor = line["batch"], line["knee"], line["floor"]
            more = sum(entry[0] for entry, _ in priced)
            plain, best = _priced(batch, 0, knee, floor), _priced(batch, more, knee, floor)
            if not (more and (batch + more) / best > batch / plain):
                for entry, _ in priced:
                    entry[3] = 0
                more, best = 0, plain
            # the requests of the step not logged (no room) commit one token each
            row_tokens += batch + sum(entry[1] for entry, _ in priced)
            row_cost += _priced(batch, sum(entry[6] for entry, _ in priced), knee, floor)
            best_tokens += batch + more
            best_cost += best
    decoded = sum(len(t) - 1 for t, s in zip(tokens, steps, strict=True) if s > 1)
    decode_steps = sum(s - 1 for s in steps if s > 1)
    recorded = sum(len(positions) for positions in found.values())
    if not recorded or not decode_steps:
        return dict.fromkeys(ORACLE_FIELDS)
    full = cost = selection = sizing = undrafted = 0
    breaks = 0
    for positions in found.values():
        at = sorted(positions)
        for p, q in zip(at, at[1:], strict=False):
            breaks += q != p + 1 + positions[p][1]
        for best, actual, whole, priced_best, priced, empty, _ in positions.values():
            full += best - actual
            cost += (priced_best if priced else best) - actual
            if empty:
                undrafted += best
            else:
                selection += best - whole
                sizing += whole - actual
    tpf = decoded / decode_steps
    oracle = (decoded + full) / decode_steps
    oracle_cost = (decoded + cost) / decode_steps if priced_any else None
    return {"oracle_tpf": oracle, "oracle_cost_tpf": oracle_cost,
            "selection_efficiency": tpf / (oracle_cost if oracle_cost is not None else oracle),
            "oracle_cost_speedup": (best_tokens / best_cost) / (row_tokens / row_cost)
            if row_tokens else None,
            "oracle_coverage": recorded / decode_steps, "oracle_chain_breaks": breaks,
            "oracle_gap_selection": selection / decode_steps,
            "oracle_gap_sizing": sizing / decode_steps,
            "oracle_gap_undrafted": undrafted / decode_steps,
            "acceptance_calibration": realized / expected if expected else None}


def _priced(batch: int, drafted: int, knee: float, floor: float) -> float:
    """A step of ``batch`` requests that verifies ``drafted`` draft tokens in all, as the
    adaptive rule prices it (the spec-decode overhead once anything is drafted)."""
    if not drafted:
        return step_cost(batch, knee, floor)
    return step_cost(batch * (1 + SPEC_STEP_OVERHEAD_PER_REQUEST) + drafted, knee, floor)


def oracle_of_log(path: str, start: int, ids: Sequence[str],
                  prompt_tokens: Sequence[Sequence[int]], tokens: Sequence[Sequence[int]],
                  steps: Sequence[int]) -> dict[str, Any]:
    """:func:`oracle_fields` from the log at ``path``, read from byte ``start``."""
    return oracle_fields(read_log(path, start), ids, prompt_tokens, tokens, steps)
