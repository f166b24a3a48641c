"""The capture mechanism every proposer of this project shares.

In each verify step vLLM computes logits at every draft position of every request, but keeps
only the accepted tokens. :class:`VerifyObserver` receives those logits (through the
``_sample`` wrapper in ``patches/verify_capture.py``), takes one argmax over all rows and
copies that single small int tensor to the host. The result, :class:`VerifyPredictions`, gives
each input-batch row the target's predictions ``g_1 .. g_{n+1}`` for its ``n`` drafts.
No extra forward pass, no collectives: every tensor-parallel rank computes the same thing.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

#: Set to 1 to print the number of requests a proposer holds state for whenever it changes
#: (the server load benchmark reads it to show that aborted requests leave nothing behind).
LOG_STATE_ENV = "VLLM_CLLM_LOG_STATE"


@dataclass
class VerifyPredictions:
    """Target argmax per row of one verify step, in input-batch order.

    ``flat[offsets[i]:offsets[i+1]]`` are request i's predictions: entry j is the target's
    choice after its j-th scheduled token (j = 0 is the token after the last committed one).
    """

    req_ids: list[str]
    flat: np.ndarray
    offsets: np.ndarray

    def row(self, i: int) -> np.ndarray:
        return self.flat[self.offsets[i]:self.offsets[i + 1]]

    @classmethod
    def from_logits(cls, logits: Any, num_rows_per_req: list[int], req_ids: list[str]
                    ) -> VerifyPredictions | None:
        """Argmax over the vocabulary on the device, then one device-to-host copy."""
        if len(num_rows_per_req) != len(req_ids) or sum(num_rows_per_req) != logits.shape[0]:
            return None  # a dummy/profiling run, not a real batch
        flat = logits.argmax(dim=-1).to("cpu").numpy().astype(np.int64, copy=False)
        offsets = np.zeros(len(num_rows_per_req) + 1, dtype=np.int64)
        np.cumsum(num_rows_per_req, out=offsets[1:])
        return cls(req_ids=req_ids, flat=flat, offsets=offsets)


class VerifyObserver:
    """Base class of proposers that draft from the verify step's predictions.

    Subclasses read :attr:`predictions` in ``propose()``; it holds only the current step
    and is cleared when consumed. Per-request state, if a subclass keeps any, lives in
    :attr:`request_state` and is dropped by :meth:`retain_requests` as soon as a request
    leaves the batch (finished, aborted or preempted).
    """

    def __init__(self) -> None:
        self.predictions: VerifyPredictions | None = None
        self.request_state: dict[str, Any] = {}
        self._log_state = os.environ.get(LOG_STATE_ENV) == "1"
        self._logged_count = 0

    def observe_verification(self, logits: Any, spec_decode_metadata: Any,
                             req_ids: list[str]) -> None:
        if spec_decode_metadata is None:
            rows = [1] * len(req_ids)
        else:
            rows = [n + 1 for n in spec_decode_metadata.num_draft_tokens]
        self.predictions = VerifyPredictions.from_logits(logits, rows, req_ids)

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """The draft model is the target itself: nothing to load."""

    @staticmethod
    def draft_room(sampled: list[int], num_tokens: int, max_draft: int, max_model_len: int
                   ) -> int:
        """Draft slots a request may use this step: none during a partial prefill (nothing
        sampled) or when nothing more fits before ``max_model_len``."""
        return max(0, min(max_draft, max_model_len - num_tokens)) if sampled else 0

    def take_predictions(self) -> VerifyPredictions | None:
        """The current step's predictions, once; a later call in the same step gets None."""
        predictions, self.predictions = self.predictions, None
        return predictions

    def retain_requests(self, live_req_ids: set[str]) -> None:
        self.predictions = None  # a new step begins; last step's capture is spent
        for req_id in [r for r in self.request_state if r not in live_req_ids]:
            del self.request_state[req_id]
        if self._log_state and len(self.request_state) != self._logged_count:
            self._logged_count = len(self.request_state)
            print(f"vllm-cllm: state held for {self._logged_count} requests "
                  f"({len(live_req_ids)} in the batch)", file=sys.stderr, flush=True)

    def tracked_requests(self) -> set[str]:
        """Requests the proposer holds anything for (tests use it to prove nothing leaks)."""
        held = set(self.request_state)
        if self.predictions is not None:
            held.update(self.predictions.req_ids)
        return held


class SelfDraftingProposer(VerifyObserver):
    """A vLLM ``custom_class`` proposer whose draft model is the target itself, built in each
    worker as ``Class(vllm_config)``: worker patches applied, the method's options read from
    the config (``jacobi`` and ``space`` share this start)."""

    method: ClassVar[str]

    def __init__(self, vllm_config: Any) -> None:
        super().__init__()
        from vllm_cllm.options import options_from_vllm_config
        from vllm_cllm.plugin import apply_worker_patches

        apply_worker_patches()
        self.options = options_from_vllm_config(vllm_config, self.method)
        self.k = self.options.num_speculative_tokens
        self.max_model_len = vllm_config.model_config.max_model_len
