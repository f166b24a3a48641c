"""Adaptive hybrid drafting: the learned acceptance table, the suffix-tree lookup, and the
proposer choosing and sizing candidates with them (no engine)."""

from __future__ import annotations

import numpy as np
import pytest
from fakes import jacobi, predictions, step, verify_and_propose

from vllm_cllm.core.requests import RequestState
from vllm_cllm.core.tokens import matched_prefix
from vllm_cllm.policies.acceptance import PRIOR_RATE, TokenAcceptance
from vllm_cllm.policies.adaptive import best_candidate

#: The adaptive policy's candidates, as ``jacobi`` names them.
LEARNED_SOURCES = ("lookup", "ngram", "model")


def _a(*tokens: int) -> np.ndarray:
    return np.array(tokens, dtype=np.int64)


def test_agreeing_candidates_are_worth_more_than_lone_ones_from_the_prior():
    table = TokenAcceptance(LEARNED_SOURCES)
    values = table.values(table.cells({"lookup": _a(1, 2, 3), "model": _a(1, 9)}))
    assert values["lookup"][0] == values["model"][0] == PRIOR_RATE  # nothing learned yet
    for _ in range(50):  # agreeing first tokens are right, lone ones wrong
        for candidates, committed in (({"lookup": _a(1, 2), "model": _a(1, 5)}, [1, 2]),
                                      ({"lookup": _a(4), "model": _a(6)}, [7])):
            table.observe(candidates, table.cells(candidates), committed)
    agree = table.values(table.cells({"lookup": _a(1, 2), "model": _a(1, 3)}))
    alone = table.values(table.cells({"lookup": _a(4, 2), "model": _a(6, 3)}))
    assert agree["lookup"][0] > 0.9 and alone["lookup"][0] < 0.1
    assert all(np.diff(agree["lookup"]) <= 0)  # cumulative: a position needs all before it


def test_only_what_the_committed_tokens_reveal_is_counted():
    table = TokenAcceptance(LEARNED_SOURCES)
    before = table.trials.copy()
    # two tokens committed: the lookup's first two are known right, its third unknown; the
    # model's first is known wrong, and nothing after a miss is counted
    candidates = {"lookup": _a(1, 2, 3), "model": _a(5, 2, 3)}
    table.observe(candidates, table.cells(candidates), [1, 2])
    counted = table.trials - before
    assert counted[LEARNED_SOURCES.index("lookup")].sum() == 2
    assert counted[LEARNED_SOURCES.index("model")].sum() == 1
    assert table.accepted[LEARNED_SOURCES.index("model")].sum() == \
        TokenAcceptance(LEARNED_SOURCES).accepted[0].sum()  # a miss adds no acceptance


def test_a_request_whose_last_draft_missed_is_valued_on_its_own():
    from vllm_cllm.policies.acceptance import HIT, MISSED

    table = TokenAcceptance(LEARNED_SOURCES)
    lone = {"lookup": _a(1, 2)}
    for _ in range(40):  # after a miss lone lookups miss again; after a hit they hit
        table.observe(lone, table.cells(lone, MISSED), [9])
        table.observe(lone, table.cells(lone, HIT), [1, 2])
    assert table.values(table.cells(lone, MISSED))["lookup"][0] < 0.1
    assert table.values(table.cells(lone, HIT))["lookup"][0] > 0.9


def test_best_candidate_weighs_expected_tokens_against_the_step_cost():
    good, poor = np.array([0.9, 0.8, 0.7]), np.array([0.2, 0.04])
    assert best_candidate({"lookup": poor, "ngram": good}, 20, 0) == "ngram"
    assert best_candidate({"model": np.array([0.01])}, 20, 0) is None  # not worth a draft
    assert best_candidate({"model": np.array([])}, 20, 0) is None


def _trees_draft(trees, req_id: str, greedy: bool, context, prompt_len: int, room: int,
                 states: dict[str, RequestState]) -> list[int]:
    """The suffix trees' draft for one request (its state kept in ``states``)."""
    state = states.setdefault(req_id, RequestState())
    one = step([list(context)], [list(context[prompt_len:])], rooms=room, greedy=greedy,
               req_ids=[req_id])
    return trees.propose(one, [0], [room], [state])["suffix"][0].tolist()


def test_suffix_lookup_shares_greedy_outputs_only():
    pytest.importorskip("arctic_inference.suffix_decoding")
    from vllm_cllm.sources.suffix_trees import SuffixTrees

    trees, states = SuffixTrees(max_cached=8), {}
    first = _a(90, 91, 40, 41, 42, 43, 44, 45)  # prompt of 2, then its output
    assert _trees_draft(trees, "a", True, first[:3], 2, 4, states) == []  # nothing yet
    _trees_draft(trees, "a", True, first, 2, 4, states)
    trees.release("a", states.pop("a"))
    later = _a(7, 8, 40, 41, 42)
    assert _trees_draft(trees, "b", True, later, 2, 3, states) == [43, 44, 45]
    # a sampled request drafts from its own tokens only (its samples depend on its drafts)
    assert _trees_draft(trees, "c", False, later, 2, 3, states) == []
    # its own prompt and output count, as they do for greedy requests
    own = _a(5, 6, 9, 5, 6)
    assert _trees_draft(trees, "d", False, own, 4, 2, states)[:1] == [9]


