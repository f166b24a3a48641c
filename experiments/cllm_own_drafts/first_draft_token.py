"""What a pure Jacobi draft holds behind a rejected token: vLLM's ``jacobi`` with ``fill: tail``
replayed in transformers (verify [last token + k drafts], accept the matching prefix, draft the
predictions behind it), and each of the next draft's first three tokens classified against the
greedy answer: right, the previous token (the right token one slot late), the next token (one
slot early), another token of the answer nearby, or other.

    .venv/bin/python experiments/cllm_own_drafts/first_draft_token.py \\
        --model base=smollm2-135m-instruct --model demo=smollm2-135m-cllm-gsm --problems 6
"""

from __future__ import annotations

import argparse
import collections
import json
from pathlib import Path

import torch
from evaluate import evaluation_set, model_paths  # the sibling script: the same problems

from vllm_cllm.training.gsm import chat_prompt

KINDS = ("right", "one slot late", "one slot early", "nearby in the answer", "other")


def replay(model, prompt_ids: list[int], k: int, max_tokens: int, realign: bool = False,
           reference: list[int] | None = None
           ) -> tuple[list[int], list[tuple[int, list[int]]], int]:
    """Greedy answer, (answer index of the draft's first slot, draft) per step, verify steps.

    ``reference``: verify against this text instead of the model's own greedy tokens (the
    model still drafts): how well its drafts predict a fixed answer, e.g. the base model's.
    """
    with torch.no_grad():
        out = model(torch.tensor([prompt_ids]), use_cache=True)
        cache = out.past_key_values
        last = int(out.logits[0, -1].argmax()) if reference is None else reference[0]
        answer, drafts, steps = [last], [], 0
        draft = prompt_ids[-k:]  # no tail before the first step: context tokens
        limit = max_tokens if reference is None else len(reference)
        while len(answer) < limit and (reference is not None
                                       or last != model.config.eos_token_id):
            pred = model(torch.tensor([[last] + draft]), past_key_values=cache,
                         use_cache=True).logits[0].argmax(-1).tolist()
            target = pred if reference is None else reference[len(answer):len(answer) + k + 1]
            accepted = 0
            while (accepted < min(k, len(target) - 1)
                   and draft[accepted] == target[accepted]):
                accepted += 1
            committed = target[:accepted + 1]
            cache.crop(cache.get_seq_length() - (k + 1) + len(committed))
            answer += committed
            last, steps = committed[-1], steps + 1
            tail = pred[accepted + 1:]
            if realign and tail and tail[0] == last:  # the tail one slot late: drop its head
                tail = tail[1:]
            draft = tail + [last] * (k - len(tail))
            drafts.append((len(answer), tail))
    return answer, drafts, steps


def classify(answer: list[int], at: int, token: int) -> str:
    if token == answer[at]:
        return KINDS[0]
    if token == answer[at - 1]:
        return KINDS[1]
    if at + 1 < len(answer) and token == answer[at + 1]:
        return KINDS[2]
    return KINDS[3] if token in answer[max(0, at - 20):at + 20] else KINDS[4]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", action="append", required=True, help="label=name-or-path")
    parser.add_argument("--problems", type=int, default=6)
    parser.add_argument("--k", type=int, default=15)
    parser.add_argument("--max-tokens", type=int, default=160)
    parser.add_argument("--realign", action="store_true",
                        help="drop the tail's first token where it repeats the bonus token")
    parser.add_argument("--out", type=Path, default=None, help="write results.json here")
    args = parser.parse_args()
    from transformers import AutoModelForCausalLM

    _, tokenizer, problems = evaluation_set(args.problems)
    results = {}
    for label, path in model_paths(args.model).items():
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        counts: collections.Counter = collections.Counter()
        tokens = steps = 0
        for p in problems:
            ids = tokenizer(chat_prompt(tokenizer, p["question"]),
                            add_special_tokens=False).input_ids
            answer, drafts, n_steps = replay(model, ids, args.k, args.max_tokens, args.realign)
            tokens, steps = tokens + len(answer) - 1, steps + n_steps
            for at, tail in drafts:
                for slot, token in enumerate(tail[:3]):
                    if at + slot + 1 < len(answer):
                        counts[slot, classify(answer, at + slot, token)] += 1
        shares = {slot: {kind: counts[slot, kind] / max(1, sum(counts[slot, x] for x in KINDS))
                         for kind in KINDS} for slot in range(3)}
        results[label] = {"tokens_per_verify_step": tokens / steps, "shares": shares}
        print(f"{label}: {tokens / steps:.2f} tokens per verify step")
        for slot in range(3):
            print(f"  draft slot {slot + 1}: " + ", ".join(
                f"{kind} {shares[slot][kind]:.0%}" for kind in KINDS))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "first_draft_token.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
