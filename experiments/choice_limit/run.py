"""How much of the oracle's lead can a choice made at draft time recover?

The bench's oracle drafts each step's best candidate exactly as far as it is accepted: it knows
the future. This study asks how far a predictor that knows only what the proposer knows when it
drafts gets towards it. It logs the default ``jacobi`` at batch 1 (the candidate log, the Jacobi
tail's logit margins and each suffix lookup's match length and per-token probabilities), then,
over every logged step, estimates each candidate token's acceptance (given the tokens before it
accepted) three ways, each fitted on other prompts than the ones it is scored on (4 folds,
grouped by prompt):

* ``cells``: the product's cells (source, position 0-4+, agreement 0-2, the lookup's match
  level, the previous draft's outcome) as plain frequencies;
* ``boosted``: gradient-boosted trees over everything logged: the cells' features plus the
  exact position, the candidate's length, how many candidates there are, the lowest agreement
  so far, the previous draft's length and accepted count, the request's acceptance so far, the
  output position, the lookup's match length and token probabilities, the tail's margin;
* the oracle's choice of candidate with the estimated length, and the estimated choice drafted
  exactly as far as it is accepted (which of choice and sizing the estimates lose).

Each step drafts the candidate and length that promise the most tokens per step cost (the
step's logged cost model, a token's value counted at 1 / 1.3 as the product does), realized
against what was committed. Needs ``pip install scikit-learn`` for ``analyze``.

    .venv/bin/python experiments/choice_limit/run.py collect --out /tmp/cl   # ~15 min
    .venv/bin/python experiments/choice_limit/run.py analyze --out /tmp/cl
    .venv/bin/python experiments/choice_limit/run.py prior --out /tmp/cl     # the shipped prior
"""

from __future__ import annotations

import argparse
import importlib.util
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from vllm_cllm.bench.oracle import _priced
from vllm_cllm.policies.cost_model import TOKEN_MARGIN_PCT, draft_costs

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location(
    "tail_confidence", HERE.parent / "tail_confidence" / "run.py")
tail_confidence = importlib.util.module_from_spec(_spec)  # the collector and log reader
_spec.loader.exec_module(tail_confidence)  # type: ignore[union-attr]

SUFFIX_SIDE: list[Any] = []  # the suffix side log's file


def patch_suffix(path: str) -> None:
    """Log each suffix lookup's match length and token probabilities, keyed by request id and
    committed length. Every lookup takes the cache's own ``speculate`` (the same calls the
    direct path makes), whose result is read here."""
    from arctic_inference.suffix_decoding import SuffixDecodingCache

    from vllm_cllm.sources import suffix_trees

    SUFFIX_SIDE.append(open(path, "a", encoding="utf-8"))  # noqa: SIM115
    if getattr(SuffixDecodingCache, "choice_limit_patched", False):
        return
    suffix_trees._native_trees = lambda cache: None
    speculate = SuffixDecodingCache.speculate
    last: dict[str, Any] = {}

    def kept(self: Any, *args: Any, **kwargs: Any) -> Any:
        found = speculate(self, *args, **kwargs)
        last["found"] = found
        return found

    draft = suffix_trees.SuffixTrees.draft

    def logged(self: Any, req_id: str, state: Any, greedy: bool, context: np.ndarray,
               first_output: int, max_tokens: int) -> np.ndarray:
        last.pop("found", None)
        out = draft(self, req_id, state, greedy, context, first_output, max_tokens)
        found = last.get("found")
        if found is not None:
            SUFFIX_SIDE[0].write(json.dumps({
                "id": req_id, "num_tokens": len(context), "match_len": int(found.match_len),
                "probs": [round(float(p), 4) for p in found.probs]}) + "\n")
        return out

    SuffixDecodingCache.speculate = kept
    SuffixDecodingCache.choice_limit_patched = True
    suffix_trees.SuffixTrees.draft = logged


def collect(out: Path, models: list[str], datasets: list[str], prompts: int,
            max_tokens: int, offset: int) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for model in models:
        side = out / f"{model}.suffix.jsonl"
        side.unlink(missing_ok=True)
        patch_suffix(str(side))
        tail_confidence.collect(out, [model], datasets, prompts, max_tokens, offset)
        SUFFIX_SIDE.pop().close()


SOURCES = ("suffix", "ngram", "tail", "restart")
LEVEL_MATCH = (4, 10)  # as vllm_cllm.sources.suffix_trees (match_level's edges)


