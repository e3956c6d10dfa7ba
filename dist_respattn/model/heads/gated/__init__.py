"""The attribute-gated head: its parameters, E- and M-steps, and the words it mixes and generates."""
