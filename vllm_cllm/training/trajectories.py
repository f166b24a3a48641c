"""Jacobi trajectory data: for each answer block, states on the way to its fixed point.

For a prompt and the target's greedy answer, split into n-token blocks, the fixed point of
Jacobi iteration on block j (given the prompt and blocks < j) is the greedy block itself.
Two ways to get the states in between:

* ``jacobi``: real Jacobi iterates from a CLLM-style initial guess (tokens drawn from the
  context), one forward of the block per iteration over the cached context (CLLM);
* ``noise``: states synthesized from the fixed point, keeping a prefix and replacing the rest
  by context tokens at progressive noise levels (Jacobi Forcing); no forward pass at all;
* ``shifted``: the same prefixes, the rest being the fixed point one position late or context
  tokens, one of the two per state: what a pure Jacobi draft behind a rejected token mostly
  is (the right tokens one slot late, or other tokens of the answer), again without a forward;
* ``guided``: a model's own pure Jacobi drafts along the answer (:mod:`.guided`): the drafts
  of inference, the answer's fixed points.

Records are JSON lines (see :class:`TrajectoryRecord`); a build resumes where it stopped.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from vllm_cllm.training.guided import guided_batch_records
from vllm_cllm.training.records import TrajectoryRecord, done_prompt_ids

__all__ = ["TrajectoryRecord", "build_records", "done_prompt_ids", "read_trajectories",
           "write_trajectories"]

MODES = ("noise", "shifted", "jacobi", "guided")


def context_guess(context: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """CLLM's initial block: n tokens drawn uniformly from the context."""
    return context[rng.integers(0, len(context), size=n)]


def noise_states(context: np.ndarray, fixed: np.ndarray, rng: np.random.Generator,
                 levels: int, shifted: bool = False) -> list[list[int]]:
    """Progressive noise: state l keeps the first round(n*(1-l/levels)) tokens... down to none;
    behind them context tokens, or with ``shifted``, per state at even odds, the fixed point one
    position late (its previous token repeated) instead.

    A draft one position *early* (a token skipped) is not among the shifted states: behind it
    the fixed point repeats the token just read, which clean text cannot tell from a skip, so
    it would teach the model to repeat itself.
    """
    n = len(fixed)
    before = np.concatenate([context[-1:], fixed])  # before[i] is the token preceding fixed[i]
    out = []
    for level in range(1, levels + 1):
        keep = int(round(n * (1 - level / levels)))
        state = fixed.copy()
        if shifted and rng.integers(2) == 0:
            state[keep:] = before[keep:n]
        else:
            state[keep:] = context_guess(context, n - keep, rng)
        if not np.array_equal(state, fixed):
            out.append(state.tolist())
    return out


def jacobi_states(model: Any, context: np.ndarray, fixed: np.ndarray,
                  rng: np.random.Generator, max_states: int) -> list[list[int]]:
    """Real Jacobi iterates y_0 → y_1 → … until the fixed point (excluded), on a HF model.

    The context is encoded once; each iteration forwards only the n block tokens over a copy
    of its KV cache. Convergence takes at most n iterations (each fixes one more token).
    """
    import torch

    n = len(fixed)
    with torch.no_grad():
        ctx = torch.as_tensor(context, dtype=torch.long).unsqueeze(0)
        prefill = model(ctx[:, :-1], use_cache=True)
        state = context_guess(context, n, rng)
        states: list[list[int]] = []
        for _ in range(n + 1):
            cache = _copy_cache(prefill.past_key_values)
            block = torch.as_tensor(np.concatenate([context[-1:], state[:-1]]),
                                    dtype=torch.long).unsqueeze(0)
            logits = model(block, past_key_values=cache, use_cache=True).logits[0]
            new_state = logits.argmax(-1).numpy()
            if np.array_equal(new_state, state):
                break
            states.append(state.tolist())
            state = new_state
    if not np.array_equal(state, fixed):
        return []  # HF and vLLM greedy disagree (a numerical near-tie): skip this block
    return _spread(states, max_states)


def _copy_cache(cache: Any) -> Any:
    import copy

    return copy.deepcopy(cache)


