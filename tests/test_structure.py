"""The module boundaries docs/architecture.md states, checked on the source (no import).

- processor/core imports nothing outside processor/core except processor.errors;
- no module of processor imports another module's private name (`from x import _y`);
- the core's modules import one another at module level only (an import inside a
  function is how a cycle hides), except registry.py's deliberate lazy build;
- no shipped command (worker, replay, count, keygen, plan, audit, view, demo) imports
  processor.experiments, the research code, at any depth, inside functions included:
  only `experiment` crosses that boundary.
Each check has a control: the same function flags a made-up violating source.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "processor"

#: Private names still imported across modules by files other changes were editing when
#: this test came in; each entry goes when its import does.
KNOWN_PRIVATE_IMPORTS: set[tuple[str, str, str]] = set()
#: Core modules whose in-function imports are deliberate: the registry builds its table on
#: first use so that `count --help` stays light.
LAZY_CORE = {"processor/core/registry.py"}
#: The commands that ship (the dispatcher's table less `experiment`) and the research
#: package none of them may import.
SHIPPED = {"worker", "replay", "count", "keygen", "plan", "audit", "view", "demo"}
RESEARCH = "processor.experiments"


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


def imported_modules(source: str) -> set[str]:
    """Every processor module `source` imports, anywhere in it, with the packages whose
    __init__ that runs (`from processor.a import b` imports processor.a and, when b is a
    module, processor.a.b)."""
    out: set[str] = set()
    for node, _ in _imports(ast.parse(source)):
        names = _modules(node)
        if isinstance(node, ast.ImportFrom) and node.module:
            names += [f"{node.module}.{a.name}" for a in node.names]
        for mod in names:
            parts = mod.split(".")
            if parts[0] == "processor":
                out.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    return out


def module_source(module: str) -> str | None:
    """The source of a processor module (None: not a module, e.g. a class's name)."""
    base = ROOT.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path.read_text(encoding="utf-8")
    return None


def research_reached(start: dict[str, str], source_of: Callable[[str], str | None]
                     ) -> list[str]:
    """`name: a -> b -> ... -> processor.experiments...` for each start module (name ->
    module) whose imports reach the research package."""
    bad = []
    for name, first in sorted(start.items()):
        via = {first: [first]}
        todo = [first]
        while todo:
            mod = todo.pop()
            if mod.startswith(RESEARCH):
                bad.append(f"{name}: {' -> '.join(via[mod])}")
                break
            src = source_of(mod)
            for nxt in sorted(imported_modules(src) if src is not None else ()):
                if nxt not in via:
                    via[nxt] = [*via[mod], nxt]
                    todo.append(nxt)
    return bad


def dispatcher_table() -> dict[str, str]:
    """command -> module of its entry, read from the dispatcher's _DELEGATED."""
    tree = ast.parse(module_source("processor.commands.main") or "")
    for node in tree.body:
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                and node.target.id == "_DELEGATED" and node.value is not None):
            table = ast.literal_eval(node.value)
            return {name: entry[0] for name, entry in table.items()}
    raise AssertionError("no _DELEGATED table in processor/commands/main.py")


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


def test_no_shipped_command_imports_the_research_code() -> None:
    table = dispatcher_table()
    assert set(table) == SHIPPED | {"experiment"}  # a new command is classified here
    start = {name: mod for name, mod in table.items() if name in SHIPPED}
    start["the dispatcher"] = "processor.commands.main"
    assert research_reached(start, module_source) == []
    # control: the experiment command reaches it, and so would a shipped command's module
    # that imported the research code inside a function, two modules away
    assert research_reached({"experiment": table["experiment"]}, module_source) != []
    made_up = {"processor.x.cmd": "def main():\n    from processor.x.lib import f\n",
               "processor.x.lib":
               "def f():\n    from processor.experiments.figures import fig1a\n"}
    [found] = research_reached({"cmd": "processor.x.cmd"}, lambda m: made_up.get(m))
    assert found.startswith("cmd: processor.x.cmd -> processor.x.lib -> processor.experiments")
