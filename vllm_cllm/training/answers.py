"""The target's greedy answers, generated with vLLM in batches, cached as JSON lines."""

from __future__ import annotations

import json
from pathlib import Path


def _answer_rows(model: str, prompts: list[str], max_new_tokens: int) -> list[dict]:
    """One vLLM engine, all ``prompts`` in one batch, greedy."""
    from vllm import SamplingParams

    from vllm_cllm.runtime.engine import with_engine

    def run(llm):
        params = SamplingParams(temperature=0.0, max_tokens=max_new_tokens)
        return [{"prompt": out.prompt, "prompt_ids": list(out.prompt_token_ids),
                 "answer_ids": list(out.outputs[0].token_ids)}
                for out in llm.generate(prompts, params)]

    return with_engine(model, None, run)


def generate_answers(model: str, prompts: list[str], max_new_tokens: int, cache: Path, *,
                     ray_workers: int = 0) -> list[tuple[list[int], list[int]]]:
    """(prompt_ids, answer_ids) per prompt; answers already in ``cache`` are not regenerated.

    ``ray_workers > 0`` spreads the missing prompts over that many Ray actors, one vLLM engine
    each (:mod:`vllm_cllm.training.ray_answers`); the cache and the result are the same.
    """
    cache.parent.mkdir(parents=True, exist_ok=True)
    known = {}
    if cache.exists():
        for line in cache.read_text().splitlines():
            row = json.loads(line)
            known[row["prompt"]] = (row["prompt_ids"], row["answer_ids"])
    missing = [p for p in dict.fromkeys(prompts) if p not in known]
    if missing:
        if ray_workers > 0:
            from vllm_cllm.training.ray_answers import answer_rows_on_ray

            rows = answer_rows_on_ray(_answer_rows, model, missing, max_new_tokens, ray_workers)
        else:
            rows = _answer_rows(model, missing, max_new_tokens)
        with cache.open("a") as f:
            for row in rows:
                known[row["prompt"]] = (row["prompt_ids"], row["answer_ids"])
                f.write(json.dumps(row) + "\n")
    return [known[p] for p in prompts]
