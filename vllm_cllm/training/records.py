"""One training record of a Jacobi trajectory, and the resume check of a records file."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


@dataclass
class TrajectoryRecord:
    """One answer block of one prompt.

    prompt_id: index of the prompt in the build; context_ids: prompt + earlier answer blocks;
    fixed_point: the block's n greedy tokens; states: noisy blocks (n tokens each), the fixed
    point not included; answer_ids: the whole greedy answer (AR loss labels);
    prompt_len: tokens of the prompt alone within context_ids.
    """

    prompt_id: int
    block: int
    prompt_len: int
    context_ids: list[int]
    fixed_point: list[int]
    states: list[list[int]]
    answer_ids: list[int]


def done_prompt_ids(path: Path) -> set[int]:
    """Prompts already written (resume support); a torn last line is ignored."""
    done: set[int] = set()
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                done.add(json.loads(line)["prompt_id"])
            except (json.JSONDecodeError, KeyError):
                continue
    return done
