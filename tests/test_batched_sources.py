"""The whole-step paths of the drafting core against the per-request functions they replace:
the same numbers to the last bit, so that the same drafts come out."""

from __future__ import annotations

import heapq

import numpy as np
import pytest

from vllm_cllm.policies.acceptance import TokenAcceptance, _add_ones, add_ones_scalar
from vllm_cllm.policies.adaptive import best_candidate, best_candidates
from vllm_cllm.policies.cost_model import draft_lengths, draft_lengths_grid, step_cost
from vllm_cllm.sources.ngram import ngram_continuations, ngram_starts

NAMES = ("suffix", "ngram", "tail")


def _heap_draft_lengths(values, rooms, knee, floor, overhead=0.25, margin=0.1,
                        token_margin=0.0):
    """The sizing rule as a heap over each request's next position (its first statement)."""
    batch = len(values)
    lengths = [0] * batch
    caps = [min(room, len(v)) for room, v in zip(rooms, values, strict=True)]
    plain_cost = step_cost(batch, knee, floor)
    trust = 1.0 / (1.0 + token_margin)
    gain, tokens = float(batch), batch * (1 + overhead)
    heap = [(-float(values[i][0]), i) for i in range(batch) if caps[i] > 0 and values[i][0] > 0]
    heapq.heapify(heap)
    while heap:
        neg_value, i = heapq.heappop(heap)
        value = -neg_value * trust
        if (gain + value) / step_cost(tokens + 1, knee, floor) <= \
                gain / step_cost(tokens, knee, floor):
            break
        lengths[i] += 1
        gain, tokens = gain + value, tokens + 1
        if lengths[i] < caps[i]:
            heapq.heappush(heap, (-float(values[i][lengths[i]]), i))
    # kept where the drafts' tokens beat what their cost would buy at the plain rate
    bought = (step_cost(tokens, knee, floor) - plain_cost) * batch / plain_cost
    return lengths if gain - batch > (1 + margin) * bought else [0] * batch


def test_draft_lengths_pops_positions_in_the_heaps_order():
    rng = np.random.default_rng(1)
    for _ in range(400):
        batch = int(rng.integers(1, 40))
        values = []
        for _ in range(batch):
            n = int(rng.integers(0, 8))
            # coarse values make ties between requests and within one common
            values.append(np.cumprod(rng.choice([0.25, 0.5, 0.75, 1.0], n)))
        rooms = rng.integers(0, 8, batch).tolist()
        knee, floor = float(rng.choice([20, 256, 2048])), float(rng.choice([0, 64]))
        margin = float(rng.choice([0.0, 0.3]))
        assert draft_lengths(values, rooms, knee, floor, token_margin=margin) == \
            _heap_draft_lengths(values, rooms, knee, floor, token_margin=margin)


def test_add_ones_adds_one_at_a_time():
    rng = np.random.default_rng(2)
    start = np.concatenate([rng.random(200) * 600, [1.2, 0.6, 4.0, 0.3 * 4, 256.5, 511.75],
                            256 + rng.integers(0, 2 ** 44, 50) * 2.0 ** -44])
    counts = rng.integers(0, 700, len(start)).astype(np.float64)
    counts[:20] = 0
    expected = start.copy()
    for j in range(len(start)):
        for _ in range(int(counts[j])):
            expected[j] += 1.0
    assert np.array_equal(_add_ones(start, counts), expected)
    assert [add_ones_scalar(a, int(n)) for a, n in zip(start, counts, strict=True)] == \
        expected.tolist()


def _candidates(rng, vocab=6, k=6):
    return {name: rng.integers(0, vocab, int(rng.integers(0, k + 1))) for name in NAMES}