def steps_of(out: Path, model: str) -> list[dict[str, Any]]:
    """The logged steps (tail_confidence's reader) with the lookup's match and probabilities
    and the request's previous draft (its length and accepted count) attached."""
    steps = [s for s in tail_confidence.observations(out, model) if s["knee"] is not None]
    suffix = {}
    path = out / f"{model}.suffix.jsonl"
    for line in path.read_text().splitlines():
        entry = json.loads(line)
        suffix[(entry["id"], entry["num_tokens"])] = entry
    outputs = {r["id"]: r for r in json.loads((out / f"{model}.outputs.json").read_text())}
    last: dict[str, tuple[int, int]] = {}
    seen: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for s in steps:
        entry = suffix.get((s["engine_id"], len(outputs[s["id"]]["prompt"]) + s["position"]))
        s["match_len"] = entry["match_len"] if entry else 0
        s["suffix_probs"] = entry["probs"] if entry else []
        s["previous"] = last.get(s["id"])
        s["so_far"] = tuple(seen[s["id"]])
        last[s["id"]] = (len(s["drafted"]), s["actual"])
        seen[s["id"]][0] += len(s["drafted"])
        seen[s["id"]][1] += s["actual"]
    return steps


def token_rows(s: dict[str, Any], name: str) -> tuple[list[tuple], list[list[float]]]:
    """Per token of candidate ``name`` in step ``s``: its cell and its feature vector."""
    tokens = s["candidates"][name]
    others = [c for n, c in s["candidates"].items() if n != name]
    prev = s["previous"]
    outcome = 2 if prev is None or prev[0] == 0 else int(prev[1] > 0)
    level = 0
    probs: list[float] = []
    if name == "suffix":
        level = 1 + (s["match_len"] >= LEVEL_MATCH[0]) + (s["match_len"] >= LEVEL_MATCH[1])
        probs = s["suffix_probs"]
    margin = s["margin"] if name == "tail" and s["margin"] else []
    drafted, accepted = s["so_far"]
    cells, features = [], []
    low = 2
    for p, t in enumerate(tokens):
        votes = min(sum(1 for c in others if len(c) > p and c[p] == t), 2)
        low = min(low, votes)
        backed = level if (p < len(probs) and probs[p] >= 0.5) else 0
        cells.append((name, min(p, 4), votes, backed, outcome))
        features.append([
            SOURCES.index(name) if name in SOURCES else len(SOURCES), p, votes, low,
            len(tokens), len(s["candidates"]), outcome,
            prev[0] if prev else -1, prev[1] if prev else -1,
            (accepted + 1) / (drafted + 2), s["position"], s["match_len"] if probs else -1,
            probs[p] if p < len(probs) else -1, float(np.prod(probs[:p + 1])) if probs else -1,
            margin[p] if p < len(margin) else -1])
    return cells, features


def table(steps: list[dict[str, Any]]) -> tuple[list, list, list, list]:
    """Every candidate token of every step: (step index, name, position), cell, features, and
    its label where it was reached (1 accepted, 0 not, -1 not reached)."""
    keys, cells, features, labels = [], [], [], []
    for k, s in enumerate(steps):
        for name in s["candidates"]:
            a = s["accepted"][name]
            c, f = token_rows(s, name)
            for p in range(len(c)):
                keys.append((k, name, p))
                cells.append(c[p])
                features.append(f[p])
                labels.append(1 if p < a else 0 if p == a else -1)
    return keys, cells, features, labels


def cell_rates(cells: list[tuple], labels: np.ndarray) -> dict[tuple, float]:
    """Acceptance per cell over the reached tokens (the product's prior: 4 trials at 30 %)."""
    trials: dict[tuple, float] = defaultdict(lambda: 4.0)
    won: dict[tuple, float] = defaultdict(lambda: 1.2)
    for cell, label in zip(cells, labels, strict=True):
        if label >= 0:
            trials[cell] += 1
            won[cell] += label
    return {cell: won[cell] / trials[cell] for cell in trials}


def estimates(steps: list[dict[str, Any]], folds: int = 4) -> dict[str, np.ndarray]:
    """Each token's acceptance estimate (``cells``, ``boosted``), fitted on the other folds'
    prompts."""
    from sklearn.ensemble import HistGradientBoostingClassifier

    keys, cells, features, labels = table(steps)
    x, y = np.array(features, dtype=float), np.array(labels)
    ids = sorted({s["id"] for s in steps})
    fold_of = {rid: i % folds for i, rid in enumerate(ids)}
    fold = np.array([fold_of[steps[k]["id"]] for k, _, _ in keys])
    out = {"cells": np.zeros(len(keys)), "boosted": np.zeros(len(keys))}
    for f in range(folds):
        train, test = (fold != f) & (y >= 0), fold == f
        rates = cell_rates([c for c, t in zip(cells, train, strict=True) if t], y[train])
        out["cells"][test] = [rates.get(c, 0.3) for c, t in zip(cells, test, strict=True) if t]
        model = HistGradientBoostingClassifier(max_iter=200, learning_rate=0.05,
                                               max_leaf_nodes=31, l2_regularization=1.0,
                                               categorical_features=[0], random_state=0)
        model.fit(x[train], y[train])
        out["boosted"][test] = model.predict_proba(x[test])[:, 1]
    per_step: dict[str, dict[tuple, float]] = {}
    for name, values in out.items():
        per_step[name] = dict(zip(keys, values.tolist(), strict=True))
    return per_step  # type: ignore[return-value]


