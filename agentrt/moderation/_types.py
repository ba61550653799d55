"""The seam of moderation: the verdict a moderation model gives, and the protocol it implements."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol, runtime_checkable

__all__ = ["Moderation", "ModerationModel"]


@dataclass(frozen=True, slots=True)
class Moderation:
    """One text's verdict: whether it was `flagged`, each category's flag (`categories`, by the
    provider's own names, e.g. `"harassment/threatening"`) and score (`scores`, 0 to 1), and the
    `model` that judged it."""

    flagged: bool
    categories: Mapping[str, bool] = field(default_factory=lambda: MappingProxyType({}))
    scores: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    model: str | None = None

    @property
    def flagged_categories(self) -> tuple[str, ...]:
        """The names of the categories that were flagged, in the provider's order."""
        return tuple(name for name, flag in self.categories.items() if flag)


@runtime_checkable
class ModerationModel(Protocol):
    """Judges texts: one `Moderation` per text, in order. It may be cancelled at any await (a call
    that ends first, the caller's cancellation); adapters raise the chat adapters' `ModelError`
    kinds."""

    @property
    def name(self) -> str: ...

    async def moderate(self, texts: Sequence[str]) -> list[Moderation]: ...