def test_grid_values_and_best_candidates_match_the_per_request_ones():
    rng = np.random.default_rng(4)
    table = TokenAcceptance(NAMES)
    table.accepted *= rng.random(table.accepted.shape) * 3  # varied rates, some above 1/2
    for _ in range(60):
        batch, k = int(rng.integers(1, 20)), 6
        found = [_candidates(rng, k=k) for _ in range(batch)]
        previous = rng.integers(0, 3, batch)
        cells = np.full((batch, len(NAMES), k), -1, dtype=np.int64)
        for r, candidates in enumerate(found):
            for s, name in enumerate(NAMES):
                cells[r, s, :len(candidates[name])] = candidates[name]
        index = table.grid_cells(np.arange(len(NAMES)), cells, previous)
        assert 0 <= index.min() and index.max() < table.trials.size
        values = table.grid_values(index)
        lengths = (cells >= 0).sum(axis=-1)
        knee, margin = float(rng.choice([8, 64, 2048])), 0.3
        best = best_candidates(values, lengths, knee, 0.0, margin)
        for r, candidates in enumerate(found):
            expected = table.values(table.cells(candidates, int(previous[r])))
            for s, name in enumerate(NAMES):
                if name in expected:
                    assert np.array_equal(values[r, s, :lengths[r, s]], expected[name])
            name = best_candidate(expected, knee, 0.0, margin)
            assert (NAMES[best[r]] if best[r] >= 0 else None) == name


def test_the_byte_search_finds_what_the_scan_finds():
    """ngram_starts over a request's tokens as bytes (int32 as in vLLM's buffer, and int64)
    against the numpy scan, with vocabularies small enough that n-grams repeat and large
    enough that a token's bytes also match across two tokens."""
    rng = np.random.default_rng(5)
    for trial in range(3000):
        vocab = int(rng.choice([2, 5, 9, 300, 70000]))
        ngram_min = int(rng.integers(1, 4))
        ngram_max = ngram_min + int(rng.integers(0, 4))
        dtype = (np.int32, np.int64)[trial % 2]
        context = rng.integers(0, vocab, int(rng.integers(0, 200))).astype(dtype)
        if vocab == 70000 and len(context) > 8:  # repeat a phrase: a match across bytes too
            context[-4:] = context[3:7]
        usual, latest = ngram_continuations(context, ngram_min, ngram_max, 5)
        found = ngram_starts(context.tobytes(), context.itemsize, ngram_min, ngram_max)
        if found is None:
            assert not len(usual) and not len(latest)
        else:
            assert context[found[0]:found[0] + 5].tolist() == usual.tolist()
            assert context[found[1]:found[1] + 5].tolist() == latest.tolist()
    # the bytes of 65536, 65536, 5 << 16 hold those of 1, 1 two bytes in (little-endian
    # 0 0 1 0 | 0 0 1 0 | 0 0 5 0): not an occurrence of the last two tokens
    tokens = np.array([65536, 65536, 5 << 16, 7, 1, 1], dtype=np.int32)
    assert tokens.tobytes().find(tokens[-2:].tobytes()) == 2
    assert ngram_starts(tokens.tobytes(), 4, 2, 4) is None


def _same_drafts_run():
    """``run`` of experiments/proposer_step_cost/same_drafts.py (synthetic verify steps)."""
    from scripts import load_script

    return load_script("experiments/proposer_step_cost/same_drafts.py").run


def test_small_steps_draft_as_the_grid_does(monkeypatch):
    """The plain-Python path for a few requests (Adaptive._draft_small, _count_small), and
    steps that switch between it and the grid, draft exactly what the grid alone does."""
    from vllm_cllm.policies import adaptive
    from vllm_cllm.proposers.jacobi import JacobiProposer

    run = _same_drafts_run()
    spec = {"method": "jacobi", "num_speculative_tokens": 15, "knee_tokens": 2048,
            "floor_tokens": 0}
    monkeypatch.setattr(adaptive, "SMALL_STEP", 0)
    grid, _ = run(spec, 6, 150, seed=7)
    monkeypatch.setattr(adaptive, "SMALL_STEP", 100)
    small, _ = run(spec, 6, 150, seed=7)
    assert small == grid
    rng = np.random.default_rng(8)
    propose = JacobiProposer.propose

    def switching(self, *args, **kwargs):  # each step on one path or the other, at random
        adaptive.SMALL_STEP = int(rng.choice([0, 100]))
        return propose(self, *args, **kwargs)

    monkeypatch.setattr(JacobiProposer, "propose", switching)
    mixed, _ = run(spec, 6, 150, seed=7)
    assert mixed == grid


