"""The request's own n-grams as a draft source (prompt-lookup decoding), and the fills that
complete a Jacobi tail up to k tokens.

Each is a deterministic function of the request's own tokens, so every tensor-parallel rank
drafts the same thing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

import numpy as np

try:  # the whole step's search in C (_ngram_native.c), built by setup.py where a compiler is
    from vllm_cllm.sources import _ngram_native
except ImportError:  # not built: Python's byte search, the same spans
    _ngram_native = None

from vllm_cllm.core.drafter import Candidates
from vllm_cllm.core.requests import RequestState
from vllm_cllm.core.step import VerifyStep
from vllm_cllm.core.tokens import EMPTY, write_spans


class Fill(Protocol):
    def __call__(self, context: np.ndarray, num_tokens: int) -> np.ndarray:
        """Up to ``num_tokens`` guesses for the tokens that follow ``context``."""


def _longest_ngram_hits(context: np.ndarray, ngram_min: int, ngram_max: int) -> np.ndarray:
    """Positions right after each earlier occurrence of the longest suffix n-gram
    (``ngram_max`` down to ``ngram_min`` tokens) that occurred before; empty if none did.

    Every earlier occurrence of the last token is extended backwards one token at a time, so
    a step costs one comparison over the context and a few over its matches (it runs for
    every request at every step)."""
    length = len(context)
    top = min(ngram_max, length - 1)
    if top < max(ngram_min, 1):
        return np.empty(0, dtype=np.int64)
    ends = np.flatnonzero(context[:length - 1] == context[length - 1])
    run = np.ones(len(ends), dtype=np.int64)  # matched suffix length ending at each end
    for back in range(1, top):
        alive = np.flatnonzero((run == back) & (ends >= back))
        if not len(alive):
            break
        same = context[ends[alive] - back] == context[length - 1 - back]
        run[alive[same]] += 1
    if not len(run) or run.max() < ngram_min:
        return np.empty(0, dtype=np.int64)
    return ends[run == run.max()] + 1


def _usual_start(context: np.ndarray, hits: np.ndarray) -> int:
    """The first hit whose next token is the one that most often followed the n-gram."""
    _, which, counts = np.unique(context[hits], return_inverse=True, return_counts=True)
    return int(hits[np.argmax(counts[which])])


def longest_ngram_continuation(context: np.ndarray, ngram_min: int, ngram_max: int,
                               num_tokens: int) -> np.ndarray:
    """Tokens that followed the longest matching suffix n-gram: at the occurrence whose next
    token followed it most often, the first such occurrence on a tie.

    The first occurrence, as vLLM's ngram proposer does: in code and in answers that quote the
    prompt it is the original the model copies from. The most frequent next token first, as
    vLLM's ``suffix`` method ranks its tree: an n-gram seen several times with different
    continuations continues as it usually did (docs/decisions.md).

    Prompt-lookup decoding over the request's own tokens. Written with numpy rather than by
    calling vLLM's numba matcher: importing numba (llvmlite) into a process makes every later
    in-process vLLM 0.32 engine fail at start-up (its kernel-override scan trips over an
    llvmlite object), which would break sequential engines in tests and benchmarks.
    """
    hits = _longest_ngram_hits(context, ngram_min, ngram_max)
    if not len(hits):
        return context[:0]
    start = _usual_start(context, hits)
    return context[start:start + num_tokens]


def ngram_continuations(context: np.ndarray, ngram_min: int, ngram_max: int,
                        num_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """The usual continuation (:func:`longest_ngram_continuation`) and the one at the n-gram's
    latest occurrence, from one search. The latest is what a worked solution continues with
    once its numbers move on (step 3 repeats step 2's phrasing with step 2's results);
    ``jacobi`` scores both per request."""
    hits = _longest_ngram_hits(context, ngram_min, ngram_max)
    if not len(hits):
        return context[:0], context[:0]
    usual, latest = _usual_start(context, hits), int(hits[-1])
    return context[usual:usual + num_tokens], context[latest:latest + num_tokens]


class NgramFill:
    """Continue the longest suffix n-gram that already occurred in the request's tokens."""

    def __init__(self, ngram_min: int, ngram_max: int, max_model_len: int) -> None:
        self.ngram_min, self.ngram_max, self.max_model_len = ngram_min, ngram_max, max_model_len

    def room(self, length: int, num_tokens: int) -> int:
        """Tokens a continuation of a context of ``length`` tokens may have (0: none, or too
        short a context to search)."""
        if length <= self.ngram_min:
            return 0
        return max(0, min(num_tokens, self.max_model_len - length))

    def __call__(self, context: np.ndarray, num_tokens: int) -> np.ndarray:
        num_tokens = self.room(len(context), num_tokens)
        if num_tokens == 0:
            return context[:0]
        return longest_ngram_continuation(np.asarray(context), self.ngram_min, self.ngram_max,
                                          num_tokens)


class NoFill:
    """Complete nothing: the tail alone (CLLM's shrinking block)."""

    def __call__(self, context: np.ndarray, num_tokens: int) -> np.ndarray:
        return context[:0]


