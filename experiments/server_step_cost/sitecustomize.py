"""Logs every timed verify step of a ``vllm serve`` engine to ``$STEP_LOG_DIR/<pid>.jsonl``:
the step's batch size, scheduled tokens, forward seconds and rest (as the measured cost model
gets them) and the cost model in use. On ``PYTHONPATH`` it is imported by every process."""

import json
import os
import time

if os.environ.get("STEP_LOG_DIR"):
    import importlib.abc
    import sys

    def _patch() -> None:
        from vllm_cllm.proposers.base import SelfDraftingProposer

        original = SelfDraftingProposer.retain_requests
        if getattr(original, "_step_logged", False):
            return
        path = os.path.join(os.environ["STEP_LOG_DIR"], f"{os.getpid()}.jsonl")

        def retain_requests(self, live_req_ids, greedy_req_ids=None, scheduled_tokens=None):
            timed, now = self._timed, time.perf_counter()
            original(self, live_req_ids, greedy_req_ids, scheduled_tokens)
            if timed is not None:
                tokens, forward, predicted, batch = timed
                cost = self.drafter.cost_measurement.cost if self.drafter.cost_measurement \
                    else None
                with open(path, "a") as f:
                    f.write(json.dumps({"t": now, "batch": batch, "tokens": tokens,
                                        "forward": forward, "rest": now - predicted,
                                        "knee": cost and cost.knee_tokens,
                                        "floor": cost and cost.floor_tokens}) + "\n")

        retain_requests._step_logged = True
        SelfDraftingProposer.retain_requests = retain_requests

    class _Hook(importlib.abc.MetaPathFinder):
        """Runs :func:`_patch` right after ``vllm_cllm.proposers.base`` is executed."""

        def find_spec(self, name, path, target=None):
            if name != "vllm_cllm.proposers.base":
                return None
            sys.meta_path.remove(self)
            import importlib.util
            spec = importlib.util.find_spec(name)
            execute = spec.loader.exec_module

            def exec_module(module):
                execute(module)
                _patch()

            spec.loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, _Hook())
