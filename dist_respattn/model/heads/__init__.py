"""The kinds of head, one folder each."""