def _grid_of(candidates, width):
    """Per-request candidates packed as a grid (-1 past each) and their lengths."""
    grid = np.full((len(candidates), width), -1, dtype=np.int64)
    for j, tokens in enumerate(candidates):
        grid[j, :len(tokens)] = tokens
    return grid, np.array([len(c) for c in candidates])


def _random_step(rng, batch, vocab=5, device=False, masks=False):
    """A verify step of ``batch`` requests over a small vocabulary (so that n-grams repeat),
    with random verify rows and commits; ``device``: blocks from the fixed-point step."""
    from fakes import step

    contexts, committed, rows = [], [], []
    for _ in range(batch):
        drafts = int(rng.integers(0, 6))
        row = rng.integers(0, vocab, drafts + 1).tolist()
        accepted = int(rng.integers(0, drafts + 1))
        context = rng.integers(0, vocab, int(rng.integers(3, 60))).tolist()
        contexts.append(context + row[:accepted + 1])
        committed.append(row[:accepted + 1])
        rows.append(row)
    made = step(contexts, committed, rows, rooms=rng.integers(0, 8, batch).tolist())
    p = made.predictions
    if masks:
        p.num_mask = rng.integers(0, 3, batch)
    if device:
        k = 6
        p.accepted = np.where(rng.random(batch) < 0.7, made.num_committed - 1, -1)
        p.next_len = rng.integers(0, k + 1, batch)
        p.next_draft = rng.integers(0, vocab, (batch, k))
    return made


def test_tails_written_into_a_grid_are_the_tails():
    rng = np.random.default_rng(9)
    for _ in range(200):
        batch = int(rng.integers(5, 12))
        made = _random_step(rng, batch, device=bool(rng.random() < 0.5),
                            masks=bool(rng.random() < 0.5))
        rows = [i for i in range(batch) if rng.random() < 0.8] or [0]
        lengths = np.asarray(rng.integers(1, 8, len(rows)))
        expected, sizes = _grid_of(made.tails(rows, lengths.tolist()), 8)
        into = np.full((len(rows), 8), -1, dtype=np.int64)
        assert np.array_equal(made.tails_into(rows, lengths, into), sizes)
        assert np.array_equal(into, expected)


def test_grid_sources_write_what_they_propose():
    """Each source that writes into the grid (the n-grams, the Jacobi tail, the suffix trees)
    writes there what it proposes as arrays, and a source without that way is packed: two
    copies of the sources, one asked for a grid and one for arrays, step by step."""
    from test_core import Period

    from vllm_cllm.core.grid import candidate_grid
    from vllm_cllm.core.requests import RequestState
    from vllm_cllm.policies.fixed_order import gather
    from vllm_cllm.sources.ngram import NgramFill, RequestNgrams
    from vllm_cllm.sources.suffix_trees import SuffixTrees
    from vllm_cllm.sources.tail import JacobiTail

    def sources():
        trees, ngrams = SuffixTrees(max_cached=4), RequestNgrams(NgramFill(2, 4, 70))
        return {"suffix": trees, "ngram": ngrams, "ngram_latest": ngrams, "tail": JacobiTail(),
                "period": Period(3)}

    rng = np.random.default_rng(10)
    into_grid, as_arrays = sources(), sources()
    names = ("suffix", "ngram", "tail", "period", "ngram_latest")
    states: tuple[dict[str, RequestState], dict[str, RequestState]] = ({}, {})
    for _ in range(60):
        made = _random_step(rng, 8, device=bool(rng.random() < 0.5))
        made.req_ids = [f"q{n}" for n in rng.permutation(12)[:8].tolist()]
        rows = [i for i in range(8) if made.rooms[i] > 0]
        if not rows:
            continue
        mine = [[table.setdefault(made.req_ids[i], RequestState()) for i in rows]
                for table in states]
        lengths = made.rooms[np.asarray(rows)]
        grid, sizes = candidate_grid(into_grid, names, made, rows, lengths, mine[0])
        proposed = gather(as_arrays, names, made, rows, lengths.tolist(), mine[1])
        for s, name in enumerate(names):
            expected, lengths_of = _grid_of(proposed[name], grid.shape[2])
            assert np.array_equal(grid[:, s], expected), name
            assert np.array_equal(sizes[:, s], lengths_of), name
        for req_id in list(states[0]):  # some requests leave
            if rng.random() < 0.2:
                for table, copy in zip(states, (into_grid, as_arrays), strict=True):
                    copy["suffix"].release(req_id, table.pop(req_id))


