"""How much of the oracle's lead can a choice made at draft time recover?

``collect`` logs the default ``jacobi`` at batch 1 (the candidate log, the Jacobi tail's logit
margins, each suffix lookup's match length and token probabilities); ``analyze`` replays every
logged step with each candidate token's acceptance estimated several ways (the product's online
cells, the same cells converged, gradient-boosted trees over everything logged, a fitted prior),
each step drafting the candidate and length that promise the most tokens per priced cost,
realized against what was committed (README.md). ``analyze`` needs scikit-learn.

    .venv/bin/python experiments/choice_limit/run.py collect --out /tmp/cl   # ~15 min
    .venv/bin/python experiments/choice_limit/run.py analyze --out /tmp/cl
"""

from __future__ import annotations

import importlib.util
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from vllm_cllm.bench.oracle import _priced
from vllm_cllm.policies.acceptance import (
    HIT,
    LEVELS,
    MAX_VOTES,
    MISSED,
    POSITIONS,
    PRIOR_RATE,
    PRIOR_TRIALS,
    UNDRAFTED,
    TokenAcceptance,
)
from vllm_cllm.policies.cost_model import TOKEN_MARGIN_PCT
from vllm_cllm.sources.suffix_trees import backed_tokens, match_level

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


def steps_of(out: Path, model: str) -> list[dict[str, Any]]:
    """The logged steps (tail_confidence's reader) with the lookup's match and probabilities,
    the request's output and its previous draft (its length and accepted count) attached."""
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
        s["output"] = outputs[s["id"]]["tokens"]
        s["previous"] = last.get(s["id"])
        s["so_far"] = tuple(seen[s["id"]])
        last[s["id"]] = (len(s["drafted"]), s["actual"])
        seen[s["id"]][0] += len(s["drafted"])
        seen[s["id"]][1] += s["actual"]
    return steps


def token_rows(s: dict[str, Any], name: str) -> tuple[list[tuple], list[list[float]]]:
    """Per token of candidate ``name`` in step ``s``: its cell (the product's: source,
    position, votes, the lookup's level where its match backs the token, the previous draft's
    outcome) and its feature vector."""
    tokens = s["candidates"][name]
    others = [c for n, c in s["candidates"].items() if n != name]
    prev = s["previous"]
    outcome = UNDRAFTED if prev is None or prev[0] == 0 else HIT if prev[1] > 0 else MISSED
    level = backed = 0
    probs: list[float] = []
    if name == "suffix":
        probs = s["suffix_probs"]
        level, backed = match_level(s["match_len"]), backed_tokens(probs)
    margin = s["margin"] if name == "tail" and s["margin"] else []
    drafted, accepted = s["so_far"]
    cells, features = [], []
    low = MAX_VOTES
    for p, t in enumerate(tokens):
        votes = min(sum(1 for c in others if len(c) > p and c[p] == t), MAX_VOTES)
        low = min(low, votes)
        cells.append((name, min(p, POSITIONS - 1), votes, level if p < backed else 0, outcome))
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
    """Acceptance per cell over the reached tokens, from the product's prior."""
    trials: dict[tuple, float] = defaultdict(lambda: PRIOR_TRIALS)
    won: dict[tuple, float] = defaultdict(lambda: PRIOR_TRIALS * PRIOR_RATE)
    for cell, label in zip(cells, labels, strict=True):
        if label >= 0:
            trials[cell] += 1
            won[cell] += label
    return {cell: won[cell] / trials[cell] for cell in trials}


def estimates(steps: list[dict[str, Any]], folds: int = 4) -> dict[str, dict[tuple, float]]:
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
        out["cells"][test] = [rates.get(c, PRIOR_RATE)
                              for c, t in zip(cells, test, strict=True) if t]
        model = HistGradientBoostingClassifier(max_iter=200, learning_rate=0.05,
                                               max_leaf_nodes=31, l2_regularization=1.0,
                                               categorical_features=[0], random_state=0)
        model.fit(x[train], y[train])
        out["boosted"][test] = model.predict_proba(x[test])[:, 1]
    return {name: dict(zip(keys, values.tolist(), strict=True)) for name, values in out.items()}


def simulate(steps: list[dict[str, Any]], index: list[int], rates: dict[tuple, float] | None,
             choose: str = "estimate", size: str = "estimate") -> tuple[float, float]:
    """Tokens and priced cost over ``steps`` (tail_confidence's replay) with each token's
    estimate in ``rates`` (keyed by step index, candidate, position; ``index[k]``: step
    ``k``'s index there), a value counted at 1 / 1.3 as the product does."""
    return tail_confidence.replay(
        steps, lambda k, step, name: [rates[(index[k], name, p)]  # type: ignore[index]
                                      for p in range(len(step["candidates"][name]))],
        1.0 / (1.0 + TOKEN_MARGIN_PCT / 100), choose, size)


