"""Outputs of requests that already finished, as a draft source for the ones still running.

Answers to similar prompts repeat whole phrases ("Let's break this down step by step", the
scaffolding of a solution, boilerplate code); vLLM's ``suffix`` method drafts from earlier
responses for that reason. :class:`OutputHistory` keeps the last few outputs, indexed by their
n-grams of ``min_match`` tokens, so that a lookup per request and step costs a dictionary
probe, not a scan of every output. Filled in the order requests leave the batch, which every
tensor-parallel rank sees alike, so every rank drafts the same. Only greedy requests draft
from it: a sampled request's samples depend on its drafts, and a seeded one must get the same
samples whatever ran before it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import numpy as np

from vllm_cllm.core.drafter import Candidates
from vllm_cllm.core.requests import RequestState
from vllm_cllm.core.step import VerifyStep
from vllm_cllm.core.tokens import EMPTY
from vllm_cllm.sources.ngram import Fill


class OutputHistory:
    """The last ``size`` outputs and where each of their ``min_match``-grams occurs."""

    def __init__(self, size: int, min_match: int = 3, max_match: int = 16) -> None:
        self.size, self.min_match, self.max_match = size, min_match, max_match
        self.outputs: dict[int, np.ndarray] = {}  # serial → tokens, oldest first
        self.index: defaultdict[tuple[int, ...], list[tuple[int, int]]] = defaultdict(list)
        self._serial = 0

    def __len__(self) -> int:
        return len(self.outputs)

    def _ngrams(self, tokens: np.ndarray) -> list[tuple[tuple[int, ...], int]]:
        """Each n-gram followed by a token, with the position of that token."""
        n, values = self.min_match, tokens.tolist()
        return [(tuple(values[p - n:p]), p) for p in range(n, len(values))]

    def add(self, output: np.ndarray) -> None:
        """Remember ``output`` (a copy), forgetting the oldest beyond ``size``."""
        if self.size <= 0 or len(output) <= self.min_match:
            return
        serial, self._serial = self._serial, self._serial + 1
        tokens = self.outputs[serial] = np.array(output, dtype=np.int64)
        for key, pos in self._ngrams(tokens):
            self.index[key].append((serial, pos))
        while len(self.outputs) > self.size:
            oldest = next(iter(self.outputs))
            for key, _ in self._ngrams(self.outputs.pop(oldest)):
                entries = [e for e in self.index[key] if e[0] != oldest]
                if entries:
                    self.index[key] = entries
                else:
                    del self.index[key]

    def continuation(self, context: np.ndarray, num_tokens: int) -> np.ndarray:
        """What followed the longest suffix of ``context`` (``max_match`` down to
        ``min_match`` tokens) in a remembered output: the newest output first, its first
        occurrence."""
        n = self.min_match
        if num_tokens <= 0 or len(context) < n:
            return context[:0]
        entries = self.index.get(tuple(context[-n:].tolist()))
        if not entries:
            return context[:0]
        tail = context[-self.max_match:][::-1]  # context backwards from its last token
        best = (0, 0, 0)  # (matched length, serial, -position)
        for serial, pos in entries:
            before = self.outputs[serial][max(0, pos - self.max_match):pos][::-1]
            m = min(len(before), len(tail))
            differ = np.flatnonzero(before[:m] != tail[:m])
            best = max(best, (int(differ[0]) if len(differ) else m, serial, -pos))
        _, serial, neg_pos = best
        return self.outputs[serial][-neg_pos:-neg_pos + num_tokens]


class HistoryFill:
    """``first`` (e.g. the request's own n-grams), else the history's continuation."""

    def __init__(self, first: Fill, history: OutputHistory) -> None:
        self.first, self.history = first, history

    def __call__(self, context: np.ndarray, num_tokens: int) -> np.ndarray:
        found = self.first(context, num_tokens)
        return found if len(found) else self.history.continuation(context, num_tokens)


class HistorySource:
    """Source ``history``: the :class:`OutputHistory` continuation, for greedy requests.
    Subscribes to the request table (wanting outputs): a request that leaves adds its
    output."""

    names = ("history",)

    def __init__(self, history: OutputHistory) -> None:
        self.history = history

    def propose(self, step: VerifyStep, rows: Sequence[int], lengths: Sequence[int],
                states: Sequence[RequestState]) -> Candidates:
        return {"history": [self.history.continuation(step.context(i), n)
                            if self.history and step.greedy[i] else EMPTY
                            for i, n in zip(rows, lengths, strict=True)]}

    def release(self, req_id: str, state: RequestState) -> None:
        self.history.add(np.asarray(state.output, dtype=np.int64))
