"""Server load: the documented ``vllm serve`` command with ``jacobi`` under ``vllm bench serve``.

One run, one server:
1. plain greedy texts of the check prompts from an offline engine without speculation;
2. ``vllm serve MODEL --speculative-config '{"method": "jacobi", ...}'`` (jemalloc preloaded,
   as docs/platform-cpu.md advises; ``--allocator glibc`` for glibc's), warm-up load at
   every concurrency measured, RSS (whole tree and per process);
3. ``vllm bench serve`` at each concurrency over ``--num-requests`` ShareGPT questions:
   throughput, TTFT / TPOT / ITL percentiles, failed requests;
4. client aborts mid-stream (connections closed after a few chunks);
5. the check prompts again, concurrently, greedy: texts must equal the offline ones;
6. RSS of the server's process tree at the end vs after warm-up; the proposer's own report of
   how many requests it holds state for (``VLLM_CLLM_LOG_STATE=1``) once the server is idle.

Writes ``load.json`` and ``table.md`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

from vllm_cllm.bench.datasets import chat_template, sharegpt_questions
from vllm_cllm.runtime.checkpoints import model_path
from vllm_cllm.runtime.engine import with_engine
from vllm_cllm.runtime.server import (
    add_allocator_option,
    allocator_env_of,
    hang_up_midstream,
    held_state,
    per_process_mib,
    tree_rss_mib,
    vllm_executable,
    watched_server,
)

PERCENTILES = "50,90,99"


def bench_serve(base: str, model: str, dataset: Path, num: int, concurrency: int,
                output_len: int, result: Path) -> dict:
    """``vllm bench serve`` against the running server; returns its saved result JSON."""
    cmd = [vllm_executable(), "bench", "serve", "--backend", "openai", "--base-url", base,
           "--model", model, "--served-model-name", "model", "--dataset-name", "custom",
           "--dataset-path", str(dataset), "--custom-output-len", str(output_len),
           "--num-prompts", str(num), "--max-concurrency", str(concurrency),
           "--temperature", "0", "--ignore-eos", "--percentile-metrics", "ttft,tpot,itl,e2el",
           "--metric-percentiles", PERCENTILES, "--save-result", "--result-dir",
           str(result.parent), "--result-filename", result.name, "--disable-tqdm"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return json.loads(result.read_text())


def abort_midstream(base: str, prompts: list[str], chunks: int = 3) -> int:
    """Stream each prompt and hang up after ``chunks`` chunks; returns how many were cut."""
    def one(prompt: str) -> bool:
        return hang_up_midstream(base + "/v1/completions", {
            "model": "model", "prompt": prompt, "max_tokens": 400, "temperature": 0.0,
            "ignore_eos": True}, chunks)

    with ThreadPoolExecutor(len(prompts)) as pool:
        return sum(pool.map(one, prompts))


def greedy_texts(base: str, prompts: list[str], max_tokens: int, concurrency: int
                 ) -> list[str]:
    def one(prompt: str) -> str:
        resp = requests.post(base + "/v1/completions", timeout=300, json={
            "model": "model", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0})
        resp.raise_for_status()
        return resp.json()["choices"][0]["text"]

    with ThreadPoolExecutor(concurrency) as pool:
        return list(pool.map(one, prompts))


def offline_texts(model: str, prompts: list[str], max_tokens: int) -> list[str]:
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    return with_engine(model, None, lambda llm: [
        o.outputs[0].text for o in llm.generate(prompts, params, use_tqdm=False)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--k", type=int, default=15)
    parser.add_argument("--fixed-k", action="store_true", help="draft k every step "
                        "(default: adaptive, which stops drafting where the batch is large)")
    parser.add_argument("--num-requests", type=int, default=1000, help="per concurrency level")
    parser.add_argument("--requests-at-1", type=int, default=200,
                        help="at concurrency 1 (one request at a time takes ~1.7 s on 2 cores)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--check-prompts", type=int, default=32)
    parser.add_argument("--aborts", type=int, default=16)
    add_allocator_option(parser)
    args = parser.parse_args()
    malloc_env = allocator_env_of(parser, args.allocator)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model = str(model_path(args.model))

    from transformers import AutoTokenizer

    questions = sharegpt_questions(args.num_requests + args.check_prompts, max_chars=600)
    dataset = out / "sharegpt_prompts.jsonl"
    dataset.write_text("".join(json.dumps({"prompt": q}) + "\n"
                               for q in questions[:args.num_requests]))
    check = chat_template(AutoTokenizer.from_pretrained(model), questions[-args.check_prompts:])
    offline = offline_texts(model, check, args.output_len)

    spec = json.dumps({"method": "jacobi", "num_speculative_tokens": args.k,
                       **({"adaptive": False} if args.fixed_k else {})})
    log = out / "server.log"
    results: dict = {"model": args.model, "speculative_config": spec,
                     "output_len": args.output_len, "num_requests": args.num_requests,
                     "allocator": args.allocator,
                     "date": time.strftime("%Y-%m-%d"), "runs": []}
    with watched_server(model, spec, log, malloc_env) as (base, pid):
        # Warm up at every concurrency that is measured (4 rounds of each): the baseline RSS
        # then holds the working set of every batch shape the run will see (vLLM's worker
        # caches per shape), and growth after it means a leak, not a new shape.
        for concurrency in sorted(args.concurrency):
            bench_serve(base, model, dataset, 4 * concurrency, concurrency, args.output_len,
                        out / f"warmup-c{concurrency}.json")
        results["rss_after_warmup_mib"] = tree_rss_mib(pid)
        results["rss_by_process"] = {"after warm-up": per_process_mib(pid)}
        for concurrency in args.concurrency:
            num = args.requests_at_1 if concurrency == 1 else args.num_requests
            run = bench_serve(base, model, dataset, num, concurrency, args.output_len,
                              out / f"c{concurrency}.json")
            run.pop("errors", None)
            run["rss_mib"] = tree_rss_mib(pid)
            results["rss_by_process"][f"after c{concurrency}"] = per_process_mib(pid)
            results["runs"].append(run)
            print(f"concurrency {concurrency}: {run['completed']} completed, "
                  f"{run['failed']} failed, {run['output_throughput']:.1f} tok/s", flush=True)
        results["aborted_midstream"] = abort_midstream(base, check[:args.aborts])
        time.sleep(2)
        served = greedy_texts(base, check, args.output_len, concurrency=8)
        results["identical_to_offline"] = sum(a == b for a, b in zip(served, offline,
                                                                      strict=True))
        results["check_prompts"] = len(check)
        greedy_texts(base, check[:1], 4, concurrency=1)  # one more step: drops finished state
        time.sleep(2)
        results["rss_at_end_mib"] = tree_rss_mib(pid)
        results["rss_by_process"]["end"] = per_process_mib(pid)
        results["health_after_aborts"] = requests.get(base + "/health", timeout=10).status_code
    results.update(held_state(log))
    results["rss_growth"] = results["rss_at_end_mib"] / results["rss_after_warmup_mib"] - 1
    (out / "load.json").write_text(json.dumps(results, indent=1))
    table = report(results)
    (out / "table.md").write_text(table)
    print(table)


def report(results: dict) -> str:
    lines = [f"vllm serve + jacobi ({results['speculative_config']}), {results['model']}, "
             f"{results['date']}: ShareGPT questions, {results['output_len']} output tokens "
             "(ignore_eos), greedy", "",
             "| concurrency | requests | failed | req/s | output tok/s | TTFT p50 / p90 / p99 ms "
             "| ITL p50 / p90 / p99 ms | TPOT p50 ms | RSS MiB |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in results["runs"]:
        lines.append(
            f"| {r['max_concurrency']} | {r['completed']} | {r['failed']} | "
            f"{r['request_throughput']:.2f} | {r['output_throughput']:.1f} | "
            f"{r['p50_ttft_ms']:.0f} / {r['p90_ttft_ms']:.0f} / {r['p99_ttft_ms']:.0f} | "
            f"{r['p50_itl_ms']:.0f} / {r['p90_itl_ms']:.0f} / {r['p99_itl_ms']:.0f} | "
            f"{r['p50_tpot_ms']:.0f} | {r['rss_mib']:.0f} |")
    lines += ["", f"* RSS after warm-up {results['rss_after_warmup_mib']:.0f} MiB, at the end "
              f"{results['rss_at_end_mib']:.0f} MiB ({100 * results['rss_growth']:+.1f} %)",
              f"* {results['aborted_midstream']} streams cut by the client mid-stream; health "
              f"afterwards: {results['health_after_aborts']}",
              f"* greedy texts identical to offline plain decoding: "
              f"{results['identical_to_offline']} / {results['check_prompts']} (sent 8 at a time, "
              "after the aborts)",
              f"* proposer state: held for at most {results['state_held_max']} requests, "
              f"{results['state_held_last']} at the end (one request running)",
              "* RSS by process (MiB): " + "; ".join(
                  f"{phase}: " + ", ".join(f"{name.split(':', 1)[1]} {mib:.0f}"
                                           for name, mib in procs.items())
                  for phase, procs in results.get("rss_by_process", {}).items())]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
