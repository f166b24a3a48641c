"""The request's prompt, its output so far and earlier requests' outputs as a draft source,
through arctic-inference's suffix trees (the library behind vLLM's own ``suffix`` method).

A suffix tree answers "what followed the longest match of the context's last tokens, and how
often" in microseconds, over every cached output at once, with per-token frequency estimates;
the numpy lookups (:mod:`vllm_cllm.sources.ngram`, :mod:`vllm_cllm.sources.history`) see the
request's own tokens and a few recent outputs only. ``jacobi`` drafts from this source when
arctic-inference is installed (option ``lookup``: ``suffix``).

Which outputs a request may draft from: a
greedy request drafts from every cached greedy output (drafts cannot change a greedy output),
a sampled one only from its own prompt and output, so that a seeded request gets the same
drafts, and so the same samples, whatever ran before it. Every tensor-parallel rank calls the
lookup in the same order, so every rank drafts the same.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Any

import numpy as np

from vllm_cllm.core.drafter import Candidates
from vllm_cllm.core.requests import RequestState
from vllm_cllm.core.step import VerifyStep

#: How long a match must be for a long draft: arctic-inference caps a draft at
#: ``factor * match_length + offset`` tokens and stops at a token whose estimated probability
#: falls below ``min_token_prob``. vLLM ``suffix``'s defaults: the tokens a looser reach adds
#: share the acceptance table's cells with likelier ones, which overstates them where a draft
#: token costs time (docs/decisions.md).
SPEC_FACTOR, SPEC_OFFSET, MIN_TOKEN_PROB = 1.0, 0.0, 0.1
#: Tokens of context matched against the trees (vLLM's ``suffix_decoding_max_tree_depth``).
TREE_DEPTH = 24

_EMPTY = np.empty(0, dtype=np.int64)

#: A lookup's tokens whose estimated probability (the tree's counts along the path) is at
#: least this are backed by its match (:func:`match_level`); the ones after them are not.
BACKED_PROB = 0.5
#: Match lengths from which a lookup's backed tokens are at level 2 and 3 (1 below).
LEVEL_MATCH = (4, 10)


def match_level(match_len: int) -> int:
    """How strongly a lookup that continues a match of ``match_len`` context tokens backs
    its tokens, 1..3 (:data:`vllm_cllm.policies.acceptance.LEVELS`): a long match is text
    being repeated, and its continuation is accepted far more often than a short one's
    (experiments/suffix_match_length)."""
    return 1 + (match_len >= LEVEL_MATCH[0]) + (match_len >= LEVEL_MATCH[1])


def backed_tokens(probs: Sequence[float]) -> int:
    """How many leading tokens of a lookup its match backs (their probabilities fall along
    the path: the first below :data:`BACKED_PROB` ends them)."""
    n = 0
    for prob in probs:
        if prob < BACKED_PROB:
            break
        n += 1
    return n


def suffix_tree_missing() -> str | None:
    """None when arctic-inference's suffix trees can be imported, else why not."""
    try:
        from arctic_inference.suffix_decoding import SuffixDecodingCache  # noqa: F401
    except ImportError as exc:
        return (f"arctic-inference is not installed ({exc}); "
                "`pip install 'vllm-cllm[suffix]'` or `pip install arctic-inference`")
    return None


def _native_trees(cache: Any) -> tuple[Any, Any] | None:
    """arctic-inference's ``SuffixTree.extend_ndarray`` and ``.speculate_ndarray`` where its
    cache keeps its trees as version 0.3 does (``_local_trees``, ``_global_tree``,
    ``_req_to_seq_id``, ``_max_cached_requests``), else None (the cache's methods)."""
    try:
        from arctic_inference.suffix_decoding._C import SuffixTree
    except ImportError:
        return None
    if not all(hasattr(cache, name) for name in ("_local_trees", "_global_tree",
                                                  "_req_to_seq_id", "_max_cached_requests")):
        return None
    if not all(hasattr(SuffixTree, name) for name in ("extend_ndarray", "speculate_ndarray")):
        return None
    return SuffixTree.extend_ndarray, SuffixTree.speculate_ndarray


@dataclass(slots=True)
class _InTree:
    """A request's place in the trees (kept in its state): its cache, how many of its tokens
    the cache holds and, where the cache is read natively, its own tree, the cache's global
    tree (None: the cache keeps no outputs) and the cache's map of requests to their
    sequences in that tree."""

    cache: Any
    seen: int
    local: Any = None
    global_tree: Any = None
    seq_ids: dict[Any, int] | None = None
    #: the last lookup's level (:func:`match_level`) and how many of its tokens it backs
    level: int = 0
    backed: int = 0


