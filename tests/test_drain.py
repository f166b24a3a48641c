"""A batch that drains: requests finish and none take their places. Only the requests that
end last draft where drafts cost time; a batch that refills drafts as before."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from patches.verify_capture import _output_limit
from tests.fakes import jacobi, predictions, step
from vllm_cllm.core.flow import REFILL_STEPS, BatchFlow
from vllm_cllm.core.tokens import matched_prefix
from vllm_cllm.policies.adaptive import drain_rooms
from vllm_cllm.policies.cost_model import draft_lengths_grid


def _steps(flow: BatchFlow, previous: set[str], live: set[str], steps: int) -> set[str]:
    for _ in range(steps):
        flow.update(previous, live)
        previous = live
    return previous


def test_a_batch_whose_finished_requests_are_not_replaced_drains():
    flow = BatchFlow()
    live = _steps(flow, set(), {"a", "b", "c"}, 5)
    assert not flow.draining
    live = _steps(flow, live, {"a", "b"}, REFILL_STEPS)  # "c" finished, nobody came
    assert not flow.draining  # a client's next request may still be on its way
    _steps(flow, live, {"a", "b"}, 1)
    assert flow.draining


def test_a_request_that_takes_a_finished_ones_place_marks_it_refilling():
    flow = BatchFlow()
    live = _steps(flow, set(), {"a", "b", "c"}, 5)
    live = _steps(flow, live, {"a", "b"}, 3)
    live = _steps(flow, live, {"a", "b", "d"}, REFILL_STEPS + 5)  # "d" took "c"'s place
    assert not flow.draining
    live = _steps(flow, live, {"a", "b"}, REFILL_STEPS + 1)
    assert flow.draining
    _steps(flow, live, {"a", "b", "e"}, 1)
    assert not flow.draining


def test_a_fresh_batch_keeps_what_the_last_one_taught():
    """Requests arriving at the start (a prefill spread over steps) are no refill; a new
    batch after the last one ended is not either: the next offline batch drains too."""
    flow = BatchFlow()
    live = _steps(flow, set(), {"a"}, 1)
    live = _steps(flow, live, {"a", "b", "c"}, 1)  # joined while "a" ran, nothing had left
    live = _steps(flow, live, {"a", "b"}, REFILL_STEPS + 1)
    assert flow.draining
    live = _steps(flow, live, set(), 2)
    _steps(flow, live, {"x", "y"}, 3)
    assert flow.draining


def test_only_the_requests_that_end_last_draft_where_drafts_cost_time():
    s = step([[1, 2, 3]] * 4, [[3]] * 4, rooms=8)
    rooms, priced = drain_rooms(s, 24.0, 0.0)
    assert rooms is s.rooms and priced == 4  # the batch refills: every room, the whole batch
    s.remaining = np.array([100, 100, 60, 95])
    rooms, priced = drain_rooms(s, 24.0, 0.0)
    assert rooms.tolist() == [8, 8, 0, 8]  # 40 behind, 5 within a draft
    assert priced == 3  # priced as a batch of the three that end last
    s.remaining = np.array([5, 3, 1, 2])  # at most what each may still commit, less one
    rooms, priced = drain_rooms(s, 24.0, 0.0)
    assert rooms.tolist() == [4, 2, 0, 1] and priced == 4
    # below the floor drafts cost nothing: every room as it is
    s.remaining = np.array([100, 100, 60, 95])
    rooms, priced = drain_rooms(s, 24.0, 40.0)
    assert rooms is s.rooms and priced == 4


def test_the_request_that_ends_last_drafts_more_than_in_a_batch_that_refills():
    """A token of the one request that ends last saves a step at the batch's end, where only
    it runs: its drafts are sized as a batch of one, not of sixteen."""
    s = step([[1, 2, 3]] * 16, [[3]] * 16, rooms=8)
    values = np.zeros((16, 8))
    values[15] = 0.45 ** np.arange(1, 9) / 0.45 * 0.9  # 0.9, 0.41, 0.18, ...
    caps = np.full(16, 8)
    refill = draft_lengths_grid(values, caps, 24.0, 0.0, token_margin=0.3,
                                batch=drain_rooms(s, 24.0, 0.0)[1])
    s.remaining = np.array([60] * 15 + [100])
    rooms, priced = drain_rooms(s, 24.0, 0.0)
    drain = draft_lengths_grid(values, np.minimum(caps, rooms), 24.0, 0.0, token_margin=0.3,
                               batch=priced)
    assert priced == 1 and rooms[:15].sum() == 0
    assert drain[15] > refill[15] and drain[:15].sum() == 0


def _run(proposer, limits: dict[str, tuple[int, int]], schedule: list[list[str]]
         ) -> list[dict[str, int]]:
    """Verify steps of the requests in ``schedule`` (one list of ids per step), all
    following one text whose n-grams repeat; each step's draft lengths by request."""
    text = [3, 4, 5, 6] * 150
    tokens = np.array([text] * 3)
    row = {"a": 0, "b": 1, "c": 2}
    lengths = {r: 8 for r in row}
    drafts: dict[str, list[int]] = {r: [] for r in row}
    made = []
    for ids in schedule:
        rows = [text[lengths[r]:lengths[r] + len(drafts[r]) + 1] for r in ids]
        accepted = [matched_prefix(np.array(drafts[r], dtype=np.int64), v[:len(drafts[r])])
                    for r, v in zip(ids, rows, strict=True)]
        proposer.retain_requests(set(ids), set(ids), output_limit=limits.get)
        proposer.predictions = predictions(ids, rows)
        for r, a in zip(ids, accepted, strict=True):
            lengths[r] += a + 1
        out = proposer.propose([v[:a + 1] for v, a in zip(rows, accepted, strict=True)],
                               np.array([lengths[r] for r in ids]),
                               tokens[[row[r] for r in ids]])
        for r, d in zip(ids, out, strict=True):
            drafts[r] = d
        made.append({r: len(d) for r, d in zip(ids, out, strict=True)})
    return made


