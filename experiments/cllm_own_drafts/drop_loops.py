"""Drop the own-drafts records of every prompt whose answer ran to the token limit (the
previous round's loops), so a round trains on the rest: does training on looping answers teach
the loops?

    .venv/bin/python experiments/cllm_own_drafts/drop_loops.py \\
        results/lr2e3/round3-drafts.jsonl results/lr2e3l/round3-drafts.jsonl
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

from vllm_cllm.training.trajectories import read_trajectories


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("drafts", type=Path, help="train trajectories --mode onpolicy output")
    parser.add_argument("out", type=Path)
    parser.add_argument("--max-new-tokens", type=int, default=256,
                        help="the limit the drafts were recorded with")
    args = parser.parse_args()
    records = read_trajectories(args.drafts)  # one file: its prompt ids kept as written
    kept = [r for r in records if len(r.answer_ids) < args.max_new_tokens]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps(asdict(r)) + "\n" for r in kept))
    prompts = {r.prompt_id for r in records}
    kept_prompts = {r.prompt_id for r in kept}
    print(f"kept {len(kept)} of {len(records)} records, {len(kept_prompts)} of {len(prompts)} "
          f"prompts -> {args.out}")


if __name__ == "__main__":
    main()
