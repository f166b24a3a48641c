"""The capture mechanism every proposer of this project shares.

In each verify step vLLM computes logits at every draft position of every request, but keeps
only the accepted tokens. :class:`VerifyObserver` receives those logits (through the
``_sample`` wrapper in ``patches/verify_capture.py``) and runs the batched fixed-point step
(:func:`vllm_cllm.kernels.fixed_point_step`: Triton on a GPU, torch elsewhere) on the device:
every row's argmax, every request's greedy accepted length and its shifted next draft. One
small int tensor then goes to the host. Where the logits already are in host memory (the CPU
platform) only the argmax is taken, with numpy, and each block is shifted on the host
(:func:`shifted_block`, the same rule). The result, :class:`VerifyPredictions`, gives each
input-batch row the target's predictions ``g_1 .. g_{n+1}`` for its ``n`` drafts and the
next Jacobi block. No extra forward pass, no collectives: every tensor-parallel rank computes
the same thing.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from vllm_cllm.sources.history import OutputHistory

#: Set to 1 to print the number of requests a proposer holds state for whenever it changes
#: (the server load benchmark reads it to show that aborted requests leave nothing behind).
LOG_STATE_ENV = "VLLM_CLLM_LOG_STATE"


def shifted_block(row: np.ndarray, num_sampled: int, num_mask: int = 0) -> np.ndarray:
    """The next Jacobi block from one request's predictions (the kernel's rule, on the host).

    ``row`` = ``g_1..g_{n+1}``; vLLM committed ``num_sampled`` = a + 1 tokens. With ``r`` real
    drafts (the last ``num_mask`` are SPACE mask slots): ``g_{a+2}..g_{r+1}`` if a real draft
    was rejected, else the mask rows ``g_{r+2}..g_{n+1}``; without masks, ``g_{a+2}..``.
    """
    real = len(row) - 1 - min(max(num_mask, 0), len(row) - 1)
    if num_sampled - 1 < real:
        return row[num_sampled:real + 1]
    return row[real + 1:]


@dataclass
class VerifyPredictions:
    """Target argmax per row of one verify step, in input-batch order.

    ``flat[offsets[i]:offsets[i+1]]`` are request i's predictions: entry j is the target's
    choice after its j-th scheduled token (j = 0 is the token after the last committed one).
    ``accepted``, ``next_draft`` and ``next_len`` (optional) are the fixed-point step's
    greedy accepted length and next block per request, computed on the device.
    """

    req_ids: list[str]  # [B], input-batch order
    flat: np.ndarray  # [T] int64, T = sum over requests of (drafts + 1)
    offsets: np.ndarray  # [B + 1] int64
    accepted: np.ndarray | None = None  # [B]
    next_draft: np.ndarray | None = None  # [B, k]; row i valid up to next_len[i]
    next_len: np.ndarray | None = None  # [B]
    num_mask: np.ndarray | None = None  # [B] mask slots the step was run with (SPACE)

    def row(self, i: int) -> np.ndarray:
        return self.flat[self.offsets[i]:self.offsets[i + 1]]

    def next_block(self, i: int, num_sampled: int) -> np.ndarray:
        """Request i's next Jacobi block given that vLLM committed ``num_sampled`` tokens.

        The device result whenever vLLM accepted exactly the greedy prefix (always, for a
        greedy request); a sampled request that accepted otherwise gets the same rule on the
        host (:func:`shifted_block`) from its row.
        """
        if self.accepted is not None and int(self.accepted[i]) == num_sampled - 1:
            return self.next_draft[i, :int(self.next_len[i])]
        mask = 0 if self.num_mask is None else int(self.num_mask[i])
        return shifted_block(self.row(i), num_sampled, mask)

    @classmethod
    def without_drafts(cls, req_ids: list[str]) -> VerifyPredictions:
        """A step in which no request drafted: one row each, whose value is never read (the
        sampled token is what vLLM committed; the block behind it is empty)."""
        batch = len(req_ids)
        return cls(req_ids=req_ids, flat=np.zeros(batch, dtype=np.int64),
                   offsets=np.arange(batch + 1, dtype=np.int64))

    @classmethod
    def from_fixed_point(cls, logits: Any, draft_tokens: Any, num_draft_tokens: list[int],
                         req_ids: list[str], k: int, num_mask: list[int] | None = None,
                         backend: str = "auto") -> VerifyPredictions | PendingPredictions | None:
        """The fixed-point step on the device (``logits`` [T, V], ``draft_tokens`` [D] on the
        same device), then one device-to-host copy of argmax, accepted lengths and blocks.

        On CUDA the copy goes into pinned memory behind the step on the same stream and is
        not waited for here: the wait is in ``propose()``, after vLLM has launched its
        sampler (:class:`PendingPredictions`). Elsewhere the result is ready at once."""
        import torch

        from vllm_cllm.kernels import fixed_point_step

        rows = [n + 1 for n in num_draft_tokens]
        if len(rows) != len(req_ids) or sum(rows) != logits.shape[0] \
                or draft_tokens.shape[0] != sum(num_draft_tokens):
            return None  # a dummy/profiling run, not a real batch
        device = logits.device
        num = torch.tensor(num_draft_tokens, dtype=torch.int32).to(device, non_blocking=True)
        mask = None if num_mask is None else \
            torch.tensor(num_mask, dtype=torch.int32).to(device, non_blocking=True)
        out = fixed_point_step(logits, draft_tokens, num, k, num_mask=mask, backend=backend)
        packed = torch.cat([out.argmax, out.accepted.to(torch.int64),
                            out.next_len.to(torch.int64), out.next_draft.reshape(-1)])
        pending = PendingPredictions(req_ids, packed, None, rows, k, num_mask)
        if packed.is_cuda:
            pending.host = torch.empty(packed.shape, dtype=packed.dtype, pin_memory=True)
            pending.host.copy_(packed, non_blocking=True)
            pending.done = torch.cuda.Event()
            pending.done.record()
            return pending
        return pending.resolve()

    @classmethod
    def from_packed(cls, req_ids: list[str], host: np.ndarray, rows: list[int], k: int,
                    num_mask: list[int] | None) -> VerifyPredictions:
        """Unpack ``[argmax (T) | accepted (B) | next_len (B) | next_draft (B*k)]``."""
        batch, rows_total = len(rows), sum(rows)
        accepted_at, len_at = rows_total, rows_total + batch
        return cls(req_ids=req_ids, flat=host[:rows_total], offsets=_offsets(rows),
                   accepted=host[accepted_at:len_at], next_len=host[len_at:len_at + batch],
                   next_draft=host[len_at + batch:].reshape(batch, k),
                   num_mask=None if num_mask is None else np.asarray(num_mask, np.int64))


    @classmethod
    def on_host(cls, logits: Any, num_draft_tokens: list[int], req_ids: list[str],
                num_mask: list[int] | None = None) -> VerifyPredictions | None:
        """Argmax rows only, for logits already in host memory (the CPU platform): each
        request's next block then comes from :func:`shifted_block` when it is asked for. A
        device step there would only add torch's per-op dispatch to every decode step."""
        from vllm_cllm.kernels.fixed_point import row_argmax

        rows = [n + 1 for n in num_draft_tokens]
        if len(rows) != len(req_ids) or sum(rows) != logits.shape[0]:
            return None  # a dummy/profiling run, not a real batch
        return cls(req_ids=req_ids, flat=row_argmax(logits).numpy(), offsets=_offsets(rows),
                   num_mask=None if num_mask is None else np.asarray(num_mask, np.int64))


