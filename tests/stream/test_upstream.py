"""The private Faust and aiokafka names the worker relies on (worker/upstream.py): the
installed versions are the checked ones, every listed name exists with that shape, and
the worker uses no private name of those libraries that the list leaves out."""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import inspect
from pathlib import Path
from types import ModuleType
from typing import Any

from processor.stream.worker.upstream import CHECKED_VERSIONS, PRIVATE_NAMES

#: The packages whose private names the list covers.
UPSTREAM_PACKAGES = ("faust", "mode", "aiokafka")
WORKER = Path(__file__).resolve().parents[2] / "processor" / "stream" / "worker"


def missing(name: str) -> str | None:
    """Why `module:Class.attr` is not there (None: it is): the attribute is on the
    class, or one of its methods sets `self.attr`."""
    module, path = name.split(":")
    cls_name, attr = path.rsplit(".", 1)
    cls: Any = importlib.import_module(module)
    for part in cls_name.split("."):
        cls = getattr(cls, part, None)
        if cls is None:
            return f"{name}: no {part}"
    if hasattr(cls, attr):
        return None
    source = inspect.getsource(cls)
    return None if f"self.{attr} =" in source or f"self.{attr}:" in source else (
        f"{name}: neither on the class nor set by it")


def unlisted(source: str, listed: set[str]) -> set[str]:
    """Private attributes `source` reads or sets that it does not set up itself (in an
    __init__ or a def of its own) and that `listed` leaves out (os._exit aside)."""
    tree = ast.parse(source)
    own = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == "__init__":
            own |= {n.attr for n in ast.walk(node)
                    if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)}
    used = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)
            and n.attr.startswith("_") and not n.attr.startswith("__")
            and not (isinstance(n.value, ast.Name) and n.value.id == "os")}
    return used - own - listed


def overrides(module: ModuleType) -> set[str]:
    """The private methods a module's classes override on a Faust, mode or aiokafka base
    they inherit."""
    found = set()
    for _name, cls in inspect.getmembers(module, inspect.isclass):
        if cls.__module__ != module.__name__:
            continue
        upstream = [base for base in cls.__mro__[1:]
                    if base.__module__.split(".")[0] in UPSTREAM_PACKAGES]
        for attr, value in vars(cls).items():
            if (attr.startswith("_") and not attr.startswith("__") and callable(value)
                    and any(attr in vars(base) for base in upstream)):
                found.add(attr)
    return found


def _listed() -> set[str]:
    return {name.rsplit(".", 1)[1] for name, _user, _why in PRIVATE_NAMES}


def test_the_installed_versions_are_the_checked_ones() -> None:
    for dist, version in CHECKED_VERSIONS.items():
        assert importlib.metadata.version(dist) == version, dist


def test_every_listed_private_name_has_the_checked_shape() -> None:
    assert [m for name, _user, _why in PRIVATE_NAMES if (m := missing(name))] == []
    assert all((WORKER / user).is_file() for _name, user, _why in PRIVATE_NAMES)
    # control: a name the library does not have
    assert missing("faust.tables.recovery:Recovery._no_such_field") is not None


def test_the_worker_uses_no_unlisted_private_name() -> None:
    listed = _listed()
    found = set()
    for path in sorted(WORKER.glob("*.py")):
        module = importlib.import_module(f"processor.stream.worker.{path.stem}")
        found |= {f"{path.name}: {name}" for name in
                  unlisted(path.read_text(encoding="utf-8"), listed)
                  | (overrides(module) - listed)}
    assert found == set()
    # controls: a private field of Faust's read through an object; a private method
    # overridden on a library class
    made_up = "def f(app):\n    return app.consumer._secret\n"
    assert unlisted(made_up, listed) == {"_secret"}
    fake = ModuleType("fake")
    exec("import faust\nclass A(faust.App):\n    def _new_transport(self): ...\n"
         "    def _mine(self): ...\n", fake.__dict__)
    assert overrides(fake) == {"_new_transport"}
