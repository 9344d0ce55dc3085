"""Run by tests/test_notebook.py in a process of its own, started at collection so it
overlaps the rest of the suite (`background.py`): executes notebooks/quickstart.ipynb
with nbclient and prints one `RESULTS {json}` line of what its cells printed and drew.

The kernel is this interpreter: a throw-away kernelspec whose argv is `sys.executable`
is put on JUPYTER_PATH, so the notebook runs in the same environment as the tests
(whatever `python` is on PATH). Needs the built-in model pair: if it is missing the
notebook's first cells fail and so does the test, loudly.
"""

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import nbclient
import nbformat
from xla_flags import use_fast_compile

NOTEBOOK = Path(__file__).resolve().parent.parent / "notebooks" / "quickstart.ipynb"
KERNEL = "dsd-jax-test-python"


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="dsd_notebook_"))
    kdir = work / "jupyter" / "kernels" / KERNEL
    kdir.mkdir(parents=True)
    (kdir / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "dsd-jax tests", "language": "python"}))
    os.environ["JUPYTER_PATH"] = str(work / "jupyter")
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    use_fast_compile()  # as conftest.py
    os.environ.pop("MPLBACKEND", None)  # the kernel's inline backend renders the plots

    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(nb, kernel_name=KERNEL, timeout=600, allow_errors=True,
                                     resources={"metadata": {"path": str(work)}})
    try:
        client.execute()
    finally:
        executed = work / "quickstart.executed.ipynb"
        nbformat.write(nb, executed)

    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    errors = [f"{o.get('ename')}: {o.get('evalue')}" for o in outputs if o.get("output_type") == "error"]
    if not errors:
        shutil.rmtree(work)  # kept only to debug a failure
    print("RESULTS " + json.dumps({
        "text": "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream"),
        "errors": errors, "images": sum("image/png" in o.get("data", {}) for o in outputs),
        "executed": str(executed)}))


if __name__ == "__main__":
    main()
