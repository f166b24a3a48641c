"""Server soak: thousands of mixed requests against the documented ``vllm serve`` with ``jacobi``.

One server (loopback only), one run bounded in count (``--requests``) and time
(``--max-minutes``):
1. ``vllm serve <demo CLLM> --speculative-config '{"method": "jacobi", ...}'`` (jemalloc
   preloaded, as docs/platform-cpu.md advises; ``--allocator glibc`` for glibc's), with
   ``VLLM_CLLM_LOG_STATE=1`` so that the proposer reports how many requests it holds state for;
2. ``--requests`` requests from a thread pool of ``--concurrency``, in a seeded random order
   mixing plain and streamed ``/v1/completions`` and ``/v1/chat/completions``, greedy and
   sampled (``n`` > 1 on some), stop strings, ``max_tokens`` 1, client aborts mid-stream (the
   connection closed after a few chunks) and a few malformed requests (bad JSON, an unknown
   model, a prompt longer than the context) that must each be answered with a 4xx;
   every answer that should succeed is checked (status, every choice present and finished,
   stop strings absent from the text, token counts within ``max_tokens``);
3. the RSS of the server's process tree every ``--rss-every`` requests completed;
4. idle at the end: ``/health``, the proposer's state count, vLLM's spec-decode counters.

Writes ``soak.json`` (summary and RSS samples), ``requests.jsonl`` (one line per request),
``table.md``, ``rss.png`` and ``server.log`` to ``--out``. Exits non-zero if a request that
should succeed failed, a malformed one was not refused with a 4xx, the server was unhealthy
after, or the proposer still held state.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests
from tqdm import tqdm

from vllm_cllm.bench.datasets import CHAT_QUESTIONS, chat_template, sharegpt_questions
from vllm_cllm.options import parse_options
from vllm_cllm.runtime.checkpoints import model_path
from vllm_cllm.runtime.demo import DEMO_MODEL, demo_problems, user_message
from vllm_cllm.runtime.server import (
    add_allocator_option,
    allocator_env_of,
    hang_up_midstream,
    held_state,
    metric_total,
    per_process_mib,
    read_metrics,
    tree_rss_mib,
    watched_server,
)

#: the server's context (vllm_cllm.runtime.server.serve_command's --max-model-len)
CONTEXT = 2048
STOPS = ["\n\n", ".", "Answer:", " the", "\n", "?"]
MALFORMED = ["bad-json", "unknown-model", "too-long"]
TIMEOUT_S = 300


@dataclass
class Spec:
    """One request of the soak: where it goes, what it sends, and what must come back."""

    index: int
    kind: str  # completion, completion-stream, chat, chat-stream, abort, or a MALFORMED one
    path: str  # /v1/completions or /v1/chat/completions
    body: dict | None = None
    raw: str | None = None  # sent as the body instead of ``body`` (bad JSON)
    features: list[str] = field(default_factory=list)  # n>1, stop, max_tokens=1, sampled, ...

    @property
    def expect(self) -> str:
        return "4xx" if self.kind in MALFORMED else ("cut" if self.kind == "abort" else "ok")


def build_specs(count: int, completion_prompts: list[str], chat_messages: list[str],
                seed: int, malformed_every: int, abort_share: float) -> list[Spec]:
    """``count`` requests in a seeded order. ``completion_prompts``: texts for
    /v1/completions (chat-templated and raw); ``chat_messages``: user messages for
    /v1/chat/completions. Every ``malformed_every``-th request is a malformed one, in turn
    bad JSON, an unknown model and a prompt longer than the context, on either endpoint."""
    rng = random.Random(seed)
    specs: list[Spec] = []
    malformed_seen = 0
    for i in range(count):
        chat = rng.random() < 0.5
        path = "/v1/chat/completions" if chat else "/v1/completions"

        def payload(text: str, chat: bool = chat) -> dict:
            return ({"messages": [{"role": "user", "content": text}]} if chat
                    else {"prompt": text})

        text = rng.choice(chat_messages if chat else completion_prompts)
        if malformed_every and i % malformed_every == malformed_every // 2:
            kind = MALFORMED[malformed_seen % len(MALFORMED)]
            malformed_seen += 1
            spec = Spec(i, kind, path)
            if kind == "bad-json":
                spec.raw = json.dumps({"model": "model", **payload(text)})[:-7]  # cut short
            elif kind == "unknown-model":
                spec.body = {"model": "no-such-model", **payload(text), "max_tokens": 8}
            else:  # ~3 tokens a repetition: well past the context
                spec.body = {"model": "model", **payload("once upon a time " * CONTEXT),
                             "max_tokens": 8}
            specs.append(spec)
            continue
        if rng.random() < abort_share:
            specs.append(Spec(i, "abort", path, {
                "model": "model", **payload(text), "max_tokens": 200, "ignore_eos": True,
                "temperature": 0.0}, features=["greedy"]))
            continue
        stream = rng.random() < 0.5
        body: dict[str, Any] = {"model": "model", **payload(text)}
        features: list[str] = []
        if rng.random() < 0.12:
            body["max_tokens"] = 1
            features.append("max_tokens=1")
        else:  # mostly short: 5,000 requests in about 20 minutes on 2 CPU cores
            body["max_tokens"] = rng.randint(2, 16) if rng.random() < 0.6 else rng.randint(17, 48)
        if rng.random() < 0.3:  # sampled (vLLM refuses n > 1 when greedy)
            body.update(temperature=0.8, top_p=0.95, seed=rng.randrange(2**31))
            features.append("sampled")
            if rng.random() < 0.4:
                body["n"] = rng.choice([2, 3])
                features.append("n>1")
        else:
            body["temperature"] = 0.0
            features.append("greedy")
        if rng.random() < 0.2:
            body["stop"] = rng.sample(STOPS, rng.choice([1, 2]))
            features.append("stop")
        if stream and rng.random() < 0.5:
            body["stream_options"] = {"include_usage": True}
            features.append("usage")
        if stream:
            body["stream"] = True
        specs.append(Spec(i, ("chat" if chat else "completion") + ("-stream" if stream else ""),
                          path, body, features=features))
    return specs


def check_choices(spec: Spec, texts: dict[int, str], finishes: dict[int, str | None],
                  completion_tokens: int | None) -> str | None:
    """What is wrong with the answer's choices, or None."""
    body = spec.body or {}
    n, max_tokens = body.get("n", 1), body["max_tokens"]
    if sorted(texts) != list(range(n)):
        return f"choices {sorted(texts)}, expected {n}"
    unfinished = [i for i in range(n) if finishes.get(i) not in ("stop", "length")]
    if unfinished:
        return f"choices {unfinished} without finish_reason stop/length: {finishes}"
    for stop in body.get("stop", []):
        if any(stop in t for t in texts.values()):
            return f"stop string {stop!r} in the text"
    if completion_tokens is not None and not n <= completion_tokens <= n * max_tokens:
        return f"{completion_tokens} completion tokens for n={n}, max_tokens={max_tokens}"
    return None


