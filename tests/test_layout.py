"""The command line sits on top of the library: nothing in the installed package imports
`dsd_jax.cli` (the CLI parses flags and calls into the library, never the reverse)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# everything installed as dsd_jax.* (kernels/ and models/ install as dsd_jax.kernels / .models)
PACKAGE_DIRS = {"dsd_jax": ROOT / "dsd_jax", "dsd_jax.kernels": ROOT / "kernels", "dsd_jax.models": ROOT / "models"}


def _module_name(package: str, root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join([package] + parts)


def _imported(module: str, is_package: bool, node: ast.AST) -> list[str]:
    """The absolute names an import statement brings in (``from a import b`` gives a.b)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:  # relative: resolve against this module's package
        pkg = module.split(".") if is_package else module.split(".")[:-1]
        pkg = pkg[:len(pkg) - (node.level - 1)]
        base = ".".join(pkg + ([base] if base else []))
    return [base] + [f"{base}.{a.name}" for a in node.names]


def _in_cli(module: str) -> bool:
    return module == "dsd_jax.cli" or module.startswith("dsd_jax.cli.")


def cli_imports() -> list[str]:
    found = []
    for package, root in PACKAGE_DIRS.items():
        for path in sorted(root.rglob("*.py")):
            module = _module_name(package, root, path)
            if _in_cli(module):  # the CLI's own modules
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
                for name in _imported(module, path.name == "__init__.py", node):
                    if _in_cli(name):
                        found.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {name}")
    return found


def test_nothing_in_the_package_imports_the_cli():
    assert cli_imports() == []


def test_the_scan_sees_every_import_form():
    tree = [ast.parse(src).body[0] for src in (
        "import dsd_jax.cli", "from dsd_jax import cli", "from dsd_jax.cli import main", "from .. import cli")]
    names = [_imported("dsd_jax.bench.run", False, node) for node in tree]
    assert all(any(map(_in_cli, ns)) for ns in names), names


def test_every_package_directory_is_installed():
    """A subpackage missing from pyproject's list is left out of a non-editable install
    (`pip install .`, the quick start's demo) while the tests, on an editable one, pass."""
    import tomllib
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
                 ["tool"]["setuptools"]["packages"])
    found = {_module_name(package, root, init) for package, root in PACKAGE_DIRS.items()
             for init in root.rglob("__init__.py")}
    assert found == listed
