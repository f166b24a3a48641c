"""The Jacobi shift, fill policies and the capture table, without an engine."""

from __future__ import annotations

import numpy as np
import torch
from fakes import jacobi, logits_for, predictions, step
from fakes import metadata as _metadata

from vllm_cllm.core.drafter import Drafter
from vllm_cllm.core.predictions import VerifyPredictions
from vllm_cllm.core.tokens import EMPTY, matched_prefix
from vllm_cllm.policies.fixed_order import FixedOrder
from vllm_cllm.policies.scores import SourceScores
from vllm_cllm.sources.ngram import NgramFill, NoFill
from vllm_cllm.sources.restart import RandomContextFill
from vllm_cllm.sources.tail import completed_block

_logits_for = logits_for


def test_predictions_split_by_rows_per_request():
    meta = _metadata([[1, 2], [], [5]])
    logits = _logits_for([1, 2, 3, 4, 5, 6])
    preds = VerifyPredictions.from_fixed_point(logits, meta.draft_token_ids,
                                               meta.num_draft_tokens, ["a", "b", "c"], k=2)
    assert [preds.row(i).tolist() for i in range(3)] == [[1, 2, 3], [4], [5, 6]]


def test_predictions_ignore_dummy_runs():
    meta = _metadata([[1], [2]])  # 2 drafts over 2 requests need 4 rows, not 2
    assert VerifyPredictions.from_fixed_point(_logits_for([1, 2]), meta.draft_token_ids,
                                              meta.num_draft_tokens, ["a", "b"], k=2) is None


def test_device_step_gives_the_row_tail_and_falls_back_for_sampled_requests():
    """The fixed-point step's block equals row[a + 1:] when vLLM accepted the greedy prefix;
    a request whose (sampled) commit differs gets the same rule from its row on the host."""
    logits = _logits_for([11, 12, 13, 14, 15, 21, 22, 30])
    meta = _metadata([[11, 0, 0, 0], [21], []])
    preds = VerifyPredictions.from_fixed_point(logits, meta.draft_token_ids,
                                               meta.num_draft_tokens, ["a", "b", "c"], k=3)
    assert preds.flat.tolist() == logits.argmax(-1).tolist()
    assert preds.accepted.tolist() == [1, 1, 0]
    assert preds.next_block(0, 2).tolist() == [13, 14, 15]  # from the device, cut to k = 3
    assert preds.next_block(1, 2).tolist() == [] and preds.next_block(2, 1).tolist() == []
    # a sampled request that committed only g1 (accepted 0, not the greedy 1): host rule
    assert preds.next_block(0, 1).tolist() == preds.row(0)[1:].tolist() == [12, 13, 14, 15]
    assert VerifyPredictions.from_fixed_point(logits, meta.draft_token_ids[:2], [2, 0],
                                              ["a", "b"], k=3) is None  # dummy run


def test_host_capture_gives_the_device_steps_rows_and_blocks():
    """On the CPU platform the capture takes only the argmax (numpy) and shifts each block on
    the host: the same rows and next blocks as the device step, greedy or sampled."""
    rng = np.random.default_rng(0)
    for _ in range(50):
        drafts = [list(rng.integers(0, 6, rng.integers(0, 5))) for _ in range(3)]
        rows = sum(len(d) + 1 for d in drafts)
        logits = torch.randn(rows, 6)
        meta = _metadata([[int(t) for t in d] for d in drafts])
        ids = ["a", "b", "c"]
        device = VerifyPredictions.from_fixed_point(logits, meta.draft_token_ids,
                                                    meta.num_draft_tokens, ids, k=4)
        host = VerifyPredictions.on_host(logits, meta.num_draft_tokens, ids)
        assert host.flat.tolist() == device.flat.tolist()
        for i, d in enumerate(drafts):
            for sampled in range(1, len(d) + 2):
                assert host.next_block(i, sampled)[:4].tolist() == \
                    device.next_block(i, sampled).tolist()
    assert VerifyPredictions.on_host(torch.zeros(2, 6), [1, 1], ["a", "b"]) is None  # dummy


def _proposer(k: int, fill: str = "tail", max_model_len: int = 100, **options):
    return jacobi(k, max_model_len, fill=fill, **options)


class Canned:
    """A draft source that proposes the same candidates for every request (a toy)."""

    def __init__(self, **candidates: list[int]) -> None:
        self.names = tuple(candidates)
        self.candidates = {n: np.array(c, dtype=np.int64) for n, c in candidates.items()}

    def propose(self, step, rows, lengths, states):
        return {n: [c[:length] for length in lengths] for n, c in self.candidates.items()}