def online(steps: list[dict[str, Any]], reveal: str = "committed",
           prior: dict[tuple, float] | None = None, weight: float = 16.0
           ) -> dict[tuple, float]:
    """Each token's estimate as the product's online table gives it
    (:class:`~vllm_cllm.policies.acceptance.TokenAcceptance`, its cells from
    :func:`token_rows`), the steps taken in the order the engine ran them: each step valued
    from the table as it stands, then counted as far as the step's committed tokens reveal
    (``reveal`` "all": as far as the whole output does); a cell starts at the product's prior,
    or at ``weight`` trials at its ``prior`` rate where that has one. Returns the estimates
    keyed like :func:`estimates`."""
    names = tuple(sorted({name for s in steps for name in s["candidates"]}))
    table = TokenAcceptance(names)

    def index(cell: tuple) -> tuple[int, int, int, int]:
        name, position, votes, level, outcome = cell
        return names.index(name), position, votes * LEVELS + level, outcome

    for cell, rate in (prior or {}).items():
        if cell[0] in names:
            table.trials[index(cell)], table.accepted[index(cell)] = weight, weight * rate
    rates: dict[tuple, float] = {}
    for k, s in enumerate(steps):
        current = table.accepted / table.trials
        candidates, cells = {}, {}
        for name, tokens in s["candidates"].items():
            where = [index(cell) for cell in token_rows(s, name)[0]]
            rates.update({(k, name, p): float(current[i]) for p, i in enumerate(where)})
            row, position, votes, outcome = np.array(where).T
            candidates[name] = np.asarray(tokens, dtype=np.int64)
            cells[name] = (int(row[0]), position, votes, int(outcome[0]))
        end = s["position"] + s["actual"] + 1 if reveal == "committed" else None
        table.observe(candidates, cells, s["output"][s["position"]:end])
    return rates


def per_dataset(steps: list[dict[str, Any]], runs: dict[str, tuple[str, str,
                dict[tuple, float] | None]]) -> dict[str, dict[str, float]]:
    """Per data set: tokens a step and tokens per cost ÷ the logged drafts' of each run
    (name: choose, size, estimates), and the logged drafts' own tokens a step."""
    report = {}
    for dataset in sorted({s["dataset"] for s in steps}):
        index = [k for k, s in enumerate(steps) if s["dataset"] == dataset]
        mine = [steps[k] for k in index]
        actual = (sum(1 + s["actual"] for s in mine),
                  sum(_priced(1, len(s["drafted"]), s["knee"], s["floor"]) for s in mine))
        row = {"steps": len(mine), "actual_tps": actual[0] / len(mine)}
        for name, (choose, size, rates) in runs.items():
            t, c = simulate(mine, index, rates, choose, size)
            row[f"{name}_tps"] = t / len(mine)
            row[f"{name}_per_cost"] = t / c / (actual[0] / actual[1])
        report[dataset] = row
    return report


def show(title: str, report: dict[str, dict[str, float]]) -> None:
    names = [k[:-len("_per_cost")] for k in next(iter(report.values())) if
             k.endswith("_per_cost")]
    print(f"\n{title}\n\n| data set | steps | logged tokens a step | "
          + " | ".join(names) + " |\n" + "|---" * (3 + len(names)) + "|")
    for dataset, row in report.items():
        print(f"| {dataset} | {row['steps']} | {row['actual_tps']:.2f} | " + " | ".join(
            f"{row[f'{n}_per_cost']:.3f} ({row[f'{n}_tps']:.2f})" for n in names) + " |")


def analyze(out: Path, models: list[str]) -> dict[str, Any]:
    """Tokens per cost ÷ the logged drafts' (tokens a step in brackets): the online cells
    replayed (the product's estimates: checks the replay), the same with every outcome
    revealed, the converged cells and the boosted trees (4 folds), the oracle's choice with the
    trees' length, the trees' choice at the exact length, the oracle; then, on half of the
    prompts, the online cells from a flat prior against a prior fitted on the other half's
    prompts of all models."""
    report: dict[str, Any] = {}
    everything = {model: steps_of(out, model) for model in models}
    halves = {}
    for model, steps in everything.items():
        ids = sorted({s["id"] for s in steps})
        halves[model] = {rid: i % 2 for i, rid in enumerate(ids)}
    fitted = [s for m, steps in everything.items() for s in steps if halves[m][s["id"]] == 0]
    _, cells, _, labels = table(fitted)
    prior = cell_rates(cells, np.array(labels))
    for model, steps in everything.items():
        rates = estimates(steps)
        runs = {"replayed": ("estimate", "estimate", online(steps)),
                "all revealed": ("estimate", "estimate", online(steps, reveal="all")),
                "converged cells": ("estimate", "estimate", rates["cells"]),
                "boosted": ("estimate", "estimate", rates["boosted"]),
                "oracle choice": ("oracle", "estimate", rates["boosted"]),
                "exact length": ("estimate", "oracle", rates["boosted"]),
                "oracle": ("oracle", "oracle", None)}
        report[model] = per_dataset(steps, runs)
        show(f"## {model}: {len(steps)} logged steps", report[model])
        held = [s for s in steps if halves[model][s["id"]] == 1]
        runs = {"flat prior": ("estimate", "estimate", online(held)),
                "fitted prior": ("estimate", "estimate", online(held, prior=prior))}
        report[f"{model} prior"] = per_dataset(held, runs)
        show(f"## {model}, half of the prompts: a flat prior or one fitted on the other half",
             report[f"{model} prior"])
    (out / "analysis.json").write_text(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    raise SystemExit(tail_confidence.cli(__doc__, collect, analyze, prompts=32, offset=16))