def test_sizing_only_the_drafting_requests_sizes_as_the_whole_step():
    rng = np.random.default_rng(11)
    for _ in range(300):
        batch, width = int(rng.integers(1, 30)), int(rng.integers(1, 8))
        values = np.cumprod(rng.choice([0.25, 0.5, 0.75, 1.0], (batch, width)), axis=1)
        caps = rng.integers(0, width + 1, batch)
        drafting = np.flatnonzero(rng.random(batch) < 0.6)
        whole = np.zeros_like(values)
        whole[drafting] = values[drafting]
        knee = float(rng.choice([20, 256, 2048]))
        expected = draft_lengths_grid(whole, np.where(np.isin(np.arange(batch), drafting),
                                                      caps, 0), knee, 0.0, token_margin=0.3)
        sized = draft_lengths_grid(values[drafting], caps[drafting], knee, 0.0,
                                   token_margin=0.3, batch=batch)
        assert np.array_equal(sized, expected[drafting])


def test_a_shadow_is_decided_as_the_grid_rule_decides_it():
    """Shadow.decided (lists) against the rule on the grid: every candidate missed among the
    committed tokens or is no longer than them, or as many tokens as the grid is wide."""
    from vllm_cllm.policies.adaptive import Shadow

    rng = np.random.default_rng(12)
    for _ in range(3000):
        width, vocab = int(rng.integers(1, 7)), int(rng.integers(1, 4))
        grid = np.full((3, width), -1, dtype=np.int64)
        for s in range(3):
            n = int(rng.integers(0, width + 1))
            grid[s, :n] = rng.integers(0, vocab, n)
        known = rng.integers(0, vocab, int(rng.integers(0, width + 1)))
        n = len(known)
        lengths = (grid >= 0).sum(axis=1)
        expected = n >= width or bool(np.all((grid[:, :n] != known).any(axis=1) |
                                             (lengths <= n)))
        shadow = Shadow.of(grid, np.zeros_like(grid), 0)
        assert shadow.decided(known.tolist()) == expected


def test_suffix_lookup_without_room_keeps_the_trees_as_the_caches_own_calls_do():
    """A request in its trees with no room (a draining batch's early finisher) is added to
    them by the direct calls without a lookup: the same drafts, levels and trees as the
    cache's own methods (the general path) give, step by step."""
    pytest.importorskip("arctic_inference")
    from fakes import step

    from vllm_cllm.core.requests import RequestState
    from vllm_cllm.sources.suffix_trees import SuffixTrees

    direct, general = SuffixTrees(max_cached=4), SuffixTrees(max_cached=4)
    if direct._native is None:
        pytest.skip("this arctic-inference keeps its trees elsewhere")
    general._native = None
    rng = np.random.default_rng(12)
    texts = [rng.integers(0, 4, 400).tolist() for _ in range(3)]
    ends = [int(rng.integers(5, 20)) for _ in texts]
    states = ([RequestState() for _ in texts], [RequestState() for _ in texts])
    for _ in range(60):
        committed = [int(rng.integers(1, 4)) for _ in texts]
        ends = [e + c for e, c in zip(ends, committed, strict=True)]
        made = step([t[:e] for t, e in zip(texts, ends, strict=True)],
                    [t[e - c:e] for t, e, c in zip(texts, ends, committed, strict=True)])
        lengths = rng.integers(0, 6, len(texts)) * (rng.random(len(texts)) < 0.6)
        rows = list(range(len(texts)))
        found = [trees.propose(made, rows, lengths.tolist(), mine)["suffix"]
                 for trees, mine in zip((direct, general), states, strict=True)]
        for a, b in zip(*found, strict=True):
            assert a.tolist() == b.tolist()
        assert direct.levels(states[0])[0].tolist() == general.levels(states[1])[0].tolist()
        assert direct.levels(states[0])[1].tolist() == general.levels(states[1])[1].tolist()
