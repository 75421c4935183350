"""The public API's types (issue 58, "types"): every parameter and return of what `import dpuoffload`
exports, and of the public methods of its classes, is annotated, and none is `typing.Any`.

The walk covers `dpuoffload.__all__`: its functions; its classes' public methods, properties and
annotated attributes (their own and those they inherit from `dpuoffload` classes); and the Protocols
of this package that those signatures name (what a user's objects must provide). `Any` counts
anywhere inside an annotation (`Optional[Callable[[], Any]]` too). Names a module imports only for
type checkers (`if TYPE_CHECKING:`) resolve to placeholders: they are types, not `Any`. There are no
exceptions: a record type or a sample is a TypeVar or `object`, a user's callable a `Callable` of them.
"""

from __future__ import annotations

import ast
import functools
import inspect
import typing
from pathlib import Path
from typing import Callable, Iterator

import dpuoffload

# Methods that are public though their names start with an underscore.
PUBLIC_DUNDERS = frozenset({"__init__", "__call__", "__iter__", "__next__", "__len__", "__getitem__",
                            "__contains__", "__enter__", "__exit__"})

def _placeholder(name: str) -> type:
    """A stand-in for a name imported only under TYPE_CHECKING (`MPI`, `torch.nn.Module`, ...)."""

    class Meta(type):
        def __getattr__(cls, attr: str) -> type:
            if attr.startswith("__"):
                raise AttributeError(attr)
            return _placeholder(f"{name}.{attr}")

    return Meta(name, (), {"__class_getitem__": classmethod(lambda cls, item: cls)})


def resolved_hints(obj: object) -> dict[str, object]:
    """`typing.get_type_hints(obj)`, with placeholders for names only a type checker imports."""
    fill: dict[str, object] = {}
    while True:
        try:
            return typing.get_type_hints(obj, localns=fill)
        except NameError as e:
            name = e.name
            assert name is not None and name not in fill, f"{obj!r}: {e}"
            fill[name] = typing.Any if name == "Any" else _placeholder(name)


def has_any(tp: object) -> bool:
    """`Any` anywhere in the annotation `tp` (arguments, Callable parameter lists, TypeVar bounds)."""
    if tp is typing.Any:
        return True
    if isinstance(tp, (list, tuple)):
        return any(has_any(t) for t in tp)
    if isinstance(tp, typing.TypeVar):
        return has_any(tp.__bound__) or any(has_any(t) for t in tp.__constraints__)
    return any(has_any(t) for t in typing.get_args(tp))


def protocols_in(tp: object) -> Iterator[type]:
    """The Protocols of this package an annotation names (what a caller's objects must provide)."""
    if isinstance(tp, (list, tuple)):
        for t in tp:
            yield from protocols_in(t)
        return
    origin = typing.get_origin(tp) or tp
    if (isinstance(origin, type) and getattr(origin, "_is_protocol", False)
            and origin.__module__.startswith("dpuoffload.")):
        yield origin
    for t in typing.get_args(tp):
        yield from protocols_in(t)


def _members(cls: type) -> Iterator[tuple[str, Callable[..., object], bool]]:
    """(name, function, takes self) of `cls`'s public methods and properties, its `dpuoffload` bases' included."""
    seen: set[str] = set()
    for klass in cls.__mro__:
        if not klass.__module__.startswith("dpuoffload."):
            continue
        for name, value in vars(klass).items():
            if name in seen or (name.startswith("_") and name not in PUBLIC_DUNDERS):
                continue
            seen.add(name)
            if isinstance(value, property):
                func, bound = value.fget, True
            elif isinstance(value, functools.cached_property):
                func, bound = value.func, True
            elif isinstance(value, staticmethod):
                func, bound = value.__func__, False
            elif isinstance(value, classmethod):
                func, bound = value.__func__, True
            elif inspect.isfunction(value):
                func, bound = value, True
            else:
                continue
            if func is None or not func.__qualname__.startswith(f"{klass.__qualname__}."):
                continue  # (not written for this class: a Protocol's generated __init__, say)
            yield name, func, bound