@dataclass
class PendingPredictions:
    """A device step's result on its way to the host: the copy into ``host`` (pinned) was
    queued behind the step on the device's stream and ``done`` is recorded after it. Nothing
    waits until :meth:`resolve`, which the proposer calls in ``propose()``, so vLLM's
    sampler is launched without a host sync in between."""

    req_ids: list[str]
    host: Any  # [T + 2B + B*k] int64: argmax | accepted | next_len | next_draft
    done: Any  # torch.cuda.Event, or None when ``host`` is already readable
    rows: list[int]
    k: int
    num_mask: list[int] | None

    def resolve(self) -> VerifyPredictions:
        if self.done is not None:
            self.done.synchronize()
        host = self.host.cpu().numpy() if self.done is None else self.host.numpy()
        return VerifyPredictions.from_packed(self.req_ids, host, self.rows, self.k,
                                             self.num_mask)


def _offsets(num_rows_per_req: list[int]) -> np.ndarray:
    offsets = np.zeros(len(num_rows_per_req) + 1, dtype=np.int64)
    np.cumsum(num_rows_per_req, out=offsets[1:])
    return offsets


class VerifyObserver:
    """Base class of proposers that draft from the verify step's predictions.

    Subclasses read :attr:`predictions` in ``propose()``; it holds only the current step
    and is cleared when consumed. Per-request state, if a subclass keeps any, lives in
    :attr:`request_state` and is dropped by :meth:`retain_requests` as soon as a request
    leaves the batch (finished, aborted or preempted).
    """

    def __init__(self) -> None:
        self.predictions: VerifyPredictions | PendingPredictions | None = None
        self.captured_steps = 0  # verify steps whose predictions were captured
        self.request_state: dict[str, Any] = {}
        self.greedy: set[str] = set()  # requests of the current batch that decode greedily
        self._log_state = os.environ.get(LOG_STATE_ENV) == "1"
        self._logged_count = 0

    #: Longest next block the fixed-point step returns: the draft slots vLLM verifies per
    #: request (``space``: 2k), so the device step keeps what the host path keeps.
    block_len: int = 0
    #: (vocabulary, logits dtype) of the target: what the fixed-point step is warmed for
    logits_shape: tuple[int, Any] | None = None
    #: Where the fixed-point step runs: None picks the host for logits in host memory (the
    #: CPU platform) and the device step otherwise; tests set it to exercise one path.
    capture_on_host: bool | None = None

    def observe_verification(self, logits: Any, spec_decode_metadata: Any,
                             req_ids: list[str]) -> None:
        # logits: [T, V] float, one row per scheduled position (T = sum of num_draft_tokens
        # + B); spec_decode_metadata.num_draft_tokens: [B]; .draft_token_ids: [sum drafts]
        if spec_decode_metadata is None or not any(spec_decode_metadata.num_draft_tokens):
            # No request drafted: every row is just the sampled token, with no tail to shift
            # (adaptive k at a large batch; patches/undrafted_step.py passes no metadata
            # then, a caller without that patch all-zero drafts): nothing to compute.
            self.predictions = VerifyPredictions.without_drafts(req_ids)
            return
        num_drafts = list(spec_decode_metadata.num_draft_tokens)
        on_host = self.capture_on_host
        if on_host is None:
            on_host = logits.device.type == "cpu"
        if on_host:
            self.predictions = VerifyPredictions.on_host(
                logits, num_drafts, req_ids, self.mask_slots(req_ids, num_drafts))
        else:
            self.predictions = VerifyPredictions.from_fixed_point(
                logits, spec_decode_metadata.draft_token_ids, num_drafts, req_ids,
                self.block_len, self.mask_slots(req_ids, num_drafts))
        self.captured_steps += self.predictions is not None

    def mask_slots(self, req_ids: list[str], num_drafts: list[int]) -> list[int] | None:
        """Trailing draft slots of each request that are SPACE masks (None: no masks)."""
        return None

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

    @staticmethod
    def draft_room(sampled: list[int], num_tokens: int, max_draft: int, max_model_len: int
                   ) -> int:
        """Draft slots a request may use this step: none during a partial prefill (nothing
        sampled) or when nothing more fits before ``max_model_len``."""
        return max(0, min(max_draft, max_model_len - num_tokens)) if sampled else 0

    def current_predictions(self) -> VerifyPredictions | None:
        """The current step's predictions, waiting for the device copy if one is pending."""
        if isinstance(self.predictions, PendingPredictions):
            self.predictions = self.predictions.resolve()
        return self.predictions

    def take_predictions(self) -> VerifyPredictions | None:
        """The current step's predictions, once; a later call in the same step gets None."""
        predictions, self.predictions = self.current_predictions(), None
        return predictions

    def retain_requests(self, live_req_ids: set[str],
                        greedy_req_ids: set[str] | None = None) -> None:
        self.predictions = None  # a new step begins; last step's capture is spent
        self.greedy = greedy_req_ids or set()
        self.drop_departed(live_req_ids)
        if self._log_state:
            held = len(self.tracked_requests())
            if held != self._logged_count:
                self._logged_count = held
                print(f"vllm-cllm: state held for {held} requests "
                      f"({len(live_req_ids)} in the batch)", file=sys.stderr, flush=True)

    def drop_departed(self, live_req_ids: set[str]) -> None:
        """Drop the state of every request not in ``live_req_ids`` (subclasses that keep
        more per-request state drop it here too)."""
        for req_id in [r for r in self.request_state if r not in live_req_ids]:
            self.request_done(self.request_state.pop(req_id))

    def request_done(self, state: Any) -> None:
        """Called with a request's state as it leaves the batch (finished, aborted or
        preempted); the state is dropped afterwards."""

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
        self.block_len = self.options.vllm_draft_tokens
        model_config = vllm_config.model_config
        self.max_model_len = model_config.max_model_len
        if hasattr(model_config, "get_vocab_size") and hasattr(model_config, "dtype"):
            self.logits_shape = (model_config.get_vocab_size(), model_config.dtype)
        #: Outputs of the last ``history_size`` requests that left the batch: a bounded store
        #: shared by all requests (not per-request state), filled in the order requests
        #: leave, which every tensor-parallel rank sees alike (vllm_cllm/sources/history.py).
        self.history = OutputHistory(self.options.history_in_use)

    def uses_history(self, req_id: str | None) -> bool:
        """Whether ``req_id`` may be drafted from earlier requests' outputs: only a greedy
        request, whose output no draft can change. A sampled request's samples depend on its
        drafts, and a seeded one must get the same samples whatever ran before it."""
        return bool(self.history) and req_id in self.greedy

    def request_done(self, state: Any) -> None:
        """A request's output (its state's ``output``: the tokens committed while it ran)
        goes into the history."""
        self.history.add(np.asarray(state.output, dtype=np.int64))
