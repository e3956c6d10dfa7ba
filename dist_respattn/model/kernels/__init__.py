"""Compiled kernels: the per-position and histogram E-steps, log-weights, (symbol, target) key tallies and prefetch."""
