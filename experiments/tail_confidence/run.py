"""Does the Jacobi tail's confidence tell which of its tokens vLLM accepts?

Runs the default ``jacobi`` at batch 1 with the capture patched to keep, per predicted row,
the target's top-2 logit margin and top-1 probability, and the candidate log on. Afterwards
every candidate's accepted length is known (greedy output is fixed), so each tail token that
was reached (every token before it accepted) is an observation: accepted or not, at its
position, agreeing with the other candidates or not, at its confidence. ``analyze`` prints the
acceptance by confidence and a counterfactual of the adaptive choice over the logged steps:
each step's best candidate and length valued with and without the confidence, priced by the
step's cost model, realized against what was committed.

    .venv/bin/python experiments/tail_confidence/run.py collect --out /tmp/tc
    .venv/bin/python experiments/tail_confidence/run.py analyze --out /tmp/tc
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from vllm_cllm.bench.oracle import _external, _prefix, _priced, read_log
from vllm_cllm.policies.candidate_log import CANDIDATE_LOG_ENV
from vllm_cllm.policies.cost_model import draft_costs

ADAPTIVE = {"method": "jacobi", "num_speculative_tokens": 15}
SIDE: list[Any] = []  # the side log's file, set by patch()


def patch(side_path: str) -> None:
    """Keep margins in the host capture and write each logged tail's confidence to a side log,
    keyed by request id and committed length."""
    import torch

    from vllm_cllm.core.predictions import VerifyPredictions
    from vllm_cllm.policies.candidate_log import CandidateLog

    on_host = VerifyPredictions.on_host.__func__

    def confident_on_host(cls: Any, logits: Any, num_draft_tokens: list[int],
                          req_ids: list[str], num_mask: list[int] | None = None) -> Any:
        out = on_host(cls, logits, num_draft_tokens, req_ids, num_mask)
        if out is not None:
            with torch.no_grad():
                top = torch.topk(logits.float(), 2, dim=-1).values
                out.margin = (top[:, 0] - top[:, 1]).numpy().copy()
                out.prob = (1.0 / torch.exp(logits.float() - top[:, :1]).sum(-1)).numpy().copy()
        return out

    SIDE.append(open(side_path, "a", encoding="utf-8"))  # noqa: SIM115
    if getattr(CandidateLog, "confidence_patched", False):
        return
    VerifyPredictions.on_host = classmethod(confident_on_host)
    record = CandidateLog.record
    CandidateLog.confidence_patched = True

    def logged(self: Any, step: Any, rows: Any, candidates: Any, drafts: Any, *args: Any,
               **kwargs: Any) -> None:
        p = step.predictions
        if p is not None and getattr(p, "margin", None) is not None and p.num_mask is None:
            for j, i in enumerate(rows):
                begin, end = int(p.offsets[i]), int(p.offsets[i + 1])
                start = begin + min(len(step.committed[i]), end - begin)
                n = len(candidates["tail"][j]) if "tail" in candidates else end - start
                SIDE[0].write(json.dumps({
                    "id": step.req_ids[i], "num_tokens": int(step.num_tokens[i]),
                    "margin": p.margin[start:start + n].round(3).tolist(),
                    "prob": p.prob[start:start + n].round(4).tolist()}) + "\n")
            SIDE[0].flush()
        record(self, step, rows, candidates, drafts, *args, **kwargs)

    CandidateLog.record = logged


def collect(out: Path, models: list[str], datasets: list[str], prompts: int,
            max_tokens: int, offset: int) -> None:
    import os

    from transformers import AutoTokenizer

    from vllm_cllm.bench.suite import MODELS, BenchPlan, prompt_sets
    from vllm_cllm.runtime.checkpoints import model_path

    out.mkdir(parents=True, exist_ok=True)
    dirs = {k: str(model_path(v)) for k, v in MODELS.items()}
    plan = BenchPlan(datasets=tuple(datasets), batch_sizes=(1,),
                     prompts_per_batch={1: offset + prompts})
    texts = prompt_sets(plan, AutoTokenizer.from_pretrained(dirs["base"]))
    for model in models:
        log, side = out / f"{model}.candidates.jsonl", out / f"{model}.side.jsonl"
        for path in (log, side):
            path.unlink(missing_ok=True)
        os.environ[CANDIDATE_LOG_ENV] = str(log)
        patch(str(side))
        from vllm import SamplingParams

        from vllm_cllm.runtime.engine import with_engine

        def run(llm: Any, model: str = model) -> list[dict[str, Any]]:
            from tqdm import tqdm

            params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
            rows = []
            for name in datasets:
                for text in tqdm(texts[name][offset:offset + prompts], desc=f"{model} {name}"):
                    done = llm.generate([text], params, use_tqdm=False)[0]
                    rows.append({"dataset": name, "id": done.request_id,
                                 "prompt": list(done.prompt_token_ids),
                                 "tokens": list(done.outputs[0].token_ids)})
            return rows

        rows = with_engine(dirs[model], ADAPTIVE, run)
        (out / f"{model}.outputs.json").write_text(json.dumps(rows))
        SIDE.pop().close()


def observations(out: Path, model: str) -> list[dict[str, Any]]:
    """Per logged request step: dataset, request id (vLLM's and the engine's), output
    position, cost (knee, floor), every candidate's tokens and accepted length, what was
    drafted and accepted, and the tail's confidence."""
    outputs = json.loads((out / f"{model}.outputs.json").read_text())
    requests = {r["id"]: r for r in outputs}
    known = set(requests)
    side = {}
    for line in (out / f"{model}.side.jsonl").read_text().splitlines():
        entry = json.loads(line)
        side[(entry["id"], entry["num_tokens"])] = entry
    steps = []
    for line in read_log(str(out / f"{model}.candidates.jsonl")):
        for request in line["requests"]:
            rid = _external(request["id"], known) if request["id"] else None
            if rid is None:
                continue
            r = requests[rid]
            position = request["num_tokens"] - len(r["prompt"])
            if not 0 < position < len(r["tokens"]):
                continue
            most = len(r["tokens"]) - position - 1
            if most < 1:
                continue
            candidates = {n: c[:most] for n, c in request["candidates"].items() if c}
            confidence = side.get((request["id"], request["num_tokens"]))
            steps.append({
                "dataset": r["dataset"], "id": rid, "engine_id": request["id"],
                "position": position,
                "knee": line["knee"], "floor": line["floor"],
                "candidates": candidates,
                "accepted": {n: _prefix(c, r["tokens"], position, most)
                             for n, c in candidates.items()},
                "drafted": request["drafted"][:most],
                "actual": _prefix(request["drafted"], r["tokens"], position, most),
                "margin": confidence["margin"] if confidence else None,
                "prob": confidence["prob"] if confidence else None})
    return steps


