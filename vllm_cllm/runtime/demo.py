"""``vllm-cllm demo``: the demo CLLM through vLLM with ``jacobi``, beside plain decoding.

A few grade-school math problems that no recipe trained on (``gsm_symbolic``, :data:`SEED`)
run greedily one at a time, first without speculation and then with
``{"method": "jacobi", "num_speculative_tokens": k}``, one engine after the other. The report
gives each problem's two answers, whether their tokens are identical, the tokens per verify
step (vLLM's mean acceptance length) and the speed-up in output tokens/s. ``--serve`` starts
the same model and speculative config under ``vllm serve`` instead and asks it one problem.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass
from typing import Any

#: the demo CLLM (``vllm_cllm.runtime.checkpoints``)
DEMO_MODEL = "smollm2-135m-cllm-gsm"
#: ``gsm_symbolic`` seed of the problems: the tests' seed, never used to train a shipped
#: checkpoint (the recipes train on seeds 1 and 3; ``tests/test_demo.py`` checks that none of
#: the first problems is among their training prompts verbatim)
SEED = 2024
#: the recipes' instruction (``vllm_cllm.training.gsm.INSTRUCTION``; a test keeps them equal),
#: so the model sees the prompt format it was trained on
INSTRUCTION = "Solve the problem step by step, then give the final answer as 'Answer: <number>'."


def demo_problems(count: int, seed: int = SEED) -> list[dict[str, str]]:
    """The first ``count`` ``gsm_symbolic`` problems of ``seed``: question and answer."""
    try:
        import reasoning_gym
    except ImportError as exc:  # an extra, not a dependency of the plugin
        raise SystemExit("vllm-cllm demo: the problems come from reasoning-gym; install it "
                         "(pip install 'vllm-cllm[train]' or ./install.sh)") from exc

    dataset = reasoning_gym.create_dataset("gsm_symbolic", size=count, seed=seed)
    return [{"question": item["question"], "answer": str(item["answer"])} for item in dataset]


def user_message(question: str) -> str:
    return f"{question}\n{INSTRUCTION}"


@dataclass
class Run:
    """One engine's greedy answers to the problems, in order."""

    label: str
    texts: list[str]
    tokens: list[list[int]]
    seconds: float  # generation time of all problems (engine start and warm-up excluded)
    tokens_per_step: float  # vLLM's mean acceptance length; 1.0 without speculation

    @property
    def tokens_per_s(self) -> float:
        return sum(map(len, self.tokens)) / self.seconds if self.seconds else 0.0


def run_engine(model: str, speculative_config: dict[str, Any] | None, prompts: list[str],
               max_tokens: int, label: str) -> Run:
    """Start an engine (``with_engine``), warm it up, then answer ``prompts`` one at a time
    (batch 1) under a progress bar, timing the generation and reading vLLM's spec-decode
    counters around it."""
    from tqdm import tqdm
    from vllm import SamplingParams

    from vllm_cllm.runtime.engine import mean_acceptance_length, spec_metrics, with_engine

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)

    def use(llm: Any) -> Run:
        # the first steps of an engine are slower (allocation, first kernels): not timed
        llm.generate(["Hello"], SamplingParams(temperature=0.0, max_tokens=8), use_tqdm=False)
        before = spec_metrics(llm)
        texts, tokens, seconds = [], [], 0.0
        for prompt in tqdm(prompts, desc=f"{label:<14}", unit="problem", file=sys.stderr):
            start = time.perf_counter()
            out = llm.generate([prompt], params, use_tqdm=False)[0].outputs[0]
            seconds += time.perf_counter() - start
            texts.append(out.text)
            tokens.append(list(out.token_ids))
        tps = mean_acceptance_length(before, spec_metrics(llm)) if speculative_config else 1.0
        return Run(label, texts, tokens, seconds, tps)

    return with_engine(model, speculative_config, use)


def _indent(text: str, prefix: str = "    ") -> str:
    return "\n".join(prefix + line for line in text.strip().splitlines()) or prefix


