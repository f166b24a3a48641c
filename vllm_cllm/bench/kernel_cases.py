"""Cases and a plain-Python reference for the batched fixed-point step, shared by the test
suite and ``vllm-cllm device-check``: edge cases (ties, NaN, infinities, masks, k = 0, empty
batches, every logits dtype) and seeded random ragged batches. torch only, never vLLM.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from vllm_cllm.kernels import fixed_point_step


@dataclass
class Case:
    logits: torch.Tensor
    drafts: torch.Tensor
    num: torch.Tensor
    k: int
    num_mask: torch.Tensor | None = None


def first_argmax(row: list[float]) -> int:
    """torch.argmax semantics: the first NaN, else the first maximal entry."""
    for j, x in enumerate(row):
        if math.isnan(x):
            return j
    return row.index(max(row))


def reference(case: Case) -> tuple[list[int], list[int], list[list[int]]]:
    """Loop version of the capture's rule (``shifted_block``): tail = row[a + 1:], cut to k."""
    if case.logits.dim() == 2:
        argmax = [first_argmax(r) for r in case.logits.double().tolist()]
    else:
        argmax = case.logits.tolist()
    drafts, accepted, tails, d0, r0 = case.drafts.tolist(), [], [], 0, 0
    for i, n in enumerate(case.num.tolist()):
        m = 0 if case.num_mask is None else min(max(int(case.num_mask[i]), 0), n)
        real = n - m
        row, mine = argmax[r0:r0 + n + 1], drafts[d0:d0 + n]
        a = 0
        while a < real and mine[a] == row[a]:
            a += 1
        tail = row[a + 1:real + 1] if a < real else row[real + 1:]
        accepted.append(a)
        tails.append(tail[:case.k])
        d0, r0 = d0 + n, r0 + n + 1
    return argmax, accepted, tails


def check_against_reference(case: Case, backend: str) -> None:
    """Raise AssertionError unless ``backend``'s step equals :func:`reference` on ``case``."""
    out = fixed_point_step(case.logits, case.drafts, case.num, case.k,
                           num_mask=case.num_mask, backend=backend)
    argmax, accepted, tails = reference(case)
    batch = case.num.shape[0]
    assert out.argmax.dtype == torch.int64 and out.argmax.tolist() == argmax
    assert out.accepted.dtype == torch.int32 and out.accepted.tolist() == accepted
    assert out.next_len.dtype == torch.int32 and out.next_len.tolist() == [len(t) for t in tails]
    assert out.next_draft.dtype == torch.int64 and tuple(out.next_draft.shape) == (batch, case.k)
    assert out.next_draft.tolist() == [t + [-1] * (case.k - len(t)) for t in tails]


def make_case(num: list[int], vocab: int, k: int, seed: int, accept_rate: float = 0.6,
              dtype: torch.dtype = torch.float32, masks: list[int] | None = None) -> Case:
    """Random logits; each draft copies its row's argmax with ``accept_rate``, else is random."""
    gen = torch.Generator().manual_seed(seed)
    rows = sum(num) + len(num)
    logits = torch.randn(rows, vocab, generator=gen).to(dtype)
    argmax = logits.argmax(-1)
    drafts, r0 = [], 0
    for n in num:
        for j in range(n):
            hit = torch.rand(1, generator=gen).item() < accept_rate
            drafts.append(int(argmax[r0 + j]) if hit else
                          int(torch.randint(vocab, (1,), generator=gen)))
        r0 += n + 1
    return Case(logits, torch.tensor(drafts, dtype=torch.int64),
                torch.tensor(num, dtype=torch.int32), k,
                None if masks is None else torch.tensor(masks, dtype=torch.int32))


def edge_cases() -> dict[str, Case]:
    cases: dict[str, Case] = {}
    cases["no_drafts"] = make_case([0, 0, 0], 50, 4, 1)
    cases["empty_batch"] = make_case([], 50, 4, 2)
    all_acc = make_case([3, 5], 40, 4, 3, accept_rate=1.0)
    cases["all_accepted"] = all_acc
    first_rej = make_case([4, 6], 40, 8, 4, accept_rate=1.0)
    argmax = first_rej.logits.argmax(-1)
    first_rej.drafts[0] = (argmax[0] + 1) % 40  # request 0: d_1 is wrong
    first_rej.drafts[4] = (argmax[5] + 1) % 40  # request 1 (rows start at 5): d_1 is wrong
    cases["first_rejected"] = first_rej
    cases["vocab_not_multiple_of_block"] = make_case([2, 3, 1], 1024 + 1000, 4, 5)
    cases["vocab_below_block"] = make_case([3, 2], 37, 4, 6)
    cases["k_128"] = make_case([150, 130, 2], 64, 128, 7, accept_rate=0.3)
    cases["zero_draft_neighbours"] = make_case([4, 0, 5, 0], 80, 4, 8)
    cases["k_0"] = make_case([3, 2], 30, 0, 9)
    cases["k_above_tail"] = make_case([2, 1], 30, 16, 10, accept_rate=0.0)
    ties = make_case([3, 2], 3000, 4, 11)
    ties.logits = torch.randint(0, 3, ties.logits.shape).float()  # many maximal entries
    ties.logits[0] = 1.5  # a whole row of equal values: index 0
    ties.logits[1, 2500:] = 7.0  # first maximum lies past the first block
    cases["argmax_ties"] = ties
    special = make_case([2, 2], 2100, 4, 12)
    special.logits[0] = float("-inf")
    special.logits[1, 1500] = float("nan")
    special.logits[1, 1800] = float("nan")
    special.logits[2, 5] = float("inf")
    special.logits[2, 7] = float("inf")
    cases["inf_and_nan"] = special
    int_in = make_case([3, 0, 2], 20, 4, 13)
    int_in.logits = int_in.logits.argmax(-1).to(torch.int32)
    cases["argmax_input"] = int_in
    cases["int32_drafts"] = make_case([3, 2], 60, 4, 14)
    cases["int32_drafts"].drafts = cases["int32_drafts"].drafts.to(torch.int32)
    cases["float16"] = make_case([3, 4], 1500, 4, 15, dtype=torch.float16)
    cases["float64"] = make_case([3, 4], 1500, 4, 16, dtype=torch.float64)
    cases["bfloat16"] = make_case([2, 5], 1100, 4, 19, dtype=torch.bfloat16)
    cases["mask_slots"] = make_case([5, 5, 4, 3, 0], 50, 8, 17, accept_rate=1.0,
                                    masks=[2, 0, 4, 1, 0])
    rej = make_case([6, 5], 50, 8, 18, accept_rate=1.0, masks=[3, 9])
    rej.drafts[1] = (rej.logits[1].argmax() + 1) % 50  # a real draft rejected before masks
    cases["mask_slots_rejected"] = rej
    return cases


def random_cases() -> dict[str, Case]:
    gen = torch.Generator().manual_seed(0)
    cases = {}
    for seed in range(6):
        batch = int(torch.randint(1, 12, (1,), generator=gen))
        num = torch.randint(0, 9, (batch,), generator=gen).tolist()
        vocab = int(torch.randint(2, 2600, (1,), generator=gen))
        k = int(torch.randint(1, 10, (1,), generator=gen))
        masks = torch.randint(0, 3, (batch,), generator=gen).tolist() if seed % 2 else None
        cases[f"random_{seed}"] = make_case(num, vocab, k, 100 + seed,
                                            accept_rate=[0.3, 0.7, 0.95][seed % 3], masks=masks)
    return cases
