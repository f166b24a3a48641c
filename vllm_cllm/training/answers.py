"""The target's greedy answers, generated with vLLM in batches, cached as JSON lines."""

from __future__ import annotations

import json
from pathlib import Path


def generate_answers(model: str, prompts: list[str], max_new_tokens: int, cache: Path
                     ) -> list[tuple[list[int], list[int]]]:
    """(prompt_ids, answer_ids) per prompt; answers already in ``cache`` are not regenerated."""
    from vllm import SamplingParams

    from vllm_cllm.runtime import with_engine

    cache.parent.mkdir(parents=True, exist_ok=True)
    known = {}
    if cache.exists():
        for line in cache.read_text().splitlines():
            row = json.loads(line)
            known[row["prompt"]] = (row["prompt_ids"], row["answer_ids"])
    missing = [p for p in dict.fromkeys(prompts) if p not in known]
    if missing:
        def run(llm):
            params = SamplingParams(temperature=0.0, max_tokens=max_new_tokens)
            return llm.generate(missing, params)

        with cache.open("a") as f:
            for out in with_engine(model, None, run):
                row = {"prompt": out.prompt, "prompt_ids": list(out.prompt_token_ids),
                       "answer_ids": list(out.outputs[0].token_ids)}
                known[out.prompt] = (row["prompt_ids"], row["answer_ids"])
                f.write(json.dumps(row) + "\n")
    return [known[p] for p in prompts]
