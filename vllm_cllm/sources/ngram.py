"""The request's own n-grams as a draft source (prompt-lookup decoding), and the fills that
complete a Jacobi tail up to k tokens.

Each is a deterministic function of the request's own tokens, so every tensor-parallel rank
drafts the same thing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

import numpy as np

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


class NgramIndex:
    """Where each ``ngram_min``-gram of one request's tokens occurred, kept as the request
    commits tokens (state part ``ngrams``): a step costs a dictionary probe and a look at
    the probed n-gram's occurrences, not a scan of the context. :meth:`starts` gives what
    :func:`ngram_continuations` does."""

    #: occurrences beyond which the longest match is found with numpy rather than in Python
    VECTOR_AT = 48

    def __init__(self, ngram_min: int, ngram_max: int) -> None:
        self.ngram_min, self.ngram_max = ngram_min, ngram_max
        self.tokens: list[int] = []
        #: n-gram → every position it ends at that a committed token follows, in order: the
        #: position itself while there is one (most n-grams), a list from the second on
        self.ends: dict[tuple[int, ...], int | list[int]] = {}

    def extend(self, context: np.ndarray) -> None:
        """Index the tokens of ``context`` (the request's committed tokens) not seen yet;
        starts afresh if ``context`` is not a continuation of what was indexed."""
        tokens, have, length = self.tokens, len(self.tokens), len(context)
        if have:
            if length > have:
                if tokens[-1] == context[have - 1]:
                    self._add(context[have:].tolist())
                    return
            elif length == have and tokens[-1] == context[have - 1]:
                return
        self.tokens, self.ends = [], {}
        self._add(context.tolist())

    def extend_row(self, row: np.ndarray, end: int, committed: list[int]) -> None:
        """:meth:`extend` with ``row[:end]``, the new tokens taken from ``committed`` (what
        the request committed this step, the last tokens of ``row[:end]``) where they are
        all that is new: no slice of the row is read then."""
        self.step(row[None], 0, end, committed, False)

    def step(self, buffer: np.ndarray, i: int, end: int, committed: list[int], wanted: bool
             ) -> tuple[int, int] | None:
        """:meth:`extend_row` with row ``i`` of ``buffer`` (vLLM's token buffer), then
        :meth:`starts` where ``wanted`` (one call a request and step, no row view where
        nothing but the committed tokens is new)."""
        tokens = self.tokens
        have = len(tokens)
        if have and len(committed) == end - have and tokens[-1] == buffer.item(i, have - 1):
            if committed:
                self._add(committed)
        else:
            self.extend(buffer[i, :end])
        return self._starts(buffer, i) if wanted else None

    def _add(self, new: list[int]) -> None:
        """Append ``new`` to the indexed tokens, and index the n-grams that now have a next
        token."""
        tokens, n, ends = self.tokens, self.ngram_min, self.ends
        have = len(tokens)
        tokens += new
        length = len(tokens)
        first = max(have - 1, n - 1)  # n-grams whose next token has just been committed
        if first >= length - 1:
            return
        if length - first <= 8:  # a step's few tokens: each key built without a slice
            keys = [(tokens[end - 1], tokens[end]) if n == 2 else
                    tuple(tokens[end - n + 1:end + 1]) for end in range(first, length - 1)]
        else:
            keys = zip(*(tokens[first - n + 1 + o:length - n + o] for o in range(n)),
                       strict=True)
        for end, key in enumerate(keys, first):
            found = ends.get(key)
            if found is None:
                ends[key] = end
            elif found.__class__ is int:
                ends[key] = [found, end]
            else:
                found.append(end)

    def starts(self, context: np.ndarray) -> tuple[int, int] | None:
        """Where the usual and the latest continuation of the longest suffix n-gram begin in
        the indexed tokens (:meth:`extend`), None where no suffix n-gram occurred.
        ``context`` holds them as an array (it may go on past them: a row of vLLM's token
        buffer); it is read only where an n-gram occurred very often."""
        return self._starts(context[None], 0)

    def _starts(self, buffer: np.ndarray, i: int) -> tuple[int, int] | None:
        """:meth:`starts` with row ``i`` of ``buffer`` as the context."""
        tokens, n = self.tokens, self.ngram_min
        length = len(tokens)
        top = min(self.ngram_max, length - 1)
        if top < max(n, 1):
            return None
        ends = self.ends.get((tokens[-2], tokens[-1]) if n == 2 else tuple(tokens[length - n:]))
        if ends is None:
            return None
        if ends.__class__ is int:  # one occurrence: the longest match there is
            return ends + 1, ends + 1
        if top > n and len(ends) > self.VECTOR_AT:
            hits = self._longest_vector(buffer[i], length, np.array(ends), top).tolist()
        elif top > n:
            # extend each occurrence backwards, up to top tokens; keep those that go furthest
            before = [tokens[length - 1 - back] for back in range(n, top)]  # nearest first
            best, hits = 0, []
            for end in ends:
                run = n
                for token in before:
                    if end < run or tokens[end - run] != token:
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
        counts: dict[int, int] = {}
        for end in hits:
            counts[tokens[end + 1]] = counts.get(tokens[end + 1], 0) + 1
        most = max(counts.values())
        usual = next(end for end in hits if counts[tokens[end + 1]] == most)
        return usual + 1, hits[-1] + 1

    def _longest_vector(self, context: np.ndarray, length: int, ends: np.ndarray, top: int
                        ) -> np.ndarray:
        """The occurrences in ``ends`` that match the longest suffix of ``context[:length]``
        (as :func:`_longest_ngram_hits` extends them)."""
        run = np.full(len(ends), self.ngram_min, dtype=np.int64)
        for back in range(self.ngram_min, top):
            alive = np.flatnonzero((run == back) & (ends >= back))
            if not len(alive):
                break
            same = context[ends[alive] - back] == context[length - 1 - back]
            run[alive[same]] += 1
        return ends[run == run.max()]


class RequestNgrams:
    """Source ``ngram`` (the usual continuation of the longest suffix n-gram in the request's
    tokens) and ``ngram_latest`` (its latest occurrence's), from the request's
    :class:`NgramIndex` (state part ``ngrams``)."""

    names = ("ngram", "ngram_latest")
    part = "ngrams"

    def __init__(self, fill: NgramFill) -> None:
        self.fill = fill

    def propose(self, step: VerifyStep, rows: Sequence[int], lengths: Sequence[int],
                states: Sequence[RequestState]) -> Candidates:
        spans = self._spans(step, rows, lengths, states, self.names)
        token_ids = step.token_ids
        return {name: [token_ids[i, a:a + n].astype(np.int64) if n else EMPTY
                       for i, a, n in zip(rows, starts, sizes, strict=True)]
                for name, (starts, sizes) in spans.items()}

    def propose_into(self, step: VerifyStep, rows: Sequence[int], lengths: np.ndarray,
                     states: Sequence[RequestState], into: Mapping[str, np.ndarray]
                     ) -> dict[str, np.ndarray]:
        spans = self._spans(step, rows, lengths.tolist(), states, tuple(into))
        at = step.rows_index(rows)
        found = {}
        for name, (starts, sizes) in spans.items():
            found[name] = np.array(sizes, dtype=np.int64)
            write_spans(into[name], step.token_ids, np.array(starts, dtype=np.int64),
                        found[name], source_rows=at)
        return found

    def _spans(self, step: VerifyStep, rows: Sequence[int], lengths: Sequence[int],
               states: Sequence[RequestState], names: Sequence[str]
               ) -> dict[str, tuple[list[int], list[int]]]:
        """Each request's index brought up to date with what it committed, then, for each of
        ``names``, where its continuation begins in its tokens and how long it is (0: none)."""
        fill, part, token_ids, committed = self.fill, self.part, step.token_ids, step.committed
        ngram_min, ngram_max, max_model_len = fill.ngram_min, fill.ngram_max, fill.max_model_len
        subset = step.rows_index(rows)
        ends = (step.num_tokens if subset is None else step.num_tokens[subset]).tolist()
        usual: tuple[list[int], list[int]] = ([], [])
        latest: tuple[list[int], list[int]] = ([], [])
        usual_start, usual_size = usual[0].append, usual[1].append
        latest_start, latest_size = latest[0].append, latest[1].append
        for i, n, end, state in zip(rows, lengths, ends, states, strict=True):
            index = state.parts.get(part)
            if index is None:
                index = state.parts[part] = NgramIndex(ngram_min, ngram_max)
            # NgramFill.room: what fits before max_model_len, nothing for too short a context
            n = 0 if end <= ngram_min else min(n, max_model_len - end)
            found = index.step(token_ids, i, end, committed[i], n > 0)
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
