"""The README's library example runs as written, so the documented calls and keywords stay the real ones."""

from __future__ import annotations

from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def python_block_after(heading: str) -> str:
    """The first ```python block after ``heading`` in the README."""
    text = README.read_text()
    start = text.index("```python", text.index(heading)) + len("```python")
    return text[start : text.index("```", start)]


def test_the_library_example_runs_and_its_recipe_chooses_on_held_out_rows():
    namespace: dict = {}
    exec(compile(python_block_after("## Using the library"), "README.md", "exec"), namespace)
    last = namespace["result"].history[-1]
    assert last.hyperparameters is not None and last.heldout["perplexity"] > 1.0
    assert namespace["model"].predict_proba(namespace["context"][:5], namespace["query"][:5]).shape == (5, 50)
