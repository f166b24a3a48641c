"""The proposers vLLM's ``custom_class`` hook builds, and the verify-step capture they share."""
