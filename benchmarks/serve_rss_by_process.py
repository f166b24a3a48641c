"""Where server memory grows: RSS of each server process after rounds of load, with ``jacobi``
(adaptive) and without speculation, same prompts. Needs ``benchmarks/serve_load.py``'s
prompt file (``--prompts``). Prints one line per round: ``{pid:name: MiB}``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from serve_load import bench_serve, per_process_mib, server_pid  # noqa: E402

from vllm_cllm.runtime.checkpoints import model_path  # noqa: E402
from vllm_cllm.runtime.server import running_server  # noqa: E402


def _rounded(mib: dict[str, float]) -> dict[str, int]:
    return {k: round(v) for k, v in mib.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--prompts", default="results/serve_load/sharegpt_prompts.jsonl")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=32)
    args = parser.parse_args()
    model, out, prompts = str(model_path("smollm2-135m-instruct")), Path(args.out), Path(
        args.prompts)
    out.mkdir(parents=True, exist_ok=True)
    spec = json.dumps({"method": "jacobi", "num_speculative_tokens": 15, "adaptive": True})
    for name, extra in [("jacobi", ["--speculative-config", spec]), ("plain", [])]:
        with running_server(model, *extra, log_path=str(out / f"{name}.log")) as base:
            pid = server_pid(int(base.rsplit(":", 1)[1]))
            bench_serve(base, model, prompts, 4 * args.concurrency, args.concurrency, 32,
                        out / "warmup.json")
            print(name, "warm-up", _rounded(per_process_mib(pid)), flush=True)
            for r in range(args.rounds):
                bench_serve(base, model, prompts, args.requests, args.concurrency, 32,
                            out / "round.json")
                print(name, "round", r, _rounded(per_process_mib(pid)), flush=True)


if __name__ == "__main__":
    main()
