"""Grade-school math prompts from ``reasoning-gym``'s GSM8K templates (seeded, offline)."""

from __future__ import annotations

import re
from typing import Any

INSTRUCTION = "Solve the problem step by step, then give the final answer as 'Answer: <number>'."


def gsm_problems(count: int, seed: int) -> list[dict[str, Any]]:
    """``count`` problems from ``gsm_symbolic`` with ``seed`` (training and eval seeds differ)."""
    import reasoning_gym

    dataset = reasoning_gym.create_dataset("gsm_symbolic", size=count, seed=seed)
    return [{"question": item["question"], "answer": str(item["answer"])} for item in dataset]


def chat_prompt(tokenizer: Any, question: str) -> str:
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": f"{question}\n{INSTRUCTION}"}], tokenize=False,
        add_generation_prompt=True)


def final_answer(text: str) -> str | None:
    """The number after 'Answer:' or, failing that, the last number in the text."""
    match = re.search(r"Answer:\s*\$?(-?[\d,]*\.?\d+)", text)
    numbers = [match.group(1)] if match else re.findall(r"-?[\d,]*\.?\d+", text)
    if not numbers:
        return None
    value = numbers[-1].replace(",", "").rstrip(".")
    return value[:-2] if value.endswith(".0") else value