def choice_text(choice: dict, chat: bool, stream: bool) -> str:
    if not chat:
        return choice.get("text") or ""
    return (choice.get("delta" if stream else "message") or {}).get("content") or ""


def send(base: str, spec: Spec, abort_chunks: int) -> dict:
    """Send one request; returns its record (``ok``: it came back as it should)."""
    url = base + spec.path
    start = time.perf_counter()
    record: dict[str, Any] = {"index": spec.index, "kind": spec.kind,
                              "features": spec.features, "ok": False}
    chat = spec.path.endswith("chat/completions")
    try:
        if spec.kind == "abort":
            record["ok"] = hang_up_midstream(url, spec.body or {}, abort_chunks, TIMEOUT_S)
            record["status"] = 200
            if not record["ok"]:
                record["error"] = "the stream ended before the client hung up"
        elif spec.expect == "4xx":
            resp = (requests.post(url, data=spec.raw, timeout=TIMEOUT_S,
                                  headers={"Content-Type": "application/json"})
                    if spec.raw is not None else
                    requests.post(url, json=spec.body, timeout=TIMEOUT_S))
            record["status"] = resp.status_code
            record["ok"] = 400 <= resp.status_code < 500
            record["message"] = resp.text[:200]
        elif spec.body and spec.body.get("stream"):
            with requests.post(url, json=spec.body, stream=True, timeout=TIMEOUT_S) as resp:
                record["status"] = resp.status_code
                resp.raise_for_status()
                texts: dict[int, str] = defaultdict(str)
                finishes: dict[int, str | None] = {}
                usage, done = None, False
                for line in resp.iter_lines(decode_unicode=True):
                    if not line or not line.startswith("data: "):
                        continue
                    data = line[len("data: "):]
                    if data == "[DONE]":
                        done = True
                        break
                    chunk = json.loads(data)
                    if "error" in chunk:
                        raise RuntimeError(f"error in the stream: {chunk['error']}")
                    usage = chunk.get("usage") or usage
                    for choice in chunk.get("choices", []):
                        texts[choice["index"]] += choice_text(choice, chat, True)
                        if choice.get("finish_reason"):
                            finishes[choice["index"]] = choice["finish_reason"]
                problem = "no [DONE] at the end of the stream" if not done else None
                if "usage" in spec.features and usage is None:
                    problem = "no usage chunk"
                problem = problem or check_choices(
                    spec, dict(texts), finishes, usage and usage.get("completion_tokens"))
                record["ok"], record["error"] = problem is None, problem
                record["completion_tokens"] = usage and usage.get("completion_tokens")
        else:
            resp = requests.post(url, json=spec.body, timeout=TIMEOUT_S)
            record["status"] = resp.status_code
            resp.raise_for_status()
            answer = resp.json()
            choices = answer.get("choices", [])
            tokens = (answer.get("usage") or {}).get("completion_tokens")
            problem = check_choices(spec, {c["index"]: choice_text(c, chat, False)
                                           for c in choices},
                                    {c["index"]: c.get("finish_reason") for c in choices},
                                    tokens)
            record["ok"], record["error"] = problem is None, problem
            record["completion_tokens"] = tokens
    except Exception as exc:  # noqa: BLE001 - every failure is counted, none stops the soak
        record["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    record["seconds"] = round(time.perf_counter() - start, 4)
    if record.get("error") is None:
        record.pop("error", None)
    return record


def run_soak(base: str, pid: int, specs: list[Spec], concurrency: int, rss_every: int,
             deadline: float, abort_chunks: int) -> tuple[list[dict], list[dict]]:
    """Send ``specs`` from ``concurrency`` threads; returns the per-request records (in order
    of completion) and the RSS samples. Requests not started by ``deadline`` are skipped."""
    t0 = time.time()
    samples = [{"completed": 0, "seconds": 0.0, "rss_mib": tree_rss_mib(pid)}]

    def one(spec: Spec) -> dict:
        if time.time() > deadline:
            return {"index": spec.index, "kind": spec.kind, "features": spec.features,
                    "ok": False, "skipped": True}
        return send(base, spec, abort_chunks)

    records: list[dict] = []
    failed = 0
    with ThreadPoolExecutor(concurrency) as pool, tqdm(total=len(specs), desc="soak",
                                                        mininterval=5) as bar:
        for future in as_completed([pool.submit(one, s) for s in specs]):
            record = future.result()
            records.append(record)
            failed += not record["ok"] and not record.get("skipped")
            if len(records) % rss_every == 0 or len(records) == len(specs):
                samples.append({"completed": len(records),
                                "seconds": round(time.time() - t0, 1),
                                "rss_mib": round(tree_rss_mib(pid), 1)})
                bar.set_postfix(failed=failed, rss_mib=f"{samples[-1]['rss_mib']:.0f}")
            bar.update()
    return records, samples


def rss_verdict(samples: list[dict], tolerance: float) -> dict:
    """RSS growth over the first and second halves of the run (by requests completed), and a
    least-squares slope over the second half."""
    total = samples[-1]["completed"]
    half = min(samples, key=lambda s: abs(s["completed"] - total / 2))
    first = samples[1] if len(samples) > 1 else samples[0]  # the first sample under load
    second = [s for s in samples if s["completed"] >= half["completed"]]
    xs = [s["completed"] for s in second]
    ys = [s["rss_mib"] for s in second]
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mean_x) ** 2 for x in xs)
    slope = (sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / var
             if var else 0.0)
    growth = samples[-1]["rss_mib"] / half["rss_mib"] - 1
    return {"rss_start_mib": samples[0]["rss_mib"], "rss_first_sample_mib": first["rss_mib"],
            "rss_half_mib": half["rss_mib"], "half_at": half["completed"],
            "rss_end_mib": samples[-1]["rss_mib"],
            "rss_second_half_max_mib": max(ys), "rss_second_half_min_mib": min(ys),
            "first_half_growth": half["rss_mib"] / first["rss_mib"] - 1,
            "second_half_growth": growth,
            "second_half_max_growth": max(ys) / half["rss_mib"] - 1,
            "second_half_slope_mib_per_1000": 1000 * slope,
            "tolerance": tolerance, "flat": growth <= tolerance}


