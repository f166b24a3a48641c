"""An optional log of every step's candidates and drafts, for measuring the choice afterwards.

With :data:`CANDIDATE_LOG_ENV` set to a path when the proposer is built, the ``jacobi``
policies append one JSON line per verify step and policy to that file: per drafting request
its id (vLLM's engine-core id), its committed length (prompt included), its room, every
candidate it had (tokens, already cut to the room) and what it drafted. Since greedy output
is fixed, every candidate's accepted length is known once the request has finished (its
common prefix with the output from that position): ``vllm-cllm bench`` reads the log to
compute the oracle of each ``jacobi`` row (docs/benchmarking.md). The log only reads what
the policy built; the drafts are the same with it or without.
"""

from __future__ import annotations

import json
import os
import weakref
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from vllm_cllm.core.step import VerifyStep

#: Path of the candidate log (unset or empty: no log).
CANDIDATE_LOG_ENV = "VLLM_CLLM_CANDIDATE_LOG"


class CandidateLog:
    """Appends each step's candidates to ``path``: one line per step and policy,
    ``{"step", "batch", "knee", "floor", "requests": [{"id", "num_tokens", "room",
    "candidates": {name: tokens}, "drafted", "expected"}]}`` (``expected``: how many drafted
    tokens the policy expected accepted, where it values them). ``step`` counts the verify
    steps this log saw (the policies of one step share it); ``batch`` is the step's batch
    size; ``knee`` and ``floor`` the cost model the policy priced with (None: it has none).
    Each line is flushed, so a reader sees every finished step."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 (open while serving)
        #: the last step logged, not kept alive (it holds vLLM's token buffer)
        self._last: Callable[[], VerifyStep | None] = lambda: None
        self.steps = 0

    @classmethod
    def from_env(cls) -> CandidateLog | None:
        path = os.environ.get(CANDIDATE_LOG_ENV)
        return cls(path) if path else None

    def record(self, step: VerifyStep, rows: Sequence[int],
               candidates: Mapping[str, Sequence[np.ndarray]], drafts: Sequence[np.ndarray],
               cost: tuple[float, float] | None = None,
               extra: Mapping[int, np.ndarray] | None = None, extra_name: str = "",
               expected: Mapping[int, float] | None = None) -> None:
        """One policy's requests ``rows`` of ``step``: ``candidates[name][j]`` is request
        ``rows[j]``'s candidate, ``drafts[j]`` its draft; ``extra[j]`` (named ``extra_name``)
        a candidate only some requests had (the restart blocks that were drawn);
        ``expected[j]`` how many of its draft's tokens the policy expected accepted."""
        if self._last() is not step:
            self._last, self.steps = weakref.ref(step), self.steps + 1
        requests = []
        for j, i in enumerate(rows):
            mine = {name: tokens[j].tolist() for name, tokens in candidates.items()}
            if extra is not None and j in extra:
                mine[extra_name] = extra[j].tolist()
            request = {"id": step.req_ids[i], "num_tokens": int(step.num_tokens[i]),
                       "room": int(step.rooms[i]), "candidates": mine,
                       "drafted": np.asarray(drafts[j]).tolist()}
            if expected is not None and j in expected:
                request["expected"] = expected[j]
            requests.append(request)
        knee, floor = (float(cost[0]), float(cost[1])) if cost is not None else (None, None)
        self._file.write(json.dumps({"step": self.steps, "batch": len(step), "knee": knee,
                                     "floor": floor, "requests": requests}) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()
