"""Does the default's choice among its candidates lose to vLLM ``suffix``'s rule at batch 4?

``collect`` runs the default ``jacobi`` at batch 4 (the bench's engine pool, 3 rounds of 8
prompts after the bench's first 64) and keeps its candidate log beside each round's outputs.
``analyze`` replays every logged step under the step's own cost model (as the bench's oracle
prices it: :func:`vllm_cllm.bench.oracle._priced`, every candidate's accepted length known from
the output) with other rules: the lookup candidate drafted whole (what vLLM ``suffix`` does with
the same tree lookup), the default but the lookup drafted whole where it drafted nothing, the
default with its n-gram drafts cut to 0–6 tokens, and the oracle. Per rule: tokens per priced
step cost over the default's; per source the default drafted from: drafts, tokens a draft,
accepted per token, accepted over expected.

    .venv/bin/python experiments/choice_replay_b4/run.py collect --dataset sharegpt --out DIR
    .venv/bin/python experiments/choice_replay_b4/run.py collect --dataset gsm --out DIR
    .venv/bin/python experiments/choice_replay_b4/run.py analyze --out DIR
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from collections import defaultdict
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
#: The n-gram drafts' caps replayed.
CAPS = (0, 1, 2, 3, 4, 6)


def keep_logs(out: str, tag: str) -> None:
    """In the engine's worker: each row's candidate log and outputs written to ``out``."""
    from vllm_cllm.bench import measure, oracle

    counter = itertools.count()
    original = measure.oracle_of_log

    def kept(path: str, start: int, ids: Any, prompts: Any, tokens: Any, steps: Any) -> Any:
        with open(Path(out) / f"{tag}_{next(counter)}.json", "w") as file:
            json.dump({"records": oracle.read_log(path, start), "ids": list(ids),
                       "prompt_tokens": [list(map(int, p)) for p in prompts],
                       "tokens": [list(map(int, t)) for t in tokens]}, file)
        return original(path, start, ids, prompts, tokens, steps)

    measure.oracle_of_log = kept


def collect(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from interleaved import ADAPTIVE, measure_rounds

    name, tag = f"{args.model} jacobi adaptive k=15", f"{args.model}_{args.dataset}_b4"
    Path(args.out).mkdir(parents=True, exist_ok=True)
    measure_rounds({name: (args.model, ADAPTIVE)}, {name: partial(keep_logs, args.out, tag)},
                   args.dataset, 4, 8, args.rounds, 64, 128)


def analyze(args: argparse.Namespace) -> None:
    from vllm_cllm.bench.oracle import _external, _prefix, _priced

    rules = ("default", "lookup whole", "default, else lookup whole", "oracle",
             *(f"n-gram drafts cut to {c}" for c in CAPS))
    report = {}
    for tag in sorted({p.stem.rsplit("_", 1)[0] for p in Path(args.out).glob("*_b4_*.json")}):
        tokens, cost = defaultdict(float), defaultdict(float)
        sources: dict[str, list[float]] = defaultdict(lambda: [0, 0, 0.0, 0])
        for path in sorted(Path(args.out).glob(f"{tag}_*.json")):
            data = json.loads(path.read_text())
            requests = {rid: (len(p), t) for rid, p, t in
                        zip(data["ids"], data["prompt_tokens"], data["tokens"], strict=True)}
            known = set(requests)
            steps = defaultdict(list)
            for line in data["records"]:
                steps[line["step"]].extend((line, r) for r in line["requests"])
            for pairs in steps.values():
                line = pairs[0][0]
                if line["knee"] is None:
                    continue
                gained = defaultdict(int)  # per rule: tokens accepted, tokens drafted
                drafted = defaultdict(int)
                for _, request in pairs:
                    rid = _external(request["id"], known)
                    if rid is None:
                        continue
                    prompt, output = requests[rid]
                    position = request["num_tokens"] - prompt
                    if not 0 < position < len(output):
                        continue
                    most = len(output) - position - 1
                    candidates = request["candidates"]
                    accepted = {k: _prefix(v, output, position, most)
                                for k, v in candidates.items()}
                    draft = request["drafted"]
                    lookup = candidates.get("suffix", [])
                    own = _prefix(draft, output, position, most)
                    from_ngram = bool(draft) and lookup[:len(draft)] != draft \
                        and candidates.get("ngram", [])[:len(draft)] == draft
                    chosen = {"default": (own, len(draft)),
                              "lookup whole": (accepted.get("suffix", 0), len(lookup)),
                              "default, else lookup whole": (own, len(draft)) if draft
                              else (accepted.get("suffix", 0), len(lookup))}
                    best = max(accepted.values(), default=0)
                    chosen["oracle"] = (best, best)
                    for c in CAPS:
                        cut = draft[:c] if from_ngram else draft
                        chosen[f"n-gram drafts cut to {c}"] = (
                            _prefix(cut, output, position, most), len(cut))
                    for rule, (a, n) in chosen.items():
                        gained[rule] += a
                        drafted[rule] += n
                    if draft:
                        name = next((k for k, v in candidates.items()
                                     if v[:len(draft)] == draft), "restart")
                        row = sources[name]
                        row[0] += 1
                        row[1] += len(draft)
                        row[2] += request.get("expected") or 0.0
                        row[3] += own
                if not gained:
                    continue
                batch, knee, floor = line["batch"], line["knee"], line["floor"]
                for rule in rules:
                    tokens[rule] += batch + gained[rule]
                    cost[rule] += _priced(batch, drafted[rule], knee, floor)
        default = tokens["default"] / cost["default"]
        report[tag] = {
            "tokens_per_cost_vs_default": {r: tokens[r] / cost[r] / default for r in rules},
            "drafted_from": {k: {"drafts": d, "tokens_a_draft": n / d, "accepted_a_token": a / n,
                                 "accepted_over_expected": a / e if e else None}
                             for k, (d, n, e, a) in sorted(sources.items())}}
        print(f"{tag}:")
        for rule, ratio in report[tag]["tokens_per_cost_vs_default"].items():
            print(f"  {rule:28s} {ratio:.3f}")
        for k, row in report[tag]["drafted_from"].items():
            print(f"  drafted from {k}: {row}")
    (Path(args.out) / "analysis.json").write_text(json.dumps(report, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=("collect", "analyze"))
    parser.add_argument("--out", required=True)
    parser.add_argument("--model", default="base", choices=("base", "cllm"))
    parser.add_argument("--dataset", default="sharegpt")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    collect(args) if args.what == "collect" else analyze(args)


if __name__ == "__main__":
    main()
