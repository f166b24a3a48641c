"""Whether the batch drains: its requests finish and no new ones take their places.

Where the batch refills (a queue behind it, clients that send their next request when one
ends) a request that gets ahead frees its place for another sooner, so each token it gains
saves its share of a whole step. Where it drains (an offline batch, the end of a run) the
steps go on until its last request ends: a token a request gains saves only its own query
token, unless that request is among those that end last. The adaptive policy prices drafts
for the first case and, in a draining batch, drafts only for the requests that end last,
priced as a batch of only them (:func:`vllm_cllm.policies.adaptive.drain_rooms`).

Learned from the batch's ids alone, so every tensor-parallel rank sees the same.
"""

from __future__ import annotations

#: Steps a finished request's place may stay empty while the others run before the batch
#: counts as draining (a client's next request takes a step or two to arrive).
REFILL_STEPS = 8


class BatchFlow:
    """Tracks finishes and arrivals step by step (:meth:`update`). A batch counts as
    refilling until a request finishes and no new one joins the running batch within
    :data:`REFILL_STEPS` steps; a new request joining while others run marks it refilling
    again. A batch that starts afresh (none of the last step's requests still running)
    keeps what was learned: the next offline batch drains like the last."""

    def __init__(self) -> None:
        self.draining = False
        #: places left by finished requests and not taken since, and steps they waited
        self._open = 0
        self._waited = 0

    def update(self, previous: set[str], live: set[str]) -> set[str]:
        """A new step runs ``live`` after one that ran ``previous``; the requests new in it
        (to look up once)."""
        joined = live - previous
        finished = len(previous) - (len(live) - len(joined))
        if len(joined) == len(live):  # nothing carried over: a fresh batch (or none)
            self._open = self._waited = 0
            return joined
        if joined and self._open:
            self.draining = False
            self._open = self._waited = 0
        if finished:
            if not self._open:
                self._waited = 0
            self._open += finished
        if self._open:
            self._waited += 1
            if self._waited > REFILL_STEPS:
                self.draining = True
        return joined
