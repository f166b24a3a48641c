"""Grade-school math prompts from ``reasoning-gym``'s GSM8K templates (seeded, offline)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

#: the evaluation seed of every gsm_symbolic benchmark here; the demos train on seed 1
GSM_EVAL_SEED = 1000

INSTRUCTION = "Solve the problem step by step, then give the final answer as 'Answer: <number>'."


def gsm_problems(count: int, seed: int) -> list[dict[str, Any]]:
    """``count`` problems from ``gsm_symbolic`` with ``seed`` (training and eval seeds differ)."""
    import reasoning_gym

    dataset = reasoning_gym.create_dataset("gsm_symbolic", size=count, seed=seed)
    return [{"question": item["question"], "answer": str(item["answer"])} for item in dataset]


def check_training_seed(seed: int) -> None:
    """Refuse the evaluation seed as a training seed (ValueError)."""
    if seed == GSM_EVAL_SEED:
        raise ValueError(f"seed {GSM_EVAL_SEED} is the evaluation seed of every gsm benchmark "
                         "here: train on another one")


def training_problems(count: int, seed: int, exclude_eval: int = 0) -> list[dict[str, Any]]:
    """``count`` problems of a training ``seed``, less any whose question is verbatim among the
    first ``exclude_eval`` evaluation problems: gsm_symbolic fills a limited set of templates
    with small numbers, so two seeds can draw the same question (seed 1's 400 prompts hold one
    of seed 1000's first 40)."""
    check_training_seed(seed)
    problems = gsm_problems(count, seed)
    if exclude_eval <= 0:
        return problems
    held_out = {p["question"] for p in gsm_problems(exclude_eval, GSM_EVAL_SEED)}
    return [p for p in problems if p["question"] not in held_out]


def unseen_problems(count: int, seed: int, trained_on: Iterable[tuple[int, int]]
                    ) -> list[dict[str, Any]]:
    """The first ``count`` problems of ``seed`` whose question is not verbatim among the first
    ``n`` problems of any ``(training seed, n)`` in ``trained_on``: an evaluation set a model
    trained on those prompts has never seen (seed 1000's 34th question is seed 1's 287th)."""
    trained = {p["question"] for training_seed, n in trained_on
               for p in gsm_problems(n, training_seed)}
    size = count
    while True:
        unseen = [p for p in gsm_problems(size, seed) if p["question"] not in trained]
        if len(unseen) >= count:
            return unseen[:count]
        size += count - len(unseen)


#: how a training prompt is phrased: with the recipes' instruction, the bare question (as
#: users ask), or the two alternating from problem to problem
PROMPT_FORMATS = ("instruction", "bare", "both")


def chat_prompt(tokenizer: Any, question: str, instructed: bool = True) -> str:
    """The question in the model's chat template, with :data:`INSTRUCTION` or bare."""
    content = f"{question}\n{INSTRUCTION}" if instructed else question
    return tokenizer.apply_chat_template([{"role": "user", "content": content}], tokenize=False,
                                         add_generation_prompt=True)


def format_prompts(tokenizer: Any, questions: list[str], prompt_format: str = "instruction",
                   first: int = 0) -> list[str]:
    """Chat prompts in one of :data:`PROMPT_FORMATS`; with ``both`` the seed's even-numbered
    problems (counting from ``first``'s place in the seed) carry the instruction and the odd
    ones are bare, so a later round's slice keeps the alternation."""
    if prompt_format not in PROMPT_FORMATS:
        raise ValueError(f"prompt format must be one of {PROMPT_FORMATS}; got {prompt_format!r}")
    return [chat_prompt(tokenizer, q, prompt_format == "instruction"
                        or (prompt_format == "both" and (first + i) % 2 == 0))
            for i, q in enumerate(questions)]


def final_answer(text: str) -> str | None:
    """The number after 'Answer:' or, failing that, the last number in the text."""
    match = re.search(r"Answer:\s*\$?(-?[\d,]*\.?\d+)", text)
    numbers = [match.group(1)] if match else re.findall(r"-?[\d,]*\.?\d+", text)
    if not numbers:
        return None
    value = numbers[-1].replace(",", "").rstrip(".")
    return value[:-2] if value.endswith(".0") else value
