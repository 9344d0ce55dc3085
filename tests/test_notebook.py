"""notebooks/quickstart.ipynb executed end to end (nbclient) so it can never rot.

It runs in a process of its own (`notebook_run.py`), started at collection so it overlaps
the rest of the suite; the test reads what its cells printed and drew.
"""

from __future__ import annotations

import pytest

pytest.importorskip("nbformat")
pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

import background  # noqa: E402


@pytest.fixture(scope="module")
def notebook():
    (out,) = background.results("test_notebook.py")  # started at collection (`background.py`)
    return out


def test_quickstart_notebook_runs(notebook):
    assert not notebook["errors"], f"{notebook['errors']} (see {notebook['executed']})"
    assert "parameters" in notebook["text"] and "K histogram" in notebook["text"]
    assert notebook["images"] >= 2, "the goodput and K-per-batch-size plots were not rendered"
