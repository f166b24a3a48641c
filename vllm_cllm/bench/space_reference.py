"""The paper's SPACE auto-correct decoding, in plain PyTorch/transformers (batch 1, greedy).

Measures what the vLLM layout (:mod:`vllm_cllm.proposers.space`) gives up. Per step the model sees

    [committed tokens not yet cached] + [G_0, c_0, G_1, c_1, ..., c_{k-1}, G_k]

where each mask group ``G_i`` is k masks. Attention is causal except that every mask group
is hidden from all tokens after it, and positions count visible keys: candidate ``c_i`` sees
the committed tokens and ``c_0..c_{i-1}`` (so verification is the plain model's), and group
``G_i`` sees exactly the committed tokens plus ``c_0..c_{i-1}``. With ``a`` candidates
accepted, the next candidates come from ``G_a`` — conditioned on the accepted prefix for
*every* a, where the vLLM layout has them only when all candidates were accepted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class ReferenceResult:
    tokens: list[int]
    steps: int

    @property
    def tokens_per_step(self) -> float:
        return len(self.tokens) / self.steps if self.steps else 0.0


def block_layout(cached: int, committed_new: int, candidates: list[int], mask_id: int, k: int
                 ) -> tuple[list[int], list[int], torch.Tensor, list[int]]:
    """Input ids (block only), positions, boolean visibility and the candidate rows.

    Rows/columns cover the new tokens: ``committed_new`` committed tokens (causal), then the
    block. The cached prefix (``cached`` tokens) is visible to every row. Returns
    (block ids, positions of all new rows, [new, cached + new] mask, row of each G_i start).
    """
    base = cached + committed_new  # tokens committed so far
    ids: list[int] = []
    kinds: list[tuple[str, int]] = []  # ("g", i) group member, ("c", i) candidate
    for i in range(k + 1):
        ids += [mask_id] * k
        kinds += [("g", i)] * k
        if i < k:
            ids.append(candidates[i])
            kinds.append(("c", i))
    new = committed_new + len(ids)
    visible = torch.zeros((new, cached + new), dtype=torch.bool)
    visible[:, :cached] = True
    for r in range(committed_new):
        visible[r, cached:cached + r + 1] = True
    positions = list(range(cached, base))
    group_start = []
    for j, (kind, i) in enumerate(kinds):
        r = committed_new + j
        visible[r, cached:cached + committed_new] = True  # all committed tokens
        for jj in range(j + 1):  # earlier candidates; a mask also sees its own group
            kind2, i2 = kinds[jj]
            if kind2 == "c" or (kind == "g" and kind2 == "g" and i2 == i):
                visible[r, cached + committed_new + jj] = True
        if kind == "g" and (j == 0 or kinds[j - 1] != ("g", i)):
            group_start.append(r)
        positions.append(int(visible[r].sum()) - 1)
    return ids, positions, visible, group_start


@torch.no_grad()
def space_generate(model: Any, prompt_ids: list[int], mask_id: int, k: int,
                   max_new_tokens: int, eos_token_id: int | None = None) -> ReferenceResult:
    """Greedy SPACE decoding of one prompt; output equals plain greedy decoding."""
    from transformers import DynamicCache

    device = next(model.parameters()).device
    cache = DynamicCache(config=model.config)
    committed = list(prompt_ids)
    cached = 0
    candidates = [mask_id] * k  # the paper starts from masks
    out: list[int] = []
    steps = 0
    while len(out) < max_new_tokens:
        new_committed = committed[cached:]
        ids, positions, visible, group_start = block_layout(cached, len(new_committed),
                                                            candidates, mask_id, k)
        additive = torch.zeros(visible.shape, dtype=torch.float32)
        additive.masked_fill_(~visible, torch.finfo(torch.float32).min)
        logits = model(input_ids=torch.tensor([new_committed + ids], device=device),
                       position_ids=torch.tensor([positions], device=device),
                       attention_mask=additive[None, None].to(device), past_key_values=cache,
                       use_cache=True).logits[0].float()
        logits[:, mask_id] = float("-inf")
        predicted = logits.argmax(-1).tolist()
        steps += 1
        # walk the candidates: c_i is accepted iff the model's choice before it equals it
        before = len(new_committed) - 1  # row of the last committed token
        accepted = 0
        emitted: list[int] = []
        while True:
            token = predicted[before]
            if accepted < k and candidates[accepted] == token:
                emitted.append(token)
                before = len(new_committed) + (accepted + 1) * (k + 1) - 1  # row of c_accepted
                accepted += 1
                if token == eos_token_id:
                    break
                continue
            emitted.append(token)  # the correction (or bonus) token
            break
        stale = cache.get_seq_length() - len(committed)
        if stale > 0:
            cache.crop(-stale)  # keep KV of committed tokens only
        cached = len(committed)
        room = max_new_tokens - len(out)
        emitted = emitted[:room]
        if eos_token_id is not None and eos_token_id in emitted:
            emitted = emitted[:emitted.index(eos_token_id) + 1]
        out += emitted
        committed += emitted
        if emitted[-1] == eos_token_id:
            break
        start = group_start[accepted]  # G_accepted: conditioned on the accepted prefix
        candidates = predicted[start:start + k]
    return ReferenceResult(tokens=out, steps=steps)
