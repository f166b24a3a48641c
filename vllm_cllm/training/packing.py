"""One forward pass per prompt for the whole CLLM objective (sequence packing).

A prompt's clean sequence (prompt + greedy answer) and every noisy block state of its
trajectory records go into one packed row. A state is packed from its first wrong token on
(the tokens before it equal the clean sequence); a 4-D attention mask lets its tokens see the
clean sequence up to that token and the earlier tokens of the same state, with the positions
they would have in an unpacked sequence. So one forward gives:

* the AR loss on the clean sequence (with gradient);
* the teacher: the model's output at every fixed point is the clean sequence's own output
  there (causal attention), detached;
* the student: its output on each noisy state.

Unpacked, this costs one forward of context + state per state plus a teacher and an AR pass;
packed, the context is encoded once per prompt, which is what makes CPU training affordable.
The logits for block position 0 come from the context alone (identical for student and
teacher), so a state contributes its first n-1 tokens and positions 1..n-1 of the loss.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from vllm_cllm.training.losses import block_mask
from vllm_cllm.training.trajectories import TrajectoryRecord


@dataclass
class PackedExample:
    """Token ids, positions and attention of one packed row plus where the loss terms live.

    student_index / teacher_index: [S, n-1] row positions whose logits predict block
    positions 1..n-1 on a state / at the fixed point; loss_mask: [S, n-1] positions that
    count; answer_start / clean_len: the clean sequence's answer span (AR labels).
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    attention: torch.Tensor  # [L, L] bool, True = may attend
    student_index: torch.Tensor
    teacher_index: torch.Tensor
    loss_mask: torch.Tensor
    answer_start: int
    clean_len: int


def _state_pairs(records: list[TrajectoryRecord], consistency: str, states_per_block: int,
                 rng: np.random.Generator) -> list[tuple[TrajectoryRecord, list[int], list[int]]]:
    """(record, student state, teacher target) triples; ``states_per_block`` caps each block."""
    pairs = []
    for r in records:
        chosen = range(len(r.states))
        if 0 < states_per_block < len(r.states):
            chosen = sorted(rng.choice(len(r.states), states_per_block, replace=False).tolist())
        for i in chosen:
            local = consistency == "local" and i + 1 < len(r.states)
            pairs.append((r, r.states[i], r.states[i + 1] if local else r.fixed_point))
    return pairs


def pack_prompt(records: list[TrajectoryRecord], *, consistency: str = "global",
                states_per_block: int = 0, seed: int = 0, window: int = 0) -> PackedExample:
    """Pack all records of one prompt (they share prompt and greedy answer).

    ``window`` > 0 (see :func:`~vllm_cllm.training.losses.block_mask`): the loss covers the
    first ``window`` positions behind a state's first wrong token, so only the state tokens
    those positions read are packed — more states per forward for the same compute.
    """
    first = records[0]
    clean = first.context_ids[:first.prompt_len] + first.answer_ids
    n = len(first.fixed_point)
    rng = np.random.default_rng([seed, first.prompt_id])
    pairs = _state_pairs(records, consistency, states_per_block, rng)
    ids, positions = list(clean), list(range(len(clean)))
    spans: list[tuple[int, int, int]] = []  # (packed row, block start, length) per segment

    def append(start: int, tokens: list[int]) -> int:
        row = len(ids)
        ids.extend(tokens)
        positions.extend(range(start, start + len(tokens)))
        spans.append((row, start, len(tokens)))
        return row

    # block position 0 is predicted from the context alone: the loss covers positions 1..n-1
    loss_mask = block_mask(
        torch.tensor([state for _, state, _ in pairs], dtype=torch.long).reshape(-1, n),
        torch.tensor([target for _, _, target in pairs], dtype=torch.long).reshape(-1, n),
        window)[:, 1:]
    student_index, teacher_index = [], []
    for (r, state, target), loss_row in zip(pairs, loss_mask, strict=True):
        start = len(r.context_ids)
        if r.context_ids != clean[:start] or r.fixed_point != clean[start:start + n]:
            raise ValueError(f"prompt {r.prompt_id} block {r.block}: record does not match "
                             "its prompt's greedy answer")
        # loss row j reads the state's first j + 1 tokens; the tokens before the first wrong
        # one equal the clean sequence there, so the segment starts at the first wrong token
        # and reads the clean sequence before it: the same logits, fewer tokens
        first_wrong = next((i for i, (a, b) in enumerate(zip(state, r.fixed_point, strict=True))
                            if a != b), n - 1)
        if loss_row.any():  # a local target may diverge earlier than the fixed point
            first_wrong = min(first_wrong, int(loss_row.nonzero().min()))
        first_wrong = min(first_wrong, n - 2)
        length = n - 1
        if window > 0 and loss_row.any():
            length = int(loss_row.nonzero().max()) + 1
        row = append(start + first_wrong, state[first_wrong:length])
        # positions outside the packed tokens are outside the loss mask; they point at the
        # segment's first or last row only to keep the index rectangular
        student_index.append([row + min(max(j - first_wrong, 0), length - 1 - first_wrong)
                              for j in range(n - 1)])
        # the clean logits at start..start+n-2 predict the fixed point's positions 1..n-1;
        # a separate teacher segment is needed only for another target (local loss)
        teacher_row = start if target == r.fixed_point else append(start, target[:n - 1])
        teacher_index.append(range(teacher_row, teacher_row + n - 1))

    attention = torch.zeros(len(ids), len(ids), dtype=torch.bool)
    attention[:len(clean), :len(clean)] = torch.tril(torch.ones(len(clean), len(clean),
                                                                 dtype=torch.bool))
    for row, start, span in spans:
        attention[row:row + span, :start] = True
        attention[row:row + span, row:row + span] = torch.tril(
            torch.ones(span, span, dtype=torch.bool))
    return PackedExample(
        input_ids=torch.tensor(ids), position_ids=torch.tensor(positions), attention=attention,
        student_index=torch.tensor(student_index, dtype=torch.long).reshape(-1, n - 1),
        teacher_index=torch.tensor(teacher_index, dtype=torch.long).reshape(-1, n - 1),
        loss_mask=loss_mask.reshape(-1, n - 1),
        answer_start=first.prompt_len, clean_len=len(clean))


def group_by_prompt(records: list[TrajectoryRecord]) -> list[list[TrajectoryRecord]]:
    """Records of each prompt together, in prompt order."""
    groups: dict[int, list[TrajectoryRecord]] = {}
    for r in records:
        groups.setdefault(r.prompt_id, []).append(r)
    return [sorted(g, key=lambda r: r.block) for _, g in sorted(groups.items())]
