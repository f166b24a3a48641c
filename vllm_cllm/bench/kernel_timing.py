"""Timing the fixed-point step on a device: a timer (CUDA events with an L2 flush, or wall
time on a CPU), the device's copy bandwidth, and inputs of a given shape. Shared by
``benchmarks/kernel_fixed_point.py`` and ``vllm-cllm device-check``; torch only."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch


class Timer:
    """Wall time of a callable in µs (median, or min on a shared CPU); CUDA: events, L2 flush."""

    def __init__(self, device: torch.device, iters: int, warmup: int, stat: str) -> None:
        self.device, self.iters, self.warmup = device, iters, warmup
        self.stat = statistics.median if stat == "median" else min
        self.flush = (torch.empty(256 * 2**20, dtype=torch.int8, device=device)
                      if device.type == "cuda" else None)

    def __call__(self, fn: Callable[[], object]) -> float:
        for _ in range(self.warmup):
            fn()
        times = []
        for _ in range(self.iters):
            if self.flush is None:
                start = time.perf_counter()
                fn()
                times.append((time.perf_counter() - start) * 1e6)
                continue
            self.flush.zero_()
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(begin.elapsed_time(end) * 1e3)
        return self.stat(times)


def copy_bandwidth(timer: Timer, device: torch.device, megabytes: int) -> float:
    """GB/s of ``dst.copy_(src)`` counting the read and the write."""
    src = torch.empty(megabytes * 2**20, dtype=torch.uint8, device=device).random_(0, 255)
    dst = torch.empty_like(src)
    micros = timer(lambda: dst.copy_(src))
    return 2 * src.numel() / micros / 1e3


def make_inputs(batch: int, k: int, vocab: int, dtype: torch.dtype, device: torch.device
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random logits; drafts agree with the argmax about half the time (ragged acceptance)."""
    gen = torch.Generator(device=device).manual_seed(batch * 1000 + k)
    logits = torch.randn(batch * (k + 1), vocab, device=device, dtype=dtype, generator=gen)
    num = torch.full((batch,), k, dtype=torch.int32, device=device)
    rows = torch.arange(batch * (k + 1), device=device).view(batch, k + 1)[:, :k].reshape(-1)
    guess = logits.argmax(-1)[rows]
    noise = torch.randint(0, vocab, guess.shape, device=device, generator=gen)
    keep = torch.rand(guess.shape, device=device, generator=gen) < 0.5
    return logits, torch.where(keep, guess, noise), num


def step_bytes(batch: int, k: int, vocab: int, elem: int) -> int:
    """Logits read, drafts and counts read, argmax and outputs written."""
    rows = batch * (k + 1)
    return rows * vocab * elem + batch * k * 8 + batch * 4 + rows * 8 + batch * (k * 8 + 8)