def check_callable(where: str, func: Callable[..., object], bound: bool, found: dict[str, str],
                   protocols: set[type]) -> None:
    """Record in `found` each missing annotation and each `Any` of `func`'s signature."""
    hints = resolved_hints(func)
    params = list(inspect.signature(func).parameters.values())
    for param in params[1:] if bound else params:
        if param.name not in hints:
            found[f"{where}({param.name})"] = "no annotation"
        elif has_any(hints[param.name]):
            found[f"{where}({param.name})"] = f"Any in {hints[param.name]}"
        if param.name in hints:
            protocols.update(protocols_in(hints[param.name]))
    if "return" not in hints:
        found[f"{where} -> return"] = "no annotation"
    elif has_any(hints["return"]):
        found[f"{where} -> return"] = f"Any in {hints['return']}"


def check_class(label: str, cls: type, found: dict[str, str], protocols: set[type]) -> None:
    for name, func, bound in _members(cls):
        check_callable(f"{label}.{name}", func, bound, found, protocols)
    for klass in cls.__mro__:
        if klass.__module__.startswith("dpuoffload."):
            for name, tp in resolved_hints(klass).items():
                if not name.startswith("_") and has_any(tp):
                    found.setdefault(f"{label}.{name}", f"Any in {tp}")


def public_api_findings() -> tuple[dict[str, str], set[str]]:
    """(location -> what is wrong, every location walked) over the public API."""
    found: dict[str, str] = {}
    protocols: set[type] = set()
    checked: set[type] = set()
    for name in dpuoffload.__all__:
        obj = getattr(dpuoffload, name)
        if inspect.isclass(obj):
            check_class(name, obj, found, protocols)
            checked.add(obj)
        elif callable(obj):
            check_callable(name, obj, False, found, protocols)
        else:
            assert isinstance(obj, str), f"dpuoffload.{name} is neither a class, a function nor a string"
    while protocols - checked:  # the Protocols the signatures name, and those theirs name
        proto = min(protocols - checked, key=lambda p: p.__qualname__)
        check_class(proto.__qualname__, proto, found, protocols)
        checked.add(proto)
    return found, {cls.__qualname__ for cls in checked}


def test_public_api_has_no_any_and_no_missing_annotation():
    found, _ = public_api_findings()
    assert not found, "the public API (dpuoffload.__all__) has:\n" + "\n".join(
        f"  {where}: {what}" for where, what in sorted(found.items()))


def test_the_walk_reaches_the_job_and_the_protocols_it_names():
    found, walked = public_api_findings()
    assert {"Job", "DpuLoader", "Restored", "MapStyleDataset", "ShardStream", "Scheduler", "ShardSource",
            "HostGroup"} <= walked
    hints = resolved_hints(dpuoffload.Job.checkpoint)
    assert not has_any(hints["scheduler"]) and not has_any(hints["extra"])


def test_the_checks_catch_any():
    found: dict[str, str] = {}

    def f(a: typing.Optional[typing.Callable[[], typing.Any]], b, c: int) -> dict[str, typing.Any]:
        return {}

    check_callable("f", f, False, found, set())
    assert set(found) == {"f(a)", "f(b)", "f -> return"}
    assert found["f(b)"] == "no annotation"


def test_type_checkers_see_every_lazy_export():
    """api/__init__.py's `if TYPE_CHECKING:` imports name exactly the lazy `_EXPORTS`, from the same modules."""
    tree = ast.parse(Path(dpuoffload.__file__).read_text())
    seen = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for stmt in node.body:
                assert isinstance(stmt, ast.ImportFrom)
                for alias in stmt.names:
                    assert alias.asname == alias.name, f"{alias.name}: re-export it as `import {alias.name} as " \
                                                       f"{alias.name}`, or a strict type checker hides it"
                    seen[alias.name] = stmt.module
    assert seen == dpuoffload._EXPORTS
