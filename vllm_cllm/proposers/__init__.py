"""The proposers vLLM's ``custom_class`` hook builds: the vLLM adapter (:mod:`.base`) and one
class per method."""
