"""The records of prompts [FIRST, END) of a trajectory file, stdin to stdout: a round's share
of the shifted-state pool (``rounds.sh``, ``formats.sh``).

    .venv/bin/python experiments/cllm_own_drafts/pool_slice.py FIRST END < pool.jsonl
"""

import json
import sys

first, end = map(int, sys.argv[1:3])
sys.stdout.writelines(line for line in sys.stdin if first <= json.loads(line)["prompt_id"] < end)
