"""Draft sources besides the model's own block: n-gram lookups in the request's tokens, the
pool of recent Jacobi iterates, arctic-inference's suffix trees and the numpy history of
earlier outputs."""