class SuffixTrees:
    """Source ``suffix``: two arctic-inference caches, ``shared`` for greedy requests (each
    one's output joins the global tree that later greedy requests draft from, the last
    ``max_cached`` kept) and ``private`` for sampled ones (a request's own prompt and output
    only). Subscribes to the request table: a request that leaves is stopped in its cache."""

    names = ("suffix",)
    part = "suffix"

    def __init__(self, max_cached: int) -> None:
        from arctic_inference.suffix_decoding import SuffixDecodingCache

        self.shared = SuffixDecodingCache(TREE_DEPTH, max_cached)
        self.private = SuffixDecodingCache(TREE_DEPTH, 0)
        #: arctic-inference's trees behind its cache's Python methods, where they are where
        #: version 0.3 keeps them: a drafting request then calls them directly (the same
        #: calls in the same order, without the per-call checks and result copies)
        self._native = _native_trees(self.shared)
        #: the last :meth:`_drafts` call's ``states`` and each one's level and backed tokens
        #: as it left them, which :meth:`levels` hands out for that same list (the policy asks
        #: right after the lookups) instead of reading every record again
        self._last_levels: tuple[Sequence[RequestState], list[int], list[int]] | None = None

    def propose(self, step: VerifyStep, rows: Sequence[int], lengths: Sequence[int],
                states: Sequence[RequestState]) -> Candidates:
        return {"suffix": [np.array(draft, dtype=np.int64) if len(draft) else _EMPTY
                           for draft in self._drafts(step, rows, lengths, states)]}

    def propose_into(self, step: VerifyStep, rows: Sequence[int], lengths: np.ndarray,
                     states: Sequence[RequestState], into: Mapping[str, np.ndarray]
                     ) -> dict[str, np.ndarray]:
        grid = into["suffix"]
        drafts = self._drafts(step, rows, lengths.tolist(), states)
        if step.native is not None:  # the token rows in C (vllm_cllm/core/_tokens_native.c)
            sizes = np.empty(len(drafts), dtype=np.int64)
            step.native.lists_into(grid, drafts, None, sizes)
            return {"suffix": sizes}
        sizes = np.fromiter(map(len, drafts), dtype=np.int64, count=len(drafts))
        grid[np.arange(grid.shape[1]) < sizes[:, None]] = np.fromiter(
            chain.from_iterable(drafts), dtype=np.int64, count=int(sizes.sum()))
        return {"suffix": sizes}

    def _drafts(self, step: VerifyStep, rows: Sequence[int], lengths: Sequence[int],
                states: Sequence[RequestState]) -> list[list[int]]:
        """Each request's lookup (at most ``lengths[j]`` tokens), as arctic-inference returns
        it: a list of token ids."""
        found: list[list[int]] = []
        append = found.append
        self._last_levels = None
        levels: list[int] = []
        backed: list[int] = []
        req_ids, token_ids = step.req_ids, step.token_ids
        subset = step.rows_index(rows)
        ends = (step.num_tokens if subset is None else step.num_tokens[subset]).tolist()
        part, native = self.part, self._native
        extend, speculate = native if native is not None else (None, None)
        # slices of vLLM's int32 token buffer are what arctic-inference reads as they are
        as_is = token_ids.dtype == np.int32 and token_ids.flags.c_contiguous
        factor, offset, min_prob = SPEC_FACTOR, SPEC_OFFSET, MIN_TOKEN_PROB
        for i, n, end, state in zip(rows, lengths, ends, states, strict=True):
            req_id = req_ids[i]
            record: _InTree | None = state.parts.get(part)
            if req_id is None or record is None or record.local is None:
                append(self._general(step, i, n, state))
                record = state.parts.get(part)
                levels.append(record.level if record is not None else 0)
                backed.append(record.backed if record is not None else 0)
                continue
            # a request in its trees: SuffixDecodingCache.add_active_response and, where it
            # may draft, .speculate, unwrapped (the same calls, without the checks and result
            # copies)
            seen, local, global_tree = record.seen, record.local, record.global_tree
            row = token_ids[i]
            if end > seen:
                tokens = row[seen:end]
                if not as_is:
                    tokens = np.ascontiguousarray(tokens, dtype=np.int32)
                extend(local, 0, tokens)
                # (the cache may have evicted the request's output from its global tree)
                seq_id = record.seq_ids.get(req_id)  # type: ignore[union-attr]
                if seq_id is not None:
                    extend(global_tree, seq_id, tokens)
            record.seen = end
            if n <= 0:  # no room (e.g. a draining batch's early finishers): nothing to look up
                record.level = record.backed = 0
                levels.append(0)
                backed.append(0)
                append([])
                continue
            context = row[end - TREE_DEPTH if end > TREE_DEPTH else 0:end]
            if not as_is:
                context = np.ascontiguousarray(context, dtype=np.int32)
            best = speculate(local, context, n, factor, offset, min_prob, False)
            if global_tree is not None:  # (an empty global tree drafts nothing)
                other = speculate(global_tree, context, n, factor, offset, min_prob, False)
                if other.score > best.score:
                    best = other
            level, at = match_level(best.match_len), backed_tokens(best.probs)
            record.level, record.backed = level, at
            levels.append(level)
            backed.append(at)
            append(best.token_ids)
        self._last_levels = (states, levels, backed)
        return found

    def _general(self, step: VerifyStep, i: int, n: int, state: RequestState) -> list[int]:
        """Request ``i``'s lookup by the general path (the cache's own methods; a request's
        first lookup): what :meth:`_drafts` takes where it cannot call the trees directly."""
        req_id = step.req_ids[i]
        if req_id is None:
            return []
        return self.draft(req_id, state, bool(step.greedy[i]), step.context(i),
                          step.prompt_end(i), n).tolist()

    def draft(self, req_id: str, state: RequestState, greedy: bool, context: np.ndarray,
              first_output: int, max_tokens: int) -> np.ndarray:
        """Up to ``max_tokens`` tokens that follow ``context`` (the request's committed tokens,
        ``context[first_output:]`` its output) by the longest suffix match.

        A request seen for the first time (or again after preemption) starts with
        ``context[:first_output]`` as its prompt; later calls add what was committed since.
        """
        self._last_levels = None  # (a record's level may change here)
        record: _InTree | None = state.parts.get(self.part)
        if record is None:
            cache = self.shared if greedy else self.private
            if req_id in cache.cached_requests:  # preempted earlier: start it afresh
                cache.evict_cached_response(req_id)
            cache.start_request(req_id, np.ascontiguousarray(context[:first_output],
                                                             dtype=np.int32))
            record = state.parts[self.part] = _InTree(cache, first_output)
            if self._native is not None:
                record.local = cache._local_trees[req_id]
                record.seq_ids = cache._req_to_seq_id
                if cache._max_cached_requests != 0:
                    record.global_tree = cache._global_tree
        if len(context) > record.seen:
            record.cache.add_active_response(
                req_id, np.ascontiguousarray(context[record.seen:], dtype=np.int32))
        record.seen = len(context)
        if max_tokens <= 0:
            record.level = record.backed = 0
            return _EMPTY
        found = record.cache.speculate(
            req_id, np.ascontiguousarray(context[-TREE_DEPTH:], dtype=np.int32),
            max_spec_tokens=max_tokens, max_spec_factor=SPEC_FACTOR,
            max_spec_offset=SPEC_OFFSET, min_token_prob=MIN_TOKEN_PROB)
        record.level, record.backed = match_level(found.match_len), backed_tokens(found.probs)
        return np.asarray(found.token_ids, dtype=np.int64)

    def levels(self, states: Sequence[RequestState]) -> tuple[np.ndarray, np.ndarray]:
        """Of each request's last lookup (``states``: theirs, in order): its level
        (:func:`match_level`; 0 without a lookup) and how many of its tokens are at it
        (the rest at 0)."""
        last = self._last_levels
        if last is not None and last[0] is states:  # what the lookups just left
            return np.array(last[1], dtype=np.int64), np.array(last[2], dtype=np.int64)
        part = self.part
        records = [state.parts.get(part) for state in states]
        level = np.fromiter((r.level if r is not None else 0 for r in records),
                            dtype=np.int64, count=len(records))
        backed = np.fromiter((r.backed if r is not None else 0 for r in records),
                             dtype=np.int64, count=len(records))
        return level, backed

    def release(self, req_id: str, state: RequestState) -> None:
        """The request left the batch (finished, aborted or preempted): forget its prompt; a
        greedy request's output stays in the shared tree for the requests after it."""
        record: _InTree | None = state.parts.get(self.part)
        if record is not None:
            record.cache.stop_request(req_id)
