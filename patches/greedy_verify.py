"""Worker patch: an all-greedy verify step of our drafters is verified from the capture's argmax.

vLLM's ``RejectionSampler.forward`` gathers and copies the logits of every draft position and
takes their argmax again, although on the CPU platform the capture
(:mod:`vllm_cllm.patches.verify_capture`) has just taken the argmax of every row in host
memory; on a CPU that is a few percent of a verify step (docs/decisions.md). For a step whose
drafter is one of ours and whose argmax the capture holds on the host, the capture hands that
argmax to the runner's rejection sampler for the duration of ``_sample`` (:func:`handing`);
where vLLM's target logits would then be the raw logits (every request greedy, no penalties,
bad words, allowed-token masks, thinking budget or active ``min_tokens``; no logprobs; not
vLLM's synthetic or FLy acceptance), the output is built from it: each request commits the argmax up
to and including its first draft that differs from it, or every draft and then its bonus
token, which vLLM's own sampler still draws from the bonus rows (so logits processors that act
on sampled tokens act as before). That is vLLM's greedy rule, token for token
(``tests/test_patches.py`` against the original); every other step calls the original.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from . import PatchGroup, Wrap, has_params

#: The rejection sampler's attribute that holds the capture's argmax during ``_sample``.
_ARGMAX = "_vllm_cllm_argmax"
#: The rejection sampler's attribute that counts the steps verified from it.
VERIFIED = "vllm_cllm_verified_steps"


@contextmanager
def handing(rejection_sampler: Any, argmax: np.ndarray | None) -> Iterator[None]:
    """Make ``argmax`` (every logits row's, int64, in host memory) available to
    ``rejection_sampler`` while the block runs; nothing where either is None."""
    if rejection_sampler is None or argmax is None:
        yield
        return
    object.__setattr__(rejection_sampler, _ARGMAX, argmax)
    try:
        yield
    finally:
        object.__setattr__(rejection_sampler, _ARGMAX, None)


def raw_targets(sampling_metadata: Any) -> bool:
    """Whether vLLM's rejection sampler verifies this batch greedily against the raw logits
    and returns no logprobs: what :func:`greedy_output` assumes."""
    from vllm.v1.sample.logits_processor.builtin import MinTokensLogitsProcessor

    m = sampling_metadata
    if not m.all_greedy or m.max_num_logprobs is not None or m.logprob_token_ids \
            or not m.no_penalties or m.bad_words_token_ids \
            or m.allowed_token_ids_mask is not None:
        return False
    holder = getattr(m, "thinking_budget_state_holder", None)
    if holder is not None and holder.has_tracked_requests():
        return False
    return not any(isinstance(p, MinTokensLogitsProcessor) and p.min_toks
                   for p in m.logitsprocs.non_argmax_invariant)


def greedy_output(argmax: np.ndarray, draft_tokens: np.ndarray, num_draft_tokens: list[int],
                  target_rows: np.ndarray, bonus: np.ndarray, width: int) -> np.ndarray:
    """[B, width] int32, -1 past each request's end: what greedy verification commits.

    ``argmax``: every logits row's argmax; ``draft_tokens``: the drafts, request after request
    (``num_draft_tokens`` each); ``target_rows``: the logits row that verifies each draft;
    ``bonus``: [B] the token drawn from each request's bonus row. The accepted length is the
    fixed-point step's (:func:`vllm_cllm.kernels.fixed_point_step`), in numpy: that step's torch
    reference would cost in per-op dispatch about what this saves on a CPU."""
    num = np.asarray(num_draft_tokens, dtype=np.int64)
    batch = len(num)
    out = np.full((batch, width), -1, dtype=np.int32)
    first = np.cumsum(num) - num  # each request's first draft
    req = np.repeat(np.arange(batch), num)
    pos = np.arange(len(draft_tokens)) - first[req]
    target = argmax[target_rows]
    miss = (draft_tokens != target).astype(np.int64)
    before = np.cumsum(miss) - miss  # misses before each draft, over the whole step
    kept = before == before[first[req]]  # no miss earlier in its own request
    out[req[kept], pos[kept]] = target[kept]
    whole = np.bincount(req, weights=miss, minlength=batch) == 0
    out[whole, num[whole]] = bonus[whole]
    return out


def _wrap_forward(original):
    def forward(self, metadata, draft_probs, logits, sampling_metadata, *args: Any,
                **kwargs: Any):
        argmax = self.__dict__.get(_ARGMAX)
        if argmax is None or args or kwargs or getattr(self, "synthetic_mode", True) \
                or getattr(self, "fly_window_size", None) is not None \
                or len(argmax) != logits.shape[0] or not raw_targets(sampling_metadata):
            return original(self, metadata, draft_probs, logits, sampling_metadata, *args,
                            **kwargs)
        from vllm.v1.outputs import SamplerOutput

        bonus = self.sampler(logits=logits[metadata.bonus_logits_indices],
                             sampling_metadata=sampling_metadata, predict_bonus_token=True)
        out = greedy_output(argmax, metadata.draft_token_ids.cpu().numpy(),
                            list(metadata.num_draft_tokens),
                            metadata.target_logits_indices.cpu().numpy(),
                            bonus.sampled_token_ids.cpu().numpy().reshape(-1),
                            metadata.max_spec_len + 1)
        import torch

        object.__setattr__(self, VERIFIED, self.__dict__.get(VERIFIED, 0) + 1)
        return SamplerOutput(sampled_token_ids=torch.from_numpy(out).to(logits.device),
                             logprobs_tensors=None)

    return forward


def patch_group() -> PatchGroup:
    import inspect

    from vllm.v1.outputs import SamplerOutput
    from vllm.v1.sample import rejection_sampler
    from vllm.v1.sample.logits_processor.builtin import MinTokensLogitsProcessor
    from vllm.v1.sample.metadata import SamplingMetadata
    from vllm.v1.sample.rejection_sampler import RejectionSampler
    from vllm.v1.sample.sampler import Sampler
    from vllm.v1.spec_decode.metadata import SpecDecodeMetadata

    metadata_fields = getattr(SamplingMetadata, "__dataclass_fields__", {})
    spec_fields = getattr(SpecDecodeMetadata, "__dataclass_fields__", {})
    return PatchGroup(
        name="greedy-verify",
        probes=[
            ("RejectionSampler.forward(metadata, draft_probs, logits, sampling_metadata)",
             lambda: list(inspect.signature(RejectionSampler.forward).parameters)[1:5]
             == ["metadata", "draft_probs", "logits", "sampling_metadata"]),
            ("RejectionSampler keeps .sampler and .synthetic_mode",
             lambda: all(s in inspect.getsource(RejectionSampler.__init__)
                         for s in ("self.sampler = ", "self.synthetic_mode = "))),
            ("RejectionSampler verifies greedy rows against the argmax of the raw target "
             "logits, placeholder -1",
             lambda: "target_logits.argmax(dim=-1)" in inspect.getsource(
                 rejection_sampler.rejection_sample)
             and getattr(rejection_sampler, "PLACEHOLDER_TOKEN_ID", None) == -1),
            ("RejectionSampler.apply_logits_processors: penalties, allowed tokens, bad words, "
             "min_tokens, thinking budget",
             lambda: all(s in inspect.getsource(RejectionSampler.apply_logits_processors) for s in
                         ("no_penalties", "allowed_token_ids_mask", "bad_words_token_ids",
                          "MinTokensLogitsProcessor", "thinking_budget_state_holder"))),
            ("Sampler.forward(logits, sampling_metadata, predict_bonus_token)",
             lambda: has_params(Sampler.forward, "logits", "sampling_metadata",
                                "predict_bonus_token")),
            ("SamplingMetadata(all_greedy, max_num_logprobs, logprob_token_ids, no_penalties, "
             "bad_words_token_ids, allowed_token_ids_mask, logitsprocs)",
             lambda: {"all_greedy", "max_num_logprobs", "logprob_token_ids", "no_penalties",
                      "bad_words_token_ids", "allowed_token_ids_mask", "logitsprocs"}
             <= set(metadata_fields)),
            ("SpecDecodeMetadata(draft_token_ids, num_draft_tokens, target_logits_indices, "
             "bonus_logits_indices)",
             lambda: {"draft_token_ids", "num_draft_tokens", "target_logits_indices",
                      "bonus_logits_indices"} <= set(spec_fields)),
            ("MinTokensLogitsProcessor.min_toks",
             lambda: "self.min_toks" in inspect.getsource(MinTokensLogitsProcessor.__init__)),
            ("SamplerOutput(sampled_token_ids, logprobs_tensors)",
             lambda: has_params(SamplerOutput, "sampled_token_ids", "logprobs_tensors")),
        ],
        wraps=[Wrap(RejectionSampler, "forward", _wrap_forward)],
    )
