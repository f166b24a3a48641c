"""The README's code blocks run as written.

Fenced ``bash`` and ``python`` blocks are run in order, on the tiny model where the demo
checkpoint adds nothing but time; a block preceded by ``<!-- readme-test: skip (why) -->``
is not run (a GPU install, the long bench). The first block is the demo and the CI contract:
``.ci/run`` runs exactly its second command. A ``vllm serve`` block is started as a server and
the block after it (the OpenAI client) is run against it.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_cllm.runtime.server import wait_healthy

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"(?:<!-- readme-test: skip \((?P<skip>[^)]*)\) -->\n)?"
                   r"```(?P<lang>bash|python)\n(?P<code>.*?)```", re.S)
#: The demo checkpoint the README names, and the tiny stand-in the test runs instead.
DEMO, TINY = "smollm2-135m-cllm-gsm", "tiny-random-llama"


def readme_blocks() -> list[tuple[str, str, str | None]]:
    text = (ROOT / "README.md").read_text()
    return [(m["lang"], m["code"], m["skip"]) for m in BLOCK.finditer(text)]


def _env() -> dict[str, str]:
    from vllm_cllm.runtime.engine import CPU_ENV

    env = {**os.environ, **CPU_ENV}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def _run(lang: str, code: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    command = [sys.executable, "-c", code] if lang == "python" else ["bash", "-euo", "pipefail",
                                                                      "-c", code]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, f"README block failed:\n{code}\n{done.stdout}\n{done.stderr}"
    return done


def test_the_readme_opens_with_the_demo_and_the_ci_commands():
    """Two commands: the demo, then the tests, which are what ``.ci/run`` runs."""
    lang, code, skip = readme_blocks()[0]
    commands = [line.split("#")[0].strip() for line in code.splitlines() if line.strip()]
    ci = [line.strip() for line in (ROOT / ".ci/run").read_text().splitlines()
          if line.strip() and not line.startswith(("#", "set ", "cd "))]
    assert (lang, skip) == ("bash", None) and commands == ["make demo", *ci]


def test_only_named_blocks_are_skipped():
    skipped = [why for _, _, why in readme_blocks() if why]
    assert all(why.strip() for why in skipped) and len(skipped) <= 3


@pytest.mark.server
def test_the_readme_blocks_run_as_written():
    blocks = readme_blocks()[1:]
    env = _env()
    ran, server = 0, None
    try:
        for lang, code, skip in blocks:
            if skip:
                continue
            code = code.replace(DEMO, TINY)
            if lang == "bash" and code.strip().startswith("vllm serve"):
                # MULTIPROCESSING=0 is for offline engines; the server keeps vLLM's default
                serve_env = {k: v for k, v in env.items() if k != "VLLM_ENABLE_V1_MULTIPROCESSING"}
                server = subprocess.Popen(["bash", "-c", code], cwd=ROOT, env=serve_env,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                          start_new_session=True)
                wait_healthy(server, "http://localhost:8000", timeout_s=300)
            else:
                out = _run(lang, code, env)
                if lang == "python":
                    assert out.stdout.strip(), f"README block printed nothing:\n{code}"
            ran += 1
    finally:
        if server is not None:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=60)
    assert ran >= 3  # the Python quick start, the server and its client

