"""The one fake of vLLM that the unit tests drive proposers with: a config, verify-step
tensors, and a loop of verify steps over a known text (no engine)."""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from vllm_cllm.core.predictions import VerifyPredictions
from vllm_cllm.core.step import VerifyStep
from vllm_cllm.core.tokens import matched_prefix
from vllm_cllm.options import parse_options


def vllm_config(spec: dict[str, Any], max_model_len: int = 200, hf_config: Any = None,
                store: bool = True) -> SimpleNamespace:
    """What a ``custom_class`` proposer reads of vLLM's config, with ``spec`` parsed as the
    front end stores it (``store=False``: nothing stored, as when the class path is given)."""
    k = spec["num_speculative_tokens"]
    slots = 2 * k if spec["method"] == "space" else k
    extra = {"vllm_cllm": parse_options(spec, max_k=128, hf_config=hf_config).to_dict()} \
        if store else {}
    return SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=slots),
                           model_config=SimpleNamespace(max_model_len=max_model_len,
                                                        hf_config=hf_config),
                           additional_config=extra)


def proposer(spec: dict[str, Any], max_model_len: int = 200, hf_config: Any = None) -> Any:
    """The method's proposer, built as vLLM builds it."""
    if spec["method"] == "space":
        from vllm_cllm.proposers.space import SpaceProposer as Class
    else:
        from vllm_cllm.proposers.jacobi import JacobiProposer as Class
    return Class(vllm_config(spec, max_model_len, hf_config))


def jacobi(k: int = 4, max_model_len: int = 200, **options: Any) -> Any:
    return proposer({"method": "jacobi", "num_speculative_tokens": k, **options},
                    max_model_len)


def logits_for(predicted: Sequence[int], vocab: int = 50) -> torch.Tensor:
    """Logits whose argmax row by row is ``predicted``."""
    logits = torch.zeros(len(predicted), vocab)
    logits[torch.arange(len(predicted)), torch.tensor(list(predicted))] = 1.0
    return logits


def metadata(drafts: Sequence[Sequence[int]]) -> SimpleNamespace:
    """The two fields of vLLM's SpecDecodeMetadata the capture reads."""
    return SimpleNamespace(num_draft_tokens=[len(d) for d in drafts],
                           draft_token_ids=torch.tensor([t for d in drafts for t in d],
                                                        dtype=torch.int32))


def predictions(req_ids: list[str], rows: Sequence[Sequence[int]]) -> VerifyPredictions:
    """Host predictions with these rows (``g_1 .. g_{n+1}`` per request)."""
    return VerifyPredictions(req_ids, np.concatenate([np.asarray(r, np.int64) for r in rows]),
                             np.cumsum([0] + [len(r) for r in rows]))


def step(contexts: Sequence[Sequence[int]], committed: Sequence[Sequence[int]],
         rows: Sequence[Sequence[int]] | None = None, rooms: Sequence[int] | int = 4,
         greedy: Sequence[bool] | bool = True, req_ids: Sequence[str] | None = None
         ) -> VerifyStep:
    """A :class:`VerifyStep` of requests whose committed tokens are ``contexts`` (the last
    ``committed[i]`` of them committed this step) and whose verify rows are ``rows``."""
    batch = len(contexts)
    ids = list(req_ids) if req_ids is not None else [f"r{i}" for i in range(batch)]
    width = max(len(c) for c in contexts) + 1
    tokens = np.zeros((batch, width), dtype=np.int64)
    for i, context in enumerate(contexts):
        tokens[i, :len(context)] = context
    rows = rows if rows is not None else [list(c[-1:]) for c in committed]
    return VerifyStep(req_ids=ids, committed=[list(c) for c in committed],
                      num_tokens=np.array([len(c) for c in contexts]), token_ids=tokens,
                      rooms=np.broadcast_to(np.asarray(rooms), (batch,)).copy(),
                      greedy=np.broadcast_to(np.asarray(greedy), (batch,)).copy(),
                      predictions=predictions(ids, rows))


def verify_and_propose(proposer: Any, ids: list[str], steps: int, text: list[int] | None = None,
                       start: int = 8) -> list[int]:
    """``steps`` verify steps of requests ``ids`` that all follow ``text`` (the target
    predicts it at every position, so a draft is accepted as far as it matches), each
    followed by the proposer's next drafts; the draft tokens made per step."""
    text = text if text is not None else [3, 4, 5, 6] * 30
    tokens = np.array([text] * len(ids))
    lengths, drafts, made = [start] * len(ids), [[] for _ in ids], []
    for _ in range(steps):
        rows = [text[n:n + len(d) + 1] for n, d in zip(lengths, drafts, strict=True)]
        accepted = [matched_prefix(np.array(d, dtype=np.int64), r[:len(d)])
                    for d, r in zip(drafts, rows, strict=True)]
        proposer.retain_requests(set(ids), set(ids))
        proposer.predictions = predictions(ids, rows)
        lengths = [n + a + 1 for n, a in zip(lengths, accepted, strict=True)]
        drafts = proposer.propose([r[:a + 1] for r, a in zip(rows, accepted, strict=True)],
                                  np.array(lengths), tokens)
        made.append(sum(len(d) for d in drafts))
    return made