MARGIN_EDGES = (1.0, 2.5, 5.0)  # logit margin buckets: <1, 1-2.5, 2.5-5, >=5
POSITIONS = 5


def token_features(step: dict[str, Any], name: str, confidence: bool) -> list[tuple]:
    """Per token of candidate ``name``: its cell (source, position, votes, margin bucket)."""
    tokens = step["candidates"][name]
    others = [c for n, c in step["candidates"].items() if n != name]
    cells = []
    for p, t in enumerate(tokens):
        votes = min(sum(1 for c in others if len(c) > p and c[p] == t), 2)
        bucket = -1
        if confidence and name == "tail" and step["margin"] and p < len(step["margin"]):
            bucket = int(np.searchsorted(MARGIN_EDGES, step["margin"][p], side="right"))
        cells.append((name, min(p, POSITIONS - 1), votes, bucket))
    return cells


def fit(steps: list[dict[str, Any]], confidence: bool) -> dict[tuple, float]:
    """Acceptance per cell over the reached tokens of every candidate (prior: 4 at 30 %)."""
    trials: dict[tuple, float] = defaultdict(lambda: 4.0)
    won: dict[tuple, float] = defaultdict(lambda: 1.2)
    for step in steps:
        for name in step["candidates"]:
            a = step["accepted"][name]
            for p, cell in enumerate(token_features(step, name, confidence)):
                if p > a:
                    break
                trials[cell] += 1
                won[cell] += p < a
    return {cell: won[cell] / trials[cell] for cell in trials}


def replay(steps: list[dict[str, Any]], rates_of: Any, trust: float,
           choose: str = "estimate", size: str = "estimate") -> tuple[float, float]:
    """Tokens and priced cost over the steps when each step drafts the candidate and length
    that promise the most tokens per cost, each token's rate ``rates_of(k, step, name)`` (per
    position of step ``k``'s candidate ``name``) and its value counted at ``trust`` of it;
    ``choose`` / ``size`` "oracle": the candidate accepted furthest / exactly as far as the
    chosen one is accepted."""
    tokens = cost = 0.0
    for k, step in enumerate(steps):
        knee, floor = step["knee"], step["floor"]
        plain = 1.0 / _priced(1, 0, knee, floor)
        best, best_rate = None, plain
        names = list(step["candidates"])
        if choose == "oracle":
            names = [max(names, key=lambda n: step["accepted"][n])] if names else []
        for name in names:
            if size == "oracle":
                if step["accepted"][name]:
                    best = (name, step["accepted"][name])
                continue
            values = np.cumprod(rates_of(k, step, name))
            rate = (1 + np.cumsum(values) * trust) / draft_costs(len(values), knee, floor)
            n = int(rate.argmax())
            if rate[n] > best_rate:
                best, best_rate = (name, n + 1), float(rate[n])
        if best is None:
            tokens, cost = tokens + 1, cost + _priced(1, 0, knee, floor)
        else:
            name, n = best
            tokens += 1 + min(step["accepted"][name], n)
            cost += _priced(1, n, knee, floor)
    return tokens, cost


