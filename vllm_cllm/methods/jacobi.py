"""``jacobi``: a CLLM drafts its own next block by fixed-point iteration.

The block is the Jacobi tail (the target's predictions behind what was accepted) completed
by the fill. With ``fill: hybrid`` the request's n-grams, a lookup of earlier text (the
suffix trees, or the output history) and, at a fixed k, the pool of recent iterates are
candidates too; greedy requests then choose and size adaptively (``adaptive``, the default),
sampled ones in a fixed order, from their own tokens.
"""

from __future__ import annotations

import numpy as np

from vllm_cllm.core.drafter import Drafter, DraftSource
from vllm_cllm.core.requests import RequestTable
from vllm_cllm.core.step import VerifyStep
from vllm_cllm.options import ProposerOptions
from vllm_cllm.policies.adaptive import Adaptive
from vllm_cllm.policies.cost_model import CostModel
from vllm_cllm.policies.fixed_order import FixedOrder
from vllm_cllm.policies.measured_cost import CostMeasurement
from vllm_cllm.sources.history import HistorySource, OutputHistory
from vllm_cllm.sources.ngram import NgramFill, NoFill, RequestNgrams
from vllm_cllm.sources.pool import IteratePool
from vllm_cllm.sources.restart import RestartBlock
from vllm_cllm.sources.tail import JacobiBlock, JacobiTail

FIXED, ADAPTIVE, UNCAPTURED = 0, 1, 2


def jacobi_drafter(options: ProposerOptions, max_model_len: int) -> Drafter:
    ngrams = NgramFill(options.ngram_min, options.ngram_max, max_model_len)
    restart = RestartBlock(options.seed)
    fill = {"hybrid": ngrams, "ngram": ngrams, "random": restart.fill, "tail": NoFill()}
    block = JacobiBlock(fill[options.fill], restart.fill)
    as_is = FixedOrder(["block"], scored=False)
    if options.fill != "hybrid":
        return Drafter([block], [as_is])
    table = RequestTable()
    lookup: DraftSource
    if options.lookup == "suffix":
        from vllm_cllm.sources.suffix_trees import SuffixTrees

        lookup = SuffixTrees(options.history_size)
        table.subscribe(lookup)
    else:
        lookup = HistorySource(OutputHistory(options.history_size))
        table.subscribe(lookup, wants_output=options.history_size > 0)
    sources = [block, RequestNgrams(ngrams), JacobiTail(), restart, lookup]
    if options.pool_size:
        sources.append(IteratePool(options.pool_size, options.ngram_max))
    name = lookup.names[0]
    cost = CostModel(options.knee_tokens, options.floor_tokens)
    policies = [FixedOrder(["ngram", name, "pool", "block"], optional=["pool"]),
                Adaptive([name, "ngram", "tail"] if options.ngram_candidate else [name, "tail"],
                         cost, options.token_margin_pct / 100, drain=options.drain),
                as_is]

    def route(step: VerifyStep, rows: list[int]) -> list[int] | int:
        if options.adaptive and None not in step.req_ids and step.all_greedy():
            return ADAPTIVE  # the usual step: every request greedy and captured
        greedy = step.greedy if len(rows) == len(step) else step.greedy[rows]
        if options.adaptive and greedy.all() and None not in step.req_ids:
            return ADAPTIVE
        adaptive = greedy & options.adaptive
        to = np.where(adaptive, ADAPTIVE, FIXED)
        if None in step.req_ids:  # a step that was not captured: the block as it is
            to[[step.req_ids[i] is None for i in rows]] = UNCAPTURED
        return to.tolist()

    drafter = Drafter(sources, policies, route, table)
    if options.adaptive and options.measure_cost:
        drafter.cost_measurement = CostMeasurement(cost)
    return drafter