def report(problems: list[dict[str, str]], plain: Run, spec: Run, k: int) -> str:
    """The demo's printout: each problem's question and both answers, then the summary."""
    lines = []
    identical = [p == s for p, s in zip(plain.tokens, spec.tokens, strict=True)]
    for i, (problem, same) in enumerate(zip(problems, identical, strict=True)):
        lines += [f"--- problem {i + 1} (reference answer: {problem['answer']})",
                  _indent(problem["question"]),
                  f"  {plain.label} ({len(plain.tokens[i])} tokens):",
                  _indent(plain.texts[i]),
                  f"  {spec.label} ({len(spec.tokens[i])} tokens):",
                  _indent(spec.texts[i]),
                  f"  token-identical: {'yes' if same else 'NO'}", ""]
    speedup = spec.tokens_per_s / plain.tokens_per_s if plain.tokens_per_s else 0.0
    lines += [f"token-identical:        {sum(identical)} of {len(identical)} answers",
              f"tokens per verify step: {spec.tokens_per_step:.2f} with jacobi k {k} "
              "(plain decoding: 1)",
              f"output tokens/s:        {plain.tokens_per_s:.1f} plain, "
              f"{spec.tokens_per_s:.1f} jacobi",
              f"speed-up:               {speedup:.2f}x"]
    return "\n".join(lines)


def _model_dir(name_or_path: str) -> str:
    """A checkpoint name of ``vllm_cllm.runtime.checkpoints`` (prepared if missing) or a path."""
    if os.path.isdir(name_or_path):
        return name_or_path
    from vllm_cllm.runtime.checkpoints import model_path

    return str(model_path(name_or_path))


def _quiet(verbose: bool) -> None:
    """CPU-build settings (``apply_cpu_env``) and, unless ``verbose``, vLLM's errors only, so
    that the report is not lost among engine start-up logs; the user's exports win."""
    import warnings

    from vllm_cllm.runtime.engine import apply_cpu_env

    apply_cpu_env()
    if not verbose:
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        warnings.filterwarnings("ignore", category=FutureWarning)


def run_demo(args: argparse.Namespace) -> int:
    _quiet(args.verbose)
    from transformers import AutoTokenizer

    model = _model_dir(args.model)
    spec = {"method": "jacobi", "num_speculative_tokens": args.k}
    problems = demo_problems(args.problems)
    tokenizer = AutoTokenizer.from_pretrained(model)
    prompts = [tokenizer.apply_chat_template([{"role": "user",
                                                "content": user_message(p["question"])}],
                                              tokenize=False, add_generation_prompt=True)
               for p in problems]
    print(f"{args.model}: {len(problems)} gsm_symbolic problems (seed {SEED}, never trained "
          f"on), greedy, up to {args.max_tokens} new tokens, one at a time; plain decoding, "
          f"then speculative_config={json.dumps(spec)}", flush=True)
    start = time.perf_counter()
    plain = run_engine(model, None, prompts, args.max_tokens, "plain decoding")
    jacobi = run_engine(model, spec, prompts, args.max_tokens, f"jacobi k {args.k}")
    print(report(problems, plain, jacobi, args.k))
    print(f"(the two engines ran one after the other, {time.perf_counter() - start:.0f} s in "
          "all; `vllm-cllm bench` compares in lock step)")
    return 0 if plain.tokens == jacobi.tokens else 1


def serve_env() -> dict[str, str]:
    """The server's environment: the CPU settings (vLLM's own multiprocessing kept) and the
    ``ray`` wheel's jemalloc preloaded where it is installed (docs/platform-cpu.md)."""
    from vllm_cllm.runtime.engine import CPU_ENV
    from vllm_cllm.runtime.server import bundled_jemalloc

    env = {k: v for k, v in os.environ.items() if k != "VLLM_ENABLE_V1_MULTIPROCESSING"}
    for key, value in CPU_ENV.items():
        if key != "VLLM_ENABLE_V1_MULTIPROCESSING":
            env.setdefault(key, value)
    lib = bundled_jemalloc()
    if lib and "LD_PRELOAD" not in env:
        env["LD_PRELOAD"] = lib
    return env


