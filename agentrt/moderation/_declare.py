"""Declaring moderation: `@moderate` on a method or a class, with the model from `build`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Literal, TypeVar, overload

from .._errors import ConfigurationError
from ._types import ModerationModel

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["MODERATE_ATTR", "Moderate", "moderate"]

MODERATE_ATTR: Final = "__agentrt_moderate__"

_T = TypeVar("_T")

OnError = Literal["fail", "allow"]


@dataclass(frozen=True, slots=True)
class Moderate:
    """How a method is moderated: by `model` (default: `build(moderation_model=...)`), the user's
    message always and the `answer` too when asked; `on_error` says what a moderation model that
    fails means: `"fail"` stops the call (`ModerationFailedError`), `"allow"` lets it go on."""

    model: ModerationModel | None = None
    answer: bool = False
    on_error: OnError = "fail"


@overload
def moderate(target: _T, /) -> _T: ...


@overload
def moderate(
    *, model: ModerationModel | None = None, answer: bool = False, on_error: OnError = "fail"
) -> Callable[[_T], _T]: ...


def moderate(
    target: object = None,
    /,
    *,
    model: ModerationModel | None = None,
    answer: bool = False,
    on_error: OnError = "fail",
) -> object:
    """Moderate the user's message of a method (or of every method of a class) concurrently with the
    model call; with `answer=True`, the answer too, before any of it is released.

    A flagged message cancels the model call at once (its stream is closed), raises
    `ModerationError` with the flagged categories, and stores nothing; until the verdict is in, no
    text of the call reaches a reader. Use as `@moderate` or `@moderate(answer=True, ...)`."""
    if on_error not in ("fail", "allow"):
        raise ConfigurationError(f"@moderate: on_error must be 'fail' or 'allow', got {on_error!r}")
    if not isinstance(answer, bool):
        raise ConfigurationError(f"@moderate: answer must be a bool, got {answer!r}")
    if model is not None and (isinstance(model, type) or not callable(getattr(model, "moderate", None))):
        kind = "a class (pass an instance)" if isinstance(model, type) else "not a ModerationModel"
        raise ConfigurationError(f"@moderate: {model!r} is {kind}: it needs a moderate(texts) method")
    settings = Moderate(model, answer, on_error)

    def decorate(item: _T) -> _T:
        setattr(item, MODERATE_ATTR, settings)
        return item

    if target is not None:
        return decorate(target)
    return decorate
