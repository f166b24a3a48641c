"""Fixed-order drafting: each request drafts the first source, in a fixed order, that has a
candidate this step, up to its room (``adaptive: false``, every fill but ``hybrid``, and every
sampled request).

A lookup's match guesses the next token right more often than a small CLLM's tail does, so
``jacobi``'s order puts the request's n-grams and the lookup of earlier text first, the pool
of recent iterates before the block (docs/decisions.md). The block's score, per request,
decides only its probe (:mod:`vllm_cllm.policies.scores`). A sampled request's drafts depend
on its own tokens only, so a seeded request samples the same whatever runs beside it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from vllm_cllm.core.drafter import Candidates, DraftSource
from vllm_cllm.core.requests import RequestState
from vllm_cllm.core.step import VerifyStep
from vllm_cllm.core.tokens import EMPTY
from vllm_cllm.policies.candidate_log import CandidateLog
from vllm_cllm.policies.scores import SourceScores

#: ``ngram``'s slot goes to whichever of its two continuations has matched better in the
#: request, the usual one on a tie: worked solutions reuse a phrase with new numbers, and
#: there the latest occurrence is right more often; in code and chat the usual one is.
ALTERNATIVES = {"ngram": "ngram_latest"}


def gather(sources: Mapping[str, DraftSource], names: Sequence[str], step: VerifyStep,
           rows: Sequence[int], lengths: Sequence[int], states: Sequence[RequestState]
           ) -> Candidates:
    """The candidates of ``names`` (each source asked once, in the order of ``names``)."""
    found: Candidates = {}
    for name in names:
        if name not in found:
            found.update(sources[name].propose(step, rows, lengths, states))
    return {name: found[name] for name in names}


class FixedOrder:
    """Drafts the first of ``order`` that has a candidate. With ``scored``, every candidate
    is scored per request (state part ``scores``), the ``block``'s score cuts it to a probe
    while it misses, and :data:`ALTERNATIVES` may take a source's slot; without, the first
    candidate is drafted as it is."""

    part = "scores"

    def __init__(self, order: Sequence[str], scored: bool = True,
                 optional: Sequence[str] = ()) -> None:
        self.order = tuple(order)
        #: sources in ``order`` that may be missing from a drafter (skipped then)
        self.optional = set(optional)
        self.scored = scored
        #: logs each step's candidates where set (:mod:`vllm_cllm.policies.candidate_log`)
        self.recorder: CandidateLog | None = None

    def draft(self, step: VerifyStep, rows: Sequence[int], states: Sequence[RequestState],
              sources: Mapping[str, DraftSource]) -> list[np.ndarray]:
        names = [n for n in self.order if n in sources or n not in self.optional]
        if self.scored:
            names += [ALTERNATIVES[n] for n in names if ALTERNATIVES.get(n) in sources]
            for i, state in zip(rows, states, strict=True):
                self.scores(state).update(step.committed[i])
        lengths = [int(step.rooms[i]) for i in rows]
        candidates = gather(sources, names, step, rows, lengths, states)
        for source in {id(sources[n]): sources[n] for n in names}.values():
            remember = getattr(source, "remember", None)  # sources that keep this step
            if remember is not None:
                remember(step, rows, states)
        drafts = []
        for j, state in enumerate(states):
            mine = {name: candidates[name][j] for name in names}
            if not self.scored:
                drafts.append(next((mine[n] for n in names if len(mine[n])), EMPTY))
                continue
            scores = self.scores(state)
            scores.proposed = dict(mine)  # scored next step, before a slot is taken
            for name, other in ALTERNATIVES.items():
                if name in mine and scores.scores.get(other, 0.0) > \
                        scores.scores.get(name, 0.0) and len(mine[other]):
                    mine[name] = mine[other]
            name = next((n for n in self.order if len(mine.get(n, EMPTY))), None)
            drafts.append(EMPTY if name is None else scores.probed(name, mine[name]))
        if self.recorder is not None:
            self.recorder.record(step, rows, candidates, drafts)
        return drafts

    def scores(self, state: RequestState) -> SourceScores:
        return state.parts.setdefault(self.part, SourceScores("block"))
