"""Host time per verify step of each proposer, by batch size, on real text with drafting on.

What a proposer adds to every engine step on the host: this project's ``jacobi`` (the
adaptive default with GPU-like cost parameters, so that it drafts; the same without the
request's n-gram candidate, ``ngram_candidate: false``; and fixed k) and ``space``,
beside vLLM's ``ngram`` proposer and arctic-inference's suffix cache as vLLM's ``suffix``
drives it. No engine starts: each proposer is driven as vLLM's model runner drives it, on
synthetic verify steps whose target "is" the text, so that what a proposer drafts is accepted
as far as it matches the real continuation.

* **Text.** ShareGPT conversations in SmolLM2's ChatML, tokenized by its tokenizer, one
  stream in file order. A request's prompt is the ``--min-prompt``..``--max-prompt`` tokens
  before the start of an assistant answer (that conversation's history and earlier ones);
  it then "generates" that answer up to its ``<|im_end|>`` (or ``--max-model-len``), and its
  slot is taken by the next answer, a fresh request, in the step after it finishes.
* **Verify step.** For request drafts ``d`` at committed length ``pos`` the target predicts
  ``text[pos + j]`` at draft row ``j`` up to the first rejected row ``a``, so ``a`` drafts
  are accepted and the bonus is the text's next token; vLLM's sampled ids are the accepted
  prefix plus the bonus. Past row ``a`` the target is conditioned on a wrong token: with
  ``--tail draft`` (default) it repeats the draft it was given, so that the target knows
  nothing of the text beyond what the proposer drafted (a token of the text one position off
  would leak it: fixed-k ``jacobi``'s pool of recent iterates realigns it); with ``--tail
  text`` it predicts the text itself (an oracle for Jacobi tails and SPACE masks).
* **The capture.** This project's proposers read the target's predictions of every draft
  position. With ``--capture device`` (default) they get them as a GPU's capture hands them
  to ``propose``: the fixed-point step's small packed result (computed outside the timed
  region from the target rows by the kernels' torch path), no logits in host memory. With
  ``--capture host`` as on the CPU platform: ``observe_verification`` takes the argmax over
  float32 one-hot logits rows right before ``propose``, whose sweep over 20-800 MB leaves
  the caches cold for it. Either way the CPU platform's capture is timed alone
  (``capture_us``; with ``device`` over the last steps, after the run).
* **Timed.** Only the proposer's own calls: for this project's proposers
  ``retain_requests`` + ``propose`` (``propose_us``, the capture left out); for ``ngram``
  ``NgramProposer.propose``; for ``suffix`` ``SuffixDecodingProposer.propose``
  (``start_request`` for a new request, ``add_active_response`` + ``speculate`` per request).
  All proposers of one batch size run in lock step, one step each in an order that rotates,
  so that they share the machine's state; a row's figure is the median over the steps
  after ``--warmup``.

    .venv/bin/python benchmarks/host_cost.py --out results/host_cost
    .venv/bin/python benchmarks/host_cost.py --out results/host_cost_before \\
        --tree /tmp/host_cost_before                    # vllm_cllm of another checkout
    .venv/bin/python benchmarks/host_cost.py --out results/host_cost_prof \\
        --batch-sizes 64 --profile jacobi               # cProfile of one proposer's calls

Outputs: ``DIR/results.json`` (rows: ``proposer``, ``batch_size``, ``propose_us`` and extras),
``DIR/table.md`` and ``DIR/host_cost.png``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

#: Row names, in table order: this project's proposers, then vLLM's.
PROPOSERS = ("jacobi", "jacobi no ngram", "jacobi fixed", "space", "ngram", "suffix")
OWN = ("jacobi", "jacobi no ngram", "jacobi fixed", "space")
#: SmolLM2's vocabulary: the logits' width.
VOCAB = 49152
#: vLLM 0.32's suffix defaults (SpeculativeConfig.suffix_decoding_*).
SUFFIX_DEFAULTS = {"max_tree_depth": 24, "max_spec_factor": 1.0, "min_token_prob": 0.1,
                   "max_cached_requests": 10000}


@dataclass
class Settings:
    """What one run measures (the command line's options)."""

    batch_sizes: Sequence[int] = (1, 16, 64, 256)
    steps: int = 300
    warmup: int = 50
    k: int = 15  # jacobi, jacobi fixed, ngram and suffix: most draft tokens per request
    space_k: int = 5  # space: mask slots per step (vLLM verifies 2k)
    knee_tokens: int = 2048
    floor_tokens: int = 0
    ngram_min: int = 2
    ngram_max: int = 4
    max_model_len: int = 2048
    vocab: int = VOCAB
    tail: str = "draft"
    #: how this project's proposers get the verify step's predictions: ``device`` as from a
    #: GPU's capture (the fixed-point step's small result; no logits in host memory), ``host``
    #: as on the CPU platform (the argmax over the logits right before ``propose``)
    capture: str = "device"
    proposers: Sequence[str] = PROPOSERS
    profile: str | None = None  # a proposer whose timed calls are profiled (cProfile)


# --------------------------------------------------------------------------- text


@dataclass
class Request:
    """One request's text: ``prompt_len`` prompt tokens, then the answer it generates."""

    tokens: np.ndarray  # int32 [prompt_len + answer_len]
    prompt_len: int


class RequestPool:
    """Requests in a fixed order, made on demand; every proposer's run takes them in the same
    order (request ``n`` is the same text for all), none twice."""

    def __init__(self, make: Callable[[], list[Request]]) -> None:
        self._make = make  # the next chunk of requests; [] when the text is used up
        self.requests: list[Request] = []

    def __getitem__(self, index: int) -> Request:
        while index >= len(self.requests):
            more = self._make()
            if not more:
                raise RuntimeError(f"only {len(self.requests)} requests in the text; "
                                   "use fewer --steps or smaller --batch-sizes")
            self.requests.extend(more)
        return self.requests[index]


def _sharegpt_conversations() -> Any:
    """ShareGPT conversations (lists of ``{"from", "value"}``) in file order, from the data
    file the project's bench uses."""
    from vllm_cllm.bench.datasets import sharegpt_conversations

    return sharegpt_conversations()


def sharegpt_pool(settings: Settings, seed: int = 0, chunk: int = 200) -> RequestPool:
    """Requests cut from ShareGPT (see the module docstring): each ends with one assistant
    answer, its prompt the tokens before it. Token ids at or above ``settings.vocab`` (only
    with a smaller vocabulary) wrap around."""
    from transformers import AutoTokenizer

    from vllm_cllm.runtime.checkpoints import model_path

    tokenizer = AutoTokenizer.from_pretrained(str(model_path("smollm2-135m-instruct")))
    roles = {"human": "user", "gpt": "assistant", "system": "system"}
    header = {role: tokenizer(f"<|im_start|>{role}\n", add_special_tokens=False)["input_ids"]
              for role in roles.values()}
    end = tokenizer("<|im_end|>\n", add_special_tokens=False)["input_ids"]
    conversations = _sharegpt_conversations()
    rng = np.random.default_rng(seed)
    stream: list[int] = []  # every conversation so far, in ChatML
    span = max(1, settings.max_model_len // 4)  # prompts draw from [min, max] below
    low, high = span, 3 * span

    def make() -> list[Request]:
        turns = []  # (role, text) of the next `chunk` conversations
        for conversation in conversations:
            if all(t.get("from") in roles for t in conversation):
                turns.extend((roles[t["from"]], t.get("value") or "") for t in conversation)
            if len(turns) >= 4 * chunk:
                break
        if not turns:
            return []
        contents = tokenizer([text for _, text in turns], add_special_tokens=False)["input_ids"]
        out = []
        for (role, _), ids in zip(turns, contents, strict=True):
            stream.extend(header[role])
            start = len(stream)
            stream.extend(ids)
            stream.extend(end[:1])  # <|im_end|>: the answer's last generated token
            answer_end = len(stream)
            stream.extend(end[1:])
            prompt_len = int(rng.integers(low, high + 1))
            answer_len = min(answer_end - start, settings.max_model_len - prompt_len - 1)
            if role != "assistant" or start < prompt_len or answer_len < 8:
                continue
            tokens = np.asarray(stream[start - prompt_len:start + answer_len], dtype=np.int64)
            out.append(Request((tokens % settings.vocab).astype(np.int32), prompt_len))
        return out

    return RequestPool(make)


# --------------------------------------------------------------------------- proposers


def fake_vllm_config(spec: dict[str, Any], max_model_len: int) -> Any:
    """The part of a VllmConfig that this project's proposers read when vLLM builds them
    (``Class(vllm_config)``): vLLM's draft slots, the model length, and the options that the
    plugin's front end stores in ``additional_config`` (``space``: 2k slots)."""
    from vllm_cllm.options import parse_options

    k = spec["num_speculative_tokens"]
    slots = 2 * k if spec["method"] == "space" else k
    return SimpleNamespace(
        speculative_config=SimpleNamespace(num_speculative_tokens=slots),
        model_config=SimpleNamespace(max_model_len=max_model_len),
        additional_config={"vllm_cllm": parse_options(spec, max_k=slots).to_dict()})


def own_spec(name: str, settings: Settings) -> dict[str, Any]:
    """The speculative config of one of this project's rows."""
    if name == "jacobi":
        return {"method": "jacobi", "num_speculative_tokens": settings.k,
                "knee_tokens": settings.knee_tokens, "floor_tokens": settings.floor_tokens}
    if name == "jacobi no ngram":  # the default without the request's n-gram candidate
        return {**own_spec("jacobi", settings), "ngram_candidate": False}
    if name == "jacobi fixed":
        return {"method": "jacobi", "num_speculative_tokens": settings.k, "adaptive": False}
    if name == "space":
        return {"method": "space", "num_speculative_tokens": settings.space_k,
                "mask_token_id": settings.vocab - 1}
    raise KeyError(name)


def build_own(name: str, settings: Settings) -> Any:
    spec = own_spec(name, settings)
    if spec["method"] == "space":
        from vllm_cllm.proposers.space import SpaceProposer as cls
    else:
        from vllm_cllm.proposers.jacobi import JacobiProposer as cls
    return cls(fake_vllm_config(spec, settings.max_model_len))


def build_ngram(settings: Settings, batch: int) -> Any:
    """vLLM's n-gram proposer (numba), from the VllmConfig fields its constructor reads."""
    from vllm.v1.spec_decode.ngram_proposer import NgramProposer

    return NgramProposer(SimpleNamespace(
        speculative_config=SimpleNamespace(prompt_lookup_min=settings.ngram_min,
                                           prompt_lookup_max=settings.ngram_max,
                                           num_speculative_tokens=settings.k),
        model_config=SimpleNamespace(max_model_len=settings.max_model_len),
        scheduler_config=SimpleNamespace(max_num_seqs=batch),
        parallel_config=SimpleNamespace(tensor_parallel_size=1)))


def build_suffix(settings: Settings) -> Any:
    """vLLM's ``suffix`` proposer (arctic-inference's SuffixDecodingCache) with vLLM's defaults."""
    from vllm.v1.spec_decode.suffix_decoding import SuffixDecodingProposer

    d = SUFFIX_DEFAULTS
    return SuffixDecodingProposer(SimpleNamespace(
        speculative_config=SimpleNamespace(
            num_speculative_tokens=settings.k, suffix_decoding_max_tree_depth=d["max_tree_depth"],
            suffix_decoding_max_spec_factor=d["max_spec_factor"],
            suffix_decoding_min_token_prob=d["min_token_prob"],
            suffix_decoding_max_cached_requests=d["max_cached_requests"]),
        model_config=SimpleNamespace(max_model_len=settings.max_model_len)))


def suffix_missing() -> str | None:
    """Why vLLM's ``suffix`` cannot run here (arctic-inference missing), or None."""
    try:
        import arctic_inference.suffix_decoding  # noqa: F401
    except ImportError as exc:
        return str(exc)
    return None


# --------------------------------------------------------------------------- one run

#: Steps whose capture is timed after the run (``device``).
CAPTURE_STEPS = 20


def device_capture(proposer: Any, rows: np.ndarray, meta: Any, req_ids: list[str]) -> Any:
    """The predictions as a GPU's capture hands them to ``propose``: the fixed-point step's
    result (argmax, accepted lengths, next blocks) packed on the device and copied to the
    host, here computed from the argmax rows (``rows``) by the kernels' torch path. Its views
    are built here, as the capture builds them while the device runs the forward pass; what
    ``propose`` does with it (:meth:`PendingPredictions.resolve`) is the proposer's."""
    import torch

    from vllm_cllm.core.predictions import PendingPredictions, VerifyPredictions
    from vllm_cllm.kernels import fixed_point_step

    if meta is None:
        return VerifyPredictions.without_drafts(req_ids)
    num_drafts = list(meta.num_draft_tokens)
    mask = proposer.mask_slots(req_ids, num_drafts)
    out = fixed_point_step(torch.from_numpy(rows.astype(np.int64)), meta.draft_token_ids,
                           torch.tensor(num_drafts, dtype=torch.int32), proposer.block_len,
                           num_mask=None if mask is None else torch.tensor(mask,
                                                                           dtype=torch.int32),
                           backend="torch")
    packed = torch.cat([out.argmax, out.accepted.to(torch.int64), out.next_len.to(torch.int64),
                        out.next_draft.reshape(-1)])
    return PendingPredictions(req_ids, packed, None, [n + 1 for n in num_drafts],
                              proposer.block_len, mask)


class LogitsBuffer:
    """One float32 [rows, vocab] buffer of one-hot rows, shared by the proposers of a batch
    size: only the ones (and a SPACE mask column, which ``space`` sets to −inf in place) are
    written and cleared each step, so no step allocates or zeroes 100s of MB."""

    def __init__(self, rows: int, vocab: int) -> None:
        import torch

        self.tensor = torch.zeros(rows, vocab, dtype=torch.float32)
        self._set: Any = None

    def fill(self, targets: np.ndarray) -> Any:
        import torch

        rows = torch.arange(len(targets))
        cols = torch.from_numpy(targets.astype(np.int64))
        self.tensor[rows, cols] = 1.0
        self._set = (rows, cols)
        return self.tensor[:len(targets)]

    def clear(self, mask_column: int | None) -> None:
        rows, cols = self._set
        self.tensor[rows, cols] = 0.0
        if mask_column is not None:
            self.tensor[:len(rows), mask_column] = 0.0


@dataclass
class Slot:
    """One row of the batch: the request in it, its committed length and last draft."""

    request: Request
    req_id: str
    pos: int = 0  # committed tokens (0: prefill pending)
    draft: list[int] = field(default_factory=list)


class Run:
    """One proposer at one batch size: the batch's requests, the verify step and the timed
    proposer calls."""

    def __init__(self, name: str, batch: int, pool: RequestPool, settings: Settings,
                 logits: LogitsBuffer | None) -> None:
        self.name, self.batch, self.pool, self.settings = name, batch, pool, settings
        self.logits = logits
        self.own = name in OWN
        if self.own:
            self.proposer = build_own(name, settings)
        elif name == "ngram":
            self.proposer = build_ngram(settings, batch)
        else:
            self.proposer = build_suffix(settings)
        self.mask_column = settings.vocab - 1 if name == "space" else None
        self.next_request = 0
        self.slots = [self._new_slot() for _ in range(batch)]
        self.token_ids = np.zeros((batch, settings.max_model_len), dtype=np.int32)
        self.num_tokens = np.zeros(batch, dtype=np.int32)
        self.times: list[float] = []
        self.capture_times: list[float] = []
        #: the last timed steps' logits rows and drafts (``device``: the capture is timed
        #: after the run, so that no sweep over the logits precedes a timed ``propose``)
        self.saved: deque[tuple[np.ndarray, Any, list[str]]] = deque(maxlen=CAPTURE_STEPS)
        self.accepted: list[int] = []  # per request and decode step (prefill steps left out)
        self.drafted: list[int] = []
        self.finished = 0
        self.profiler: Any = None
        if settings.profile == name:
            import cProfile

            self.profiler = cProfile.Profile()

    def _new_slot(self) -> Slot:
        index = self.next_request
        self.next_request += 1
        return Slot(self.pool[index], f"req-{index}")

    def step(self, timed: bool) -> None:
        """One verify step: what the target accepts of the last drafts (untimed), then the
        proposer's calls for the next drafts (timed)."""
        sampled: list[list[int]] = []
        targets: list[np.ndarray] = []
        drafts_verified: list[list[int]] = []
        for i, slot in enumerate(self.slots):
            if slot.pos >= len(slot.request.tokens):  # finished last step: a fresh request
                self.finished += 1
                self.slots[i] = slot = self._new_slot()
            tokens = slot.request.tokens
            if slot.pos == 0:  # prefill: one logits row, the first generated token
                slot.pos = slot.request.prompt_len
                self.token_ids[i, :slot.pos] = tokens[:slot.pos]
                slot.draft = []
            draft, pos = slot.draft, slot.pos
            n = len(draft)
            text = tokens[pos:pos + n + 1]
            matches = np.asarray(draft[:len(text)], dtype=np.int64) == text[:n]
            a = int(np.argmin(matches)) if not matches.all() else len(matches)
            a = min(a, len(text) - 1)  # the text ends: a draft past it is rejected there
            target = np.take(tokens, np.arange(pos, pos + n + 1), mode="clip")
            if n > a and self.settings.tail == "draft":
                # past the rejected row the target repeats the draft (the last row its last
                # token): it knows nothing of the text beyond what the proposer drafted
                target[a + 1:] = np.asarray(draft, dtype=np.int64)[np.minimum(
                    np.arange(a + 1, n + 1), n - 1)]
            committed = tokens[pos:pos + a + 1]
            self.token_ids[i, pos:pos + a + 1] = committed
            slot.pos = pos + a + 1
            self.num_tokens[i] = slot.pos
            sampled.append(committed.tolist())
            targets.append(target)
            drafts_verified.append(draft)
            if timed and pos > slot.request.prompt_len:
                self.accepted.append(a)
                self.drafted.append(n)
        req_ids = [slot.req_id for slot in self.slots]
        if self.own:
            drafts = self._own_step(req_ids, sampled, targets, drafts_verified, timed)
        elif self.name == "ngram":
            num_tokens = self.num_tokens.copy()
            started = time.perf_counter()
            drafts = self.proposer.propose(self.settings.k, sampled, num_tokens, self.token_ids)
            self._record(time.perf_counter() - started, timed)
        else:
            batch = SimpleNamespace(  # the InputBatch fields SuffixDecodingProposer reads
                req_ids=req_ids, num_tokens_no_spec=self.num_tokens.copy(),
                req_id_to_index={r: i for i, r in enumerate(req_ids)},
                num_prompt_tokens=np.array([s.request.prompt_len for s in self.slots]),
                token_ids_cpu=self.token_ids)
            started = time.perf_counter()
            drafts = self.proposer.propose(self.settings.k, batch, sampled)
            self._record(time.perf_counter() - started, timed)
        for slot, draft in zip(self.slots, drafts, strict=True):
            slot.draft = [int(t) for t in draft]

    def _own_step(self, req_ids: list[str], sampled: list[list[int]],
                  targets: list[np.ndarray], drafts: list[list[int]], timed: bool
                  ) -> list[list[int]]:
        """``retain_requests``, the capture and ``propose`` as vLLM's runner calls them; the
        first and the last are timed."""
        import torch

        rows = np.concatenate(targets)
        num_drafts = [len(d) for d in drafts]
        # vLLM passes no metadata in a step where no request drafted
        meta = SimpleNamespace(num_draft_tokens=num_drafts, draft_token_ids=torch.tensor(
            [t for d in drafts for t in d], dtype=torch.int64)) if any(num_drafts) else None
        live = set(req_ids)
        num_tokens = self.num_tokens.copy()
        on_host = self.settings.capture == "host"
        logits = None
        if on_host:
            assert self.logits is not None
            logits = self.logits.fill(rows)
        if self.profiler is not None and timed:
            self.profiler.enable()
        started = time.perf_counter()
        self.proposer.retain_requests(live, live)  # every request decodes greedily
        capture_start = time.perf_counter()
        if on_host:
            self.proposer.observe_verification(logits, meta, req_ids)
        else:  # the device's part, untimed: its result is what propose() waits for
            self.proposer.predictions = device_capture(self.proposer, rows, meta, req_ids)
        capture_end = time.perf_counter()
        out = self.proposer.propose(sampled, num_tokens, self.token_ids)
        ended = time.perf_counter()
        if self.profiler is not None and timed:
            self.profiler.disable()
        if on_host:
            self.logits.clear(self.mask_column)
        self._record(ended - started - (capture_end - capture_start), timed)
        if timed:
            if on_host:
                self.capture_times.append(capture_end - capture_start)
            else:
                self.saved.append((rows, meta, req_ids))
        return out

    def time_capture(self) -> None:
        """``device``: the CPU platform's capture (the argmax over the logits) of the last
        timed steps, each timed alone, after the run."""
        if self.settings.capture == "host" or self.logits is None:
            return
        for rows, meta, req_ids in self.saved:
            logits = self.logits.fill(rows)
            started = time.perf_counter()
            self.proposer.observe_verification(logits, meta, req_ids)
            self.capture_times.append(time.perf_counter() - started)
            self.proposer.predictions = None
            self.logits.clear(self.mask_column)

    def _record(self, seconds: float, timed: bool) -> None:
        if timed:
            self.times.append(seconds)

    def row(self) -> dict[str, Any]:
        us = np.asarray(self.times) * 1e6
        row: dict[str, Any] = {
            "proposer": self.name, "batch_size": self.batch,
            "propose_us": float(np.median(us)),
            "propose_p10_us": float(np.percentile(us, 10)),
            "propose_p90_us": float(np.percentile(us, 90)),
            "propose_us_per_request": float(np.median(us)) / self.batch,
            "steps_timed": len(us),
            "accepted_per_step": float(np.mean(self.accepted)) if self.accepted else 0.0,
            "tokens_per_step": 1.0 + (float(np.mean(self.accepted)) if self.accepted else 0.0),
            "drafted_per_step": float(np.mean(self.drafted)) if self.drafted else 0.0,
            "mean_context": float(np.mean(self.num_tokens)),
            "requests_finished": self.finished,
        }
        if self.capture_times:
            row["capture_us"] = float(np.median(self.capture_times) * 1e6)
        if self.own:
            row["spec"] = own_spec(self.name, self.settings)
        return row


def measure(pool: RequestPool, settings: Settings, progress: bool = True
            ) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """Rows for every proposer and batch size (the proposers of one batch size in lock step),
    and the profiles of ``settings.profile`` by batch size (pstats text)."""
    from tqdm import tqdm

    names = list(settings.proposers)
    if "suffix" in names and (why := suffix_missing()):
        print(f"host_cost: no suffix row: {why}", file=sys.stderr)
        names.remove("suffix")
    from vllm_cllm.errors import ConfigError

    for name in [n for n in names if n in OWN]:  # an older tree (--tree) may lack an option
        try:
            fake_vllm_config(own_spec(name, settings), settings.max_model_len)  # parses only
        except ConfigError as exc:
            print(f"host_cost: no {name!r} row: {exc}", file=sys.stderr)
            names.remove(name)
    rows, profiles = [], {}
    for batch in settings.batch_sizes:
        slots = max((2 * settings.space_k if n == "space" else settings.k)
                    for n in names if n in OWN) if any(n in OWN for n in names) else 0
        logits = LogitsBuffer(batch * (slots + 1), settings.vocab) if slots else None
        runs = [Run(name, batch, pool, settings, logits) for name in names]
        total = settings.warmup + settings.steps
        for step in tqdm(range(total), desc=f"batch {batch}", disable=not progress,
                         leave=False):
            shift = step % len(runs)  # a rotating order: no proposer always runs first
            for run in runs[shift:] + runs[:shift]:
                run.step(timed=step >= settings.warmup)
        for run in runs:
            run.time_capture()
            rows.append(run.row())
            if run.profiler is not None:
                import io
                import pstats

                text = io.StringIO()
                stats = pstats.Stats(run.profiler, stream=text)
                stats.sort_stats("cumulative").print_stats(30)  # where the time goes, by call
                stats.sort_stats("tottime").print_stats(30)  # and by function's own time
                profiles[f"{run.name}@{batch}"] = text.getvalue()
        del runs, logits
    return rows, profiles


# --------------------------------------------------------------------------- outputs


def table(rows: list[dict[str, Any]]) -> str:
    """Markdown: µs per step by proposer and batch size, with the ratio to ``suffix``; then
    tokens per verify step and draft tokens per step."""
    batches = sorted({r["batch_size"] for r in rows})
    names = [n for n in PROPOSERS if any(r["proposer"] == n for r in rows)]
    cell = {(r["proposer"], r["batch_size"]): r for r in rows}
    head = "| proposer | " + " | ".join(f"batch {b}" for b in batches) + " |"
    rule = "|---|" + "---|" * len(batches)
    lines = ["Host µs per verify step (median; × `suffix`):", "", head, rule]
    for name in names:
        cells = []
        for b in batches:
            r, base = cell.get((name, b)), cell.get(("suffix", b))
            if r is None:
                cells.append("")
                continue
            ratio = f" ({r['propose_us'] / base['propose_us']:.1f}x)" if base else ""
            cells.append(f"{r['propose_us']:,.0f}{ratio}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    for label, key in (("the CPU platform's capture (argmax over the logits) µs per step, "
                        "not included above", "capture_us"),
                       ("tokens per verify step (1 + accepted)", "tokens_per_step"),
                       ("draft tokens per request and step", "drafted_per_step")):
        lines += ["", f"{label}:", "", head, rule]
        for name in names:
            if not any(key in cell.get((name, b), {}) for b in batches):
                continue
            values = [cell.get((name, b), {}).get(key) for b in batches]
            lines.append(f"| {name} | " + " | ".join(
                "" if v is None else (f"{v:,.0f}" if key == "capture_us" else f"{v:.2f}")
                for v in values) + " |")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for name in PROPOSERS:
        own = sorted((r for r in rows if r["proposer"] == name), key=lambda r: r["batch_size"])
        if own:
            ax.plot([r["batch_size"] for r in own], [r["propose_us"] for r in own], "o-",
                    label=name)
    capture = sorted((r for r in rows if r["proposer"] == "jacobi fixed" and "capture_us" in r),
                     key=lambda r: r["batch_size"])
    if capture:
        ax.plot([r["batch_size"] for r in capture], [r["capture_us"] for r in capture], "k:",
                label="capture (argmax), jacobi fixed")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("batch size")
    ax.set_ylabel("host µs per verify step")
    ax.set_title("Proposer host time per step (no engine)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def tree_commit(tree: Path) -> str:
    """The checkout's commit, with ``-dirty`` when it has uncommitted changes."""
    try:
        commit = subprocess.run(["git", "-C", str(tree), "rev-parse", "HEAD"], check=True,
                                capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(tree), "status", "--porcelain", "--",
                                "vllm_cllm"], capture_output=True, text=True).stdout.strip()
        return commit + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tree", type=Path, default=None,
                        help="import vllm_cllm from this checkout (default: the installed one)")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16, 64, 256])
    parser.add_argument("--steps", type=int, default=300, help="timed steps per batch size")
    parser.add_argument("--warmup", type=int, default=50, help="untimed steps before them")
    parser.add_argument("--proposers", nargs="+", default=list(PROPOSERS), choices=PROPOSERS)
    parser.add_argument("--knee-tokens", type=int, default=2048,
                        help="jacobi (adaptive)'s knee_tokens: GPU-like, so that it drafts")
    parser.add_argument("--floor-tokens", type=int, default=0)
    parser.add_argument("--k", type=int, default=15)
    parser.add_argument("--space-k", type=int, default=5)
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--tail", choices=("draft", "text"), default="draft",
                        help="what the target predicts past the first rejected draft row")
    parser.add_argument("--capture", choices=("device", "host"), default="device",
                        help="device: predictions as a GPU's capture hands them (no logits "
                             "in host memory); host: the CPU platform's argmax right before "
                             "propose (its sweep over the logits leaves the caches cold)")
    parser.add_argument("--profile", choices=PROPOSERS, default=None,
                        help="cProfile this proposer's timed calls (its times then include "
                             "the profiler's overhead): DIR/profile_<name>_b<batch>.txt")
    args = parser.parse_args(argv)
    tree = (args.tree or Path(__file__).resolve().parents[1]).resolve()
    if args.tree is not None:
        sys.path.insert(0, str(tree))  # the tree under test before the installed package
    import vllm

    import vllm_cllm

    settings = Settings(batch_sizes=args.batch_sizes, steps=args.steps, warmup=args.warmup,
                        k=args.k, space_k=args.space_k, knee_tokens=args.knee_tokens,
                        floor_tokens=args.floor_tokens, max_model_len=args.max_model_len,
                        tail=args.tail, capture=args.capture, proposers=args.proposers,
                        profile=args.profile)
    started = time.time()
    rows, profiles = measure(sharegpt_pool(settings), settings)
    args.out.mkdir(parents=True, exist_ok=True)
    from importlib.metadata import version

    meta = {"tree": str(tree), "vllm_cllm": str(Path(vllm_cllm.__file__).parent),
            "commit": tree_commit(tree), "vllm": vllm.__version__,
            "arctic_inference": None if suffix_missing() else version("arctic-inference"),
            "date": time.strftime("%Y-%m-%d %H:%M"), "seconds": round(time.time() - started),
            "settings": {k: list(v) if isinstance(v, tuple) else v
                         for k, v in vars(settings).items()}}
    (args.out / "results.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    text = table(rows) + f"\nTree {tree} at {meta['commit']}; vllm {meta['vllm']}.\n"
    (args.out / "table.md").write_text(text)
    plot(rows, args.out / "host_cost.png")
    for key, profile in profiles.items():
        name, batch = key.split("@")
        (args.out / f"profile_{name.replace(' ', '_')}_b{batch}.txt").write_text(profile)
    print(text)


if __name__ == "__main__":
    main()
