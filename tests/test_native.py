"""The host path's C modules (``policies/_grid_native.c``, ``sources/_ngram_native.c``,
``core/_tokens_native.c``) give exactly what their numpy / Python equivalents give: the same
cells, values, choices, sizes and counts to the bit, the same n-gram spans, tails and token
rows, and so the same drafts."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from test_batched_sources import NAMES, _candidates, _random_step, _same_drafts_run

from vllm_cllm.core import step as core_step
from vllm_cllm.core.step import VerifyStep
from vllm_cllm.policies import acceptance
from vllm_cllm.policies.acceptance import HALVE_AT, TokenAcceptance
from vllm_cllm.policies.adaptive import Adaptive
from vllm_cllm.policies.cost_model import CostModel
from vllm_cllm.sources import ngram
from vllm_cllm.sources.ngram import NgramFill, RequestNgrams, ngram_starts

built = pytest.mark.skipif(acceptance._grid_native is None or ngram._ngram_native is None
                           or core_step._tokens_native is None,
                           reason="the C modules were not built (no compiler at install)")


def test_the_install_builds_the_native_modules():
    """./install.sh builds all three (setup.py's optional extensions): without them every step
    takes the slower numpy path, silently but for this test."""
    from vllm_cllm.core import _tokens_native  # noqa: F401
    from vllm_cllm.policies import _grid_native  # noqa: F401
    from vllm_cllm.sources import _ngram_native  # noqa: F401


@built
@pytest.mark.parametrize("spec, batch, steps, churn", [
    ({"knee_tokens": 2048, "floor_tokens": 0}, 16, 120, False),
    ({"knee_tokens": 2048, "floor_tokens": 0}, 64, 60, True),
    ({"knee_tokens": 256, "floor_tokens": 0, "lookup": "ngram"}, 24, 80, True),
    ({}, 8, 100, False),
])
def test_the_native_path_drafts_what_numpy_drafts(monkeypatch, spec, batch, steps, churn):
    run = _same_drafts_run()
    spec = {"method": "jacobi", "num_speculative_tokens": 15, **spec}
    native, left = run(spec, batch, steps, seed=11, churn=churn)
    monkeypatch.setattr(acceptance, "_grid_native", None)
    monkeypatch.setattr(ngram, "_ngram_native", None)
    monkeypatch.setattr(VerifyStep, "native", None)
    numpy, _ = run(spec, batch, steps, seed=11, churn=churn)
    assert native == numpy and left == 0
    assert sum(len(d) for step in native for d in step) > steps  # it drafted


@built
@pytest.mark.parametrize("native", [True, False])
def test_counting_halves_as_request_by_request(native):
    """observe_grid, native or numpy, against the per-request ``observe`` over many steps in
    which cells are halved, also within a step."""
    rng = np.random.default_rng(3)
    one, grid = TokenAcceptance(NAMES), TokenAcceptance(NAMES)
    if not native:
        grid.native = None
    rows, k = np.arange(len(NAMES)), 6
    halvings = 0
    for _ in range(300):
        batch = int(rng.integers(1, 64))
        found = [_candidates(rng, k=k) for _ in range(batch)]
        previous = rng.integers(0, 3, batch)
        committed = [rng.integers(0, 6, int(rng.integers(1, k + 2))).tolist()
                     for _ in range(batch)]
        before = one.trials.copy()
        for candidates, prev, known in zip(found, previous, committed, strict=True):
            one.observe(candidates, one.cells(candidates, int(prev)), known)
        halvings += int((one.trials < before).sum())
        tokens = np.full((batch, len(NAMES), k), -1, dtype=np.int64)
        for r, candidates in enumerate(found):
            for s, name in enumerate(NAMES):
                tokens[r, s, :len(candidates[name])] = candidates[name]
        known = np.full((batch, k), -2, dtype=np.int64)
        for r, c in enumerate(committed):
            known[r, :min(k, len(c))] = c[:k]
        grid.observe_grid(grid.grid_cells(rows, tokens, previous), tokens, known,
                          np.array([len(c) for c in committed], dtype=np.int64))
        assert np.array_equal(one.counts, grid.counts)
    assert halvings > 40 and grid.trials.max() <= HALVE_AT


class _Levels:
    """A source that backs its candidates at a level (as the suffix trees do)."""

    def __init__(self, level: np.ndarray, backed: np.ndarray) -> None:
        self.found = level, backed

    def levels(self, states):
        return self.found


@built
def test_choosing_matches_numpy_to_the_bit():
    """Adaptive._choose_native against _choose on random grids: the restart block of a row
    without a tail, backing levels, varied rates, rooms, batch sizes beyond the grid's rows
    and cost parameters below and above the floor."""
    rng = np.random.default_rng(12)
    for trial in range(300):
        rows, k = int(rng.integers(1, 40)), int(rng.integers(1, 16))
        batch = rows + int(rng.integers(0, 3)) * int(rng.integers(0, 50))
        knee, floor = float(rng.choice([8, 64, 256, 2048])), float(rng.choice([0, 0, 300]))
        policy = Adaptive(NAMES, CostModel(knee, floor), float(rng.choice([0, 0.3])))
        table = policy.acceptance
        table.accepted[...] = table.trials * rng.random(table.trials.shape)
        if trial % 3 == 0:  # many ties: a few distinct rates
            table.accepted[...] = table.trials * rng.choice([0.25, 0.5, 1.0], table.trials.shape)
        grid = np.full((rows, len(NAMES), k), -1, dtype=np.int64)
        sizes = rng.integers(0, k + 1, (rows, len(NAMES)))
        for r in range(rows):
            for s in range(len(NAMES)):
                grid[r, s, :sizes[r, s]] = rng.integers(0, 4, sizes[r, s])
        previous = rng.integers(0, 3, rows)
        rooms = rng.integers(1, k + 1, rows)
        rooms[rng.integers(0, rows)] = k
        step = _Step(batch, rng.integers(0, 3, rows) * 50)
        level = _Levels(rng.integers(0, 4, rows), rng.integers(0, k + 1, rows))
        sources = {"suffix": level if trial % 2 else SimpleNamespace(), "ngram": None,
                   "tail": None}
        levels = policy._level_table(sources, [None] * rows, rows)
        expected = policy._choose(step, batch, grid, sizes.copy(), previous, None, rooms, *levels)
        got = policy._choose_native(step, batch, grid, sizes.copy(), previous, None,
                                       rooms, *levels)
        for mine, theirs in zip(got, expected, strict=True):
            assert mine.dtype == theirs.dtype and np.array_equal(mine, theirs)


class _Step:
    """What the choosers read of a step: its batch size and each request's token count."""

    def __init__(self, batch: int, num_tokens: np.ndarray) -> None:
        self.batch, self.num_tokens = batch, num_tokens

    def __len__(self) -> int:
        return self.batch


@built
def test_the_native_ngram_search_finds_what_the_byte_search_finds():
    """RequestNgrams.propose_into in C against ngram_starts, per request, over vLLM-like
    token buffers (int32 and int64), a subset of their rows, rooms and max_model_len."""
    rng = np.random.default_rng(13)
    for trial in range(400):
        vocab = int(rng.choice([2, 5, 9, 300, 70000]))
        ngram_min = int(rng.integers(1, 4))
        ngram_max = ngram_min + int(rng.integers(0, 4))
        batch, width = int(rng.integers(1, 12)), 160
        max_model_len = int(rng.choice([width, 120]))
        dtype = (np.int32, np.int64)[trial % 2]
        token_ids = rng.integers(0, vocab, (batch, width)).astype(dtype)
        num_tokens = rng.integers(0, max_model_len + 1, batch)
        num_tokens[0] = max_model_len
        rows = sorted(rng.choice(batch, int(rng.integers(1, batch + 1)), replace=False).tolist())
        lengths = rng.integers(1, 9, len(rows))
        step = VerifyStep(req_ids=[str(i) for i in range(batch)],
                          committed=[[1]] * batch, num_tokens=num_tokens, token_ids=token_ids,
                          rooms=np.full(batch, 8), greedy=np.ones(batch, dtype=bool),
                          predictions=None)
        names = [("ngram",), ("ngram_latest",), ("ngram", "ngram_latest")][trial % 3]
        source = RequestNgrams(NgramFill(ngram_min, ngram_max, max_model_len))
        grid = np.full((len(rows), 2, 8), -1, dtype=np.int64)
        into = {name: grid[:, s] for s, name in enumerate(names)}
        found = source.propose_into(step, rows, lengths, [], into)
        for j, i in enumerate(rows):
            end = int(num_tokens[i])
            n = 0 if end <= ngram_min else min(int(lengths[j]), max_model_len - end)
            starts = ngram_starts(token_ids[i, :end].tobytes(), token_ids.itemsize,
                                  ngram_min, ngram_max) if n > 0 else None
            for s, name in enumerate(names):
                start = None if starts is None else starts[name == "ngram_latest"]
                want = [] if start is None else token_ids[i, start:min(start + n, end)].tolist()
                assert int(found[name][j]) == len(want)
                assert grid[j, s, :len(want)].tolist() == want
                assert (grid[j, s, len(want):] == -1).all()


@built
def test_the_native_token_rows_are_the_numpy_ones(monkeypatch):
    """VerifyStep.tails_into (host rows and the device's blocks, row subsets, tails longer
    than the room) and committed_grid (commits longer than the grid) in C against numpy."""
    rng = np.random.default_rng(14)
    for trial in range(300):
        batch = int(rng.integers(1, 14))
        made = _random_step(rng, batch, device=trial % 2 == 0)
        rows = sorted(rng.choice(batch, int(rng.integers(1, batch + 1)), replace=False).tolist())
        lengths = rng.integers(0, 8, len(rows))
        width = int(rng.integers(1, 9))
        found = []
        for native in (core_step._tokens_native, None):
            monkeypatch.setattr(VerifyStep, "native", native)
            into = np.full((len(rows), 8), -1, dtype=np.int64)
            sizes = made.tails_into(rows, lengths, into)
            found.append((into, sizes, *made.committed_grid(rows, width)))
        for mine, theirs in zip(*found, strict=True):
            assert mine.dtype == theirs.dtype and np.array_equal(mine, theirs)



@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_the_native_step_arrays_are_the_numpy_ones(monkeypatch, dtype):
    """VerifyStep.from_vllm in C against numpy: lengths, commits, rooms (partial prefills,
    requests at or past the end of the model's length) and the requests that draft."""
    rng = np.random.default_rng(15)
    for _ in range(200):
        batch = int(rng.integers(1, 20))
        committed = [rng.integers(0, 99, int(rng.integers(0, 4))).tolist()
                     for _ in range(batch)]
        num_tokens = rng.integers(0, 70, batch + int(rng.integers(0, 3))).astype(dtype)
        max_draft, max_model_len = int(rng.integers(0, 9)), int(rng.integers(1, 70))
        steps = []
        for native in (core_step._tokens_native, None):
            monkeypatch.setattr(VerifyStep, "native", native)
            steps.append(VerifyStep.from_vllm(committed, num_tokens, np.zeros((batch, 70)),
                                              None, set(), max_draft, max_model_len))
        mine, theirs = steps
        assert mine._drafting is not None and theirs._drafting is None
        for name in ("num_tokens", "num_committed", "rooms", "greedy"):
            a, b = getattr(mine, name), getattr(theirs, name)
            assert a.dtype == b.dtype and np.array_equal(a, b), name
        assert mine.drafting() == theirs.drafting() == np.flatnonzero(theirs.rooms).tolist()
    with pytest.raises(ValueError, match="num_tokens"):
        core_step._tokens_native.step_arrays([[1]], np.zeros(1, dtype=np.float64), 1, 9,
                                             np.empty((3, 1), dtype=np.int64))