def test_a_draining_batch_drafts_for_the_request_that_ends_last_only():
    """"a" may commit 100 tokens, "b" 400: once "c" has finished and nobody took its place,
    "a" ends long before "b" does, and a token it gains shortens no step."""
    limits = {"a": (8, 100), "b": (8, 400), "c": (8, 400)}
    start = [["a", "b", "c"]] * 6
    draining = _run(jacobi(k=4, max_model_len=600, knee_tokens=24, floor_tokens=0), limits,
                    start + [["a", "b"]] * (REFILL_STEPS + 3))
    assert draining[-1]["a"] == 0 and draining[-1]["b"] > 0
    refilling = _run(jacobi(k=4, max_model_len=600, knee_tokens=24, floor_tokens=0), limits,
                     start + [["a", "b", "c"]] * (REFILL_STEPS + 3))
    assert refilling[-1]["a"] > 0 and refilling[-1]["b"] > 0


def test_the_output_limits_are_released_with_their_requests():
    proposer = jacobi(k=4, max_model_len=600, knee_tokens=24, floor_tokens=0)
    limits = {"a": (8, 100), "b": (8, 400), "c": (8, 400)}
    _run(proposer, limits, [["a", "b", "c"]] * 2 + [["a", "b"]])
    assert {r for r, state in proposer.drafter.table.items() if state.limit} == {"a", "b"}
    proposer.retain_requests(set())
    assert proposer.tracked_requests() == set()


def test_the_output_limit_is_read_from_the_runners_request_state():
    state = SimpleNamespace(num_prompt_tokens=7, sampling_params=SimpleNamespace(max_tokens=20))
    runner = SimpleNamespace(requests={"r": state, "pooled": SimpleNamespace(
        num_prompt_tokens=3, sampling_params=None)})
    assert _output_limit(runner, "r") == (7, 20)
    assert _output_limit(runner, "pooled") is None
    assert _output_limit(runner, "gone") is None
