"""The module boundaries docs/architecture.md states, checked on the source (no import).

- processor/core imports nothing outside processor/core except processor.errors;
- no module of processor imports another module's private name (`from x import _y`) or
  reaches one through a module it imported (`m._y`);
- processor/stream imports none of devtools, experiments, view, commands, simulator, audit;
- processor/stream's folders are its layers (STREAM_LAYERS): every module sits in model/,
  kafka/, worker/ or replay/; model imports no client library, kafka/ no Faust stack,
  replay/ not the worker; only worker/ imports faust, aiokafka, rocksdict or mode;
- the test hooks (DPC_TEST_*) are named in code only in stream/faults.py (and devtools,
  which starts workers with them); nothing patches argparse;
- docs/architecture.md's layer list names every module of processor, under its folder's
  heading, and every module it lists exists;
- the core's modules import one another at module level only (an import inside a
  function is how a cycle hides), except registry.py's deliberate lazy build;
- no shipped command (worker, replay, count, keygen, send, plan, audit, view, demo) imports
  processor.experiments, the research code, at any depth, inside functions included:
  only `experiment` crosses that boundary.
Each check has a control: the same function flags a made-up violating source.
"""

from __future__ import annotations

import ast
import re
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
SHIPPED = {"worker", "replay", "count", "keygen", "send", "plan", "audit", "view", "demo"}
RESEARCH = "processor.experiments"
#: What the stream layer never imports (docs/architecture.md: data flows one way).
ABOVE_STREAM = ("processor.devtools", "processor.experiments", "processor.view",
                "processor.commands", "processor.simulator", "processor.audit")
#: The Faust stack: only processor/stream/worker/ imports it.
FAUST_STACK = ("faust", "aiokafka", "rocksdict", "mode")
#: processor/stream's layers, lowest first: package -> what its modules never import.
STREAM_LAYERS: dict[str, tuple[str, ...]] = {
    "model": ("confluent_kafka", *FAUST_STACK, "processor.stream.kafka",
              "processor.stream.worker", "processor.stream.replay"),
    "kafka": (*FAUST_STACK, "processor.stream.worker", "processor.stream.replay"),
    "replay": (*FAUST_STACK, "processor.stream.worker"),
    "worker": (),
}
#: Where the DPC_TEST_* hooks may be named in code (the plan, and the tooling that sets
#: them for the workers it starts).
FAULT_HOOK_FILES = ("processor/stream/model/faults.py", "processor/devtools/")


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


def module_private_uses(source: str, name: str, is_module: Callable[[str], bool]
                        ) -> set[tuple[str, str, str]]:
    """(file, alias, name) of every `m._name` where m is a processor module `source`
    imported (`import processor.x as m`, `from processor.x import m`)."""
    modules = set()
    for node, _ in _imports(ast.parse(source)):
        for alias in node.names:
            if isinstance(node, ast.Import) and alias.name.startswith("processor"):
                modules.add(alias.asname or alias.name.split(".")[0])
            elif (isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                    "processor") and is_module(f"{node.module}.{alias.name}")):
                modules.add(alias.asname or alias.name)
    return {(name, n.value.id, n.attr) for n in ast.walk(ast.parse(source))
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
            and n.value.id in modules and n.attr.startswith("_")
            and not n.attr.startswith("__")}


def layer_violations(source: str, name: str) -> list[str]:
    """A stream-layer module's imports of a layer above it (ABOVE_STREAM)."""
    return [f"{name}: imports {mod}" for node, _ in _imports(ast.parse(source))
            for mod in _modules(node) if mod.startswith(ABOVE_STREAM)]


def _is_under(module: str, names: tuple[str, ...]) -> bool:
    return any(module == n or module.startswith(f"{n}.") for n in names)