def ngram_starts(tokens: bytes, size: int, ngram_min: int, ngram_max: int
                 ) -> tuple[int, int] | None:
    """Where the usual and the latest continuation of the longest suffix n-gram begin in a
    request's tokens (``tokens``: their bytes, ``size`` bytes each, as in vLLM's token
    buffer), None where no suffix n-gram occurred: what :func:`ngram_continuations` finds.

    Every earlier occurrence of the last ``ngram_min`` tokens is found by a search of the
    bytes (Python's substring search, in C: no index to build, keep and free per request,
    one pass over the request's tokens a step), then extended backwards up to ``ngram_max``
    tokens as :func:`_longest_ngram_hits` extends them."""
    length = len(tokens) // size
    top = min(ngram_max, length - 1)
    if top < max(ngram_min, 1):
        return None
    n, find = ngram_min, tokens.find
    pattern = tokens[(length - n) * size:]
    limit = (length - 1) * size  # an occurrence ends before the last token: one follows it
    ends = []
    at = find(pattern, 0, limit)
    while at >= 0:
        if at % size:  # across two tokens' bytes: not an occurrence
            at = find(pattern, at + 1, limit)
            continue
        ends.append(at // size + n - 1)
        at = find(pattern, at + size, limit)
    if not ends:
        return None
    if len(ends) == 1:  # one occurrence: the longest match there is
        return ends[0] + 1, ends[0] + 1
    if top > n:
        # extend each occurrence backwards, up to top tokens; keep those that go furthest
        before = [tokens[(length - 1 - back) * size:(length - back) * size]
                  for back in range(n, top)]  # the suffix's earlier tokens, nearest first
        best, hits = 0, []
        for end in ends:
            run = n
            for token in before:
                at = (end - run) * size
                if end < run or tokens[at:at + size] != token:
                    break
                run += 1
            if run > best:
                best, hits = run, [end]
            elif run == best:
                hits.append(end)
    else:
        hits = ends
    if len(hits) == 1:
        return hits[0] + 1, hits[0] + 1
    # the first hit whose next token followed the n-gram most often
    follows = [tokens[(end + 1) * size:(end + 2) * size] for end in hits]
    counts: dict[bytes, int] = {}
    for token in follows:
        counts[token] = counts.get(token, 0) + 1
    most = max(counts.values())
    usual = next(end for end, token in zip(hits, follows, strict=True) if counts[token] == most)
    return usual + 1, hits[-1] + 1


class RequestNgrams:
    """Source ``ngram`` (the usual continuation of the longest suffix n-gram in the request's
    tokens) and ``ngram_latest`` (its latest occurrence's), looked up in the request's tokens
    in vLLM's buffer each step (:func:`ngram_starts`); nothing is kept between steps."""

    names = ("ngram", "ngram_latest")

    def __init__(self, fill: NgramFill) -> None:
        self.fill = fill
        #: the C module that searches a whole step (None: Python; tests switch it)
        self.native = _ngram_native

    def propose(self, step: VerifyStep, rows: Sequence[int], lengths: Sequence[int],
                states: Sequence[RequestState]) -> Candidates:
        spans = self._spans(step, rows, lengths, self.names)
        token_ids = step.token_ids
        return {name: [token_ids[i, a:a + n].astype(np.int64) if n else EMPTY
                       for i, a, n in zip(rows, starts, sizes, strict=True)]
                for name, (starts, sizes) in spans.items()}

    def propose_into(self, step: VerifyStep, rows: Sequence[int], lengths: np.ndarray,
                     states: Sequence[RequestState], into: Mapping[str, np.ndarray]
                     ) -> dict[str, np.ndarray]:
        token_ids = step.token_ids
        if self.native is not None and token_ids.flags.c_contiguous and \
                token_ids.dtype in (np.int32, np.int64):  # the same search, in C
            fill = self.fill
            subset = step.rows_index(rows)
            ends = step.num_tokens if subset is None else step.num_tokens[subset]
            sizes = {name: np.zeros(len(rows), dtype=np.int64) for name in into}
            self.native.spans(token_ids, subset, np.ascontiguousarray(ends, dtype=np.int64),
                              np.ascontiguousarray(lengths, dtype=np.int64), fill.ngram_min,
                              fill.ngram_max, fill.max_model_len, into.get("ngram"),
                              into.get("ngram_latest"), sizes.get("ngram"),
                              sizes.get("ngram_latest"))
            return sizes
        spans = self._spans(step, rows, lengths.tolist(), tuple(into))
        at = step.rows_index(rows)
        found = {}
        for name, (starts, sizes) in spans.items():
            found[name] = np.array(sizes, dtype=np.int64)
            write_spans(into[name], step.token_ids, np.array(starts, dtype=np.int64),
                        found[name], source_rows=at)
        return found

    def _spans(self, step: VerifyStep, rows: Sequence[int], lengths: Sequence[int],
               names: Sequence[str]) -> dict[str, tuple[list[int], list[int]]]:
        """For each of ``names``, where each request's continuation begins in its tokens and
        how long it is (0: none)."""
        fill, token_ids = self.fill, step.token_ids
        ngram_min, ngram_max, max_model_len = fill.ngram_min, fill.ngram_max, fill.max_model_len
        size = token_ids.itemsize
        subset = step.rows_index(rows)
        ends = (step.num_tokens if subset is None else step.num_tokens[subset]).tolist()
        usual: tuple[list[int], list[int]] = ([], [])
        latest: tuple[list[int], list[int]] = ([], [])
        usual_start, usual_size = usual[0].append, usual[1].append
        latest_start, latest_size = latest[0].append, latest[1].append
        for i, n, end in zip(rows, lengths, ends, strict=True):
            # NgramFill.room: what fits before max_model_len, nothing for too short a context
            n = 0 if end <= ngram_min else min(n, max_model_len - end)
            found = ngram_starts(token_ids[i, :end].tobytes(), size, ngram_min, ngram_max) \
                if n > 0 else None
            if found is None:
                usual_start(end)
                usual_size(0)
                latest_start(end)
                latest_size(0)
            else:
                one, other = found
                usual_start(one)
                usual_size(min(n, end - one))
                latest_start(other)
                latest_size(min(n, end - other))
        return {name: spans for name, spans in zip(self.names, (usual, latest), strict=True)
                if name in names}
