"""The drafting core, free of vLLM: one verify step as the drafters see it, the target's
predictions in it, the table of per-request state, and the interfaces of draft sources and
policies (:mod:`vllm_cllm.core.drafter`)."""
