"""The restart block: a new Jacobi block drawn from the request's own tokens (CLLM's block
initialisation), drafted where the request has no tail to iterate on."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from vllm_cllm.core.drafter import Candidates, propose_each
from vllm_cllm.core.requests import RequestState
from vllm_cllm.core.step import VerifyStep


class RandomContextFill:
    """Tokens drawn uniformly from the request's own prompt and output.

    The generator is seeded from the option seed and the request's own length and last tokens,
    never from earlier calls: a seeded request then gets the same drafts, and therefore the
    same samples from vLLM's rejection sampler, whatever ran before it or beside it.
    """

    def __init__(self, seed: int) -> None:
        self.seed = seed

    def __call__(self, context: np.ndarray, num_tokens: int) -> np.ndarray:
        if num_tokens <= 0 or len(context) == 0:
            return context[:0]
        key = [self.seed, len(context), *(int(t) for t in context[-4:])]
        rng = np.random.default_rng(key)
        return context[rng.integers(0, len(context), size=num_tokens)]


class RestartBlock:
    """Source ``restart``: a block of the request's own tokens (:class:`RandomContextFill`)."""

    names = ("restart",)

    def __init__(self, seed: int) -> None:
        self.fill = RandomContextFill(seed)

    def propose(self, step: VerifyStep, rows: Sequence[int], lengths: Sequence[int],
                states: Sequence[RequestState]) -> Candidates:
        return {"restart": propose_each(step, rows, lengths,
                                        lambda i, n: self.fill(step.context(i), n))}
