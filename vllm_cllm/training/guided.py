"""Guided trajectory states: a model's pure Jacobi drafts along another model's greedy answer.

On-policy states (:mod:`.onpolicy`) pair the model's drafts with the model's own greedy
answer, so a model that has drifted (its answers loop, say) is trained on its own course.
Here the course is fixed by a teacher's answer (the base model's, cached): the student
drafts as ``jacobi`` with ``fill: tail`` does in vLLM — its predictions behind the accepted
tokens, a block of context tokens when none are left — but acceptance and the committed
tokens follow the teacher's answer. The noise in each state is the student's own; the fixed
point it is trained toward is the teacher's text. The replay runs in transformers over a KV
cache (one forward of the draft per step), so the records are the same
:class:`~.records.TrajectoryRecord` rows as on-policy ones.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from vllm_cllm.core.predictions import shifted_block
from vllm_cllm.core.tokens import matched_prefix
from vllm_cllm.sources.restart import RandomContextFill
from vllm_cllm.training.onpolicy import prompt_records
from vllm_cllm.training.records import TrajectoryRecord


def guided_drafts(model: Any, courses: list[tuple[list[int], list[int]]], n: int, k: int,
                  restart_seed: int = 0) -> list[list[tuple[int, list[int]]]]:
    """Per (prompt, answer): (committed tokens before the draft, draft) for every verify step
    of pure Jacobi decoding with ``model`` along the answer, while a full n-token block
    remains after the draft.

    The first draft follows the prefill's token; a draft is the previous step's predictions
    behind the accepted tokens and the committed one (``shifted_block``), or, when none are
    left, k tokens drawn from the context (the proposer's restart). A step commits the
    draft's prefix that matches the answer and the answer's next token.

    The courses run as one batch over one KV cache: every step appends each row's input
    (its last committed token, the draft, padding up to k + 1), and a 2-D attention mask
    keeps only the committed tokens visible (rejected draft tokens and padding stay in the
    cache, masked); rows leave the batch when they are done.
    """
    import torch

    restart = RandomContextFill(restart_seed)
    cleans = [prompt + answer for prompt, answer in courses]
    committed = [len(prompt) + 1 for prompt, _ in courses]  # the prefill samples one token
    drafts: list[list[tuple[int, list[int]]]] = [[] for _ in courses]
    rows = [i for i, clean in enumerate(cleans) if committed[i] + n <= len(clean)]
    if not rows:
        return drafts
    # the prefill, right-padded (a padded query still sees its row's tokens: no empty rows)
    width = max(committed[i] - 1 for i in rows)
    ids = torch.zeros((len(rows), width), dtype=torch.long)
    visible = torch.zeros((len(rows), width), dtype=torch.long)
    for r, i in enumerate(rows):
        ids[r, :committed[i] - 1] = torch.tensor(cleans[i][:committed[i] - 1])
        visible[r, :committed[i] - 1] = 1
    positions = torch.arange(width).expand(len(rows), -1)
    tails = {i: np.empty(0, dtype=np.int64) for i in rows}
    with torch.no_grad():
        cache = model(input_ids=ids, attention_mask=visible, position_ids=positions,
                      use_cache=True).past_key_values
        while rows:
            ids = torch.zeros((len(rows), k + 1), dtype=torch.long)
            step_drafts = []
            for r, i in enumerate(rows):
                tail = tails[i]
                draft = tail[:k] if len(tail) else restart(np.asarray(cleans[i][:committed[i]]), k)
                step_drafts.append(draft)
                ids[r, :len(draft) + 1] = torch.tensor([cleans[i][committed[i] - 1],
                                                        *draft.tolist()])
            positions = (torch.tensor([committed[i] - 1 for i in rows]).unsqueeze(1)
                         + torch.arange(k + 1))
            mask = torch.cat([visible, torch.ones((len(rows), k + 1), dtype=torch.long)],
                             dim=1)  # the step's own tokens: causal among themselves
            new = torch.zeros((len(rows), k + 1), dtype=torch.long)
            logits = model(input_ids=ids, attention_mask=mask, position_ids=positions,
                           past_key_values=cache, use_cache=True).logits
            predictions = logits.argmax(-1).numpy()
            keep = []
            for r, (i, draft) in enumerate(zip(rows, step_drafts, strict=True)):
                start = committed[i]
                accepted = matched_prefix(draft, cleans[i][start:start + len(draft)])
                drafts[i].append((start, draft.tolist()))
                new[r, :accepted + 1] = 1  # the last committed token and the accepted ones
                committed[i] = start + accepted + 1
                tails[i] = shifted_block(predictions[r, :len(draft) + 1], accepted + 1)
                if committed[i] + n <= len(cleans[i]):
                    keep.append(r)
            visible = torch.cat([visible, new], dim=1)
            if len(keep) < len(rows):
                index = torch.tensor(keep, dtype=torch.long)
                cache.batch_select_indices(index)
                visible = visible[index]
                rows = [rows[r] for r in keep]
    return drafts


def guided_batch_records(model: Any, items: list[tuple[int, list[int], list[int]]], *, n: int,
                         max_states: int, seed: int) -> list[list[TrajectoryRecord]]:
    """Each (prompt_id, prompt, answer)'s records from its guided drafts, replayed in one
    batch (as :func:`.onpolicy.prompt_records`: states that differ from their full n-token
    fixed point, at most ``max_states`` a prompt, a seeded choice kept in decoding order);
    deterministic in (seed, prompt_id)."""
    drafts = guided_drafts(model, [(prompt, answer) for _, prompt, answer in items], n, n - 1)
    return [prompt_records(pid, prompt, answer, course, n, max_states,
                           np.random.default_rng([seed, pid]))
            for (pid, prompt, answer), course in zip(items, drafts, strict=True)]
