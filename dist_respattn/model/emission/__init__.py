"""The emission: its dense and sparse layouts, its Dirichlet prior and the (symbol, target) pair counts."""
