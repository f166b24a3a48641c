"""Configurations compared side by side: every engine loaded at once, each group of prompts run
by all of them in lock step, a few engine steps each in turn (vllm_cllm/bench/engine_pool.py), so
that a ratio is not this machine's drift.

Each round takes a fresh group of prompts (never seen by any engine before: vLLM's prefix
cache and the proposers' memory of earlier outputs would flatter a repeat) and runs it on
every engine. A row's speed-up is the median over
rounds of its tokens/s divided by its baseline's tokens/s in the same round.

    .venv/bin/python benchmarks/interleaved.py --preset gsm-b1 --rounds 8 --out results/il_gsm_b1
    .venv/bin/python benchmarks/interleaved.py --preset zero-draft --dataset mtbench \\
        --batch-size 16 --rounds 6 --out results/il_zero_draft

Presets (engines: model label and speculative config; baselines are each model's ``none``):
``gsm-b1`` — the bench's batch-1 gsm question (CLLM demo's ``jacobi`` k=15 and adaptive
against vLLM's ``ngram`` and ``suffix`` on the base model); ``same-model-b1`` — the same
question with ``suffix`` on the CLLM demo itself; ``tuned-suffix-b1`` — the same with vLLM's
``suffix`` also at looser settings, on both models; ``zero-draft`` — the CLLM demo
with adaptive k against no speculation, where adaptive k drafts little or nothing;
``cost-model`` (``cost-model-base``) — the adaptive rule's default cost model against the
earlier fit, on the CLLM demo (the base model); ``token-margin`` — adaptive k at the default
``token_margin_pct`` against 0 % and 60 %, on the CLLM demo; ``both-models`` — adaptive k
against no speculation on the base model and the CLLM demo; ``ngram-candidate`` — adaptive k
with and without the request's n-grams as a candidate, on both models; ``spec-path`` — adaptive
k, the same engine under a cost model that never drafts, and vLLM's ``suffix``, against no
speculation on the CLLM demo (what the speculative path costs by itself); ``drain`` — adaptive
k with and without ``drain`` (in a draining batch only the last requests draft), on both models;
``lookup-reach`` — adaptive k with the suffix-tree lookup offering up to 8 tokens past its
match's length (``SPEC_OFFSET``, set in that engine's worker) against the shipped reach, beside
vLLM's ``suffix``, on both models; ``reach-wide`` — the same with the lookup's earlier, wider
reach (2 tokens past the match, probability down to 0.05), on the base model (``reach-wide-cllm``:
the demo);
``k-24`` — adaptive k at 15 and at vLLM ``suffix``'s default 24, beside ``suffix``, on both models;
``drain-price`` — adaptive k against the same with the requests that end a draining batch
priced as in a batch that refills, beside ``suffix``, on both models; ``fresh-batch`` — adaptive
k against the same with a batch that starts afresh refilling where a queue stood behind the
last one, beside ``suffix``, on the CLLM demo (with ``--prompts`` above the batch size;
``fresh-batch-swapped``: the two in the other order, since an engine's place in the pool moves
its ratio by a few per cent; ``fresh-batch-base``: each twice on the base model);
``greedy-verify`` — adaptive k against the same with every verify step through vLLM's
rejection sampler (not the capture's argmax), beside ``suffix``, on the CLLM demo
(``greedy-verify-swapped``: the two in the other order; ``greedy-verify-base``: the base model);
``acceptance-positions`` — adaptive k with a cell of its own for each of the first 8 and 16
draft positions against the shipped 5, on the base model (``acceptance-positions-cllm``: the
demo); ``lookup-whole`` — adaptive k against the same drafting its lookup candidate whole
(vLLM ``suffix``'s rule inside this proposer), beside ``suffix``, on the base model
(``lookup-whole-chosen``: also the lookup drafted whole only where the default drafted a prefix
of it, without ``suffix``).
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from tqdm import tqdm

from vllm_cllm.bench.engine_pool import EnginePool
from vllm_cllm.bench.measure import WARMUP_PROMPT
from vllm_cllm.bench.suite import (
    DATASETS,
    MODELS,
    NEVER_DRAFTING,
    NGRAM_SPEC,
    SUFFIX_SPEC,
    BenchPlan,
    prompt_sets,
)
from vllm_cllm.runtime.checkpoints import model_path

JACOBI = {"method": "jacobi", "num_speculative_tokens": 15}
#: vLLM's ``suffix`` with drafts as loose as ``jacobi``'s lookup takes them (vLLM exposes no
#: offset: a longer draft per matched token and a lower per-token probability instead).
SUFFIX_TUNED_SPEC = {**SUFFIX_SPEC, "suffix_decoding_max_spec_factor": 2.0,
                     "suffix_decoding_min_token_prob": 0.05}
ADAPTIVE = {**JACOBI, "adaptive": True}
Configs = dict[str, tuple[str, dict[str, Any] | None]]
#: The CLLM's adaptive jacobi against vLLM's proposers on the CLLM itself.
SAME_MODEL: Configs = {
    "cllm none": ("cllm", None),
    "cllm suffix": ("cllm", SUFFIX_SPEC),
    "cllm jacobi adaptive k=15": ("cllm", ADAPTIVE),
}


def adaptive_variants(model: str, variants: dict[str, dict[str, Any]]) -> Configs:
    """``model`` without speculation, with adaptive k at its defaults, and with adaptive k at
    each variant's options (labelled by the variant's name)."""
    return {f"{model} none": (model, None),
            f"{model} jacobi adaptive k=15": (model, ADAPTIVE),
            **{f"{model} jacobi adaptive {label}": (model, {**ADAPTIVE, **options})
               for label, options in variants.items()}}


#: The adaptive rule's defaults against an earlier, slower-machine fit of the cost model.
EARLIER_FIT = {"knee=16 floor=25": {"knee_tokens": 16, "floor_tokens": 25}}
#: Adaptive drafting without the request's n-grams as a candidate (the lookup and the tail).
NO_NGRAM = {"no ngram candidate": {"ngram_candidate": False}}
#: Adaptive drafting that drafts for every request in a batch that drains too.
NO_DRAIN = {"no drain": {"drain": False}}
#: The default per-token margin (``token_margin_pct``) against others.
MARGINS = {f"margin={m}%": {"token_margin_pct": m} for m in (0, 60)}
#: The default with room for drafts as long as vLLM ``suffix``'s (its default k is 24).
K_24 = {"k=24": {"num_speculative_tokens": 24}}
#: A cost model under which no draft pays: the speculative path's own cost.
NEVER = {"never drafting": NEVER_DRAFTING}


def set_lookup_reach(offset: float, min_token_prob: float | None = None) -> None:
    """In an engine's worker: the suffix-tree lookup offers up to ``offset`` tokens past its
    match's length, down to ``min_token_prob`` (None: the shipped one)."""
    from vllm_cllm.sources import suffix_trees

    suffix_trees.SPEC_OFFSET = offset
    if min_token_prob is not None:
        suffix_trees.MIN_TOKEN_PROB = min_token_prob


