"""The module boundaries docs/architecture.md states, checked on the source (no import).

- processor/core imports nothing outside processor/core except processor.errors;
- no module of processor imports another module's private name (`from x import _y`);
- the core's modules import one another at module level only (an import inside a
  function is how a cycle hides), except registry.py's deliberate lazy build.
Each check has a control: the same function flags a made-up violating source.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "processor"

#: Private names still imported across modules by files other changes were editing when
#: this test came in; each entry goes when its import does.
KNOWN_PRIVATE_IMPORTS: set[tuple[str, str, str]] = set()
#: Core modules whose in-function imports are deliberate: the registry builds its table on
#: first use so that `count --help` stays light; core/audit.py (its statistics import
#: scipy lazily and the mechanisms' constants) is edited by another change at the time of
#: writing.
LAZY_CORE = {"processor/core/registry.py", "processor/core/audit.py"}


def _imports(tree: ast.AST) -> list[tuple[ast.ImportFrom | ast.Import, bool]]:
    """Every import of `tree` and whether it sits inside a function."""
    out: list[tuple[ast.ImportFrom | ast.Import, bool]] = []

    def walk(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import | ast.ImportFrom):
                out.append((child, in_function))
            walk(child, in_function or isinstance(child, ast.FunctionDef
                                                  | ast.AsyncFunctionDef))

    walk(tree, False)
    return out


def _modules(node: ast.Import | ast.ImportFrom) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    return [node.module or ""]


def core_violations(source: str, name: str) -> list[str]:
    """A core module's imports of processor outside the core, and in-function imports of
    the core (unless the module is in LAZY_CORE)."""
    bad = []
    for node, in_function in _imports(ast.parse(source)):
        for mod in _modules(node):
            if mod.startswith("processor.") and not (
                    mod.startswith("processor.core") or mod == "processor.errors"):
                bad.append(f"{name}: imports {mod}")
            if (in_function and mod.startswith("processor.core")
                    and name not in LAZY_CORE):
                bad.append(f"{name}: imports {mod} inside a function")
    return bad


def private_imports(source: str, name: str) -> set[tuple[str, str, str]]:
    """(file, module, name) of every `from processor... import _name`."""
    out = set()
    for node, _ in _imports(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("processor"):
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    out.add((name, node.module or "", alias.name))
    return out


def _sources(root: Path) -> list[tuple[str, str]]:
    return [(str(p.relative_to(ROOT)), p.read_text(encoding="utf-8"))
            for p in sorted(root.rglob("*.py"))]


def test_the_core_imports_only_itself_at_module_level() -> None:
    bad = [v for name, src in _sources(PACKAGE / "core") for v in core_violations(src, name)]
    assert bad == []
    # control: an I/O module and a function-level import of the core are both flagged
    made_up = ("from processor.keyfile import read_key\n"
               "def f():\n    from processor.core.ecc import ECC\n")
    assert len(core_violations(made_up, "processor/core/x.py")) == 2


def test_no_private_name_crosses_modules() -> None:
    found = set().union(*(private_imports(src, name) for name, src in _sources(PACKAGE)))
    assert found - KNOWN_PRIVATE_IMPORTS == set()
    # control: a private import is seen
    assert private_imports("from processor.core.cc import _x\n", "m.py") == {
        ("m.py", "processor.core.cc", "_x")}
