"""Every draft of ``jacobi`` and ``space`` in 13 configurations at batch 1, 4 and 16 (and
``jacobi`` with GPU-like cost parameters at batch 64 and 256, its batch-size cut-off on and
off), over synthetic verify steps driven through the proposer's three calls (requests
finishing and arriving, greedy and sampled; with ``churn`` also preempted and re-entering
under the same id, prefilled in chunks, and the batch reordered): written to ``argv[1]`` as
JSON, so that two trees can be compared draft for draft. Run once per tree, from outside the
checkout:

    cd /tmp && PYTHONPATH=TREE python TREE/experiments/proposer_step_cost/same_drafts.py OUT
"""

from __future__ import annotations

import hashlib
import json
import sys
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from vllm_cllm.options import parse_options

#: A key of a configuration that is not an option: the adaptive policy's cut-off switch.
CUT_OFF = "stop_when_compute_bound"


def digest(*parts: Any) -> int:
    return int(hashlib.md5(repr(parts).encode()).hexdigest()[:8], 16)


def make(spec: dict[str, Any], vocab: int, max_model_len: int) -> Any:
    spec = {key: value for key, value in spec.items() if key != CUT_OFF}
    k = spec["num_speculative_tokens"]
    slots = 2 * k if spec["method"] == "space" else k
    hf = SimpleNamespace(mask_token_id=vocab - 1, vocab_size=vocab)
    options = parse_options(spec, max_k=128, hf_config=hf)
    config = SimpleNamespace(
        speculative_config=SimpleNamespace(num_speculative_tokens=slots),
        model_config=SimpleNamespace(max_model_len=max_model_len, hf_config=hf),
        additional_config={"vllm_cllm": options.to_dict()})
    if spec["method"] == "space":
        from vllm_cllm.proposers.space import SpaceProposer as Proposer
    else:
        from vllm_cllm.proposers.jacobi import JacobiProposer as Proposer
    return Proposer(config)


def run(spec: dict[str, Any], batch: int, steps: int, seed: int, vocab: int = 40,
        max_model_len: int = 400, churn: bool = False) -> tuple[list[list[list[int]]], int]:
    """Each step's drafts, and how many requests the proposer still holds at the end.

    With ``churn``, as a loaded server's batch changes: a running request is preempted now
    and then (out of the batch for a few steps, then prefilled again under the same id, its
    drafts gone), a new request's prefill may take a chunk first (nothing committed, no
    room), and the batch's order is rotated now and then (vLLM condenses its batch)."""
    rng = np.random.default_rng(seed)
    proposer = make(spec, vocab, max_model_len)
    if CUT_OFF in spec:
        for policy in proposer.drafter.policies:
            if hasattr(policy, CUT_OFF):
                setattr(policy, CUT_OFF, spec[CUT_OFF])
    phrases = [list(rng.integers(0, vocab - 2, rng.integers(3, 9))) for _ in range(12)]

    def text(req_id: str) -> list[int]:  # phrases repeated, with noise
        g = np.random.default_rng(digest("t", seed, req_id))
        out: list[int] = []
        while len(out) < max_model_len + 40:
            out += phrases[g.integers(0, len(phrases))] if g.random() < 0.8 \
                else [int(g.integers(0, vocab - 2))]
        return out

    serial = 0

    def new() -> dict[str, Any]:
        nonlocal serial
        req_id, serial = f"r{serial}", serial + 1
        return {"id": req_id, "T": text(req_id), "n": int(rng.integers(5, 30)), "drafts": [],
                "greedy": bool(rng.random() < 0.8), "left": int(rng.integers(20, 120)),
                "first": True, "away": 0, "chunk": churn and bool(rng.random() < 0.3)}

    everyone = [new() for _ in range(batch)]
    log = []
    for _ in range(steps):
        for j, s in enumerate(everyone):  # departures and arrivals
            if s["left"] <= 0 or s["n"] >= max_model_len - 2:
                everyone[j] = new()
        if churn:
            for s in everyone:
                if s["away"]:  # preempted: back after a few steps, prefilled again
                    s["away"] -= 1
                elif not s["first"] and rng.random() < 0.04:
                    s["away"], s["first"], s["drafts"] = int(rng.integers(1, 4)), True, []
            if rng.random() < 0.2:
                shift = int(rng.integers(1, batch)) if batch > 1 else 0
                everyone = everyone[shift:] + everyone[:shift]
        slots = [s for s in everyone if not s["away"]]
        ids = [s["id"] for s in slots]
        proposer.retain_requests(set(ids), {s["id"] for s in slots if s["greedy"]})
        rows, committed = [], []
        for s in slots:
            tokens, n, drafts = s["T"], s["n"], s["drafts"]
            if s["first"]:
                rows.append([tokens[n]])
                # a prefill chunk samples nothing; the next step finishes the prefill
                committed.append([] if s["chunk"] else [tokens[n]])
                continue
            row, ok, accepted = [], True, 0
            for j in range(len(drafts) + 1):  # the target: the text, then noise after a miss
                row.append(tokens[n + j] if ok or digest("p", s["id"], n, j) % 3
                           else digest("q", s["id"], n, j) % (vocab - 2))
                if j < len(drafts):
                    if ok and drafts[j] == tokens[n + j]:
                        accepted += 1
                    else:
                        ok = False
            rows.append(row)
            committed.append(tokens[n:n + accepted + 1])
        num = [len(s["drafts"]) for s in slots]
        flat = sum(rows, [])
        logits = torch.zeros(len(flat), vocab)
        logits[torch.arange(len(flat)), torch.tensor(flat)] = 1.0
        meta = SimpleNamespace(num_draft_tokens=num, draft_token_ids=torch.tensor(
            sum([s["drafts"] for s in slots], []), dtype=torch.int64)) if any(num) else None
        proposer.observe_verification(logits, meta, ids)
        token_ids = np.zeros((len(slots), max_model_len + 40), dtype=np.int64)
        lengths = np.zeros(len(slots), dtype=np.int64)
        for j, s in enumerate(slots):
            s["n"] += len(committed[j])
            s["left"] -= len(committed[j])
            s["first"] = s["chunk"]
            s["chunk"] = False
            token_ids[j, :s["n"]] = s["T"][:s["n"]]
            lengths[j] = s["n"]
        drafts = proposer.propose(committed, lengths, token_ids)
        for j, s in enumerate(slots):
            s["drafts"] = [int(t) for t in drafts[j]]
        log.append(drafts)
        assert proposer.tracked_requests() <= set(ids)
    proposer.retain_requests(set())
    return log, len(proposer.tracked_requests())


