"""Collapse checks for a trained CLLM: accuracy, repetition and drift from the base model.

A consistency-trained model can get fast by repeating itself; these figures, beside the base
model's own, show whether it did: final-answer accuracy, the distinct-4-gram ratio of the
answers, and the mean negative log-likelihood of the answers under the base model.
"""

from __future__ import annotations

from typing import Any

from vllm_cllm.training.gsm import final_answer


def repeated_ngram_ends(tokens: list[int], n: int) -> list[bool]:
    """Per token: whether it completes an n-gram that already occurred earlier in ``tokens``
    (the tokens that lower the distinct-n ratio)."""
    seen: set[tuple[int, ...]] = set()
    ends = [False] * len(tokens)
    for t in range(n - 1, len(tokens)):
        gram = tuple(tokens[t - n + 1:t + 1])
        ends[t] = gram in seen
        seen.add(gram)
    return ends


def distinct_n(tokens: list[int], n: int = 4) -> float:
    """Unique n-grams / n-grams in one answer (1.0 when it is too short to repeat)."""
    grams = len(tokens) - n + 1
    return 1.0 - sum(repeated_ngram_ends(tokens, n)) / grams if grams > 0 else 1.0


def mean_distinct_n(answers: list[list[int]], n: int = 4) -> float:
    return sum(distinct_n(a, n) for a in answers) / max(len(answers), 1)


def accuracy(texts: list[str], gold: list[str]) -> float:
    """Share of answers whose final number equals the reference."""
    def same(text: str, ref: str) -> bool:
        got = final_answer(text)
        try:
            return got is not None and float(got) == float(ref)
        except ValueError:
            return got == ref

    return sum(same(t, g) for t, g in zip(texts, gold, strict=True)) / max(len(gold), 1)


def mean_nll(model_dir: str, prompts: list[list[int]], answers: list[list[int]]) -> float:
    """Mean per-token NLL of ``answers`` (after their prompts) under the model in model_dir."""
    return pooled_nll(answer_nlls(model_dir, prompts, answers), answers)


def pooled_nll(nlls: list[float], answers: list[list[int]]) -> float:
    """Mean per-token NLL from each answer's summed NLL (:func:`answer_nlls`)."""
    return sum(nlls) / max(sum(map(len, answers)), 1)


def answer_nlls(model_dir: str, prompts: list[list[int]], answers: list[list[int]]
                ) -> list[float]:
    """Each answer's summed NLL (after its prompt) under the model in model_dir; 0 if empty."""
    import torch
    from transformers import AutoModelForCausalLM

    model: Any = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    nlls = []
    with torch.no_grad():
        for prompt, answer in zip(prompts, answers, strict=True):
            if not answer:
                nlls.append(0.0)
                continue
            ids = torch.tensor([prompt + answer])
            logits = model(input_ids=ids).logits[0, len(prompt) - 1:-1]
            nlls.append(float(torch.nn.functional.cross_entropy(
                logits, torch.tensor(answer), reduction="sum")))
    return nlls