def _first_in_order(scores: SourceScores, order: list[str], **candidates) -> np.ndarray:
    """One request's fixed-order draft among ``candidates`` (empty lists: no candidate),
    with ``scores`` as its scores."""
    source = Canned(**candidates)
    drafter = Drafter([source], [FixedOrder(order, optional=order)])
    state = drafter.table.open("r0", [])
    state.parts["scores"] = scores
    return drafter.propose(step([[1, 2, 3]], [[3]], rooms=8))[0]

def test_next_draft_is_tail_past_accepted_prefix():
    # Request 0 had drafts d1..d4; target predicted g1..g5 = 11..15; 1 draft accepted, so vLLM
    # committed g1, g2 (= sampled). Next draft: g3..g5. Request 1 had all accepted: no tail.
    proposer = _proposer(k=4)
    proposer.observe_verification(_logits_for([11, 12, 13, 14, 15, 21, 22], vocab=60),
                                  _metadata([[11, 0, 0, 0], [21]]), ["r0", "r1"])
    tokens = np.arange(40).reshape(2, 20)
    drafts = proposer.propose([[11, 12], [21, 22]], np.array([10, 12]), tokens)
    assert drafts[0] == [13, 14, 15]  # 'tail' fill adds nothing while the tail is non-empty
    assert len(drafts[1]) == 4 and set(drafts[1]) <= set(tokens[1, :12].tolist())  # restart
    assert proposer.take_predictions() is None  # consumed


def test_discarded_rows_and_max_model_len_get_no_draft():
    proposer = _proposer(k=4, max_model_len=12)
    proposer.observe_verification(_logits_for([5, 6, 7]), None, ["a", "b", "c"])
    tokens = np.zeros((3, 12), dtype=np.int64)
    drafts = proposer.propose([[5], [], [7]], np.array([10, 4, 12]), tokens)
    assert len(drafts[0]) == 2  # room for 2 before max_model_len
    assert drafts[1] == [] and drafts[2] == []


def test_ngram_fill_continues_after_tail():
    context = np.array([1, 2, 3, 4, 5, 9, 1, 2])
    fill = NgramFill(2, 4, max_model_len=100)
    assert completed_block(np.array([3]), context, 4, fill, NoFill()).tolist() == [3, 4, 5, 9]


def test_random_fill_is_seeded_and_from_context():
    a = RandomContextFill(7)(np.array([4, 5, 6]), 10)
    b = RandomContextFill(7)(np.array([4, 5, 6]), 10)
    assert a.tolist() == b.tolist() and set(a.tolist()) <= {4, 5, 6}


def test_hybrid_prefers_the_source_that_matched():
    state = SourceScores("block")
    block, ngram = np.array([1, 2, 3]), np.array([7, 8, 9])
    for _ in range(3):
        state.choose({"block": block, "ngram": ngram})
        state.update([1, 2, 3, 4])  # the Jacobi draft was right
    assert state.choose({"block": block, "ngram": ngram}) is block
    assert matched_prefix(np.array([1, 2, 5]), [1, 2, 3]) == 2


def test_hybrid_switches_to_a_third_source_that_keeps_matching():
    state = SourceScores("block")
    block, ngram, pool = np.array([1, 2, 3]), np.array([7, 8, 9]), np.array([4, 5, 6])
    for _ in range(6):
        state.choose({"block": block, "ngram": ngram, "pool": pool})
        state.update([4, 5, 6, 1])  # only the recycled iterate was right
    assert state.choose({"block": block, "ngram": ngram, "pool": pool}) is pool
    state.update([9])  # a step where no source matched...
    state.choose({"block": block, "ngram": ngram, "pool": EMPTY})
    state.update([9])  # ...and one where the pool had nothing: its score is kept
    assert state.scores["pool"] > state.scores["ngram"]


def test_hybrid_probes_a_useless_block_with_a_short_draft():
    state = SourceScores("block")
    block = np.arange(10, 18)
    assert len(state.choose({"block": block, "ngram": EMPTY})) == 8  # optimistic start
    for _ in range(5):
        state.choose({"block": block, "ngram": EMPTY})
        state.update([1, 2, 3])  # the block never matches
    assert len(state.choose({"block": block, "ngram": EMPTY})) == 2


def test_jacobi_drafts_a_lookup_before_the_pool_and_the_pool_before_its_block():
    order = ["ngram", "suffix", "pool", "block"]
    scores = SourceScores("block", {"block": 2.0})  # the block has been right: no matter
    assert _first_in_order(scores, order, block=[1, 2, 3], ngram=[7, 8, 9], pool=[6],
                           suffix=[4, 5]).tolist() == [7, 8, 9]
    assert _first_in_order(scores, order, block=[1, 2, 3], ngram=[], pool=[6],
                           suffix=[4, 5]).tolist() == [4, 5]
    assert _first_in_order(scores, order, block=[1, 2, 3], ngram=[], pool=[6]
                           ).tolist() == [6]
    assert _first_in_order(scores, order, block=[1, 2, 3], ngram=[]).tolist() == [1, 2, 3]
    missing = SourceScores("block", {"block": 0.1})  # a block that keeps missing: a probe
    assert _first_in_order(missing, order, block=list(range(8)), ngram=[]).tolist() == [0, 1]


