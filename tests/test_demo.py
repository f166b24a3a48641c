"""``vllm-cllm demo``: its arguments, its problems (never trained on), its report, and one
short run of each mode."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from vllm_cllm.runtime import demo


def _args(*argv: str) -> argparse.Namespace:
    from vllm_cllm.cli import build_parser

    return build_parser().parse_args(["demo", *argv])


def test_the_arguments_and_their_defaults():
    args = _args()
    assert (args.serve, args.problems, args.max_tokens, args.k, args.model) == (
        False, 4, 128, 15, "smollm2-135m-cllm-gsm")
    args = _args("--serve", "--port", "8123", "--once", "--problems", "1")
    assert (args.serve, args.port, args.once, args.problems) == (True, 8123, True, 1)
    assert demo.main(_args("--problems", "0")) == 2  # refused before any engine starts


def test_the_prompts_are_the_recipes_format():
    from vllm_cllm.training.gsm import INSTRUCTION

    assert demo.INSTRUCTION == INSTRUCTION
    assert demo.user_message("Q?") == f"Q?\n{INSTRUCTION}"


def test_the_problems_were_never_trained_on():
    """Seed 2024 is no recipe's training seed, and none of its first problems is verbatim among
    the recipes' training prompts (seed 3: the CLLM demo's 600; seed 1: the SPACE demos' 400)."""
    from vllm_cllm.training.gsm import GSM_EVAL_SEED, gsm_problems

    assert demo.SEED not in (1, 3, GSM_EVAL_SEED)
    trained = {p["question"] for seed, n in ((3, 600), (1, 400)) for p in gsm_problems(n, seed)}
    problems = demo.demo_problems(8)
    assert [p["question"] for p in problems] == [p["question"]
                                                 for p in gsm_problems(8, demo.SEED)]
    assert not trained & {p["question"] for p in problems}


def _run(label, texts, tokens, seconds, tps):
    return demo.Run(label, texts, tokens, seconds, tps)


def test_the_report_from_fixed_runs():
    problems = [{"question": "What is 2 + 3?", "answer": "5"},
                {"question": "What is 4 * 2?", "answer": "8"}]
    plain = _run("plain decoding", ["2 + 3 = 5\nAnswer: 5", "Answer: 8"],
                 [[1, 2, 3, 4], [5, 6]], 2.0, 1.0)
    spec = _run("jacobi k 15", ["2 + 3 = 5\nAnswer: 5", "Answer: 9"],
                [[1, 2, 3, 4], [5, 7]], 0.5, 2.5)
    text = demo.report(problems, plain, spec, 15)
    assert "--- problem 1 (reference answer: 5)" in text and "    What is 4 * 2?" in text
    assert "  plain decoding (4 tokens):\n    2 + 3 = 5\n    Answer: 5" in text
    assert "  jacobi k 15 (2 tokens):\n    Answer: 9" in text
    assert text.count("token-identical: yes") == 1 and "token-identical: NO" in text
    assert "token-identical:        1 of 2 answers" in text
    assert "tokens per verify step: 2.50 with jacobi k 15" in text
    assert "output tokens/s:        3.0 plain, 12.0 jacobi" in text  # 6 tokens in 2 s, 0.5 s
    assert text.endswith("speed-up:               4.00x")


def test_the_server_counters_sum_over_labels():
    metrics = {'vllm:spec_decode_num_drafts_total{engine="0",model_name="model"}': 10.0,
               'vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="model"}': 12.0,
               'vllm:spec_decode_num_accepted_tokens_per_pos_total{position="0"}': 7.0}
    assert demo.spec_counters(metrics) == (10.0, 12.0)


def _cli(*argv: str, timeout: int) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vllm_cllm.cli", "demo", *argv],
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.engine
def test_the_demo_runs_one_problem():
    done = _cli("--problems", "1", "--max-tokens", "24", timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "token-identical:        1 of 1 answers" in done.stdout
    assert "tokens per verify step:" in done.stdout and "speed-up:" in done.stdout
    assert "plain decoding" in done.stderr and "jacobi k 15" in done.stderr  # progress bars


@pytest.mark.server
def test_the_demo_serves_and_answers(tmp_path):
    from vllm_cllm.runtime.server import free_port

    done = _cli("--serve", "--once", "--port", str(free_port()), "--max-tokens", "24",
                "--log", str(tmp_path / "serve.log"), timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr + (tmp_path / "serve.log").read_text()
    assert "asking:" in done.stdout and "tokens per verify step:" in done.stdout
