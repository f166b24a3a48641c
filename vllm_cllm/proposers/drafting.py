"""What both proposers draft with: the Jacobi tail completed by a fill, and per-request
scores of how well each draft source has predicted the committed tokens."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from vllm_cllm.sources.ngram import Fill

EMPTY = np.empty(0, dtype=np.int64)

#: Below this expected match length the model's own draft is cut to a short probe: verifying
#: k tokens that are almost never accepted costs time, while a probe keeps measuring the tail.
PROBE_BELOW = 0.5
PROBE_TOKENS = 2
#: The model's own draft (Jacobi tail + fill, or SPACE's candidates) is the source named
#: here; it starts optimistic so that a CLLM's tail is drafted in full at once.
MODEL_SOURCE = "model"


def next_draft(tail: np.ndarray, context: np.ndarray, k: int, fill: Fill, restart: Fill
               ) -> np.ndarray:
    """``tail`` then ``fill`` up to ``k`` tokens; ``restart`` supplies a block when both are empty.

    ``context`` is the request's committed tokens; the fill sees them followed by the tail.
    """
    tail = tail[:k]
    extra = fill(np.concatenate([context, tail]) if len(tail) else context, k - len(tail))
    draft = np.concatenate([tail, extra]) if len(extra) else tail
    if len(draft) == 0:
        draft = restart(context, k)  # never stall: e.g. the first decode step after prefill
    return np.asarray(draft[:k], dtype=np.int64)


def matched_prefix(candidate: np.ndarray, committed: list[int]) -> int:
    """How many leading tokens of ``candidate`` equal the tokens vLLM committed."""
    n = min(len(candidate), len(committed))
    mismatch = np.flatnonzero(candidate[:n] != np.asarray(committed[:n]))
    return int(mismatch[0]) if len(mismatch) else n


def _initial_scores() -> dict[str, float]:
    return {MODEL_SOURCE: 1.0}


@dataclass
class SourceScores:
    """Per-request record of how well each draft source has predicted committed tokens.

    Sources are named (``model``, ``ngram``, ``pool``, ``lookup``; ``space`` adds ``tail``);
    a source seen for the first time starts at 0. :meth:`choose` drafts the best-scoring
    source that has a draft (ties go to the source listed first), the model's own draft cut
    to a probe while it keeps missing.
    """

    scores: dict[str, float] = field(default_factory=_initial_scores)
    proposed: dict[str, np.ndarray] = field(default_factory=dict)

    def update(self, committed: list[int], decay: float = 0.7) -> None:
        """Score each source on the steps where it proposed something.

        A step where the n-gram lookup found no match says nothing about how good its matches
        are; counting it as 0 would hand the draft to the Jacobi tail right when a match shows up.
        """
        for name, draft in self.proposed.items():
            if len(draft):
                self.scores[name] = decay * self.scores.get(name, 0.0) + (1 - decay) * \
                    matched_prefix(draft, committed)
        self.proposed = {}

    def choose(self, candidates: dict[str, np.ndarray]) -> np.ndarray:
        """The draft of the best-scoring source that has one, probe rule applied."""
        self.proposed = candidates
        ranked = [name for name, draft in candidates.items() if len(draft)]
        if not ranked:
            return EMPTY
        best = max(ranked, key=lambda name: (self.scores.get(name, 0.0), -ranked.index(name)))
        return self.probed(best, candidates[best])

    def probed(self, name: str, draft: np.ndarray) -> np.ndarray:
        """``draft`` of source ``name``; the model's own is cut to a probe while it misses."""
        if name == MODEL_SOURCE and self.scores[MODEL_SOURCE] < PROBE_BELOW:
            return draft[:PROBE_TOKENS]
        return draft
