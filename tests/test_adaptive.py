"""Draft sizing: the allocation rule and the cost model."""

from __future__ import annotations

import itertools

from vllm_cllm.policies.cost_model import (
    SPEC_STEP_OVERHEAD_PER_REQUEST,
    CostModel,
    draft_lengths,
    step_cost,
)


def geometric_values(first: float, cont: float, room: int) -> list[float]:
    """Position j (from 1) yields ``first * cont**(j-1)``."""
    return [first * cont ** j for j in range(room)]


def sized(rates, rooms, *args, **kwargs):
    """:func:`draft_lengths` for requests whose positions yield ``first * cont**(j-1)``."""
    return draft_lengths([geometric_values(f, c, room) for (f, c), room in
                          zip(rates, rooms, strict=True)], rooms, *args, **kwargs)


def _ratio(rates, lengths, knee, overhead=SPEC_STEP_OVERHEAD_PER_REQUEST, floor=0.0):
    expected = [sum(f * c ** (j - 1) for j in range(1, n + 1))
                for (f, c), n in zip(rates, lengths, strict=True)]
    cost = knee + len(rates) + sum(lengths) + (overhead * len(rates) if any(lengths) else 0)
    return (len(rates) + sum(expected)) / max(floor, cost)


def test_batch_one_drafts_long_when_acceptance_is_decent():
    assert sized([(0.97, 0.97)], [15], knee_tokens=16) == [15]
    assert 5 <= sized([(0.8, 0.8)], [15], knee_tokens=16)[0] < 15
    assert sized([(0.3, 0.3)], [15], knee_tokens=16)[0] in (1, 2)


def test_large_batch_drafts_only_what_is_likely_accepted():
    assert sized([(0.5, 0.5)] * 16, [8] * 16, knee_tokens=16) == [0] * 16  # the prior
    lengths = sized([(0.3, 0.9)] * 8 + [(0.95, 0.95)] * 8, [8] * 16, knee_tokens=16)
    assert lengths[:8] == [0] * 8  # a first token right 30 % of the time is not worth it
    assert all(n > 0 for n in lengths[8:])


def test_tokens_below_the_floor_are_drafted_at_batch_one():
    # with knee 16 and floor 25 (an earlier fit of the CPU) a one-request step verifies
    # ~7 draft tokens for the price of one: a draft right 30 % of the time is still worth
    # those free slots, not more
    assert sized([(0.3, 0.3)], [15], knee_tokens=16, floor_tokens=25) == [7]
    assert sized([(0.97, 0.97)], [15], knee_tokens=16, floor_tokens=25) == [15]
    # at batch 16 the step is already past the floor: the floor changes nothing
    rates = [(0.3, 0.9)] * 8 + [(0.95, 0.95)] * 8
    assert sized(rates, [8] * 16, 16, floor_tokens=25) == sized(rates, [8] * 16,
                                                                                16)


def test_requests_without_room_get_nothing_but_count_in_the_batch():
    assert sized([(0.9, 0.9), (0.9, 0.9)], [0, 4], knee_tokens=16) == [0, 4]


def test_allocation_is_optimal_for_the_cost_model():
    rates, rooms, knee = [(0.9, 0.8), (0.6, 0.9), (0.4, 0.5)], [3, 3, 3], 4
    for floor in (0.0, 9.0, 12.5, 20.0):
        best = max(_ratio(rates, c, knee, floor=floor)
                   for c in itertools.product(range(4), repeat=3))
        chosen = sized(rates, rooms, knee, floor_tokens=floor, margin=0.0)
        assert abs(_ratio(rates, chosen, knee, floor=floor) - best) < 1e-12, floor
    small = [(0.6, 0.5)] * 4  # drafting pays per token, but not the step overhead
    assert sized(small, [2] * 4, 4, overhead_per_request=2.0, margin=0.0) == [0] * 4
    assert any(sized(small, [2] * 4, 4, overhead_per_request=0.0, margin=0.0))


def test_drafting_on_a_thin_margin_is_dropped():
    # batch 16, knee 24: a step costs 40 query tokens for 16 tokens, so a query token is worth
    # 0.4 of one; 16 first positions accepted 53 % of the time add 8.48 expected tokens for 20
    # query tokens (the 16 drafts and the spec path's 4) worth 8.0: a gain of 6 %, from the
    # luckiest estimates, so nothing is drafted; at 60 % (9.6 against 8.0) it is
    thin = [(0.53, 0.0)] * 16
    assert sized(thin, [8] * 16, 24, margin=0.0) == [1] * 16
    assert sized(thin, [8] * 16, 24) == [0] * 16
    assert sized([(0.6, 0.0)] * 16, [8] * 16, 24) == [1] * 16
    # a request whose drafts keep being accepted clears it, and batch 1 keeps its free slots
    assert all(sized([(0.95, 0.95)] * 16, [8] * 16, 24))
    assert sized([(0.5, 0.5)], [15], 24, floor_tokens=28)[0] >= 2


def test_the_margin_is_on_the_drafts_not_on_the_batch():
    """A request whose drafts are nearly always accepted drafts beside 15 that have nothing
    to draft, as it would alone: the margin asks its drafts to beat what they cost, not the
    other requests' tokens to grow by a tenth (a cut-off by batch size)."""
    good = (0.95, 0.95)
    assert sized([good], [8], 24)[0] == 8
    lengths = sized([good] + [(0.0, 0.0)] * 15, [8] * 16, 24)
    assert lengths[0] > 0 and not any(lengths[1:])


def test_what_a_request_costs_raises_knee_and_floor_with_the_batch():
    cost = CostModel(16, 0)
    assert cost.at(1) == cost.at(64) == (16, 0)  # no part per request: the same at any batch
    cost = CostModel(16, 25, per_request_tokens=0.5)
    assert cost.at(8) == (20, 29)
    assert CostModel(16, 0, per_request_tokens=0.5).at(8) == (20, 0)  # no floor stays none


def test_step_cost_is_flat_below_the_floor_and_linear_above():
    assert step_cost(1, 24, 28) == step_cost(4, 24, 28) == 28  # extra query tokens come free
    assert step_cost(16, 24, 28) - step_cost(15, 24, 28) == 1  # then each costs one unit