#: The lookup's earlier reach: 2 tokens past the match, probability down to 0.05.
WIDE_REACH = partial(set_lookup_reach, 2.0, 0.05)


def price_drain_as_refill() -> None:
    """In an engine's worker: in a draining batch the requests that end last draft, but priced
    at the step's whole batch size, as in a batch that refills."""
    from vllm_cllm.policies import adaptive

    original = adaptive.drain_rooms

    def refill_priced(step: Any, knee_tokens: float, floor_tokens: float) -> tuple[Any, int]:
        return original(step, knee_tokens, floor_tokens)[0], len(step)

    adaptive.drain_rooms = refill_priced


def fresh_batch_refills_after_a_queue() -> None:
    """In an engine's worker: a batch that starts afresh starts refilling where a request took
    a finished one's place in the last one (a queue stood behind it), instead of keeping the
    state the last one ended in."""
    from vllm_cllm.core import flow

    original = flow.BatchFlow.update

    def update(self: Any, previous: set[str], live: set[str]) -> set[str]:
        joined = live - previous
        if len(joined) == len(live):  # a fresh batch
            if getattr(self, "refilled", False):
                self.draining = False
            self.refilled = False
        elif joined and self._open:  # a request took a finished one's place
            self.refilled = True
        return original(self, previous, live)

    flow.BatchFlow.update = update


