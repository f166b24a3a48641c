"""Start and stop a ``vllm serve`` process on 127.0.0.1 (examples, tests and load benchmarks)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from vllm_cllm.runtime.engine import CPU_ENV, platform_settings


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def vllm_executable() -> str:
    """The ``vllm`` console script of the running interpreter's environment."""
    beside = Path(sys.executable).with_name("vllm")
    return str(beside) if beside.exists() else (shutil.which("vllm") or "vllm")


def bundled_jemalloc() -> str | None:
    """jemalloc as the ``ray`` wheel ships it (an extra of this project), for ``LD_PRELOAD``:
    vLLM's CPU guide advises preloading an allocator for a long-running server, and glibc's
    lets the worker's RSS creep under load (docs/platform-cpu.md)."""
    import importlib.util

    spec = importlib.util.find_spec("ray")
    if spec is None or not spec.submodule_search_locations:
        return None
    lib = Path(next(iter(spec.submodule_search_locations))) / "core" / "libjemalloc.so"
    return str(lib) if lib.exists() else None


def serve_command(model: str, port: int, *extra: str) -> list[str]:
    """The documented command: ``vllm serve MODEL ...`` plus the platform's settings
    (:func:`~vllm_cllm.runtime.engine.platform_settings`: CPU-friendly on the CPU build,
    vLLM's defaults elsewhere)."""
    settings = platform_settings()  # the server keeps vLLM's own executor choice
    flags = [f"--dtype={settings['dtype']}"] if "dtype" in settings else []
    flags += ["--enforce-eager"] if settings.get("enforce_eager") else []
    return [vllm_executable(), "serve", model, "--host", "127.0.0.1", "--port", str(port),
            "--max-model-len", "2048", *flags, "--served-model-name", "model", *extra]


def wait_healthy(proc: subprocess.Popen, base_url: str, timeout_s: float,
                 log_path: str | None = None) -> None:
    """Return once ``base_url/health`` answers 200; raise if ``proc`` exits or time runs out."""
    deadline = time.time() + timeout_s
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"vllm serve exited with {proc.returncode}; log: {log_path}")
        try:
            with urllib.request.urlopen(base_url + "/health", timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        if time.time() > deadline:
            raise TimeoutError(f"vllm serve not healthy after {timeout_s}s; log: {log_path}")
        time.sleep(1)


@contextmanager
def running_server(model: str, *extra: str, timeout_s: float = 240.0,
                   log_path: str | None = None,
                   extra_env: dict[str, str] | None = None) -> Iterator[str]:
    """Run ``vllm serve`` until the block exits; yields its base URL. Kills the process group."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "VLLM_ENABLE_V1_MULTIPROCESSING"}
    env.update({k: v for k, v in CPU_ENV.items() if k != "VLLM_ENABLE_V1_MULTIPROCESSING"})
    env.update(extra_env or {})
    log = open(log_path or os.devnull, "w")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(serve_command(model, port, *extra), env=env, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(proc, base, timeout_s, log_path)
        yield base
    finally:
        stop_server(proc)
        log.close()


def stop_server(proc: subprocess.Popen) -> None:
    """End a server started in its own process group: SIGTERM, then SIGKILL after 30 s."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def read_metrics(base_url: str, prefix: str = "vllm:spec_decode") -> dict[str, float]:
    """Prometheus counters from ``/metrics`` whose name starts with ``prefix`` (labels kept)."""
    with urllib.request.urlopen(base_url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(prefix):
            match = re.match(r"^(\S+?)(\{.*\})?\s+(\S+)$", line)
            if match:
                out[match.group(1) + (match.group(2) or "")] = float(match.group(3))
    return out