def _learned_proposer(k: int = 4, knee: int = 20, floor: int = 0):
    return jacobi(k, adaptive=True, knee_tokens=knee, floor_tokens=floor)


def test_proposer_learns_which_candidates_pay_and_frees_their_state():
    """A request whose text repeats: its lookups always agree and are always right, so the
    proposer, starting from the 30 % prior, comes to draft the full k."""
    proposer = _learned_proposer(k=4)
    assert proposer.options.adaptive
    text = [3, 4, 5, 6] * 30
    tokens = np.array([text])
    length, draft, lengths = 8, [], []
    for _ in range(15):  # one verify step of the last draft, then the next proposal
        predicted = text[length:length + len(draft) + 1]  # the target's g_1 .. g_{n+1}
        accepted = matched_prefix(np.array(draft), predicted[:len(draft)])
        proposer.retain_requests({"r"}, {"r"})
        proposer.predictions = predictions(["r"], [predicted])
        length += accepted + 1
        draft = proposer.propose([predicted[:accepted + 1]], np.array([length]), tokens)[0]
        assert draft == text[length:length + len(draft)]
        lengths.append(len(draft))
    assert lengths[0] < 4 and lengths[-1] == 4
    proposer.retain_requests(set())  # finished: nothing of it is kept but its output
    assert proposer.tracked_requests() == set()


def test_at_a_compute_bound_batch_the_drafts_follow_the_acceptance():
    """Batch 16 under the CPU cost model (every draft token costs time there): requests whose
    lookups are always right come to draft; requests whose text gives the lookups nothing to
    find draft (almost) nothing. No batch size stops drafting by itself."""
    busy = [f"r{i}" for i in range(16)]
    repeating = verify_and_propose(_learned_proposer(k=4, knee=24, floor=28), busy, 30)
    assert sum(repeating[-10:]) > 16 * 10  # more than a token per request and step
    noise = np.random.default_rng(0).integers(10, 5000, 200).tolist()
    scattered = verify_and_propose(_learned_proposer(k=4, knee=24, floor=28), busy, 30,
                                   text=noise)
    assert sum(scattered[-10:]) < sum(repeating[-10:]) / 10


def test_the_table_follows_a_change_of_workload():
    table = TokenAcceptance(LEARNED_SOURCES)
    lone = {"lookup": _a(1)}
    cells = table.cells(lone)
    for _ in range(3000):  # a workload where lone lookups are right
        table.observe(lone, cells, [1])
    for _ in range(400):  # then one where they are wrong
        table.observe(lone, cells, [2])
    assert table.values(cells)["lookup"][0] < 0.5


def test_the_default_drafts_a_strong_jacobi_tail_over_worse_lookups():
    """A checkpoint whose own predictions are right even behind wrong draft tokens (an ideal
    CLLM), on text whose n-grams recur with other continuations (the lookups propose, and
    are mostly wrong): the default drafts the model's tail — restarting its block from
    noise whenever a tail was accepted whole — and commits several tokens per step."""
    k = 8
    rng = np.random.default_rng(0)
    text = rng.integers(10, 16, 400).tolist()  # six tokens: every n-gram recurs
    proposer = jacobi(k, max_model_len=400)
    assert proposer.options.adaptive and proposer.options.fill == "hybrid"
    tokens = np.array([text])
    length, draft, committed, from_tail = 16, [], [], 0
    for _ in range(60):
        row = text[length:length + len(draft) + 1]  # right at every position
        accepted = matched_prefix(np.array(draft), row[:len(draft)])
        proposer.retain_requests({"r"}, {"r"})
        proposer.predictions = predictions(["r"], [row])
        tail = row[accepted + 1:]
        length += accepted + 1
        committed.append(accepted + 1)
        draft = proposer.propose([row[:accepted + 1]], np.array([length]), tokens)[0]
        from_tail += bool(tail) and draft == tail[:len(draft)]
        if length > 300:
            break
    assert from_tail >= len(committed) // 3  # every step that has a tail drafts it
    assert np.mean(committed[10:]) > 2.5  # fixed-order hybrid, lookups first: ~1.2 here


def test_undrafted_requests_learn_the_later_positions():
    """Requests that draft nothing (every draft token would cost far more than it could
    yield) still learn how their candidates fare past the first position: the tokens they
    commit one per step decide the candidates of the step each one was made in. On
    repeating text the lookups' later positions come out right nearly always, and nothing
    but the positions' cells changes what is drafted."""
    busy = [f"r{i}" for i in range(4)]
    proposer = _learned_proposer(k=4, knee=1, floor=0)
    proposer.drafter.policies[1].cost.knee_tokens = 1e-6  # nothing pays: no drafts
    made = verify_and_propose(proposer, busy, 40)
    assert sum(made) == 0
    table = proposer.drafter.policies[1].acceptance
    suffix = table.sources.index("suffix")
    trials = table.trials[suffix, 1:4].sum()
    rates = table.accepted[suffix, 1:4] / table.trials[suffix, 1:4]
    assert trials > 3 * 4 * 3 * 4 + 30  # beyond the prior of every cell of those positions
    assert rates.max() > 0.8
