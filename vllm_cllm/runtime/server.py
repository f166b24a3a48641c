"""Start and stop a ``vllm serve`` process on 127.0.0.1 (examples, tests and load benchmarks)."""

from __future__ import annotations

import argparse
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


def allocator_env(allocator: str) -> dict[str, str]:
    """The environment that gives a server ``allocator``'s malloc: ``jemalloc`` preloaded
    (:func:`bundled_jemalloc`, as docs/platform-cpu.md's serve command does) or ``glibc``'s own
    (nothing to set). Raises ``RuntimeError`` where jemalloc is asked for but not installed."""
    if allocator == "glibc":
        return {}
    lib = bundled_jemalloc()
    if lib is None:
        raise RuntimeError("jemalloc: the ray wheel's libjemalloc.so is not installed "
                           "(pip install ray); or use glibc's allocator")
    return {"LD_PRELOAD": lib}


def add_allocator_option(parser: argparse.ArgumentParser) -> None:
    """``--allocator jemalloc|glibc``: the server's malloc (:func:`allocator_env`)."""
    parser.add_argument("--allocator", choices=["jemalloc", "glibc"], default="jemalloc",
                        help="the server's malloc: jemalloc preloaded, as docs/platform-cpu.md "
                        "serve command does, or glibc's own")


def allocator_env_of(parser: argparse.ArgumentParser, allocator: str) -> dict[str, str]:
    """:func:`allocator_env`, a missing jemalloc reported as a command-line error."""
    try:
        return allocator_env(allocator)
    except RuntimeError as exc:
        parser.error(f"--allocator {exc}, or pass --allocator glibc")


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


def metric_total(metrics: dict[str, float], name: str) -> float:
    """Metric ``name`` of :func:`read_metrics`' result summed over its labels: that name
    exactly, not the metrics whose names merely begin with it (``..._per_pos_total``)."""
    return sum(v for key, v in metrics.items() if key.split("{", 1)[0] == name)


# -- what load benchmarks read off a running server (benchmarks/serve_load.py, serve_soak.py) --

#: what a proposer prints to stderr when ``VLLM_CLLM_LOG_STATE=1`` and its count changes
#: (:data:`vllm_cllm.proposers.base.LOG_STATE_ENV`)
STATE_LINE = re.compile(r"vllm-cllm: state held for (\d+) requests")


def held_state(log: Path) -> dict[str, int | None]:
    """How many requests the proposer held state for, from the server log: the most at any
    time (``state_held_max``) and at the end (``state_held_last``); None without a report."""
    counts = [int(m) for m in STATE_LINE.findall(log.read_text(errors="replace"))]
    return {"state_held_max": max(counts) if counts else None,
            "state_held_last": counts[-1] if counts else None}


@contextmanager
def watched_server(model: str, spec_config: str, log_path: Path,
                   extra_env: dict[str, str]) -> Iterator[tuple[str, int]]:
    """:func:`running_server` with ``--speculative-config spec_config``, the proposer
    reporting the requests it holds state for (:func:`held_state`): its base URL and the API
    server's pid (whose process tree is the server's memory)."""
    from vllm_cllm.proposers.base import LOG_STATE_ENV

    with running_server(model, "--speculative-config", spec_config, log_path=str(log_path),
                        extra_env={LOG_STATE_ENV: "1", **extra_env}) as base:
        yield base, server_pid(int(base.rsplit(":", 1)[1]))


def server_pid(port: int) -> int:
    """The process that listens on ``port`` (the API server of ``vllm serve``)."""
    import psutil

    for conn in psutil.net_connections("tcp"):
        if conn.laddr and conn.laddr.port == port and conn.status == psutil.CONN_LISTEN:
            return conn.pid
    raise RuntimeError(f"no process listens on port {port}")


def per_process_mib(pid: int) -> dict[str, float]:
    """Resident memory of a process and each of its children (API server, engine core,
    worker), keyed ``pid:name``."""
    import psutil

    root = psutil.Process(pid)
    out: dict[str, float] = {}
    for proc in [root, *root.children(recursive=True)]:
        try:
            out[f"{proc.pid}:{proc.name()[:20]}"] = proc.memory_info().rss / 2**20
        except psutil.NoSuchProcess:  # a helper that exited between listing and reading
            pass
    return out


def tree_rss_mib(pid: int) -> float:
    """Resident memory of the whole server process tree."""
    return sum(per_process_mib(pid).values())


def hang_up_midstream(url: str, body: dict, chunks: int = 3, timeout_s: float = 300) -> bool:
    """POST a streamed request and close the connection after ``chunks`` lines of the
    stream; True if it was cut (the stream had not ended by then). Raises on an HTTP error."""
    import requests

    with requests.post(url, json={**body, "stream": True}, stream=True,
                       timeout=timeout_s) as resp:
        resp.raise_for_status()
        for i, _ in enumerate(resp.iter_lines()):
            if i >= chunks:
                return True  # leaving the block closes the connection mid-stream
    return False