def spec_counters(metrics: dict[str, float]) -> tuple[float, float]:
    """Drafts and accepted draft tokens summed over labels, from ``read_metrics``."""
    from vllm_cllm.runtime.server import metric_total

    return (metric_total(metrics, "vllm:spec_decode_num_drafts_total"),
            metric_total(metrics, "vllm:spec_decode_num_accepted_tokens_total"))


def ask(base_url: str, question: str, max_tokens: int) -> str:
    """One greedy chat completion from the server (the OpenAI API over plain HTTP)."""
    import urllib.request

    body = {"model": "model", "temperature": 0, "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": user_message(question)}]}
    request = urllib.request.Request(base_url + "/v1/chat/completions",
                                     data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as resp:
        return json.loads(resp.read())["choices"][0]["message"]["content"]


def run_serve(args: argparse.Namespace) -> int:
    import subprocess
    import tempfile

    from vllm_cllm.runtime.server import read_metrics, serve_command, stop_server, wait_healthy

    model = _model_dir(args.model)  # the server logs to its own file, at vLLM's level
    spec = {"method": "jacobi", "num_speculative_tokens": args.k}
    command = serve_command(model, args.port, "--speculative-config", json.dumps(spec))
    log_path = args.log or os.path.join(tempfile.gettempdir(), f"vllm-cllm-serve-{args.port}.log")
    print("$ " + " ".join(command[:3]) + " ... --speculative-config '" + json.dumps(spec) + "'")
    print(f"starting the server (log: {log_path}) ...", flush=True)
    log = open(log_path, "w")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(command, env=serve_env(), stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    base = f"http://127.0.0.1:{args.port}"
    try:
        wait_healthy(proc, base, timeout_s=600, log_path=log_path)
        problem = demo_problems(1)[0]
        print(f"asking: {problem['question']}\n(reference answer: {problem['answer']})")
        try:
            answer = ask(base, problem["question"], args.max_tokens)
        except OSError as exc:  # HTTP errors included: the server's log says why
            print(f"vllm-cllm demo: the server did not answer ({exc}); log: {log_path}",
                  file=sys.stderr)
            return 1
        drafts, accepted = spec_counters(read_metrics(base))
        print(_indent(answer))
        print(f"tokens per verify step: {1 + accepted / drafts if drafts else 1.0:.2f} "
              f"(vllm:spec_decode_* on {base}/metrics)")
        if args.once:
            return 0
        print(f"serving the demo CLLM with jacobi at {base}/v1 (model name \"model\"); "
              "Ctrl-C stops it", flush=True)
        proc.wait()
        return proc.returncode or 0
    except KeyboardInterrupt:
        return 0
    except (RuntimeError, TimeoutError) as exc:  # the server exited or never became healthy
        print(f"vllm-cllm demo: {exc}", file=sys.stderr)
        return 1
    finally:
        stop_server(proc)
        log.close()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--serve", action="store_true", help="serve the same model and "
                        "speculative config with vLLM's OpenAI-compatible server instead, ask "
                        "it one problem, and keep serving until Ctrl-C")
    parser.add_argument("--problems", type=int, default=4, help="problems (default 4)")
    parser.add_argument("--max-tokens", type=int, default=128, help="new tokens per answer "
                        "(default 128)")
    parser.add_argument("--k", type=int, default=15, help="num_speculative_tokens (default 15)")
    parser.add_argument("--model", default=DEMO_MODEL, help="checkpoint name or directory "
                        f"(default {DEMO_MODEL})")
    parser.add_argument("--port", type=int, default=8000, help="--serve: port (default 8000)")
    parser.add_argument("--once", action="store_true", help="--serve: stop after the answer")
    parser.add_argument("--log", default=None, help="--serve: the server's log file")
    parser.add_argument("--verbose", action="store_true", help="keep vLLM's info logs")


def main(args: argparse.Namespace) -> int:
    if args.problems < 1 or args.max_tokens < 1 or args.k < 1:
        print("vllm-cllm demo: --problems, --max-tokens and --k must be 1 or more",
              file=sys.stderr)
        return 2
    return run_serve(args) if args.serve else run_demo(args)