def draft_the_lookup_whole(only_chosen: bool = False) -> None:
    """In an engine's worker: the adaptive policy counts and chooses as usual, then every
    request drafts its lookup candidate whole, to its room (vLLM ``suffix``'s rule, inside
    this proposer); ``only_chosen``: only where the policy drafted a prefix of it."""
    from vllm_cllm.policies.adaptive import Adaptive

    draft = Adaptive.draft

    def whole(self: Any, step: Any, rows: Any, states: Any, sources: Any) -> Any:
        drafts = draft(self, step, rows, states, sources)  # the table and records as usual
        name = self.names[0]
        lookups = sources[name].propose(step, list(rows), step.rooms[list(rows)].tolist(),
                                        list(states))[name]
        if not only_chosen:
            return lookups
        return [lookup if len(mine) and len(lookup) > len(mine)
                and (lookup[:len(mine)] == mine).all() else mine
                for mine, lookup in zip(drafts, lookups, strict=True)]

    Adaptive.draft = whole


def set_acceptance_positions(positions: int) -> None:
    """In an engine's worker: the acceptance table holds a cell of its own for each of the
    first ``positions`` draft positions (acceptance.POSITIONS)."""
    from vllm_cllm.policies import acceptance

    acceptance.POSITIONS = positions


#: Studies of variants that a function in the engine's worker makes: per preset its model, its
#: variants (label: that function) and whether vLLM ``suffix`` runs beside.
WHOLE = {"lookup whole": draft_the_lookup_whole}
POSITION_CELLS = {f"positions={n}": partial(set_acceptance_positions, n) for n in (8, 16)}
WORKER_VARIANTS: dict[str, tuple[str, dict[str, Callable[[], None]], bool]] = {
    "lookup-whole": ("base", WHOLE, True),
    "lookup-whole-chosen": (
        "base", {"lookup whole where chosen": partial(draft_the_lookup_whole, True), **WHOLE},
        False),
    "acceptance-positions": ("base", POSITION_CELLS, False),
    "acceptance-positions-cllm": ("cllm", POSITION_CELLS, False),
}


def verify_with_vllms_sampler() -> None:
    """In an engine's worker: every verify step through vLLM's rejection sampler, none from
    the capture's argmax (patches/greedy_verify.py)."""
    from vllm_cllm.patches import greedy_verify

    greedy_verify.raw_targets = lambda sampling_metadata: False


#: The greedy-verify study: per preset its model and whether the variant (verification
#: through vLLM's sampler) comes before the default in the pool.
GREEDY_VERIFY = {"greedy-verify": ("cllm", False), "greedy-verify-swapped": ("cllm", True),
                 "greedy-verify-base": ("base", False)}
GREEDY_PAIR = (("jacobi adaptive k=15", ADAPTIVE), ("jacobi adaptive vllm verify", ADAPTIVE))

#: The fresh-batch study's engines: the variant first, then the default (``-swapped``: the
#: other order), or each twice on the base model (``-base``: positions 2 and 5 against 3 and 4).
FRESH = "jacobi adaptive fresh refills"
FRESH_BATCH = {
    "fresh-batch": ("cllm", (FRESH, "jacobi adaptive k=15")),
    "fresh-batch-swapped": ("cllm", ("jacobi adaptive k=15", FRESH)),
    "fresh-batch-base": ("base", (FRESH, "jacobi adaptive k=15", "jacobi adaptive k=15 2",
                                  f"{FRESH} 2")),
}

#: The lookup-reach studies: per preset, its models, the variant's label and what that
#: variant's engine runs in its worker first; each beside the shipped reach and vLLM's ``suffix``.
REACHES: dict[str, tuple[tuple[str, ...], str, Callable[[], None]]] = {
    "lookup-reach": (("base", "cllm"), "offset=8", partial(set_lookup_reach, 8.0)),
    "reach-wide": (("base",), "reach=wide", WIDE_REACH),
    "reach-wide-cllm": (("cllm",), "reach=wide", WIDE_REACH),
}

