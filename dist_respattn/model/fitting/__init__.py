"""Fitting in one process: the EM loop, the held-out choice of the prior's strengths and the hold-out rule."""
