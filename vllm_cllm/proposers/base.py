"""The vLLM adapter: the ``custom_class`` proposer vLLM builds, and the contract it runs.

vLLM builds ``Class(vllm_config)`` in each worker. The worker patches
(:mod:`vllm_cllm.patches.worker`) then make three calls per step, in this order:

1. :meth:`retain_requests` after the model runner updated its input batch: the live requests
   (others finished, were aborted or preempted, and are released), the greedy ones and how
   to look up a new request's output limit (whether the batch drains:
   :mod:`vllm_cllm.core.flow`);
2. :meth:`observe_verification` with the verify step's logits, before sampling: the target's
   predictions at every draft position (the capture, below) and the batch's request ids; an
   argmax taken on the host then verifies an all-greedy step (:meth:`host_argmax`);
3. :meth:`propose`, vLLM's own call: the committed tokens of each request; it builds the
   :class:`~vllm_cllm.core.step.VerifyStep` and returns the drafter's drafts.

The capture runs the batched fixed-point step (:func:`vllm_cllm.kernels.fixed_point_step`:
Triton on a GPU, torch elsewhere) on the device, and one small int tensor goes to the host
behind it; where the logits already are in host memory (the CPU platform) only the argmax is
taken, and each block is shifted on the host when asked for. No extra forward pass and no
collectives: every tensor-parallel rank computes the same predictions and the same drafts.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np

from vllm_cllm.core.drafter import Drafter
from vllm_cllm.core.flow import BatchFlow
from vllm_cllm.core.predictions import PendingPredictions, VerifyPredictions
from vllm_cllm.options import ProposerOptions, options_from_vllm_config

#: Set to 1 to print the number of requests a proposer holds state for whenever it changes
#: (the server load benchmark reads it to show that aborted requests leave nothing behind).
LOG_STATE_ENV = "VLLM_CLLM_LOG_STATE"


class SelfDraftingProposer:
    """A ``custom_class`` proposer whose draft model is the target itself; subclasses name
    the method and build its drafter (:meth:`build_drafter`)."""

    method: ClassVar[str]
    #: what the worker patches look for (``patches/verify_capture.py``)
    vllm_cllm_observer: ClassVar[bool] = True
    #: Where the fixed-point step runs: None picks the host for logits in host memory (the
    #: CPU platform) and the device step otherwise; tests set it to exercise one path.
    capture_on_host: bool | None = None

    def __init__(self, vllm_config: Any) -> None:
        from vllm_cllm.patches.worker import apply_worker_patches

        apply_worker_patches()
        self.options = options_from_vllm_config(vllm_config, self.method)
        self.k = self.options.num_speculative_tokens
        #: the draft slots vLLM verifies per request (``space``: 2k), which the device step
        #: keeps of each next block
        self.block_len = self.options.vllm_draft_tokens
        model_config = vllm_config.model_config
        self.max_model_len = model_config.max_model_len
        #: (vocabulary, logits dtype) of the target: what the fixed-point step is warmed for
        self.logits_shape: tuple[int, Any] | None = None
        if hasattr(model_config, "get_vocab_size") and hasattr(model_config, "dtype"):
            self.logits_shape = (model_config.get_vocab_size(), model_config.dtype)
        self.drafter = self.build_drafter(self.options, self.max_model_len)
        if self.drafter.cost_measurement is not None:
            self.drafter.cost_measurement.log = _info
            _info(f"measuring the step cost while serving, from knee "
                  f"{self.options.knee_tokens}, floor {self.options.floor_tokens}")
        #: when the current step began and the tokens it scheduled; of the step before, where
        #: it is timed, its tokens, seconds to its predictions, when they came and its
        #: requests (the measured step cost)
        self._step: tuple[float, int] | None = None
        self._timed: tuple[int, float, float, int] | None = None
        self._live: set[str] = set()
        #: whether the batch drains (each request's limit: its state in the request table)
        self.flow = BatchFlow()
        self.predictions: VerifyPredictions | PendingPredictions | None = None
        self.captured_steps = 0  # verify steps whose predictions were captured
        self.greedy: set[str] = set()  # requests of the current batch that decode greedily
        self._log_state = os.environ.get(LOG_STATE_ENV) == "1"
        self._logged_count = 0

    def build_drafter(self, options: ProposerOptions, max_model_len: int) -> Drafter:
        raise NotImplementedError

    # -- 1. the batch -----------------------------------------------------------------------

    def retain_requests(self, live_req_ids: set[str],
                        greedy_req_ids: set[str] | None = None,
                        scheduled_tokens: int | None = None,
                        output_limit: Callable[[str], tuple[int, int] | None] | None = None
                        ) -> None:
        """A new step begins: last step's capture is spent, and every request not in
        ``live_req_ids`` is released; the step schedules ``scheduled_tokens`` tokens;
        ``output_limit(req_id)``: a new request's prompt tokens and ``max_tokens`` (None:
        unknown)."""
        self.predictions = None
        now = time.perf_counter()
        if self._timed is not None and self.drafter.cost_measurement is not None:
            tokens, forward, predicted, requests = self._timed
            # the rest of the last step (this proposer, sampling, output, scheduling), unless
            # none of its requests is here: the engine may have waited for new ones
            rest = now - predicted if not live_req_ids.isdisjoint(self._live) else None
            self.drafter.cost_measurement.add(tokens, forward, rest, requests)
        self._timed = None
        joined = self.flow.update(self._live, live_req_ids)
        if output_limit is not None:
            for req_id in joined:
                limit = output_limit(req_id)
                if limit is not None:  # kept in its state, released with it
                    prompt, max_tokens = limit
                    self.drafter.table.open(req_id, []).limit = (
                        prompt, min(prompt + max_tokens, self.max_model_len))
        self._live = live_req_ids
        self._step = (now, scheduled_tokens) if scheduled_tokens else None
        self.greedy = greedy_req_ids or set()
        self.drafter.table.retain(live_req_ids)
        if self._log_state:
            held = len(self.tracked_requests())
            if held != self._logged_count:
                self._logged_count = held
                print(f"vllm-cllm: state held for {held} requests "
                      f"({len(live_req_ids)} in the batch)", file=sys.stderr, flush=True)

    # -- 2. the capture ---------------------------------------------------------------------

    def observe_verification(self, logits: Any, spec_decode_metadata: Any,
                             req_ids: list[str]) -> None:
        # logits: [T, V] float, one row per scheduled position (T = sum of num_draft_tokens
        # + B); spec_decode_metadata.num_draft_tokens: [B]; .draft_token_ids: [sum drafts]
        if spec_decode_metadata is None or not any(spec_decode_metadata.num_draft_tokens):
            # No request drafted: every row is just the sampled token, with no tail to shift
            # (patches/undrafted_step.py passes no metadata then, a caller without that patch
            # all-zero drafts): nothing to compute.
            self.predictions = VerifyPredictions.without_drafts(req_ids)
            return
        num_drafts = list(spec_decode_metadata.num_draft_tokens)
        on_host = self.capture_on_host
        if on_host is None:
            on_host = logits.device.type == "cpu"
        mask = self.mask_slots(req_ids, num_drafts)
        if on_host:
            self.predictions = VerifyPredictions.on_host(logits, num_drafts, req_ids, mask)
        else:
            self.predictions = VerifyPredictions.from_fixed_point(
                logits, spec_decode_metadata.draft_token_ids, num_drafts, req_ids,
                self.block_len, mask)
        self.captured_steps += self.predictions is not None

    def host_argmax(self, rows: int) -> np.ndarray | None:
        """This step's argmax of every one of its ``rows`` logits rows where the capture took
        it in host memory (the CPU platform), else None (also for a step without drafts,
        whose predictions hold no argmax)."""
        predictions = self.predictions
        if isinstance(predictions, VerifyPredictions) and predictions.accepted is None \
                and len(predictions.flat) == rows > len(predictions.req_ids):
            return predictions.flat
        return None

    def mask_slots(self, req_ids: list[str], num_drafts: list[int]) -> list[int] | None:
        """Trailing draft slots of each request that are SPACE masks (None: no masks)."""
        return None

    def take_predictions(self) -> VerifyPredictions | None:
        """The current step's predictions (waiting for a pending device copy), once; a later
        call in the same step gets None."""
        predictions, self.predictions = self.predictions, None
        if isinstance(predictions, PendingPredictions):
            predictions = predictions.resolve()
        return predictions

    # -- 3. the drafts ----------------------------------------------------------------------

    def propose(self, sampled_token_ids: list[list[int]], num_tokens_no_spec: np.ndarray,
                token_ids_cpu: np.ndarray, *args: Any, **kwargs: Any) -> list[list[int]]:
        # sampled_token_ids: [B][a_i + 1] committed this step; num_tokens_no_spec: [B];
        # token_ids_cpu: [B, max_model_len], row i valid up to num_tokens_no_spec[i]
        from vllm_cllm.core.step import VerifyStep

        predictions = self.take_predictions()
        # A step is timed from its start to its predictions (the forward pass, which grows
        # with the tokens) and on to the next step's start (the rest, about the same for any
        # draft length), and only a step of decode and verify tokens: a prefill chunk's
        # tokens cost less each than a verify step's, and would flatten the fitted slope.
        if self._step is not None and predictions is not None and \
                self._step[1] == len(predictions.flat):
            started, tokens = self._step
            predicted = time.perf_counter()
            self._timed = (tokens, predicted - started, predicted, len(predictions.req_ids))
        self._step = None
        step = VerifyStep.from_vllm(sampled_token_ids, num_tokens_no_spec, token_ids_cpu,
                                    predictions, self.greedy, self.block_len,
                                    self.max_model_len)
        if self.flow.draining and len(step) > 1:
            step.remaining = self._remaining(step)
        return [draft.tolist() for draft in self.drafter.propose(step)]

    def _remaining(self, step: Any) -> np.ndarray | None:
        """[B] the tokens each request of ``step`` may still commit, past its prompt even in
        prefill (unknown: up to the model's length); None where no request's limit is known."""
        get, unknown = self.drafter.table.get, (0, self.max_model_len)
        limits = [(state.limit if (state := get(r)) is not None else None) for r in step.req_ids]
        if not any(limits):
            return None
        spans = np.array([limit or unknown for limit in limits], dtype=np.int64)
        return spans[:, 1] - np.maximum(step.num_tokens, spans[:, 0])

    # -- vLLM's other calls -----------------------------------------------------------------

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """The draft model is the target itself: nothing to load. The fixed-point step's
        kernels are compiled here, before the engine serves, for every variant a step can
        use (a no-op off CUDA)."""
        import torch

        if self.logits_shape is None or not torch.cuda.is_available():
            return
        from vllm_cllm.kernels import warm_up

        vocab, dtype = self.logits_shape
        warm_up(vocab, dtype, torch.device("cuda", torch.cuda.current_device()),
                self.block_len, with_mask=self.mask_slots([], []) is not None)

    def tracked_requests(self) -> set[str]:
        """Requests the proposer holds anything for (tests use it to prove nothing leaks)."""
        held = self.drafter.table.ids()
        if self.predictions is not None:
            held.update(self.predictions.req_ids)
        return held


def _info(message: str) -> None:
    """Log through vLLM's logger (the engine's log; a logger outside vLLM's name space has no
    handler there), prefixed with the plugin's name."""
    from vllm.logger import init_logger

    init_logger(f"vllm.{__name__}").info("vllm-cllm: %s", message)
