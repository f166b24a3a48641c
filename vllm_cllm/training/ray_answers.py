"""The answer step of trajectory data over a Ray cluster: one vLLM engine per Ray actor.

Greedy answers are the only part of the data step that needs the model at scale (noise states
need no forward pass), so this is what spreads over a cluster. Prompts are dealt round-robin
to ``num_workers`` actors; each runs the single-machine answer step
(``vllm_cllm.training.answers``) on its share, and the rows come back in prompt order, so
the dataset equals the one-machine one.
Connects to the cluster in ``RAY_ADDRESS`` (or starts a local one); every node needs this
package installed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

#: What one actor runs on its share: (model, prompts, max_new_tokens) → rows.
AnswerRows = Callable[[str, list[str], int], list[dict]]


def _answer_worker_class() -> Any:
    import ray

    @ray.remote(num_cpus=1)
    class AnswerWorker:
        """Holds nothing between calls: each call builds, uses and frees one engine."""

        def answer_rows(self, rows: AnswerRows, model: str, prompts: list[str],
                        max_new_tokens: int) -> list[dict]:
            return rows(model, prompts, max_new_tokens)

    return AnswerWorker


def answer_rows_on_ray(answer_step: AnswerRows, model: str, prompts: list[str],
                       max_new_tokens: int, num_workers: int) -> list[dict]:
    """``answer_step`` (the single-machine answer step, sent to the actors by reference) on
    each actor's share, the rows in prompt order."""
    import ray

    if not ray.is_initialized():
        ray.init(ignore_reinit_error=True)
    shares = [share for share in (prompts[i::num_workers] for i in range(num_workers)) if share]
    worker_class = _answer_worker_class()
    workers = [worker_class.remote() for _ in shares]
    results = ray.get([w.answer_rows.remote(answer_step, model, share, max_new_tokens)
                       for w, share in zip(workers, shares, strict=True)])
    for worker in workers:
        ray.kill(worker)
    by_prompt = {row["prompt"]: row for rows in results for row in rows}
    return [by_prompt[p] for p in prompts]
