"""The methods this plugin adds, each a set of draft sources and policies over the drafting
core: ``jacobi`` (:mod:`.jacobi`) and ``space`` (:mod:`.space`)."""
