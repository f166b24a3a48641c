"""Policies: how each request's draft is chosen among the sources' candidates and sized —
in a fixed order (:mod:`.fixed_order`), adaptively by learned acceptance and the step cost
model (:mod:`.adaptive`, :mod:`.acceptance`, :mod:`.cost_model`), or as SPACE's candidates
followed by mask slots (:mod:`.mask_slots`); :mod:`.scores` scores the sources per request."""