def summarize(specs: list[Spec], records: list[dict]) -> dict:
    by_kind: dict[str, Counter] = defaultdict(Counter)
    by_feature: dict[str, Counter] = defaultdict(Counter)
    seconds: dict[str, list[float]] = defaultdict(list)
    for r in records:
        outcome = "skipped" if r.get("skipped") else ("ok" if r["ok"] else "failed")
        by_kind[r["kind"]][outcome] += 1
        if outcome != "skipped":
            seconds[r["kind"]].append(r["seconds"])
        for feature in r["features"]:
            by_feature[feature][outcome] += 1
    statuses: dict[str, Counter] = defaultdict(Counter)
    messages: dict[str, str] = {}
    for r in records:
        if r["kind"] in MALFORMED and "status" in r:
            statuses[r["kind"]][str(r["status"])] += 1
            messages.setdefault(r["kind"], r.get("message", ""))

    def latency(kind: str) -> dict:
        xs = sorted(seconds[kind])
        return {"mean_s": sum(xs) / len(xs), "p99_s": xs[min(len(xs) - 1, int(0.99 * len(xs)))]
                } if xs else {}

    return {"by_kind": {k: {**dict(v), **latency(k)} for k, v in sorted(by_kind.items())},
            "by_feature": {k: dict(v) for k, v in sorted(by_feature.items())},
            "malformed_status": {k: dict(v) for k, v in statuses.items()},
            "malformed_message": messages,
            "failures": [r for r in records if not r["ok"] and not r.get("skipped")][:50],
            "requests": len(specs),
            "completed": sum(1 for r in records if not r.get("skipped")),
            "failed": sum(1 for r in records if not r["ok"] and not r.get("skipped")),
            "greedy_outputs": sum(1 for r in records if "greedy" in r["features"]
                                  and r["ok"] and r["kind"] != "abort")}