def simulate(steps: list[dict[str, Any]], rates: dict[tuple, float] | None,
             choose: str = "estimate", size: str = "estimate") -> tuple[float, float]:
    """Tokens and priced cost over the steps. Each step drafts the candidate and length that
    promise the most tokens per cost under ``rates`` (``choose`` / ``size`` "oracle": the
    candidate accepted furthest / exactly as far as the chosen one is accepted)."""
    trust = 1.0 / (1.0 + TOKEN_MARGIN_PCT / 100)
    tokens = cost = 0.0
    for k, s in enumerate(steps):
        knee, floor = s["knee"], s["floor"]
        plain = 1.0 / _priced(1, 0, knee, floor)
        best, best_rate = None, plain
        names = list(s["candidates"])
        if choose == "oracle":
            names = [max(names, key=lambda n: s["accepted"][n])] if names else []
        for name in names:
            length = len(s["candidates"][name])
            if size == "oracle":
                n = s["accepted"][name]
                if n:
                    best, best_rate = (name, n), 1.0
                continue
            values = np.cumprod([rates[(k, name, p)] for p in range(length)])  # type: ignore[index]
            rate = (1 + np.cumsum(values) * trust) / draft_costs(length, knee, floor)
            n = int(rate.argmax())
            if rate[n] > best_rate:
                best, best_rate = (name, n + 1), float(rate[n])
        if best is None:
            tokens, cost = tokens + 1, cost + _priced(1, 0, knee, floor)
        else:
            name, n = best
            tokens += 1 + min(s["accepted"][name], n)
            cost += _priced(1, n, knee, floor)
    return tokens, cost


def online(steps: list[dict[str, Any]], halve_at: float, reveal: str = "committed",
           prior: tuple[float, float] = (4.0, 0.3)) -> dict[tuple, float]:
    """Each token's estimate as the product's online cells would give it, the steps taken in
    the order the engine ran them: every candidate counted up to its first miss as far as the
    step's committed tokens reveal (``reveal`` "all": as far as the whole output does), each
    cell halved once its trials pass ``halve_at``. Returns the estimates keyed like
    :func:`estimates` (what each cell held when the step was valued)."""
    trials: dict[tuple, float] = defaultdict(lambda: prior[0])
    won: dict[tuple, float] = defaultdict(lambda: prior[0] * prior[1])
    rates: dict[tuple, float] = {}
    for k, s in enumerate(steps):
        rows = {name: token_rows(s, name)[0] for name in s["candidates"]}
        for name, cells in rows.items():
            for p, cell in enumerate(cells):
                rates[(k, name, p)] = won[cell] / trials[cell]
        # what the engine committed this step: the accepted drafts and one more
        known = s["actual"] + 1 if reveal == "committed" else 1 << 30
        for name, cells in rows.items():
            a = s["accepted"][name]
            for p, cell in enumerate(cells):
                if p >= known or p > a:
                    break
                trials[cell] += 1
                won[cell] += p < a
                if trials[cell] > halve_at:
                    trials[cell] /= 2
                    won[cell] /= 2
    return rates


