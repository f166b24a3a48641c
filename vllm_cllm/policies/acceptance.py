"""How likely each draft token is to be accepted, learned online from what vLLM commits.

``jacobi``'s adaptive drafting has several candidate drafts per request and step (the suffix
lookup, the request's own n-gram continuation, the model's Jacobi tail). Each token of each
candidate falls into a cell — its source, its position in the draft (0..3, 4 and later
together), how many of the *other* candidates put the same token at the same position, and
how the request's previous draft fared (nothing accepted, something accepted, nothing
drafted) —, and each cell holds how often a token in it was accepted given that the tokens
before it were. Agreement is the strongest signal there is: a lookup token that the Jacobi
tail also predicts is accepted far more often than one it contradicts (docs/decisions.md).

The estimates are learned from every candidate (drafted or not) on the positions whose
outcome the committed tokens reveal, so a source that is not being drafted is still measured.
Counts start at a prior of 30 % and are halved when they grow large, so the estimates follow
the workload. Every tensor-parallel rank sees the same committed tokens in the same order and
so holds the same estimates.
"""

from __future__ import annotations

import numpy as np

#: Draft positions with a cell of their own; later positions share the last cell.
POSITIONS = 5
#: Agreement counts with a cell of their own; more agreeing candidates share the last cell.
MAX_VOTES = 2
#: How the request's previous draft fared: a cell of its own each.
MISSED, HIT, UNDRAFTED = 0, 1, 2
#: The prior: this many observations at a 30 % acceptance. Low enough that a fresh engine
#: under load drafts nothing until its cells show better, high enough that at batch 1 it
#: drafts from the first step (its first verify steps fill the cells of position 0 whether
#: anything is drafted or not).
PRIOR_TRIALS, PRIOR_RATE = 4.0, 0.3
#: A cell's counts are halved once it has seen this many tokens, so that recent evidence
#: weighs more: the table follows a change of workload within a few hundred tokens per cell.
HALVE_AT = 512.0

#: Per candidate: its source's row, each token's position and vote cells, the outcome cell.
Cells = dict[str, tuple[int, np.ndarray, np.ndarray, int]]


class TokenAcceptance:
    """Per-cell acceptance counts for the candidate sources named at construction."""

    def __init__(self, sources: tuple[str, ...]) -> None:
        self.sources = sources
        self._row = {name: i for i, name in enumerate(sources)}
        shape = (len(sources), POSITIONS, MAX_VOTES + 1, 3)
        self.trials = np.full(shape, PRIOR_TRIALS)
        self.accepted = np.full(shape, PRIOR_TRIALS * PRIOR_RATE)

    def cells(self, candidates: dict[str, np.ndarray], previous: int = UNDRAFTED) -> Cells:
        """Each non-empty candidate's (source row, position cells, vote cells, ``previous``:
        how the request's last draft fared, :data:`MISSED` / :data:`HIT` / :data:`UNDRAFTED`)."""
        names = [name for name, draft in candidates.items() if len(draft)]
        if not names:
            return {}
        width = max(len(candidates[name]) for name in names)
        grid = np.full((len(names), width), -1, dtype=np.int64)
        for r, name in enumerate(names):
            grid[r, :len(candidates[name])] = candidates[name]
        present = grid >= 0
        votes = ((grid[:, None, :] == grid[None, :, :]) & present[None, :, :]).sum(axis=1) - 1
        positions = np.minimum(np.arange(width), POSITIONS - 1)
        return {name: (self._row[name], positions[:len(candidates[name])],
                       np.minimum(votes[r, :len(candidates[name])], MAX_VOTES), previous)
                for r, name in enumerate(names)}

    def values(self, cells: Cells) -> dict[str, np.ndarray]:
        """Per candidate (its :meth:`cells`), the expected number of tokens each of its
        positions adds: the probability that it and every token before it are accepted
        (non-increasing)."""
        rates = self.accepted / self.trials
        return {name: np.cumprod(rates[row, pos, votes, previous])
                for name, (row, pos, votes, previous) in cells.items()}

    def observe(self, candidates: dict[str, np.ndarray], cells: Cells,
                committed: list[int]) -> None:
        """Count each candidate's tokens (``cells``: theirs) up to its first miss, as far as
        ``committed`` (what vLLM committed in the step that verified them) reveals."""
        known = np.asarray(committed, dtype=np.int64)
        for name, (row, pos, votes, previous) in cells.items():
            draft = candidates[name]
            n = min(len(draft), len(known))
            if n == 0:
                continue
            misses = np.flatnonzero(draft[:n] != known[:n])
            seen = int(misses[0]) + 1 if len(misses) else n
            np.add.at(self.trials, (row, pos[:seen], votes[:seen], previous), 1.0)
            hits = seen - 1 if len(misses) else seen
            np.add.at(self.accepted, (row, pos[:hits], votes[:hits], previous), 1.0)
        crowded = self.trials > HALVE_AT
        if crowded.any():
            self.trials[crowded] /= 2
            self.accepted[crowded] /= 2
