"""``vllm-cllm device-check``: what this plugin's GPU path needs, checked on one machine.

Needs torch (and Triton, transformers-free) only, never vLLM, so it runs on any GPU machine
without vLLM installed, also from a bare checkout::

    python -m vllm_cllm.bench.device_check --out DIR

Writes ``DIR/device_check.json`` and ``DIR/device_check.md``. Parts:

1. the fixed-point step's torch path against a plain-Python reference (every device);
2. the Triton kernel on CUDA (not the interpreter) against torch, on the same cases and with
   forced vocabulary splits;
3. the capture's device path (``VerifyPredictions.from_fixed_point``) against the host path
   (``VerifyPredictions.on_host``) on the same verify steps, for both proposers' layouts
   (``jacobi``: block k, no masks; ``space``: block 2k with mask slots); on CUDA also under
   ``torch.cuda.set_sync_debug_mode("error")``, which raises at any host sync;
4. the step's time against a plain argmax and as a fraction of the device's copy bandwidth
   (vocab 49,152 and 151,936; k 4/8/15/32; batch 1/16/64; bf16 logits);
5. Triton compiles after the warm-up that ``load_model()`` runs: serving-shaped steps of every
   batch size and draft count must compile nothing more.

Without CUDA, parts 2, 4 and 5 (and 3's CUDA run) are written as "not run: no CUDA", and the
command still exits 0; a failed check exits 1.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
import traceback
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

NO_CUDA = "not run: no CUDA"
VOCABS = (49152, 151936)
KS = (4, 8, 15, 32)
BATCHES = (1, 16, 64)


def _outcome(check: Callable[[], dict[str, Any] | None]) -> dict[str, Any]:
    """Run one part: ``passed`` with its details, or ``failed`` with the error."""
    started = time.perf_counter()
    try:
        details = check() or {}
        status = "passed"
    except Exception as exc:  # a failed part is reported, the others still run
        details = {"error": f"{type(exc).__name__}: {exc}",
                   "traceback": traceback.format_exc(limit=4)}
        status = "failed"
    return {"status": status, "seconds": round(time.perf_counter() - started, 2), **details}


def kernel_against_reference() -> dict[str, Any]:
    from vllm_cllm.bench.kernel_cases import check_against_reference, edge_cases, random_cases

    cases = {**edge_cases(), **random_cases()}
    for case in cases.values():
        check_against_reference(case, "torch")
    return {"cases": len(cases)}


def triton_against_torch(device: torch.device) -> dict[str, Any]:
    from vllm_cllm.bench.kernel_cases import edge_cases, random_cases
    from vllm_cllm.kernels import fixed_point_step
    from vllm_cllm.kernels._triton import fixed_point_step_triton

    cases = {**edge_cases(), **random_cases()}
    runs = 0
    for name, case in cases.items():
        mask = None if case.num_mask is None else case.num_mask.to(device)
        args = (case.logits.to(device), case.drafts.to(device), case.num.to(device), case.k)
        want = fixed_point_step(*args, num_mask=mask, backend="torch")
        tries = [fixed_point_step(*args, num_mask=mask, backend="triton")]
        if case.logits.dim() == 2 and case.num.numel():
            tries += [fixed_point_step_triton(*args, mask, splits=s) for s in (1, 3, 16, 256)]
        for got in tries:
            for field in ("argmax", "accepted", "next_draft", "next_len"):
                a, b = getattr(got, field), getattr(want, field)
                if a.dtype != b.dtype or not torch.equal(a.cpu(), b.cpu()):
                    raise AssertionError(f"case {name}: {field} differs from torch")
            runs += 1
    return {"cases": len(cases), "runs": runs}


def _verify_step(rng: np.random.Generator, slots: int, vocab: int, masked: bool
                 ) -> tuple[torch.Tensor, torch.Tensor, list[int], list[int] | None]:
    """A random verify step: ragged drafts, about 60 % of them the row's argmax."""
    num = [int(n) for n in rng.integers(0, slots + 1, int(rng.integers(1, 9)))]
    logits = torch.from_numpy(rng.standard_normal((sum(num) + len(num), vocab),
                                                  dtype=np.float32))
    drafts, r0 = [], 0
    for n in num:
        for j in range(n):
            hit = rng.random() < 0.6
            drafts.append(int(logits[r0 + j].argmax()) if hit else int(rng.integers(vocab)))
        r0 += n + 1
    masks = [int(rng.integers(0, n + 1)) for n in num] if masked else None
    return logits, torch.tensor(drafts, dtype=torch.int64), num, masks