def plot(samples: list[dict], verdict: dict, title: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    ax.plot([s["completed"] for s in samples], [s["rss_mib"] for s in samples], marker=".")
    ax.axvline(verdict["half_at"], color="grey", linestyle="--", linewidth=1)
    ax.annotate(f"second half {100 * verdict['second_half_growth']:+.2f} %",
                (verdict["half_at"], verdict["rss_half_mib"]), textcoords="offset points",
                xytext=(8, -14), fontsize=9)
    ax.set_xlabel("requests completed")
    ax.set_ylabel("RSS of the server's process tree (MiB)")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def rss_line(v: dict) -> str:
    pct = {k: f"{100 * v[k]:+.2f} %" for k in ("first_half_growth", "second_half_growth",
                                               "second_half_max_growth")}
    verdict = "flat" if v["flat"] else "NOT flat"
    return (f"{v['rss_start_mib']:.0f} MiB idle at start, {v['rss_first_sample_mib']:.0f} at "
            f"the first sample under load, {v['rss_half_mib']:.0f} at {v['half_at']} requests, "
            f"{v['rss_end_mib']:.0f} at the end; first half {pct['first_half_growth']}, second "
            f"half {pct['second_half_growth']} (max {pct['second_half_max_growth']}, slope "
            f"{v['second_half_slope_mib_per_1000']:+.1f} MiB per 1000 requests): {verdict} "
            f"(tolerance {100 * v['tolerance']:.0f} %)")


def report(results: dict) -> str:
    s, v = results["summary"], results["rss"]
    lines = [f"vllm serve {results['model']} + jacobi ({results['speculative_config']}), "
             f"{results['date']}: {s['requests']} requests, concurrency "
             f"{results['concurrency']}, {results['minutes']:.1f} min", "",
             "| kind | requests | succeeded as expected | failed | mean s | p99 s |",
             "|---|---|---|---|---|---|"]
    for kind, c in s["by_kind"].items():
        n = c.get("ok", 0) + c.get("failed", 0) + c.get("skipped", 0)
        mean = f"{c['mean_s']:.2f}" if "mean_s" in c else "–"
        p99 = f"{c['p99_s']:.2f}" if "p99_s" in c else "–"
        lines.append(f"| {kind} | {n} | {c.get('ok', 0)} | {c.get('failed', 0)} | {mean} | "
                     f"{p99} |")
    lines.append(f"| **all** | {s['requests']} | {s['completed'] - s['failed']} | "
                 f"{s['failed']} | | |")
    feats = ", ".join(f"{k} {c.get('ok', 0)}/{sum(c.values())}"
                      for k, c in s["by_feature"].items())
    codes = "; ".join(f"{k}: " + ", ".join(f"{n}× {code}" for code, n in c.items())
                      for k, c in s["malformed_status"].items())
    lines += ["", f"* by feature (succeeded / sent): {feats}",
              f"* malformed requests' status codes: {codes}",
              f"* RSS of the server's tree: {rss_line(v)}; idle after the run "
              f"{results['rss_idle_mib']:.0f} MiB",
              f"* greedy outputs (the {results['lookup']} lookup keeps the last "
              f"{results['history_size']}): "
              f"{s['greedy_outputs']} in the run",
              f"* health after the run: {results['health_after']}; requests running at the end: "
              f"{results['running_at_end']:.0f}; preemptions {results['preemptions']:.0f}",
              f"* proposer state: held for at most {results['state_held_max']} requests, "
              f"{results['state_held_last']} at the end",
              f"* spec decode: {results['spec_decode'].get('summary', 'no counters')}",
              f"* server log: {results['log_tracebacks']} tracebacks, "
              f"{results['log_errors']} ERROR lines"]
    return "\n".join(lines) + "\n"


def spec_decode_summary(metrics: dict[str, float]) -> dict:
    drafts = metric_total(metrics, "vllm:spec_decode_num_drafts_total")
    drafted = metric_total(metrics, "vllm:spec_decode_num_draft_tokens_total")
    accepted = metric_total(metrics, "vllm:spec_decode_num_accepted_tokens_total")
    out = {"drafts": drafts, "draft_tokens": drafted, "accepted_tokens": accepted}
    if drafts:
        out["summary"] = (f"{drafts:.0f} drafts, {drafted:.0f} tokens drafted, "
                          f"{accepted:.0f} accepted (mean acceptance length "
                          f"{1 + accepted / drafts:.2f})")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--model", default=DEMO_MODEL)
    parser.add_argument("--k", type=int, default=15)
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--max-minutes", type=float, default=45.0,
                        help="requests not started by then are skipped (and reported)")
    parser.add_argument("--rss-every", type=int, default=100)
    parser.add_argument("--malformed-every", type=int, default=250)
    parser.add_argument("--abort-share", type=float, default=0.03)
    parser.add_argument("--abort-chunks", type=int, default=3)
    parser.add_argument("--rss-tolerance", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=0)
    add_allocator_option(parser)
    parser.add_argument("--dry-run", action="store_true",
                        help="build and print the request mix, start no server")
    args = parser.parse_args()
    malloc_env = allocator_env_of(parser, args.allocator)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model = str(model_path(args.model))

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    # About as many distinct prompts as requests, so the suffix trees fill with distinct
    # outputs (a soak of memory, not of speed: a repeat is harmless).
    gsm = [user_message(p["question"]) for p in demo_problems(args.requests // 5)]
    questions = sharegpt_questions(args.requests * 3 // 5, max_chars=600)
    messages = gsm + questions + CHAT_QUESTIONS
    completion_prompts = (chat_template(tokenizer, messages)
                          + questions[:args.requests // 10])  # and some raw text
    specs = build_specs(args.requests, completion_prompts, messages, args.seed,
                        args.malformed_every, args.abort_share)
    mix = Counter(s.kind for s in specs)
    features = Counter(f for s in specs for f in s.features)
    print("request mix:", dict(mix), dict(features), flush=True)
    if args.dry_run:
        return 0

    spec_config = json.dumps({"method": "jacobi", "num_speculative_tokens": args.k})
    options = parse_options(json.loads(spec_config), max_k=args.k)
    log = out / "server.log"
    results: dict[str, Any] = {
        "model": args.model, "speculative_config": spec_config, "concurrency":
        args.concurrency, "allocator": args.allocator, "seed": args.seed,
        "date": time.strftime("%Y-%m-%d"), "mix": dict(mix), "features": dict(features),
        "history_size": options.history_size, "lookup": options.lookup,
        "command": " ".join(sys.argv)}
    t0 = time.time()
    with watched_server(model, spec_config, log, malloc_env) as (base, pid):
        results["rss_by_process"] = {"start": per_process_mib(pid)}
        run_start = time.time()
        records, samples = run_soak(base, pid, specs, args.concurrency, args.rss_every,
                                    run_start + 60 * args.max_minutes, args.abort_chunks)
        results["minutes"] = (time.time() - run_start) / 60
        results["rss_by_process"]["end of run"] = per_process_mib(pid)
        time.sleep(3)
        for _ in range(2):  # a step or two more: finished and aborted requests' state dropped
            requests.post(base + "/v1/completions", timeout=60, json={
                "model": "model", "prompt": messages[0], "max_tokens": 1, "temperature": 0.0})
        time.sleep(3)
        results["rss_idle_mib"] = tree_rss_mib(pid)
        results["rss_by_process"]["idle after"] = per_process_mib(pid)
        results["health_after"] = requests.get(base + "/health", timeout=10).status_code
        metrics = read_metrics(base, "vllm:")
        results["running_at_end"] = metric_total(metrics, "vllm:num_requests_running")
        results["preemptions"] = metric_total(metrics, "vllm:num_preemptions_total")
        results["spec_decode"] = spec_decode_summary(metrics)
    results["total_minutes"] = (time.time() - t0) / 60
    results.update(held_state(log))
    text = log.read_text(errors="replace")
    results["log_tracebacks"] = text.count("Traceback")
    results["log_errors"] = sum(" ERROR " in line for line in text.splitlines())
    results["summary"] = summarize(specs, records)
    results["rss"] = rss_verdict(samples, args.rss_tolerance)
    results["rss_samples"] = samples
    with open(out / "requests.jsonl", "w") as f:
        for record in sorted(records, key=lambda r: r["index"]):
            f.write(json.dumps(record) + "\n")
    (out / "soak.json").write_text(json.dumps(results, indent=1))
    plot(samples, results["rss"], f"vllm serve + jacobi, {args.model}: {args.requests} mixed "
         f"requests, concurrency {args.concurrency}", out / "rss.png")
    table = report(results)
    (out / "table.md").write_text(table)
    print(table)
    s = results["summary"]
    ok = (s["failed"] == 0 and s["completed"] == s["requests"]
          and results["health_after"] == 200 and results["state_held_last"] == 0)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
