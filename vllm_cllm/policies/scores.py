"""Per-request scores of how well each draft source has predicted the committed tokens."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from vllm_cllm.core.tokens import EMPTY, matched_prefix

#: Below this expected match length the optimistic source's draft is cut to a short probe:
#: verifying k tokens that are almost never accepted costs time, while a probe keeps
#: measuring the source.
PROBE_BELOW = 0.5
PROBE_TOKENS = 2
#: The decay of a source's score per step it proposed something.
DECAY = 0.7


@dataclass
class SourceScores:
    """How well each named source has matched, in one request.

    The ``optimistic`` source (the model's own draft) starts at 1, so that a CLLM's tail is
    drafted in full at once, and is cut to a probe while it keeps missing; a source seen for
    the first time starts at 0. :meth:`choose` drafts the best-scoring source that has a
    draft (ties go to the source listed first).
    """

    optimistic: str
    scores: dict[str, float] = field(default_factory=dict)
    proposed: dict[str, np.ndarray] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.scores.setdefault(self.optimistic, 1.0)

    def update(self, committed: list[int]) -> None:
        """Score each source on the steps where it proposed something.

        A step where a lookup found no match says nothing about how good its matches are;
        counting it as 0 would hand the draft to the Jacobi tail right when a match shows up.
        """
        for name, draft in self.proposed.items():
            if len(draft):
                self.scores[name] = DECAY * self.scores.get(name, 0.0) + (1 - DECAY) * \
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
        """``draft`` of source ``name``; the optimistic one's is cut to a probe while it
        misses."""
        if name == self.optimistic and self.scores[self.optimistic] < PROBE_BELOW:
            return draft[:PROBE_TOKENS]
        return draft