def stream_layer_violations(source: str, name: str) -> list[str]:
    """A module of processor/ (`name`, its path) that breaks the stream layering: a
    processor/stream module outside the STREAM_LAYERS packages, an import its layer never
    makes, or the Faust stack imported anywhere but processor/stream/worker/."""
    parts = name.split("/")
    bad = []
    layer = None
    if parts[:2] == ["processor", "stream"] and name != "processor/stream/__init__.py":
        layer = parts[2] if len(parts) > 3 and parts[2] in STREAM_LAYERS else None
        if layer is None:
            bad.append(f"{name}: not in a layer package ({', '.join(STREAM_LAYERS)})")
    forbidden = STREAM_LAYERS[layer] if layer is not None else ()
    if layer != "worker":
        forbidden = (*forbidden, *FAUST_STACK)
    for node, _ in _imports(ast.parse(source)):
        for mod in _modules(node):
            if _is_under(mod, forbidden):
                bad.append(f"{name}: imports {mod}")
    return sorted(set(bad))


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef
                      | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def hook_violations(source: str, name: str) -> list[str]:
    """Where code outside FAULT_HOOK_FILES names a DPC_TEST_* hook (docstrings may
    mention them) or patches argparse."""
    tree = ast.parse(source)
    docs = _docstrings(tree)
    bad = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Constant) and isinstance(node.value, str)
                and "DPC_TEST" in node.value and id(node) not in docs
                and not name.startswith(FAULT_HOOK_FILES)):
            bad.append(f"{name}:{node.lineno}: names a DPC_TEST hook")
        targets: list[ast.expr]
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif (isinstance(node, ast.Call)
              and isinstance(node.func, ast.Name) and node.func.id == "setattr"):
            targets = node.args[:1]
        else:
            continue
        for target in targets:
            base = target
            while isinstance(base, ast.Attribute):
                base = base.value
            if (isinstance(base, ast.Name) and base.id == "argparse"
                    and (target is not base or isinstance(node, ast.Call))):
                bad.append(f"{name}:{node.lineno}: patches argparse")
    return bad


def _subfolder_blocks(text: str) -> dict[str, str]:
    """A section's subfolder headings (`  sub/`) -> their blocks (the heading's line and
    the lines indented deeper that follow it)."""
    subs: dict[str, str] = {}
    sub = None
    for line in text.splitlines():
        m = re.match(r"  ([a-z_]\w*/)", line)
        if m:
            sub = m.group(1)
            subs[sub] = line + "\n"
        elif sub is not None and line.startswith("    "):
            subs[sub] += line + "\n"
        else:
            sub = None
    return subs


def architecture_mismatches(doc: str, root: Path) -> list[str]:
    """What the layer list of docs/architecture.md (its first code block after "## Layers")
    and the tree under `root` disagree on: in a section (a line that starts with
    processor/...), each `name.py` it lists must exist under the section's folder, and each
    module under that folder (bar __init__ and __main__) must be named in it, under its
    subfolder's heading where the section has one (a line `  sub/`, its block running to
    the next line indented two spaces); every entry of processor/ needs a section."""
    block = doc.split("## Layers", 1)[1].split("```")[1]
    sections: dict[str, str] = {}
    head = ""
    for line in block.splitlines():
        m = re.match(r"(processor/\S*)", line)
        if m:
            head = m.group(1)
            sections[head] = line[len(head):] + "\n"
        elif head:
            sections[head] += line + "\n"
    bad = []
    for head, text in sections.items():
        folder = root / head
        if head.endswith(".py"):
            bad += [] if folder.is_file() else [f"{head}: no such module"]
            continue
        for listed in re.findall(r"(?<![/\w])([a-z_]\w*)\.py\b", text):
            if not any(folder.rglob(f"{listed}.py")):
                bad.append(f"{head}: lists {listed}.py, which does not exist")
        subs = _subfolder_blocks(text)
        for path in sorted(folder.rglob("*.py")):
            if path.name in ("__init__.py", "__main__.py"):
                continue
            first = path.relative_to(folder).parts[0] + "/"
            where, within = (subs[first], f"{head}{first}") if first in subs else (text, head)
            if not re.search(rf"(?<![\w/]){path.stem}\.py\b", where):
                bad.append(f"{path.relative_to(root)}: not in {within}'s section")
    for entry in sorted((root / "processor").iterdir()):
        rel = f"processor/{entry.name}{'/' if entry.is_dir() else ''}"
        if (entry.name not in ("__init__.py", "__main__.py") and not entry.name.startswith(".")
                and entry.name != "__pycache__" and rel not in sections):
            bad.append(f"{rel}: no section")
    return bad


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