def analyze(out: Path, models: list[str]) -> dict[str, Any]:
    report: dict[str, Any] = {}
    for model in models:
        steps = steps_of(out, model)
        rates = estimates(steps)
        rates["online 512"] = online(steps, 512.0)
        rates["online 4096"] = online(steps, 4096.0)
        rates["online all 4096"] = online(steps, 4096.0, reveal="all")
        print(f"\n## {model}: {len(steps)} logged steps")
        print("data set | steps | tokens a step: actual / cells / boosted / oracle | tokens per "
              "cost ÷ actual: cells / boosted / oracle choice + boosted length / boosted "
              "choice + exact length / oracle")
        for dataset in sorted({s["dataset"] for s in steps}):
            index = [k for k, s in enumerate(steps) if s["dataset"] == dataset]
            mine = [steps[k] for k in index]
            where = {k: j for j, k in enumerate(index)}
            remap = {name: {(where[k], c, p): v for (k, c, p), v in r.items() if k in where}
                     for name, r in rates.items()}
            actual = (sum(1 + s["actual"] for s in mine),
                      sum(_priced(1, len(s["drafted"]), s["knee"], s["floor"]) for s in mine))
            ref = actual[0] / actual[1]
            runs = {"online 512": simulate(mine, remap["online 512"]),
                    "online 4096": simulate(mine, remap["online 4096"]),
                    "online all 4096": simulate(mine, remap["online all 4096"]),
                    "cells": simulate(mine, remap["cells"]),
                    "boosted": simulate(mine, remap["boosted"]),
                    "oracle choice": simulate(mine, remap["boosted"], choose="oracle"),
                    "exact length": simulate(mine, remap["boosted"], size="oracle"),
                    "oracle": simulate(mine, None, choose="oracle", size="oracle")}
            row = {"steps": len(mine), "actual_tps": actual[0] / len(mine)}
            row.update({f"{n}_tps": t / len(mine) for n, (t, _) in runs.items()})
            row.update({f"{n}_per_cost": t / c / ref for n, (t, c) in runs.items()})
            report[f"{model} {dataset}"] = row
            print(f"{dataset} | {len(mine)} | {row['actual_tps']:.2f} / {row['cells_tps']:.2f}"
                  f" / {row['boosted_tps']:.2f} / {row['oracle_tps']:.2f} | "
                  + " / ".join(f"{n} {row[f'{n}_per_cost']:.3f}" for n in runs))
    (out / "analysis.json").write_text(json.dumps(report, indent=1))
    return report


PRIOR_MIN_TRIALS = 20  # a cell with fewer reached tokens stays at the flat prior


def fit_prior(out: Path, models: list[str], path: Path) -> None:
    """The shipped acceptance prior (vllm_cllm/policies/acceptance_prior.json): every reached
    token of every logged candidate, the models pooled, counted in the product's cells (source,
    position, votes x LEVELS + the lookup's level, the previous draft's outcome; a restart
    block's tokens in the tail's cells, agreeing with nothing, after a miss)."""
    from vllm_cllm.policies.acceptance import LEVELS, MAX_VOTES, MISSED, POSITIONS

    shape = (POSITIONS, (MAX_VOTES + 1) * LEVELS, 3)
    trials: dict[str, np.ndarray] = defaultdict(lambda: np.zeros(shape))
    won: dict[str, np.ndarray] = defaultdict(lambda: np.zeros(shape))
    for model in models:
        for s in steps_of(out, model):
            for name in s["candidates"]:
                a = s["accepted"][name]
                for p, (_, pos, votes, level, outcome) in enumerate(token_rows(s, name)[0]):
                    if p > a:
                        break
                    cell = (pos, votes * LEVELS + level, outcome)
                    if name == "restart":
                        name, cell = "tail", (pos, 0, MISSED)
                    trials[name][cell] += 1
                    won[name][cell] += p < a
    rates = {}
    for name in ("suffix", "ngram", "tail"):
        rate = np.where(trials[name] >= PRIOR_MIN_TRIALS,
                        won[name] / np.maximum(trials[name], 1), np.nan).round(3)
        rates[name] = [[[None if np.isnan(r) else float(r) for r in cell] for cell in position]
                       for position in rate]
        print(f"{name}: {int((trials[name] >= PRIOR_MIN_TRIALS).sum())} of {rate.size} cells, "
              f"{int(trials[name].sum())} tokens")
    path.write_text(json.dumps({
        "about": "acceptance per cell [position][votes * 4 + level][previous outcome], fitted "
                 "by experiments/choice_limit/run.py prior on the demo models' logged steps "
                 f"(models {', '.join(models)}; four data sets, the bench's prompts left out)",
        "rates": rates}, separators=(",", ":")) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=("collect", "analyze", "prior"))
    parser.add_argument("--out", required=True)
    parser.add_argument("--models", nargs="+", default=["cllm", "base"])
    parser.add_argument("--datasets", nargs="+",
                        default=["gsm", "humaneval", "mtbench", "sharegpt"])
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--offset", type=int, default=16)
    args = parser.parse_args()
    if args.what == "collect":
        collect(Path(args.out), args.models, args.datasets, args.prompts, args.max_tokens,
                args.offset)
    elif args.what == "prior":
        fit_prior(Path(args.out), args.models,
                  HERE.parents[1] / "vllm_cllm" / "policies" / "acceptance_prior.json")
    else:
        analyze(Path(args.out), args.models)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
