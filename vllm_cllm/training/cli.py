"""``vllm-cllm train ...``: trajectory data and CLLM training from the command line."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, fields
from pathlib import Path

from vllm_cllm.runtime.checkpoints import resolve_model


def _gsm_prompts(model: str, num_prompts: int, seed: int, exclude_eval: int = 0,
                 first: int = 0, prompt_format: str = "instruction") -> list[str]:
    """``num_prompts`` gsm_symbolic problems of ``seed`` from the ``first``-th on, in the model's
    chat template (see :func:`~vllm_cllm.training.gsm.training_problems` for ``exclude_eval``
    and :func:`~vllm_cllm.training.gsm.format_prompts` for ``prompt_format``)."""
    from transformers import AutoTokenizer

    from vllm_cllm.training.gsm import format_prompts, training_problems

    questions = [p["question"]
                 for p in training_problems(first + num_prompts, seed, exclude_eval)[first:]]
    return format_prompts(AutoTokenizer.from_pretrained(model), questions, prompt_format, first)


def _gsm_answers(model: str, num_prompts: int, seed: int, max_new_tokens: int, cache: Path,
                 ray_workers: int = 0, exclude_eval: int = 0, first: int = 0,
                 prompt_format: str = "instruction") -> list[tuple[list[int], list[int]]]:
    """(prompt_ids, greedy answer_ids) for gsm_symbolic chat prompts of ``seed``, cached."""
    from vllm_cllm.training.answers import generate_answers

    prompts = _gsm_prompts(model, num_prompts, seed, exclude_eval, first, prompt_format)
    return generate_answers(model, prompts, max_new_tokens, cache, ray_workers=ray_workers)


def cmd_trajectories(args: argparse.Namespace) -> int:
    from transformers import AutoModelForCausalLM

    from vllm_cllm.training.trajectories import write_trajectories

    if args.answer_model and args.mode != "guided":
        raise SystemExit("vllm-cllm train trajectories: --answer-model is for --mode guided "
                         f"(the other modes' fixed points are --model's answers); got --mode "
                         f"{args.mode}")
    model = resolve_model(args.model)
    out = Path(args.out)
    if args.mode == "onpolicy":
        from vllm_cllm.training.onpolicy import write_onpolicy

        written = write_onpolicy(out, model, _gsm_prompts(model, args.num_prompts, args.seed,
                                                          args.exclude_eval, args.first_prompt,
                                                          args.prompt_format),
                                 n=args.block_size, k=args.block_size - 1,
                                 max_new_tokens=args.max_new_tokens,
                                 max_per_prompt=args.max_states, seed=args.seed,
                                 fill=args.onpolicy_fill)
        print(f"{written} new records in {out}")
        return 0
    answers = Path(args.answers) if args.answers else out.with_name(out.stem + ".answers.jsonl")
    answer_model = resolve_model(args.answer_model) if args.answer_model else model
    items = _gsm_answers(answer_model, args.num_prompts, args.seed, args.max_new_tokens, answers,
                         args.ray_workers, args.exclude_eval, args.first_prompt,
                         args.prompt_format)
    hf_model = None
    if args.mode in ("jacobi", "guided"):
        import torch

        hf_model = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    written = write_trajectories(out, items, n=args.block_size, mode=args.mode, seed=args.seed,
                                 max_states=args.max_states, model=hf_model,
                                 first=args.first_prompt)
    print(f"{written} new records in {out}")
    return 0


def cmd_cllm(args: argparse.Namespace) -> int:
    from vllm_cllm.training.cllm import CllmConfig, train_cllm
    from vllm_cllm.training.trajectories import read_trajectories

    config = CllmConfig(**{f.name: getattr(args, f.name) for f in fields(CllmConfig)
                           if getattr(args, f.name, None) is not None})
    records = read_trajectories(*(Path(d) for d in args.data))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "train_config.json").write_text(json.dumps(
        {"base_model": args.model, "data": args.data, **asdict(config)}, indent=1))
    print(train_cllm(resolve_model(args.model), records, out, config))
    return 0


def cmd_space(args: argparse.Namespace) -> int:
    from vllm_cllm.training.space import SpaceConfig, check_space_config, train_space

    config = SpaceConfig(**{f.name: getattr(args, f.name) for f in fields(SpaceConfig)
                            if getattr(args, f.name, None) is not None})
    try:
        check_space_config(config)  # before the answers' engine starts
    except ValueError as error:
        raise SystemExit(f"vllm-cllm train space: {error}") from None
    model = resolve_model(args.model)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    answers = Path(args.answers) if args.answers else out / "answers.jsonl"
    items = _gsm_answers(model, args.num_prompts, args.prompt_seed, args.max_new_tokens, answers,
                         exclude_eval=args.exclude_eval, prompt_format=args.prompt_format)
    (out / "train_config.json").write_text(json.dumps(
        {"base_model": args.model, "num_prompts": args.num_prompts, "prompt_seed": args.prompt_seed,
         "prompt_format": args.prompt_format, "exclude_eval": args.exclude_eval,
         "prompts_used": len(items),
         "answers": str(answers), **asdict(config)}, indent=1))
    print(train_space(model, items, out, config))
    return 0


def _add_config_flags(parser: argparse.ArgumentParser, defaults: object,
                      skip: tuple[str, ...] = ()) -> None:
    """One ``--flag`` per field of a training config dataclass (None = keep the default)."""
    from vllm_cllm.training.trainer import ANCHORS, PRECISIONS

    # refused by the parser, before any model loads
    choices = {"precision": PRECISIONS, "anchor": ANCHORS}
    for f in fields(defaults):
        if f.name in skip:
            continue
        parser.add_argument("--" + f.name.replace("_", "-"), dest=f.name, type=type(f.default),
                            default=None, choices=choices.get(f.name),
                            help=f"default {f.default}")


def _training_seed(text: str) -> int:
    """A gsm_symbolic seed to train on: refused at parse time if it is the evaluation seed."""
    from vllm_cllm.training.gsm import check_training_seed

    seed = int(text)
    try:
        check_training_seed(seed)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return seed


def _add_exclude_eval(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--exclude-eval", type=int, default=0, metavar="N",
                        help="drop prompts whose question is verbatim among the first N "
                        "evaluation problems (seed 1000; the benchmarks use at most 40)")


def _add_prompt_format(parser: argparse.ArgumentParser) -> None:
    from vllm_cllm.training.gsm import PROMPT_FORMATS

    parser.add_argument("--prompt-format", choices=PROMPT_FORMATS, default="instruction",
                        help="the question with the recipes' instruction, bare (as users ask), "
                        "or both alternating (even problems instructed)")


def add_train_parser(sub: argparse._SubParsersAction) -> None:
    train = sub.add_parser("train", help="make training data and train checkpoints")
    tsub = train.add_subparsers(dest="train_command", required=True)

    p = tsub.add_parser("trajectories", help="greedy answers (vLLM) + Jacobi trajectory states")
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--out", required=True, help="JSON-lines file (resumable)")
    p.add_argument("--num-prompts", type=int, default=200)
    p.add_argument("--first-prompt", type=int, default=0, metavar="I",
                   help="start at the seed's I-th problem (a later round's new prompts)")
    p.add_argument("--seed", type=_training_seed, default=1,
                   help="gsm_symbolic seed (training seeds only)")
    _add_prompt_format(p)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--mode", choices=["noise", "shifted", "jacobi", "onpolicy", "guided"],
                   default="noise",
                   help="noise: progressive noise from the fixed point; shifted: the same "
                   "prefixes, behind them the fixed point one late or noise; jacobi: real Jacobi "
                   "iterates (transformers); onpolicy: the drafts `jacobi` verifies in vLLM; "
                   "guided: --model's pure Jacobi drafts along --answer-model's answers "
                   "(transformers)")
    p.add_argument("--answer-model", default=None,
                   help="guided: the model whose greedy answers are the fixed points "
                   "(default --model), e.g. the base model")
    p.add_argument("--max-states", type=int, default=4,
                   help="states kept per block (onpolicy, guided: per prompt)")
    p.add_argument("--onpolicy-fill", choices=["tail", "hybrid"], default="tail",
                   help="onpolicy: the drafts of `jacobi` with this fill (tail: pure Jacobi "
                   "iterates; hybrid: what the shipped proposer verifies)")
    p.add_argument("--ray-workers", type=int, default=0,
                   help="generate the answers on N Ray actors (RAY_ADDRESS), one engine each")
    p.add_argument("--answers", default=None,
                   help="greedy-answer cache (JSON lines; default OUT with .answers.jsonl): "
                   "share one to cut a slice of an earlier file's prompts without new answers")
    _add_exclude_eval(p)
    p.set_defaults(func=cmd_trajectories)

    p = tsub.add_parser("cllm", help="consistency distillation on trajectory data")
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--data", required=True, nargs="+", metavar="FILE",
                   help="trajectory files (`train trajectories`); several train together, "
                   "each file's prompts kept apart")
    p.add_argument("--out", required=True)
    _add_config_flags(p, CllmConfigDefaults())
    p.set_defaults(func=cmd_cllm)

    p = tsub.add_parser("space", help="SPACE semi-autoregressive SFT (adds a mask token)")
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--out", required=True)
    p.add_argument("--num-prompts", type=int, default=400)
    p.add_argument("--seed", dest="prompt_seed", type=_training_seed, default=1,
                   help="gsm_symbolic seed (training seeds only); --trainer-seed seeds training")
    p.add_argument("--trainer-seed", dest="seed", type=int, default=None)
    p.add_argument("--max-new-tokens", type=int, default=256)
    _add_prompt_format(p)
    p.add_argument("--answers", default=None,
                   help="greedy-answer cache (JSON lines; default OUT/answers.jsonl)")
    _add_exclude_eval(p)
    _add_config_flags(p, SpaceConfigDefaults(), skip=("seed",))
    p.set_defaults(func=cmd_space)

    p = tsub.add_parser("average", help="average LoRA adapters exactly (one adapter of their "
                        "summed rank), as `train cllm` leaves a run: OUT/adapter, OUT/model")
    p.add_argument("adapters", nargs="+", metavar="ADAPTER_DIR",
                   help="adapter folders trained on --model (at least two)")
    p.add_argument("--model", default="smollm2-135m-instruct", help="the adapters' base")
    p.add_argument("--out", required=True)
    p.set_defaults(func=cmd_average)


def cmd_average(args: argparse.Namespace) -> int:
    from vllm_cllm.runtime.checkpoints import merge_adapter
    from vllm_cllm.training.artifact import average_adapters

    out = Path(args.out)
    try:
        rank = average_adapters([Path(a) for a in args.adapters], out / "adapter")
    except ValueError as error:  # bad input: one line, no traceback
        raise SystemExit(f"vllm-cllm train average: {error}") from None
    merge_adapter(Path(resolve_model(args.model)), out / "adapter", out / "model")
    print(f"rank {rank} adapter: {out / 'adapter'}, merged: {out / 'model'}")
    return 0


def CllmConfigDefaults():  # noqa: N802 - imported lazily to keep `vllm-cllm --help` fast
    from vllm_cllm.training.cllm import CllmConfig

    return CllmConfig()


def SpaceConfigDefaults():  # noqa: N802 - imported lazily, as above
    from vllm_cllm.training.space import SpaceConfig

    return SpaceConfig()