def test_no_private_name_is_reached_through_a_module() -> None:
    def is_module(module: str) -> bool:
        return module_source(module) is not None

    found = set().union(*(module_private_uses(src, name, is_module)
                          for name, src in _sources(PACKAGE)))
    assert found == set()
    # control: through `import ... as` and through `from package import module`
    made_up = ("import processor.core.cc as cc\nfrom processor.core import ecc\n"
               "cc._x(ecc._y, cc.__name__)\n")
    assert module_private_uses(made_up, "m.py", is_module) == {
        ("m.py", "cc", "_x"), ("m.py", "ecc", "_y")}


def test_the_stream_layer_imports_no_layer_above_it() -> None:
    bad = [v for name, src in _sources(PACKAGE / "stream") for v in layer_violations(src, name)]
    assert bad == []
    # control: an import of the tooling, inside a function too
    assert layer_violations("def f():\n    from processor.devtools import demo\n", "s.py")


def test_the_stream_folders_are_its_layers() -> None:
    bad = [v for name, src in _sources(PACKAGE) for v in stream_layer_violations(src, name)]
    assert bad == []
    # controls: each rule flags a made-up source that breaks it
    assert stream_layer_violations("import confluent_kafka\n", "processor/stream/model/x.py"
                                   ) == ["processor/stream/model/x.py: imports confluent_kafka"]
    assert stream_layer_violations("from processor.stream.kafka import kafka_io\n",
                                   "processor/stream/model/x.py")
    assert stream_layer_violations("def f():\n    import faust\n",
                                   "processor/stream/kafka/x.py")
    assert stream_layer_violations("from rocksdict import Rdict\n",
                                   "processor/stream/kafka/x.py")
    assert stream_layer_violations("from processor.stream.worker.app import Worker\n",
                                   "processor/stream/replay/x.py")
    assert stream_layer_violations("from mode import Service\n", "processor/devtools/x.py")
    assert stream_layer_violations("", "processor/stream/x.py") == [
        "processor/stream/x.py: not in a layer package (model, kafka, replay, worker)"]
    # what each layer may import is not flagged
    assert stream_layer_violations("import faust\nimport aiokafka\nimport mode\n",
                                   "processor/stream/worker/x.py") == []
    assert stream_layer_violations("import confluent_kafka\n"
                                   "from processor.stream.model import operator\n",
                                   "processor/stream/kafka/x.py") == []
    assert stream_layer_violations("from processor.stream.kafka import kafka_io\n",
                                   "processor/stream/replay/x.py") == []


def test_fault_hooks_only_in_faults_and_no_argparse_patch() -> None:
    bad = [v for name, src in _sources(PACKAGE) for v in hook_violations(src, name)]
    assert bad == []
    # control: a hook read in a runtime module, and both ways of patching argparse; a
    # docstring that mentions a hook is not flagged
    made_up = ('"""Reads DPC_TEST_CRASH_AT."""\nimport os, argparse\n'
               'os.environ.get("DPC_TEST_CLOCK_OFFSET_MS")\n'
               'argparse.ArgumentParser.error = print\n'
               'setattr(argparse.ArgumentParser, "error", print)\n')
    assert len(hook_violations(made_up, "processor/stream/model/clock.py")) == 3
    assert hook_violations(made_up, "processor/stream/model/faults.py") == [
        "processor/stream/model/faults.py:4: patches argparse",
        "processor/stream/model/faults.py:5: patches argparse"]


def test_the_architecture_lists_every_module() -> None:
    doc = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    assert architecture_mismatches(doc, ROOT) == []
    # control: a module dropped from the list and a module listed that is not there
    made_up = doc.replace("  grid.py ", "  grids.py").replace(
        "\nprocessor/keyfile.py", "\nprocessor/keyfiles.py")
    found = architecture_mismatches(made_up, ROOT)
    assert "processor/core/: lists grids.py, which does not exist" in found
    assert "processor/core/grid.py: not in processor/core/'s section" in found
    assert "processor/keyfiles.py: no such module" in found
    assert "processor/keyfile.py: no section" in found
    # control: a module listed under another subfolder's heading than its own
    moved = doc.replace("    operator.py      ticks,", "    notes            ticks,").replace(
        "    producer.py      ", "    producer.py      operator.py, ")
    assert architecture_mismatches(moved, ROOT) == [
        "processor/stream/model/operator.py: not in processor/stream/model/'s section"]


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
