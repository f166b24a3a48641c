"""The drafting core through its public interface alone: a toy draft source and policy, the
request table's one release path, and a method built of named parts (no engine, no vLLM)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
from fakes import jacobi, step, verify_and_propose

from vllm_cllm.core.drafter import Candidates, Drafter
from vllm_cllm.core.requests import RequestState, RequestTable
from vllm_cllm.core.step import VerifyStep
from vllm_cllm.policies.adaptive import Adaptive
from vllm_cllm.policies.cost_model import CostModel
from vllm_cllm.policies.fixed_order import FixedOrder
from vllm_cllm.sources.restart import RestartBlock
from vllm_cllm.sources.tail import JacobiTail


class Period:
    """A toy source: guesses that the request's text repeats with period ``period``, and
    counts the steps it saw per request (in the request's state) and the requests released."""

    names = ("period",)

    def __init__(self, period: int) -> None:
        self.period, self.released = period, []

    def propose(self, step: VerifyStep, rows: Sequence[int], lengths: Sequence[int],
                states: Sequence[RequestState]) -> Candidates:
        out = []
        for i, n, state in zip(rows, lengths, states, strict=True):
            state.parts["period"] = state.parts.get("period", 0) + 1
            context = step.context(i)
            start = len(context) - self.period
            out.append(np.array([context[start + j % self.period] for j in range(n)]))
        return {"period": out}

    def release(self, req_id: str, state: RequestState) -> None:
        self.released.append((req_id, state.parts.get("period"), list(state.output)))


def test_a_toy_source_drafts_through_a_fixed_order_and_is_released_with_its_request():
    toy = Period(4)
    table = RequestTable()
    table.subscribe(toy, wants_output=True)
    drafter = Drafter([toy, JacobiTail()], [FixedOrder(["period", "tail"], scored=False)],
                      table=table)
    text = [3, 4, 5, 6] * 10
    first = step([text[:8]], [[6]], rooms=5, req_ids=["a"])
    assert drafter.propose(first)[0].tolist() == [3, 4, 5, 6, 3]
    second = step([text[:14]], [text[8:14]], rooms=3, req_ids=["a"])
    assert drafter.propose(second)[0].tolist() == [5, 6, 3]
    assert table.get("a").last_drafted == 3
    table.retain(set())  # "a" finished: the one release path
    assert toy.released == [("a", 2, [6, *text[8:14]])] and len(table) == 0


def test_a_toy_source_competes_in_the_adaptive_policy_and_wins_where_it_is_right():
    """The adaptive policy values any named candidate by learned acceptance: on text with
    period 4 the toy's guesses are always accepted, and it comes to draft the full room."""
    from vllm_cllm.core.tokens import matched_prefix

    toy = Period(4)
    drafter = Drafter([toy, JacobiTail(), RestartBlock(0)],
                      [Adaptive(["period", "tail"], CostModel(20, 0), token_margin=0.3)])
    text, length, draft, lengths = [3, 4, 5, 6] * 30, 8, np.empty(0, np.int64), []
    for _ in range(12):
        row = text[length:length + len(draft) + 1]
        accepted = matched_prefix(draft, row[:len(draft)])
        length += accepted + 1
        draft = drafter.propose(step([text[:length]], [row[:accepted + 1]], [row], rooms=4,
                                     req_ids=["a"]))[0]
        assert draft.tolist() == text[length:length + len(draft)]
        lengths.append(len(draft))
    assert lengths[-1] == 4


@pytest.mark.parametrize("batch", [4, 8])  # the small step's path and the grid's
def test_what_a_request_costs_makes_drafts_cheaper_beside_it(batch):
    """Text of period 4, every guess accepted: where a step's fixed part is a single query
    token, drafting costs more than it brings; where each request costs ten more (its
    context to attend to), the same drafts are worth it (the knee grows with the batch)."""
    from vllm_cllm.core.tokens import matched_prefix

    final = []
    for per_request in (0.0, 10.0):
        drafter = Drafter([Period(4), JacobiTail(), RestartBlock(0)],
                          [Adaptive(["period", "tail"], CostModel(1, 0, per_request),
                                    token_margin=0.3)])
        text, length = [3, 4, 5, 6] * 30, 8
        drafts = [np.empty(0, np.int64)] * batch
        for _ in range(12):
            rows = [text[length:length + len(d) + 1] for d in drafts]
            accepted = {matched_prefix(d, row[:len(d)])
                        for d, row in zip(drafts, rows, strict=True)}
            assert len(accepted) == 1  # every request drafts and commits the same
            hit = accepted.pop()
            length += hit + 1
            drafts = drafter.propose(step([text[:length]] * batch,
                                          [row[:hit + 1] for row in rows], rows, rooms=4,
                                          req_ids=[f"r{i}" for i in range(batch)]))
        final.append([len(d) for d in drafts])
    assert final == [[0] * batch, [4] * batch]


def test_requests_without_room_are_not_drafted_and_policies_see_only_their_own():
    seen = []

    class Recording(FixedOrder):
        def draft(self, step, rows, states, sources):
            seen.append(list(rows))
            return super().draft(step, rows, states, sources)

    drafter = Drafter([JacobiTail()], [Recording(["tail"], scored=False),
                                       Recording(["tail"], scored=False)],
                      route=lambda step, rows: [int(step.greedy[i]) for i in rows])
    batch = step([[1, 2, 3]] * 4, [[3]] * 4, [[3, 9, 9]] * 4, rooms=[2, 0, 2, 2],
                 greedy=[True, True, False, True])
    drafts = drafter.propose(batch)
    assert seen == [[2], [0, 3]] and [d.tolist() for d in drafts] == [[9, 9], [], [9, 9], [9, 9]]
    assert drafter.table.ids() == {"r0", "r2", "r3"}  # no room: nothing opened


def test_the_jacobi_proposer_keeps_all_request_state_in_one_table():
    proposer = jacobi(k=4)
    ids = [f"r{i}" for i in range(3)]
    verify_and_propose(proposer, ids, 5)
    assert proposer.drafter.table.ids() == set(ids)
    proposer.retain_requests({"r1"})
    assert proposer.tracked_requests() == {"r1"}
    proposer.retain_requests(set())
    assert proposer.tracked_requests() == set()
