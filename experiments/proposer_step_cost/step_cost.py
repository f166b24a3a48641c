"""Per-step cost of the CPU capture + ``propose`` (host path) of the tree in ``argv[1]``, at
batch ``argv[2]``: median microseconds over the last 250 of 300 synthetic verify steps."""

from __future__ import annotations

import json
import sys
import time
from types import SimpleNamespace

sys.path.insert(0, sys.argv[1])  # the tree under test comes before the installed package

import numpy as np  # noqa: E402
import torch  # noqa: E402

try:
    from vllm_cllm.proposers.jacobi import JacobiProposer
except ImportError:  # the flat layout of older trees
    from vllm_cllm.jacobi import JacobiProposer
from vllm_cllm.options import parse_options  # noqa: E402

BATCH, K, VOCAB = int(sys.argv[2]), 15, 49152
spec = {"method": "jacobi", "num_speculative_tokens": K, "adaptive": True}
proposer = JacobiProposer(SimpleNamespace(
    speculative_config=SimpleNamespace(num_speculative_tokens=K),
    model_config=SimpleNamespace(max_model_len=2048),
    additional_config={"vllm_cllm": parse_options(spec, max_k=K).to_dict()}))
text = np.random.default_rng(0).integers(0, 50, (BATCH, 2048))
ids = [f"r{i}" for i in range(BATCH)]
lengths = np.full(BATCH, 100)
drafts: list[list[int]] = [[] for _ in ids]
times = []
for _ in range(300):
    num = [len(d) for d in drafts]
    logits = torch.randn(sum(num) + BATCH, VOCAB)
    meta = SimpleNamespace(num_draft_tokens=num,
                           draft_token_ids=torch.tensor(sum(drafts, []), dtype=torch.int64))
    sampled = [[int(text[i, lengths[i]])] for i in range(BATCH)]
    started = time.perf_counter()
    proposer.retain_requests(set(ids), set(ids))
    proposer.observe_verification(logits, meta, ids)
    lengths += 1
    drafts = proposer.propose(sampled, lengths.copy(), text)
    times.append(time.perf_counter() - started)
print(json.dumps({"median_us": float(np.median(times[50:]) * 1e6)}))