def capture_device_against_host(device: torch.device, sync_check: bool = False
                                ) -> dict[str, Any]:
    """Both proposers' layouts: the device step's next blocks equal the host rule's."""
    from vllm_cllm.core.predictions import PendingPredictions, VerifyPredictions

    rng = np.random.default_rng(0)
    steps = 0
    for layout, k, masked in (("jacobi", 15, False), ("space", 5, True)):
        block = 2 * k if masked else k
        for _ in range(25):
            logits, drafts, num, masks = _verify_step(rng, block, 3000, masked)
            ids = [f"r{i}" for i in range(len(num))]
            host = VerifyPredictions.on_host(logits, num, ids, masks)
            on_device = (logits.to(device), drafts.to(device))
            if sync_check:
                torch.cuda.synchronize()
                torch.cuda.set_sync_debug_mode("error")
            try:
                got = VerifyPredictions.from_fixed_point(*on_device, num, ids, block, masks)
            finally:
                if sync_check:
                    torch.cuda.set_sync_debug_mode(0)
            if isinstance(got, PendingPredictions):
                got = got.resolve()
            for i, accepted in enumerate(got.accepted):
                mine = got.next_block(i, int(accepted) + 1).tolist()
                theirs = host.next_block(i, int(accepted) + 1).tolist()
                if mine != theirs:
                    raise AssertionError(f"{layout}: request {i} of {num} (masks {masks}): "
                                         f"device {mine} != host {theirs}")
            steps += 1
    return {"steps": steps, "device": str(device), "no_host_sync": sync_check or None}


def step_timings(device: torch.device) -> dict[str, Any]:
    from vllm_cllm.bench.kernel_timing import Timer, copy_bandwidth, make_inputs, step_bytes
    from vllm_cllm.kernels import fixed_point_step

    timer = Timer(device, iters=30, warmup=5, stat="median")
    copy_gbps = copy_bandwidth(timer, device, 1024)
    rows = []
    for vocab in VOCABS:
        for k in KS:
            for batch in BATCHES:
                logits, drafts, num = make_inputs(batch, k, vocab, torch.bfloat16, device)
                nbytes = step_bytes(batch, k, vocab, logits.element_size())
                argmax_us = timer(partial(torch.argmax, logits, dim=-1))
                step_us = timer(partial(fixed_point_step, logits, drafts, num, k))
                rows.append({"vocab": vocab, "k": k, "batch": batch, "argmax_us": argmax_us,
                             "step_us": step_us, "step_over_argmax": step_us / argmax_us,
                             "of_copy_bandwidth": nbytes / step_us / 1e3 / copy_gbps})
                del logits, drafts, num
    return {"copy_gbps": copy_gbps, "dtype": "bfloat16", "rows": rows}


def _compiled_variants() -> int:
    """Compiled variants of the step's two Triton kernels, over every device."""
    from vllm_cllm.kernels import _triton

    total = 0
    for kernel in (_triton._split_argmax, _triton._fixed_point):
        caches = getattr(kernel, "device_caches", None)
        if caches is not None:  # triton >= 3.2: device -> (kernel cache, ...)
            total += sum(len(entry[0]) for entry in caches.values())
        else:
            total += sum(len(cache) for cache in getattr(kernel, "cache", {}).values())
    return total