PRESETS: dict[str, Configs] = {
    "gsm-b1": {
        "base none": ("base", None),
        "base ngram k=8": ("base", NGRAM_SPEC),
        "base suffix": ("base", SUFFIX_SPEC),
        "cllm none": ("cllm", None),
        "cllm jacobi fixed k=15": ("cllm", {**JACOBI, "adaptive": False}),
        "cllm jacobi adaptive k=15": ("cllm", ADAPTIVE),
    },
    "same-model-b1": SAME_MODEL,
    "tuned-suffix-b1": {  # vLLM's suffix with looser settings too, on both models
        "base none": ("base", None),
        "base suffix tuned": ("base", SUFFIX_TUNED_SPEC),
        **SAME_MODEL,
        "cllm suffix tuned": ("cllm", SUFFIX_TUNED_SPEC),
    },
    "cost-model": adaptive_variants("cllm", EARLIER_FIT),
    "cost-model-base": adaptive_variants("base", EARLIER_FIT),  # the refit drafts at batch 16
    "token-margin": adaptive_variants("cllm", MARGINS),
    "zero-draft": adaptive_variants("cllm", {}),
    "both-models": {**adaptive_variants("base", {}), **adaptive_variants("cllm", {})},
    "ngram-candidate": {**adaptive_variants("base", NO_NGRAM),
                        **adaptive_variants("cllm", NO_NGRAM)},
    "drain": {**adaptive_variants("base", NO_DRAIN), **adaptive_variants("cllm", NO_DRAIN)},
    "k-24": {name: config for m in ("base", "cllm") for name, config in {
        **adaptive_variants(m, K_24), f"{m} suffix": (m, SUFFIX_SPEC)}.items()},
    "spec-path": {**adaptive_variants("cllm", NEVER), "cllm suffix": ("cllm", SUFFIX_SPEC)},
    **{preset: {**adaptive_variants(m, dict.fromkeys(variants, {})),
                **({f"{m} suffix": (m, SUFFIX_SPEC)} if beside else {})}
       for preset, (m, variants, beside) in WORKER_VARIANTS.items()},
    **{preset: {f"{m} {name}": (m, spec) for name, spec in (
        ("none", None), *(reversed(GREEDY_PAIR) if swapped else GREEDY_PAIR),
        ("suffix", SUFFIX_SPEC))} for preset, (m, swapped) in GREEDY_VERIFY.items()},
    "drain-price": {name: config for m in ("base", "cllm") for name, config in {
        **adaptive_variants(m, {"refill price": {}}), f"{m} suffix": (m, SUFFIX_SPEC)}.items()},
    **{preset: {name: config for m in models for name, config in {
        **adaptive_variants(m, {label: {}}), f"{m} suffix": (m, SUFFIX_SPEC)}.items()}
       for preset, (models, label, _) in REACHES.items()},
    **{preset: {f"{m} none": (m, None),
                **({f"{m} suffix": (m, SUFFIX_SPEC)} if m == "cllm" else {}),
                **{f"{m} {name}": (m, ADAPTIVE) for name in names}}
       for preset, (m, names) in FRESH_BATCH.items()},
}
#: Per preset, the engines whose worker runs a function before the engine is built.
SETUPS: dict[str, dict[str, Callable[[], None]]] = {
    **{preset: {f"{m} jacobi adaptive {label}": setup for label, setup in variants.items()}
       for preset, (m, variants, _) in WORKER_VARIANTS.items()},
    **{preset: {f"{m} jacobi adaptive {label}": setup for m in models}
       for preset, (models, label, setup) in REACHES.items()},
    "drain-price": {f"{m} jacobi adaptive refill price": price_drain_as_refill
                    for m in ("base", "cllm")},
    **{preset: {f"{m} {GREEDY_PAIR[1][0]}": verify_with_vllms_sampler}
       for preset, (m, _) in GREEDY_VERIFY.items()},
    **{preset: {f"{m} {name}": fresh_batch_refills_after_a_queue
                for name in names if name.startswith(FRESH)}
       for preset, (m, names) in FRESH_BATCH.items()}}


