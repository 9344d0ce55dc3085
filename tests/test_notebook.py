"""Executes notebooks/quickstart.ipynb (nbclient) so it can never rot.

The kernel is this interpreter: a throw-away kernelspec whose argv is `sys.executable`
is put on JUPYTER_PATH, so the notebook runs in the same environment as the tests
(whatever `python` is on PATH). Needs the built-in model pair: if it is missing the
notebook's first cells fail and so does this test, loudly.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

NOTEBOOK = Path(__file__).resolve().parent.parent / "notebooks" / "quickstart.ipynb"
KERNEL = "dsd-jax-test-python"


def test_quickstart_notebook_runs(tmp_path, monkeypatch):
    kdir = tmp_path / "jupyter" / "kernels" / KERNEL
    kdir.mkdir(parents=True)
    (kdir / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "dsd-jax tests", "language": "python"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    monkeypatch.setenv("JAX_PLATFORMS", os.environ.get("JAX_PLATFORMS", "cpu"))
    monkeypatch.delenv("MPLBACKEND", raising=False)  # the kernel's inline backend renders the plots

    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(nb, kernel_name=KERNEL, timeout=600, allow_errors=False,
                                     resources={"metadata": {"path": str(tmp_path)}})
    try:
        client.execute()
    finally:
        nbformat.write(nb, tmp_path / "quickstart.executed.ipynb")  # for debugging a failure

    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    text = "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
    assert "parameters" in text and "K histogram" in text
    assert not any(o.get("output_type") == "error" for o in outputs)
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) >= 2, "the goodput and K-per-batch-size plots were not rendered"
