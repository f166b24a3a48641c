"""Draft sources: named producers of candidate drafts over a whole verify step
(:class:`vllm_cllm.core.drafter.DraftSource`), one module each — the Jacobi tail and block
(:mod:`.tail`), the request's n-grams (:mod:`.ngram`), the restart block (:mod:`.restart`),
the pool of recent iterates (:mod:`.pool`), arctic-inference's suffix trees
(:mod:`.suffix_trees`), the output history (:mod:`.history`) and SPACE's mask rows
(:mod:`.masks`)."""
