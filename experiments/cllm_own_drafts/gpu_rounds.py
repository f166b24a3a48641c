"""The rounds recipe (``rounds.sh held``) at GPU scale, in one time-boxed run without vLLM.

Question: does pure Jacobi drafting follow the optimizer steps far past what 4 CPU-hours buy?
The same objective and flags as ``rounds.sh`` (LoRA r 32, lr 3e-4, ω 5, anchor base, window
2), with more prompts (both formats) and as many steps as ``--budget-s`` allows:

1. the base model's greedy answers to ``--prompts`` (transformers ``generate``);
2. round 1: shifted states of the first ``--pool`` answers;
3. round 2: the round-1 model's own pure Jacobi drafts (k 15, ``fill: tail``, batched here in
   transformers, made records by :func:`vllm_cllm.training.onpolicy.prompt_records`)
   beside the shifted states of prompts not used yet;
4. round 3 (held): the same at ω 20 from round 2's drafts (``--ar-weights``: ω per round).

Every round's adapter is saved as soon as it is trained; a round whose planned steps do not
fit its share of ``--budget-s`` is shortened after its first steps, cosine schedule included
(logged). The prompts (gsm_symbolic seed 5, the instruction on even problems, the bare
question on odd ones) are tokenized into ``--prompts`` first if that file does not exist, so
the GPU machine needs neither reasoning-gym nor vLLM:

    python experiments/cllm_own_drafts/gpu_rounds.py --prompts prompts.json --make-prompts
    python experiments/cllm_own_drafts/gpu_rounds.py --base BASE_DIR --prompts prompts.json \\
        --out OUT --budget-s 470
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

import vllm_cllm.training.cllm as cllm
from vllm_cllm.training.onpolicy import prompt_records
from vllm_cllm.training.trajectories import TrajectoryRecord, build_records

BLOCK = 16
PROMPT_SEED = 5  # a training seed; none of its first 3000 questions is an evaluation one
NUM_PROMPTS = 3000
K = BLOCK - 1
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def make_prompts(path: Path, base: str) -> None:
    """The training prompts as token ids (both formats alternating, as the chat template
    renders them; the same ids vLLM's tokenizer gives)."""
    from transformers import AutoTokenizer

    from vllm_cllm.training.gsm import format_prompts, training_problems

    tokenizer = AutoTokenizer.from_pretrained(base)
    questions = [p["question"] for p in training_problems(NUM_PROMPTS, PROMPT_SEED, 40)]
    texts = format_prompts(tokenizer, questions, "both", 0)
    path.write_text(json.dumps([tokenizer(t)["input_ids"] for t in texts]))


def greedy_answers(model: Any, prompts: list[list[int]], max_new: int, batch: int, eos: int,
                   pad: int) -> list[list[int]]:
    """Greedy answers (ending with EOS where one came), left-padded batches."""
    answers = []
    for i in range(0, len(prompts), batch):
        chunk = prompts[i:i + batch]
        width = max(map(len, chunk))
        ids = torch.full((len(chunk), width), pad, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for j, p in enumerate(chunk):
            ids[j, width - len(p):] = torch.tensor(p)
            mask[j, width - len(p):] = 1
        with torch.no_grad():
            out = model.generate(input_ids=ids.to(DEVICE), attention_mask=mask.to(DEVICE),
                                 max_new_tokens=max_new, do_sample=False, eos_token_id=eos,
                                 pad_token_id=pad)
        for row in out[:, width:].tolist():
            answers.append(row[:row.index(eos) + 1] if eos in row else row)
    return answers


def jacobi_drafts(model: Any, prompts: list[list[int]], max_new: int, batch: int, eos: int,
                  pad: int) -> tuple[list[list[int]], list[list[tuple[int, list[int]]]]]:
    """Pure Jacobi decoding, ``fill: tail`` (the tail behind the accepted tokens, then the last
    committed token repeated), many prompts at once with the whole sequence recomputed each
    step (no cache: every row advances by its own accepted length). Returns each prompt's
    greedy answer and its drafts as (committed tokens before the draft, k draft tokens); the
    first step's draft (context tokens, no tail yet) is not recorded."""
    answers: list[list[int]] = []
    drafts: list[list[tuple[int, list[int]]]] = []
    for i in range(0, len(prompts), batch):
        seqs = [list(p) for p in prompts[i:i + batch]]
        lengths = [len(s) for s in seqs]
        current = [s[-K:] for s in seqs]
        found: list[list[tuple[int, list[int]]]] = [[] for _ in seqs]
        active, first = list(range(len(seqs))), True
        while active:
            width = max(len(seqs[r]) + K for r in active)
            ids = torch.full((len(active), width), pad, dtype=torch.long)
            mask = torch.zeros_like(ids)
            for j, r in enumerate(active):
                row = seqs[r] + current[r]
                ids[j, :len(row)] = torch.tensor(row)
                mask[j, :len(row)] = 1
            at = torch.tensor([[len(seqs[r]) - 1 + t for t in range(K + 1)] for r in active])
            with torch.no_grad(), torch.autocast(DEVICE, dtype=torch.bfloat16,
                                                 enabled=DEVICE == "cuda"):
                hidden = model.model(input_ids=ids.to(DEVICE),
                                     attention_mask=mask.to(DEVICE)).last_hidden_state
                picked = hidden.gather(1, at.to(DEVICE).unsqueeze(-1).expand(
                    -1, -1, hidden.shape[-1]))
                predictions = model.lm_head(picked).argmax(-1).tolist()
            still = []
            for r, pred in zip(active, predictions, strict=True):
                draft = current[r]
                if not first:
                    found[r].append((len(seqs[r]), draft))
                accepted = 0
                while accepted < K and draft[accepted] == pred[accepted]:
                    accepted += 1
                committed = pred[:accepted + 1]
                room = max_new - (len(seqs[r]) - lengths[r])
                committed = committed[:room]
                if eos in committed:
                    committed = committed[:committed.index(eos) + 1]
                seqs[r] += committed
                tail = pred[accepted + 1:]
                current[r] = tail + [seqs[r][-1]] * (K - len(tail))
                if committed[-1] != eos and len(seqs[r]) - lengths[r] < max_new:
                    still.append(r)
            active, first = still, False
        answers += [s[n:] for s, n in zip(seqs, lengths, strict=True)]
        drafts += found
    return answers, drafts


def draft_records(model: Any, prompts: list[list[int]], max_new: int, batch: int, eos: int,
                  pad: int, seed: int, id_offset: int) -> list[TrajectoryRecord]:
    """The model's own pure Jacobi drafts as training records (64 per prompt at most)."""
    answers, drafts = jacobi_drafts(model, prompts, max_new, batch, eos, pad)
    rng = np.random.default_rng(seed)
    return [r for i, (p, a, d) in enumerate(zip(prompts, answers, drafts, strict=True))
            for r in prompt_records(id_offset + i, p, a, d, BLOCK, 64, rng)]


def shifted_records(prompts: list[list[int]], answers: list[list[int]], first: int, seed: int
                    ) -> list[TrajectoryRecord]:
    return [r for i, (p, a) in enumerate(zip(prompts, answers, strict=True))
            for r in build_records(first + i, p, a, n=BLOCK, mode="shifted", seed=seed,
                                   max_states=16)]


def recipe_config(**changes: Any) -> cllm.CllmConfig:
    """``rounds.sh``'s training settings (LoRA r 32, lr 3e-4, ω 5, anchor base, window 2) at 8
    prompts a step without accumulation, no Trainer checkpoints; ``changes`` override them."""
    settings = {"block_size": BLOCK, "lora_rank": 32, "lora_alpha": 32, "learning_rate": 3e-4,
                "epochs": 1, "batch_size": 8, "grad_accum": 1, "ar_weight": 5.0,
                "anchor": "base", "consistency_window": 2, "save_steps": 10**6,
                "logging_steps": 10}
    return cllm.CllmConfig(**{**settings, **changes})


def train_with(callback: Any, base: str, records: list[TrajectoryRecord], out: Path,
               config: cllm.CllmConfig) -> Path:
    """:func:`vllm_cllm.training.cllm.train_cllm` (from scratch, no resume) with ``callback``
    added to its Trainer."""
    original = cllm.train_and_save

    def with_callback(trainer: Any, *args: Any, **kwargs: Any) -> Path:
        trainer.add_callback(callback)
        return original(trainer, *args, **kwargs)

    cllm.train_and_save = with_callback
    try:
        return cllm.train_cllm(base, records, out, config, resume=False)
    finally:
        cllm.train_and_save = original


def deadline_callback(at: float, stops: list, calibrate: int = 10) -> Any:
    """A Trainer callback that fits a round into wall-clock time ``at``: after ``calibrate``
    steps it projects the step time and, if the planned steps do not fit, shortens the run and
    its cosine schedule to the steps that do (so the learning rate still anneals to zero);
    it stops at ``at`` regardless. What it changed is appended to ``stops``."""
    from functools import partial

    from transformers import TrainerCallback
    from transformers.optimization import _get_cosine_schedule_with_warmup_lr_lambda

    class Deadline(TrainerCallback):
        began, total = 0.0, None

        def on_train_begin(self, args, state, control, **kwargs):
            self.began = time.time()

        def on_step_end(self, args, state, control, lr_scheduler=None, **kwargs):
            now, step = time.time(), state.global_step
            if step == calibrate:
                fits = step + int((at - now) / ((now - self.began) / step))
                if fits < state.max_steps:
                    self.total = max(fits, step + 1)
                    lr_scheduler.lr_lambdas[0] = partial(
                        _get_cosine_schedule_with_warmup_lr_lambda,
                        num_warmup_steps=int(0.03 * self.total),
                        num_training_steps=self.total, num_cycles=0.5)
                    stops.append({"planned": state.max_steps, "fits": self.total,
                                  "s_per_step": round((now - self.began) / step, 3)})
            if (self.total and step >= self.total) or now > at:
                if not control.should_training_stop:
                    control.should_training_stop = True
                    stops.append({"stopped_at_step": step, "of": state.max_steps})
            return control

    return Deadline()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", help="the base model's HF directory (default: vllm-cllm's "
                        "smollm2-135m-instruct)")
    parser.add_argument("--prompts", required=True, type=Path,
                        help="JSON list of prompt token ids")
    parser.add_argument("--make-prompts", action="store_true",
                        help="only write --prompts, then stop")
    parser.add_argument("--out")
    parser.add_argument("--answers", type=Path,
                        help="an earlier run's answers.json (the same prompts): not regenerated")
    parser.add_argument("--budget-s", type=float, default=480.0)
    parser.add_argument("--pool", type=int, default=2200, help="round 1's prompts")
    parser.add_argument("--fresh", type=int, default=300, help="new pool prompts per round")
    parser.add_argument("--drafted", type=int, default=512, help="prompts drafted per round")
    parser.add_argument("--steps", type=int, nargs=3, default=[600, 200, 200],
                        help="planned optimizer steps per round")
    parser.add_argument("--ar-weights", type=float, nargs=3, default=[5.0, 5.0, 20.0],
                        help="ω per round (the last one holds the answers)")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--gen-batch", type=int, default=512)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument("--data-workers", type=int, default=0,
                        help="DataLoader processes packing rows beside the GPU")
    args = parser.parse_args()
    if args.base is None:
        from vllm_cllm.runtime.checkpoints import model_path

        args.base = str(model_path("smollm2-135m-instruct"))
    if args.make_prompts or not args.prompts.exists():
        make_prompts(args.prompts, args.base)
        if args.make_prompts:
            return
    if not args.out:
        parser.error("--out is required for a run")
    start = time.time()
    torch.set_float32_matmul_precision("high")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(args.base)
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id or 0
    prompts = json.loads(args.prompts.read_text())
    summary: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()},
                               "rounds": []}

    def note(**kw: Any) -> None:
        kw["t"] = round(time.time() - start, 1)
        summary["rounds"].append(kw)
        print(json.dumps(kw), flush=True)
        (out / "summary.json").write_text(json.dumps(summary, indent=1))

    base = AutoModelForCausalLM.from_pretrained(args.base, dtype=torch.float32).to(DEVICE).eval()
    used = args.pool + 2 * args.fresh
    cache = out / "answers.json"  # a later run reuses it (--answers)
    known = json.loads(args.answers.read_text()) if args.answers else []
    if len(known) < used:
        known += greedy_answers(base, prompts[len(known):used], args.max_new_tokens,
                                args.gen_batch, eos, pad)
    answers = known[:used]
    cache.write_text(json.dumps(answers))
    note(stage="answers", prompts=len(answers),
         mean_tokens=float(np.mean([len(a) for a in answers])))
    del base
    config = recipe_config(batch_size=args.batch_size, precision=args.precision,
                           data_workers=args.data_workers)
    stops: list = []
    # rounds: (name, ω, steps, share of the remaining time it may use)
    plan = list(zip(("round1", "round2", "round3"), args.ar_weights, args.steps,
                    (0.55, 0.5, 1.0), strict=True))
    previous = None
    for index, (name, weight, steps, share) in enumerate(plan):
        if index == 0:
            records = shifted_records(prompts[:args.pool], answers[:args.pool], 0, 3)
        else:
            model = AutoModelForCausalLM.from_pretrained(
                out / previous / "model", dtype=torch.float32).to(DEVICE).eval()
            records = draft_records(model, prompts[:args.drafted], args.max_new_tokens,
                                    args.gen_batch, eos, pad, seed=index, id_offset=10**6)
            del model
            first = args.pool + (index - 1) * args.fresh
            records += shifted_records(prompts[first:first + args.fresh],
                                       answers[first:first + args.fresh], first, 3)
        note(stage=f"{name} data", records=len(records))
        left = args.budget_s - (time.time() - start)
        deadline = time.time() + left * share - 20  # room for saving and the next data
        run = replace(config, ar_weight=weight, max_steps=steps, seed=index,
                      init_adapter=str(out / previous / "adapter") if previous else "")
        train_with(deadline_callback(deadline, stops), args.base, records, out / name, run)
        history = json.loads((out / name / "log_history.json").read_text())
        note(stage=f"{name} trained", stops=list(stops), log=history[-3:])
        stops.clear()
        previous = name
        if time.time() - start > args.budget_s - 60:
            note(stage="out of time")
            break


if __name__ == "__main__":
    main()