def simulate(steps: list[dict[str, Any]], rates: dict[tuple, float], confidence: bool,
             margin: float = 0.1) -> tuple[float, float]:
    """:func:`replay` with each token's rate its cell's in ``rates`` (a value counting
    1/(1+margin))."""
    return replay(steps, lambda k, step, name: [rates.get(c, 0.3) for c in
                                                token_features(step, name, confidence)],
                  1.0 / (1 + margin))


def analyze(out: Path, models: list[str]) -> None:
    for model in models:
        steps = [s for s in observations(out, model) if s["knee"] is not None]
        print(f"\n## {model}: {len(steps)} logged steps")
        tail = [s for s in steps if "tail" in s["candidates"] and s["margin"]]
        # acceptance of reached tail tokens by position and margin bucket
        table: dict[tuple, list[int]] = defaultdict(lambda: [0, 0])
        for s in tail:
            a = s["accepted"]["tail"]
            for p, m in enumerate(s["margin"][:len(s["candidates"]["tail"])]):
                if p > a:
                    break
                cell = table[(min(p, POSITIONS - 1),
                              int(np.searchsorted(MARGIN_EDGES, m, side="right")))]
                cell[0] += 1
                cell[1] += p < a
        print("tail tokens reached: acceptance by position (rows) and margin bucket "
              f"(edges {MARGIN_EDGES})")
        for p in range(POSITIONS):
            print(f"  pos {p}: " + "  ".join(
                f"b{b} {table[(p, b)][1] / table[(p, b)][0]:.2f} (n={table[(p, b)][0]})"
                if table[(p, b)][0] else f"b{b} -" for b in range(len(MARGIN_EDGES) + 1)))
        for dataset in sorted({s["dataset"] for s in steps}):
            mine = [s for s in steps if s["dataset"] == dataset]
            actual_tokens = sum(1 + s["actual"] for s in mine)
            actual_cost = sum(_priced(1, len(s["drafted"]), s["knee"], s["floor"])
                              for s in mine)
            base = simulate(mine, fit(mine, False), False)
            conf = simulate(mine, fit(mine, True), True)
            oracle_tokens = sum(1 + max(s["accepted"].values(), default=0) for s in mine)
            oracle_cost = sum(_priced(1, max(s["accepted"].values(), default=0), s["knee"],
                                      s["floor"]) for s in mine)
            ref = actual_tokens / actual_cost
            print(f"  {dataset}: steps {len(mine)}; tokens/step actual "
                  f"{actual_tokens / len(mine):.2f}, cells {base[0] / len(mine):.2f}, "
                  f"cells+confidence {conf[0] / len(mine):.2f}"
                  f", oracle {oracle_tokens / len(mine):.2f}; tokens per cost vs actual: "
                  f"cells {base[0] / base[1] / ref:.3f}, +confidence {conf[0] / conf[1] / ref:.3f}"
                  f", oracle {oracle_tokens / oracle_cost / ref:.3f}")


def cli(doc: str, collect: Any, analyze: Any, prompts: int, offset: int) -> int:
    """``collect`` or ``analyze`` as the command line asks (this study's and choice_limit's)."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("what", choices=("collect", "analyze"))
    parser.add_argument("--out", required=True)
    parser.add_argument("--models", nargs="+", default=["cllm", "base"])
    parser.add_argument("--datasets", nargs="+",
                        default=["gsm", "humaneval", "mtbench", "sharegpt"])
    parser.add_argument("--prompts", type=int, default=prompts)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--offset", type=int, default=offset)
    args = parser.parse_args()
    if args.what == "collect":
        collect(Path(args.out), args.models, args.datasets, args.prompts, args.max_tokens,
                args.offset)
    else:
        analyze(Path(args.out), args.models)
    return 0


if __name__ == "__main__":
    raise SystemExit(cli(__doc__, collect, analyze, prompts=12, offset=64))
