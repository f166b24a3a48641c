"""How many tokens each request drafts: the step cost model and learned acceptance."""
