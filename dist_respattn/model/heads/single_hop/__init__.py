"""The single-hop head: distribution, sampler, accumulator, estimator, scoring, top-K, arrays and diagnostics."""