def test_jacobi_drafts_the_ngram_continuation_that_has_matched_better_in_the_request():
    order = ["ngram", "block"]
    usual, latest, block = [7, 8, 9], [7, 5, 6], [1, 2]
    tie = SourceScores("block")
    assert _first_in_order(tie, order, block=block, ngram=usual,
                           ngram_latest=latest).tolist() == usual  # a tie: the usual one
    better = SourceScores("block", {"ngram": 0.3, "ngram_latest": 0.9})
    assert _first_in_order(better, order, block=block, ngram=usual,
                           ngram_latest=latest).tolist() == latest
    assert set(better.proposed) >= {"ngram", "ngram_latest"}  # both scored next step
    assert better.proposed["ngram"].tolist() == usual  # as proposed, not as drafted
    # no n-gram match: the order goes on as before
    assert _first_in_order(better, order, block=block, ngram=[],
                           ngram_latest=[]).tolist() == block


def test_pool_continues_the_context_from_a_recent_iterate():
    from vllm_cllm.sources.pool import pool_continuation

    pool = [np.array([5, 6, 7, 8, 9]), np.array([1, 2, 3, 4])]
    # longest suffix first: "2 3" occurs in the newest stream, so its continuation wins
    assert pool_continuation(np.array([9, 2, 3]), pool, 4, 5).tolist() == [4]
    # one token is enough when nothing longer matches; older streams are searched too
    assert pool_continuation(np.array([0, 6]), pool, 4, 2).tolist() == [7, 8]
    assert len(pool_continuation(np.array([0, 42]), pool, 4, 2)) == 0
    assert len(pool_continuation(np.array([0, 4]), pool, 4, 2)) == 0  # nothing after it


def _pool_continuation_by_search(context, pool, ngram_max, num_tokens):
    """The lookup spelled out: longest suffix first, newest stream first, first occurrence."""
    for n in range(min(ngram_max, len(context)), 0, -1):
        key = list(context[len(context) - n:])
        for stream in reversed(pool):
            for start in range(len(stream) - n):
                if list(stream[start:start + n]) == key:
                    return list(stream[start + n:start + n + num_tokens])
    return []


def test_pool_lookup_equals_the_spelled_out_search_on_random_pools():
    from vllm_cllm.sources.pool import pool_continuation

    rng = np.random.default_rng(0)
    for _ in range(500):
        pool = [rng.integers(0, 6, rng.integers(1, 10)) for _ in range(rng.integers(1, 9))]
        context = rng.integers(0, 6, rng.integers(1, 8))
        ngram_max, num = int(rng.integers(1, 6)), int(rng.integers(1, 6))
        assert pool_continuation(context, pool, ngram_max, num).tolist() == \
            _pool_continuation_by_search(context, pool, ngram_max, num)


def test_proposer_drafts_from_its_pool_of_recent_iterates():
    """The proposer keeps each request's recent Jacobi iterates (last committed token + tail)
    and, once the pool has matched better than the other sources, drafts its continuation."""
    proposer = _proposer(k=3, fill="hybrid", adaptive=False)
    state = proposer.drafter.table.open("a", [])
    state.parts["pool"] = [np.array([2, 30, 31, 32])]
    state.parts["scores"] = SourceScores("block", {"block": 0.0, "ngram": 0.0, "pool": 2.0})
    tokens = np.zeros((1, 20), dtype=np.int64)
    tokens[0, :3] = [5, 6, 30]  # committed "... 30": the pool stream continues with 31 32
    proposer.retain_requests({"a"}, {"a"})
    proposer.predictions = predictions(["a"], [[30]])  # nothing drafted: no tail
    assert proposer.propose([[30]], np.array([3]), tokens)[0] == [31, 32]
    assert len(state.parts["pool"]) == 1  # no tail this step: nothing new to recycle


def test_hybrid_state_is_dropped_when_request_leaves():
    proposer = _proposer(k=3, fill="hybrid", adaptive=False)
    proposer.observe_verification(_logits_for([1, 2]), None, ["a", "b"])
    proposer.propose([[1], [2]], np.array([5, 5]), np.ones((2, 10), dtype=np.int64))
    assert proposer.tracked_requests() == {"a", "b"}
    proposer.retain_requests({"b"})
    assert proposer.tracked_requests() == {"b"}