def compiles_after_warm_up(device: torch.device) -> dict[str, Any]:
    """``load_model()``'s warm-up, then serving-shaped steps: no further compile."""
    from vllm_cllm.core.predictions import PendingPredictions, VerifyPredictions
    from vllm_cllm.kernels import warm_up

    vocab, dtype = VOCABS[0], torch.bfloat16
    rng = np.random.default_rng(1)
    report = {}
    for layout, block, masked in (("jacobi", 15, False), ("space", 10, True)):
        warm_up(vocab, dtype, device, block, with_mask=masked)
        before = _compiled_variants()
        for batch in (1, 2, 3, 7, 16, 33, 64, 128, 256):
            num = [int(n) for n in rng.integers(0, block + 1, batch)]
            logits = torch.randn(sum(num) + batch, vocab, dtype=dtype, device=device)
            drafts = torch.randint(0, vocab, (sum(num),), device=device)
            masks = [int(rng.integers(0, n + 1)) for n in num] if masked else None
            got = VerifyPredictions.from_fixed_point(logits, drafts, num,
                                                     [str(i) for i in range(batch)], block, masks)
            if isinstance(got, PendingPredictions):
                got.resolve()
        report[layout] = {"variants_after_warm_up": before,
                          "compiled_while_serving": _compiled_variants() - before}
    late = {name: r["compiled_while_serving"] for name, r in report.items()}
    if any(late.values()):
        raise AssertionError(f"compiled after warm-up: {late}")
    return report


def run_checks() -> dict[str, Any]:
    from vllm_cllm.kernels import triton_available

    cuda = torch.cuda.is_available()
    device = torch.device("cuda") if cuda else None
    report: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"), "python": platform.python_version(),
        "torch": torch.__version__, "cuda": cuda,
        "device": torch.cuda.get_device_name(0) if cuda else "cpu",
        "triton": triton_available(),
    }
    parts: dict[str, Any] = {
        "kernel torch vs reference": _outcome(kernel_against_reference),
        "capture device vs host (cpu tensors)":
            _outcome(partial(capture_device_against_host, torch.device("cpu"))),
    }
    gpu_parts: dict[str, Callable[[], dict[str, Any] | None]] = {
        "kernel triton vs torch (cuda)": partial(triton_against_torch, device),
        "capture device vs host (cuda, no host sync)":
            partial(capture_device_against_host, device, True),
        "step time vs argmax and copy bandwidth": partial(step_timings, device),
        "compiles after warm-up": partial(compiles_after_warm_up, device),
    }
    for name, check in gpu_parts.items():
        parts[name] = _outcome(check) if cuda and report["triton"] else {"status": NO_CUDA}
    report["parts"] = parts
    report["imports_vllm"] = "vllm" in sys.modules
    return report


def markdown(report: dict[str, Any]) -> str:
    lines = [f"# vllm-cllm device check, {report['date']}", "",
             f"Device: {report['device']}; torch {report['torch']}; Triton "
             f"{'yes' if report['triton'] else 'no'}; vLLM imported: "
             f"{'yes' if report['imports_vllm'] else 'no'}.", "",
             "| part | status | seconds | details |", "|---|---|---:|---|"]
    for name, part in report["parts"].items():
        details = {k: v for k, v in part.items()
                   if k not in ("status", "seconds", "rows", "traceback")}
        lines.append(f"| {name} | {part['status']} | {part.get('seconds', '')} | "
                     f"{json.dumps(details) if details else ''} |")
    timing = report["parts"]["step time vs argmax and copy bandwidth"]
    if timing.get("rows"):
        lines += ["", f"Step time (bf16 logits; copy bandwidth {timing['copy_gbps']:.0f} GB/s, "
                  "read + write):", "",
                  "| vocab | k | batch | argmax µs | step µs | step / argmax | % of copy bw |",
                  "|---:|---:|---:|---:|---:|---:|---:|"]
        lines += [f"| {r['vocab']} | {r['k']} | {r['batch']} | {r['argmax_us']:.1f} | "
                  f"{r['step_us']:.1f} | {r['step_over_argmax']:.2f} | "
                  f"{100 * r['of_copy_bandwidth']:.0f} |" for r in timing["rows"]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="vllm-cllm device-check",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for the JSON and table")
    args = parser.parse_args(argv)
    report = run_checks()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "device_check.json").write_text(json.dumps(report, indent=1))
    table = markdown(report)
    (args.out / "device_check.md").write_text(table)
    print(table)
    failed = [n for n, p in report["parts"].items() if p["status"] == "failed"]
    return 1 if failed or report["imports_vllm"] else 0


if __name__ == "__main__":
    sys.exit(main())
