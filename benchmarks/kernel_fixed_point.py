"""Time the batched Jacobi fixed-point step: torch path vs Triton kernel.

    PYTHONPATH=. python benchmarks/kernel_fixed_point.py --out /tmp/kernel_fixed_point.json

(PYTHONPATH only where the package is not installed: torch and triton are all it needs.)

Every request of a batch drafts k tokens, so the step reads B * (k + 1) logits rows. For each
(batch, k, vocab) it reports the median time in microseconds and the achieved bandwidth
(bytes read and written / time), also as a fraction of the device's measured copy bandwidth
(a large tensor copy: read + write). ``torch.argmax`` alone is timed as the floor (vLLM's
greedy sampler pays it anyway). On CUDA, caches are flushed between runs and the
Triton result is checked against torch. Without CUDA only the torch path runs (timings on a
shared CPU are noisy). Prints a Markdown table and writes JSON. Imports torch only (and triton
on CUDA), never vLLM.
"""

from __future__ import annotations

import argparse
import json
from functools import partial
from pathlib import Path

import torch

from vllm_cllm.bench.kernel_timing import Timer, copy_bandwidth, make_inputs, step_bytes
from vllm_cllm.kernels import fixed_point_step, triton_available


def parse_ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def run(args: argparse.Namespace) -> dict:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = getattr(torch, args.dtype)
    use_triton = device.type == "cuda" and triton_available()
    if args.threads:
        torch.set_num_threads(args.threads)
    timer = Timer(device, args.iters or (50 if device.type == "cuda" else 10),
                  warmup=5 if device.type == "cuda" else 2, stat=args.stat)
    copy_gbps = copy_bandwidth(timer, device, 1024 if device.type == "cuda" else 256)
    batches = parse_ints(args.batch_sizes or ("1,4,16,64,256" if device.type == "cuda"
                                              else "1,4,16"))
    results = []
    for vocab in parse_ints(args.vocab):
        for k in parse_ints(args.k):
            for batch in batches:
                logits, drafts, num = make_inputs(batch, k, vocab, dtype, device)
                nbytes = step_bytes(batch, k, vocab, logits.element_size())
                row = {"batch": batch, "k": k, "vocab": vocab, "rows": logits.shape[0],
                       "bytes": nbytes}
                row["argmax_us"] = timer(partial(torch.argmax, logits, dim=-1))
                backends = ["torch", "triton"] if use_triton else ["torch"]
                for name in backends:
                    micros = timer(partial(fixed_point_step, logits, drafts, num, k,
                                           backend=name))
                    row[f"{name}_us"] = micros
                    row[f"{name}_gbps"] = nbytes / micros / 1e3
                    row[f"{name}_of_copy"] = row[f"{name}_gbps"] / copy_gbps
                if use_triton:
                    want = fixed_point_step(logits, drafts, num, k, backend="torch")
                    got = fixed_point_step(logits, drafts, num, k, backend="triton")
                    row["triton_equal"] = all(torch.equal(getattr(want, f), getattr(got, f))
                                              for f in ("argmax", "accepted", "next_draft",
                                                        "next_len"))
                results.append(row)
                print(f"B={batch:>4} k={k:>2} V={vocab:>6}: torch {row['torch_us']:9.1f} us"
                      + (f", triton {row['triton_us']:9.1f} us" if use_triton else ""),
                      flush=True)
                del logits, drafts, num
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return {"device": name, "dtype": args.dtype, "copy_gbps": copy_gbps,
            "triton": use_triton, "iters": timer.iters, "stat": args.stat,
            "threads": torch.get_num_threads(), "results": results}


def markdown(report: dict) -> str:
    triton = report["triton"]
    head = "| B | k | V | rows | argmax µs | torch µs | torch GB/s | torch % copy |"
    rule = "|---:|---:|---:|---:|---:|---:|---:|---:|"
    if triton:
        head += " triton µs | triton GB/s | triton % copy | speed-up | equal |"
        rule += "---:|---:|---:|---:|:---:|"
    title = (f"Device: {report['device']} ({report['threads']} threads), logits "
             f"{report['dtype']}, copy bandwidth {report['copy_gbps']:.1f} GB/s (read + write), "
             f"{report['stat']} of {report['iters']} runs")
    if not triton:
        title += "; torch path only (no CUDA device)"
    lines = [title, "", head, rule]
    for r in report["results"]:
        line = (f"| {r['batch']} | {r['k']} | {r['vocab']} | {r['rows']} | {r['argmax_us']:.1f}"
                f" | {r['torch_us']:.1f} | {r['torch_gbps']:.1f} | {100 * r['torch_of_copy']:.0f}"
                " |")
        if triton:
            line += (f" {r['triton_us']:.1f} | {r['triton_gbps']:.1f} |"
                     f" {100 * r['triton_of_copy']:.0f} | {r['torch_us'] / r['triton_us']:.2f}x |"
                     f" {'yes' if r['triton_equal'] else 'NO'} |")
        lines.append(line)
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="JSON file to write")
    parser.add_argument("--batch-sizes", default="",
                        help="comma list (default 1,4,16,64,256 on CUDA, 1,4,16 on CPU)")
    parser.add_argument("--k", default="4,8,16")
    parser.add_argument("--vocab", default="32000,128256")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16",
                                                               "float16"])
    parser.add_argument("--iters", type=int, default=0, help="timed runs (default 50 / 10)")
    parser.add_argument("--stat", default="median", choices=["median", "min"],
                        help="min suits a CPU shared with other work")
    parser.add_argument("--threads", type=int, default=0, help="CPU threads (default: torch's)")
    args = parser.parse_args()
    report = run(args)
    table = markdown(report)
    print("\n" + table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({**report, "table": table}, indent=2))


if __name__ == "__main__":
    main()