def test_outputs_of_requests_that_left_become_a_draft_source_for_greedy_requests():
    """A finished request's output (not its prompt) enters the proposer's history; a later
    greedy request whose context ends like a phrase of it gets the rest of the phrase drafted
    once that source has matched best. A sampled request never drafts from it: its samples
    depend on its drafts, which must not depend on what ran before it."""
    proposer = _proposer(k=4, fill="hybrid", lookup="history", adaptive=False)
    history = proposer.drafter.sources["history"].history
    tokens = np.zeros((1, 20), dtype=np.int64)
    tokens[0, :12] = [90, 91, 92, 93, 40, 41, 42, 43, 44, 45, 46, 47]  # prompt of 4 + output
    proposer.observe_verification(_logits_for([40]), None, ["a"])
    proposer.propose([[40]], np.array([5]), tokens)  # first step: prompt length 4
    proposer.observe_verification(_logits_for([47]), None, ["a"])
    proposer.propose([[41, 42, 43, 44, 45, 46, 47]], np.array([12]), tokens)
    proposer.retain_requests(set())  # "a" finished
    assert proposer.tracked_requests() == set()
    assert [o.tolist() for o in history.outputs.values()] == [[40, 41, 42, 43, 44, 45, 46, 47]]
    tokens[0, :6] = [7, 8, 9, 40, 41, 42]
    for greedy, expected in (({"b"}, [43, 44, 45, 46]), (set(), [])):
        proposer.retain_requests({"b"}, greedy)
        state = proposer.drafter.table.open("b", [])
        state.parts["scores"] = SourceScores("block", {"block": 0.0, "ngram": 0.0,
                                                       "history": 2.0})
        proposer.predictions = predictions(["b"], [[42]])
        draft = proposer.propose([[42]], np.array([6]), tokens)[0]
        assert draft[:len(expected)] == expected
        assert len(state.parts["scores"].proposed["history"]) == (4 if greedy else 0)
        proposer.retain_requests(set())


def test_ngram_prefers_longest_then_usual_then_first_match():
    from vllm_cllm.sources.ngram import longest_ngram_continuation, ngram_continuations

    ctx = np.array([7, 1, 2, 8, 9, 3, 1, 2, 5, 6, 0, 3, 1, 2, 4, 3, 1, 2])
    # suffix (3,1,2) occurred at 5 and 11, followed by 5 and 4 once each -> the first: 5, 6
    assert longest_ngram_continuation(ctx, 2, 4, 2).tolist() == [5, 6]
    # (1,2) followed by 8, 5, 5, 4: 5 is the usual next token -> its first occurrence
    usual = np.array([1, 2, 8, 0, 1, 2, 5, 6, 1, 2, 5, 7, 1, 2, 4, 9, 1, 2])
    assert longest_ngram_continuation(usual, 2, 2, 3).tolist() == [5, 6, 1]
    # both continuations from one search: the usual one as above, and the latest occurrence's
    assert [c.tolist() for c in ngram_continuations(usual, 2, 2, 3)] == [[5, 6, 1], [4, 9, 1]]
    assert [c.tolist() for c in ngram_continuations(ctx, 2, 4, 2)] == [[5, 6], [4, 3]]
    assert [c.tolist() for c in ngram_continuations(np.array([1, 2, 3]), 2, 4, 2)] == [[], []]
    assert longest_ngram_continuation(np.array([1, 2, 3]), 2, 4, 2).tolist() == []


def test_random_fill_depends_only_on_the_request():
    fill = RandomContextFill(3)
    ctx = np.arange(100, 140)
    first = fill(ctx, 8)
    fill(np.arange(7), 8)  # another request in between
    assert fill(ctx, 8).tolist() == first.tolist()


def test_without_the_ngram_candidate_adaptive_drafting_never_builds_it():
    """``ngram_candidate: false``: the adaptive policy chooses between the lookup and the
    tail, and no step asks the request's n-grams for a candidate; the lookup, which sees the
    request's own tokens, still drafts the repeating text."""
    from fakes import verify_and_propose

    asked = []
    for wanted in (True, False):
        proposer = jacobi(4, 200, knee_tokens=24, floor_tokens=28, ngram_candidate=wanted)
        ngrams = proposer.drafter.sources["ngram"]
        for method in ("propose", "propose_into"):  # a small step's path, a large one's
            original = getattr(ngrams, method)

            def spy(*args, original=original, wanted=wanted, **kwargs):
                asked.append(wanted)
                return original(*args, **kwargs)

            setattr(ngrams, method, spy)
        made = verify_and_propose(proposer, ["a", "b"], 20) + \
            verify_and_propose(proposer, [f"c{i}" for i in range(6)], 20)
        assert sum(made[5:]) > 0  # drafts from the lookup (or the tail) either way
        names = proposer.drafter.policies[1].names
        assert ("ngram" in names) is wanted
    assert True in asked and False not in asked