JACOBI = {"method": "jacobi", "num_speculative_tokens": 15}
GPU_LIKE = {**JACOBI, "knee_tokens": 2048, "floor_tokens": 0}
CONFIGS = [
    JACOBI,
    GPU_LIKE,
    {**JACOBI, "lookup": "ngram"},
    {**JACOBI, "lookup": "ngram", "knee_tokens": 256, "floor_tokens": 0},
    {**JACOBI, "adaptive": False},
    {**JACOBI, "adaptive": False, "lookup": "ngram"},
    {"method": "jacobi", "num_speculative_tokens": 6, "fill": "ngram"},
    {"method": "jacobi", "num_speculative_tokens": 6, "fill": "tail"},
    {"method": "jacobi", "num_speculative_tokens": 6, "fill": "random"},
    {"method": "space", "num_speculative_tokens": 5},
    {"method": "space", "num_speculative_tokens": 5, "fill": "ngram"},
    {"method": "space", "num_speculative_tokens": 5, "fill": "masks"},
    {"method": "space", "num_speculative_tokens": 5, "fill": "tail"},
]
#: (configuration, batch, steps) beyond every configuration at batch 1, 4 and 16
LARGE = [(GPU_LIKE, 64, 200), ({**GPU_LIKE, CUT_OFF: False}, 64, 100),
         ({**JACOBI, CUT_OFF: False}, 16, 120), (GPU_LIKE, 256, 60)]
#: (configuration, batch, steps) run with ``churn``: the batch changes as on a loaded server
CHURN = [(GPU_LIKE, 6, 200), (GPU_LIKE, 24, 150), (GPU_LIKE, 96, 100), (JACOBI, 16, 120),
         ({**JACOBI, "adaptive": False}, 16, 100), ({**GPU_LIKE, "lookup": "ngram"}, 24, 100),
         ({"method": "space", "num_speculative_tokens": 5}, 16, 100)]


def main() -> None:
    out = {}
    for c, spec in enumerate(CONFIGS):
        for batch in (1, 4, 16):
            log, left = run(spec, batch, 120 if batch < 16 else 60, seed=c * 10 + batch)
            out[f"{json.dumps(spec)} b{batch}"] = {"drafts": log, "left": left}
    for spec, batch, steps in LARGE:
        log, left = run(spec, batch, steps, seed=1000 + batch)
        out[f"{json.dumps(spec)} b{batch}"] = {"drafts": log, "left": left}
    for c, (spec, batch, steps) in enumerate(CHURN):
        log, left = run(spec, batch, steps, seed=2000 + c, churn=True)
        out[f"{json.dumps(spec)} b{batch} churn"] = {"drafts": log, "left": left}
    with open(sys.argv[1], "w") as f:
        json.dump(out, f)
    print("done", len(out))


if __name__ == "__main__":
    main()
