"""The public API is what `__all__` says: sorted, complete, importable."""

from __future__ import annotations

import types
import typing

import pytest

import agentrt
import agentrt.models
import agentrt.testing


@pytest.mark.parametrize(
    ("module", "owner"),
    [(agentrt, "agentrt"), (agentrt.models, "agentrt"), (agentrt.testing, "agentrt.testing")],
)
async def test_all_is_sorted_and_lists_every_public_name(module: types.ModuleType, owner: str) -> None:
    public = set()
    for name, value in vars(module).items():
        if name.startswith("_") or name == "annotations":
            continue
        if isinstance(value, types.ModuleType):
            if value.__name__.startswith("agentrt."):
                public.add(name)
            continue
        if isinstance(value, types.UnionType) or typing.get_origin(value) is not None:
            public.add(name)  # a type alias defined here
            continue
        defined_in = getattr(value, "__module__", None)
        if defined_in is None or defined_in.startswith(owner):
            public.add(name)

    assert sorted(module.__all__) == module.__all__
    assert set(module.__all__) == public
    for name in module.__all__:
        assert getattr(module, name) is not None
