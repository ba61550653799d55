"""Stub detection: whether a declared method's body is only a placeholder (`...`, `pass`, a
docstring, `raise NotImplementedError`), which `build()` fills in; any other body is the user's own.
"""

from __future__ import annotations

import ast
import dis
import inspect
import textwrap
import types
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["is_stub"]


def is_stub(function: Callable[..., Any]) -> bool:
    """Whether a function's body is only `...`, `pass`, a docstring, or `raise NotImplementedError`
    (with or without a message or `from None`).

    Read from the function's source when there is one (exact on every Python version); otherwise
    from its bytecode, compared with stubs compiled by the running interpreter (where `return None`
    and `pass` cannot be told apart).
    """
    code = getattr(function, "__code__", None)
    if not isinstance(code, types.CodeType) or code.co_freevars or code.co_cellvars:
        return False
    body = _source_body(function)
    if body is not None:
        return all(_stub_statement(statement) for statement in body)
    return _shape(code) in _STUB_SHAPES


def _source_body(function: Callable[..., Any]) -> list[ast.stmt] | None:
    """The statements of `function`'s body from its source, if its source can be found and is its own.

    Source can be missing (code made by `exec`) or wrong (a file changed on disk, or code compiled with
    a file name whose lines are other lines): anything `inspect` or `ast` raises, a name or parameters
    that differ from the code object's, mean "no source".
    """
    try:
        source = textwrap.dedent(inspect.getsource(function))
        tree = ast.parse(source)
    except Exception:
        return None
    node = tree.body[0] if tree.body else None
    if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) or node.name != function.__name__:
        return None
    code = function.__code__
    arguments = node.args
    names = [a.arg for a in (*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs)]
    if names != list(code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]):
        return None
    return node.body


def _stub_statement(statement: ast.stmt) -> bool:
    if isinstance(statement, ast.Pass):
        return True
    if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant):
        return statement.value.value is Ellipsis or isinstance(statement.value.value, str)
    if isinstance(statement, ast.Raise) and statement.exc is not None:
        exc = statement.exc.func if isinstance(statement.exc, ast.Call) else statement.exc
        cause = statement.cause
        return (
            isinstance(exc, ast.Name)
            and exc.id == "NotImplementedError"
            and (cause is None or (isinstance(cause, ast.Constant) and cause.value is None))
        )
    return False


_STUB_BODIES: Final = (
    "...",
    "pass",
    '"""doc"""',
    '"""doc"""\n    ...',
    '"""doc"""\n    pass',
    "raise NotImplementedError",
    "raise NotImplementedError()",
    'raise NotImplementedError("message")',
    "raise NotImplementedError from None",
    'raise NotImplementedError("message") from None',
    '"""doc"""\n    raise NotImplementedError',
    '"""doc"""\n    raise NotImplementedError()',
    '"""doc"""\n    raise NotImplementedError("message")',
)


def _shape(code: types.CodeType) -> tuple[tuple[str, object], ...]:
    # What a body does, without where it stands: positions, constants' indices and string values
    # (a docstring or a NotImplementedError message) do not count.
    return tuple(
        (i.opname, "<str>" if isinstance(i.argval, str) and i.opname == "LOAD_CONST" else i.argval)
        for i in dis.get_instructions(code)
        if i.opname != "CACHE"
    )


def _reference_shapes() -> frozenset[tuple[tuple[str, object], ...]]:
    # Compiled by the running interpreter, so the comparison is exact on every Python version: the
    # bytecode of an empty coroutine changes between versions (3.12 added an exception handler).
    shapes = set()
    for prefix in ("def", "async def"):
        for body in _STUB_BODIES:
            namespace: dict[str, Any] = {}
            exec(compile(f"{prefix} stub(self, *args, **kwargs):\n    {body}\n", "<stub>", "exec"), namespace)
            shapes.add(_shape(namespace["stub"].__code__))
    return frozenset(shapes)


_STUB_SHAPES: Final = _reference_shapes()
