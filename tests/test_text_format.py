"""Counts with their noun, as every command prints them."""

from __future__ import annotations

from dist_respattn.text_format import count_text


def test_one_is_singular_and_every_other_count_plural_with_separators():
    assert count_text(1, "worker") == "1 worker"
    assert count_text(0, "worker") == "0 workers"
    assert count_text(2000, "worker") == "2,000 workers"
    assert count_text(1, "worker process", "worker processes") == "1 worker process"
    assert count_text(3, "worker process", "worker processes") == "3 worker processes"
