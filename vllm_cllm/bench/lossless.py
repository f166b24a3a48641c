"""The lossless oracle: greedy tokens with a proposer must equal the same engine without one."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class Mismatch:
    index: int
    position: int  # first differing token position
    expected: list[int]
    got: list[int]


def generate_tokens(llm: Any, prompts: list[str], params: Any, *, one_at_a_time: bool = False
                    ) -> list[list[int]]:
    """Token ids of each prompt's first completion; ``params`` may be one or a list."""
    params_list = params if isinstance(params, list) else [params] * len(prompts)
    if one_at_a_time:
        outputs = [llm.generate([p], sp, use_tqdm=False)[0]
                   for p, sp in zip(prompts, params_list, strict=True)]
    else:
        outputs = llm.generate(prompts, params_list, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outputs]


def compare(expected: list[list[int]], got: list[list[int]]) -> list[Mismatch]:
    """Every prompt whose tokens differ, with the first differing position."""
    out = []
    for i, (e, g) in enumerate(zip(expected, got, strict=True)):
        if e != g:
            pairs = enumerate(zip(e, g, strict=False))
            pos = next((j for j, (x, y) in pairs if x != y), min(len(e), len(g)))
            out.append(Mismatch(i, pos, e, g))
    return out