def _spread(states: list[list[int]], max_states: int) -> list[list[int]]:
    if len(states) <= max_states:
        return states
    keep = np.linspace(0, len(states) - 1, max_states).round().astype(int)
    return [states[i] for i in sorted(set(keep.tolist()))]


def blocks_of(prompt_ids: list[int], answer_ids: list[int], n: int
              ) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
    """(block index, context, fixed point) for every complete n-token block of the answer."""
    for j in range(len(answer_ids) // n):
        context = np.asarray(prompt_ids + answer_ids[:j * n], dtype=np.int64)
        yield j, context, np.asarray(answer_ids[j * n:(j + 1) * n], dtype=np.int64)


def build_records(prompt_id: int, prompt_ids: list[int], answer_ids: list[int], *, n: int,
                  mode: str, seed: int, max_states: int, model: Any = None
                  ) -> list[TrajectoryRecord]:
    """Every block's record for one prompt; deterministic in (seed, prompt_id).

    ``guided`` keeps at most ``max_states`` records for the prompt, one state each."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}; got {mode!r}")
    if mode == "guided":
        return guided_batch_records(model, [(prompt_id, prompt_ids, answer_ids)], n=n,
                                    max_states=max_states, seed=seed)[0]
    rng = np.random.default_rng([seed, prompt_id])
    records = []
    for j, context, fixed in blocks_of(prompt_ids, answer_ids, n):
        if mode in ("noise", "shifted"):
            states = noise_states(context, fixed, rng, max_states, shifted=mode == "shifted")
        else:
            states = jacobi_states(model, context, fixed, rng, max_states)
        if states:
            records.append(TrajectoryRecord(prompt_id, j, len(prompt_ids), context.tolist(),
                                            fixed.tolist(), states, list(answer_ids)))
    return records


def write_trajectories(path: Path, items: list[tuple[list[int], list[int]]], *, n: int,
                       mode: str, seed: int, max_states: int, model: Any = None,
                       first: int = 0, batch_size: int = 8) -> int:
    """Append records for every (prompt_ids, answer_ids) not yet in ``path``; returns count.

    ``items`` are the seed's problems from the ``first``-th on, whose prompt ids count from
    ``first``: a slice of the problems gets the same records as in a file of them all.
    One line per block; a prompt's lines are written together and flushed, so an
    interrupted build resumes at the next prompt (``guided`` replays ``batch_size`` prompts
    at a time and writes them as they finish together).
    """
    from tqdm import tqdm

    path.parent.mkdir(parents=True, exist_ok=True)
    done = done_prompt_ids(path)
    todo = [(pid, prompt_ids, answer_ids)
            for pid, (prompt_ids, answer_ids) in enumerate(items, start=first) if pid not in done]
    size = batch_size if mode == "guided" else 1
    written = 0
    with path.open("a") as f, tqdm(total=len(items), initial=len(items) - len(todo),
                                   desc=f"trajectories/{mode}") as progress:
        for at in range(0, len(todo), size):
            chunk = todo[at:at + size]
            if mode == "guided":
                per_prompt = guided_batch_records(model, chunk, n=n, max_states=max_states,
                                                  seed=seed)
            else:
                per_prompt = [build_records(pid, prompt_ids, answer_ids, n=n, mode=mode,
                                            seed=seed, max_states=max_states, model=model)
                              for pid, prompt_ids, answer_ids in chunk]
            lines = [json.dumps(asdict(r)) for records in per_prompt for r in records]
            f.write("".join(line + "\n" for line in lines))
            f.flush()
            written += len(lines)
            progress.update(len(chunk))
    return written


def read_trajectories(*paths: Path) -> list[TrajectoryRecord]:
    """The records of one or more files; with several, each file's prompts stay apart (prompt
    ids are renumbered per file, so two files' prompt 0 never pack into one row)."""
    records = [(i, TrajectoryRecord(**json.loads(line)))
               for i, path in enumerate(paths) for line in path.read_text().splitlines()
               if line.strip()]
    if len(paths) > 1:
        ids: dict[tuple[int, int], int] = {}
        for i, r in records:
            r.prompt_id = ids.setdefault((i, r.prompt_id), len(ids))
    return [r for _, r in records]