def summarise(rounds: list[dict[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per configuration: median tokens/s, per-round speed-ups against its model's ``none``
    in the same round and their median, tokens per verify step over all rounds, and whether
    every round's tokens equal the baseline's."""
    rows = []
    for name in rounds[0]:
        base = f"{name.split()[0]} none"
        ratios = [r[name]["tokens_per_s"] / r[base]["tokens_per_s"] for r in rounds]
        steps = sum(sum(s - 1 for s in r[name]["steps"] if s > 1) for r in rounds)
        decoded = sum(sum(len(t) - 1 for t, s in zip(r[name]["tokens"], r[name]["steps"],
                                                      strict=True) if s > 1) for r in rounds)
        rows.append({
            "config": name, "tokens_per_s": statistics.median(
                r[name]["tokens_per_s"] for r in rounds),
            "speedup": statistics.median(ratios), "speedup_rounds": ratios,
            "tpf": decoded / steps if steps else 1.0,
            "num_drafts": sum(r[name]["num_drafts"] for r in rounds),
            # what the verify steps cost: draft tokens per request and decode step
            "draft_tokens_per_step": sum(r[name].get("num_draft_tokens", 0) for r in rounds)
            / steps if steps else 0.0,
            "identical": all(r[name]["tokens"] == r[base]["tokens"] for r in rounds)})
    return rows


def measure_rounds(configs: Configs, setups: dict[str, Callable[[], None]] | None,
                   dataset: str, batch_size: int, per_round: int, rounds: int, offset: int,
                   max_tokens: int) -> list[dict[str, dict[str, Any]]]:
    """Every engine of ``configs`` (name: model label and speculative config; ``setups``: what
    an engine's worker runs first) loaded at once, and ``rounds`` fresh groups of
    ``per_round`` prompts of ``dataset`` (after the first ``offset``) run by all of them in
    lock step at ``batch_size``: per round, each engine's measurement (EnginePool.measure).
    ValueError where the data set holds too few prompts."""
    from transformers import AutoTokenizer

    need = offset + per_round * rounds
    plan = BenchPlan(datasets=(dataset,), batch_sizes=(1,), prompts_per_batch={1: need})
    dirs = {k: str(model_path(v)) for k, v in MODELS.items()}
    prompts = prompt_sets(plan, AutoTokenizer.from_pretrained(dirs["base"]))[dataset][offset:need]
    if len(prompts) < need - offset:
        raise ValueError(f"{dataset} has {len(prompts) + offset} prompts; {rounds} rounds of "
                         f"{per_round} after an offset of {offset} need {need}")
    measured: list[dict[str, dict[str, Any]]] = []
    with EnginePool({name: (dirs[model], spec) for name, (model, spec) in configs.items()},
                    setups) as pool:
        for r in tqdm(range(rounds), desc="rounds"):
            group = {"batch_size": batch_size, "warmup": [WARMUP_PROMPT] * batch_size,
                     "prompts": prompts[r * per_round:(r + 1) * per_round]}
            measured.append(pool.measure(group, max_tokens))
    return measured


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default="gsm-b1")
    parser.add_argument("--dataset", default="gsm", choices=DATASETS)
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--prompts", type=int, default=None,
                        help="prompts per round (default: 2 at batch 1, else the batch size)")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--offset", type=int, default=64,
                        help="skip this many prompts of the data set (the bench's own)")
    parser.add_argument("--out", default="results/interleaved")
    args = parser.parse_args()
    per_round = args.prompts or (2 if args.batch_size == 1 else args.batch_size)
    try:
        rounds = measure_rounds(PRESETS[args.preset], SETUPS.get(args.preset), args.dataset,
                                args.batch_size, per_round, args.rounds, args.offset,
                                args.max_tokens)
    except ValueError as error:
        parser.error(str(error))
    rows = summarise(rounds)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(
        {"args": vars(args), "rows": rows,
         "rounds": [{n: {k: v for k, v in row.items() if k != "tokens"} for n, row in r.items()}
                    for r in rounds]}, indent=1))
    lines = [f"{args.preset}: {args.dataset}, batch {args.batch_size}, {args.rounds} rounds of "
             f"{per_round} prompts, {args.max_tokens} tokens, engines in lock step", "",
             "| config | tokens/verify step | draft tokens/verify step | tokens/s "
             "| speed-up (median) | per round | drafts | identical |", "|---" * 8 + "|"]
    for row in rows:
        per = " ".join(f"{x:.2f}" for x in row["speedup_rounds"])
        lines.append(f"| {row['config']} | {row['tpf']:.2f} | "
                     f"{row['draft_tokens_per_step']:.2f} | {row['tokens_per_s']:.1f} | "
                     f"{row['speedup']:.2f}x | {per} | {row['num_drafts']} | "
                     f"{row['identical']} |")
    (out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n" + "\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
