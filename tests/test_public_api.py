"""The public API is what `__all__` says: sorted, complete, importable, and nothing internal."""

from __future__ import annotations

import pkgutil
import subprocess
import sys
import types
import typing

import pytest

import agentrt
import agentrt.durable
import agentrt.local
import agentrt.mcp
import agentrt.memory
import agentrt.models
import agentrt.moderation
import agentrt.otel
import agentrt.output
import agentrt.rag
import agentrt.runs
import agentrt.sse
import agentrt.testing
import agentrt.tools


def _isort_order(name: str) -> tuple[int, str]:
    return (0 if len(name) > 1 and name.isupper() else 1 if name[:1].isupper() else 2, name)


PUBLIC_MODULES = [
    (agentrt, "agentrt"),
    (agentrt.guardrails, "agentrt"),
    (agentrt.mcp, "agentrt.mcp"),
    (agentrt.memory, "agentrt"),
    (agentrt.models, "agentrt"),
    (agentrt.moderation, "agentrt"),
    (agentrt.rag, "agentrt"),
    (agentrt.output, "agentrt"),
    (agentrt.testing, "agentrt.testing"),
    (agentrt.tools, "agentrt"),
    (agentrt.sse, "agentrt.sse"),
    (agentrt.runs, "agentrt.runs"),
    (agentrt.otel, "agentrt.otel"),
    (agentrt.local, "agentrt.local"),
    (agentrt.durable, "agentrt"),
]
"""Every public module and the package its own public names are defined under."""


@pytest.mark.parametrize(("module", "owner"), PUBLIC_MODULES)
async def test_all_is_sorted_and_lists_every_public_name(module: types.ModuleType, owner: str) -> None:
    public = set()
    for name, value in vars(module).items():
        if name.startswith("_") or name == "annotations":
            continue
        if isinstance(value, types.ModuleType):
            # `agentrt.local`, `agentrt.mcp`, `agentrt.otel` and `agentrt.sse` become attributes of the
            # package once anything imports them; they are imported on their own (`import agentrt.sse`).
            # The adapter modules of `agentrt.rag` and `agentrt.moderation` are reached the same way.
            if value.__name__.startswith("agentrt.") and value.__name__ not in (
                "agentrt.durable",
                "agentrt.local",
                "agentrt.mcp",
                "agentrt.otel",
                "agentrt.runs",
                "agentrt.sse",
                "agentrt.rag.openai",
                "agentrt.rag.ollama",
                "agentrt.moderation.openai",
            ):
                public.add(name)
            continue
        if isinstance(value, types.UnionType) or typing.get_origin(value) is not None:
            public.add(name)  # a type alias defined here
            continue
        if name.isupper() and type(value).__module__.startswith(("builtins", "agentrt")):
            public.add(name)  # a constant (`LOCAL_CAPABILITIES`: an instance of a class from elsewhere)
            continue
        defined_in = getattr(value, "__module__", None)
        if defined_in is None or defined_in.startswith(owner):
            public.add(name)

    # Names a module's `__getattr__` imports when asked (`agentrt.runs.RedisRunLog`: the extra's
    # module is imported only by those who use it) are public too, once imported.
    lazy = {name for name in module.__all__ if name not in vars(module) and "__getattr__" in vars(module)}
    for name in lazy:
        assert getattr(module, name).__name__ == name
    # ruff's isort-style order (RUF022): constants, then classes, then the rest
    assert sorted(module.__all__, key=_isort_order) == module.__all__
    assert set(module.__all__) == public | lazy
    for name in module.__all__:
        assert getattr(module, name) is not None


def test_every_public_module_is_checked_here() -> None:
    """The modules above are every public one: a new public module cannot skip these checks."""
    checked = {module.__name__ for module, _ in PUBLIC_MODULES if module is not agentrt}
    public = {f"agentrt.{m.name}" for m in pkgutil.iter_modules(agentrt.__path__) if m.name[0] != "_"}
    assert public == checked


def test_every_public_name_has_one_home() -> None:
    """A public object is exported by one public module: the top level for what users of services
    touch (events, the model and tool declarations), a subpackage for the rest."""
    modules = [module for module, _ in PUBLIC_MODULES]
    homes: dict[int, list[str]] = {}
    for module in modules:
        for name in module.__all__:
            value = getattr(module, name)
            if isinstance(value, types.ModuleType):
                continue
            homes.setdefault(id(value), []).append(f"{module.__name__}.{name}")
    assert [where for where in homes.values() if len(where) > 1] == []


def test_internals_are_not_public() -> None:
    internals = {"ToolLoop", "arguments_hash", "define_tool", "collect_tools", "result_text", "local"}
    assert internals.isdisjoint(agentrt.tools.__all__)
    assert internals.isdisjoint(agentrt.__all__)


def test_lifecycle_events_cannot_be_mistaken_for_exceptions() -> None:
    for name in agentrt.__all__:
        value = getattr(agentrt, name)
        if isinstance(value, type) and not issubclass(value, BaseException):
            assert not name.endswith(("Error", "Exception")), name
            assert name not in {"Cancelled", "Failed", "Timeout", "Aborted"}, name


def test_importing_agentrt_does_not_import_the_local_server_module() -> None:
    code = "import sys, agentrt; print('agentrt.local' in sys.modules, hasattr(agentrt, 'local'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]
    code = "import agentrt.local; print(agentrt.local.__name__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "agentrt.local"


def test_public_classes_resolve_their_annotations() -> None:
    # pydantic models with a field of one of these types, and users' own tools, call get_type_hints.
    unresolved = []
    modules = (
        agentrt,
        agentrt.mcp,
        agentrt.memory,
        agentrt.models,
        agentrt.moderation,
        agentrt.output,
        agentrt.rag,
        agentrt.runs,
        agentrt.testing,
        agentrt.tools,
    )
    for module in modules:
        for name in module.__all__:
            value = getattr(module, name)
            if isinstance(value, type):
                try:
                    typing.get_type_hints(value)
                except Exception as exc:
                    unresolved.append(f"{module.__name__}.{name}: {exc}")
    assert unresolved == []


def test_errors_show_the_public_module_they_are_imported_from_and_still_pickle() -> None:
    import pickle

    errors = [
        value
        for value in (getattr(agentrt, name) for name in agentrt.__all__)
        if isinstance(value, type) and issubclass(value, BaseException)
    ]
    assert len(errors) > 20
    assert [e.__qualname__ for e in errors if e.__module__ != "agentrt"] == []
    assert repr(agentrt.BudgetExceededError) == "<class 'agentrt.BudgetExceededError'>"
    unknown = agentrt.durable.OutcomeUnknownError  # an error of one extra's module: named by it
    assert issubclass(unknown, agentrt.AgentError) and unknown.__module__ == "agentrt.durable"
    assert pickle.loads(pickle.dumps(unknown("lost"))).args == ("lost",)
    assert pickle.loads(pickle.dumps(agentrt.ConfigurationError("bad"))).args == ("bad",)
    # the classes are still their defining module's: one class, two names
    from agentrt import _errors

    assert _errors.BudgetExceededError is agentrt.BudgetExceededError
