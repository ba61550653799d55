"""What a model declares about itself is data in its `Capabilities`, read at `build()`: whether it
stops at a request's deadline itself, who serves it, and the settings it refuses on every request.
A model needs nothing but `name`, `capabilities` and `stream`; one that still sets the old attributes
(`handles_deadline`, `provider`, `check_settings`) is refused with where they moved.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from typing import Any

import anyio
import anyio.lowlevel
import pytest

import agentrt
from agentrt import (
    Budget,
    Capabilities,
    ConfigurationError,
    FinishReason,
    LifecycleEvent,
    ModelRequest,
    ModelSettings,
    Started,
    TextDelta,
    TokenStream,
    method_options,
)
from agentrt.models import Finish, ModelChunk


class Desk:
    async def ask(self, question: str) -> str: ...

    @method_options(settings=ModelSettings(max_tokens=50))
    async def brief(self, question: str) -> str: ...

    @method_options(settings=ModelSettings(temperature=0.3))
    async def warm(self, question: str) -> str: ...


class Chat:
    async def ask(self, question: str) -> str: ...

    async def stream(self, question: str) -> TokenStream: ...


class _Reads:
    """A model stream that records, at every read, the deadline the reading task runs under."""

    def __init__(self, chunks: list[ModelChunk], seen: list[float]) -> None:
        self._chunks = iter(chunks)
        self._seen = seen

    def __aiter__(self) -> _Reads:
        return self

    async def __anext__(self) -> ModelChunk:
        self._seen.append(anyio.current_effective_deadline())
        await anyio.lowlevel.checkpoint()
        for chunk in self._chunks:
            return chunk
        raise StopAsyncIteration


class Minimal:
    """A user's model as the protocol asks for it: a name, capabilities, `stream`; nothing else."""

    def __init__(self, capabilities: Capabilities | None = None) -> None:
        self.capabilities = capabilities or Capabilities()
        self.name = "minimal"
        self.deadlines: list[float] = []
        """The deadline each read of a stream ran under (`inf`: none)."""

    def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        return _Reads([TextDelta("Hello "), TextDelta("there"), Finish(FinishReason.STOP)], self.deadlines)


async def _streamed(service: Chat) -> str:
    async with await service.stream("q") as tokens:
        return "".join([token async for token in tokens])


# --- handles_deadline ------------------------------------------------------------------------------


async def test_a_model_that_declares_no_deadline_handling_is_read_under_the_deadline() -> None:
    model = Minimal()
    service = agentrt.build(Chat, model=model, budget=Budget(seconds=60))
    before = anyio.current_time()

    assert await _streamed(service) == "Hello there"

    # every read (the first, the text, the finish, the end) under a scope at the call's deadline
    assert len(model.deadlines) == 4
    assert all(before + 60 <= d <= anyio.current_time() + 60 for d in model.deadlines)


async def test_a_model_that_declares_it_handles_deadlines_is_read_without_a_scope() -> None:
    model = Minimal(Capabilities(handles_deadline=True))
    service = agentrt.build(Chat, model=model, budget=Budget(seconds=60))

    assert await _streamed(service) == "Hello there"

    assert model.deadlines == [math.inf] * 4  # the model watches the deadline: no scope per read


# --- provider --------------------------------------------------------------------------------------


async def test_the_declared_provider_is_the_started_events() -> None:
    events: list[LifecycleEvent] = []
    declared = agentrt.build(Chat, model=Minimal(Capabilities(provider="acme")), listeners=[events.append])
    silent = agentrt.build(Chat, model=Minimal(), listeners=[events.append])

    assert await declared.ask("q") == await silent.ask("q") == "Hello there"

    started = [e for e in events if isinstance(e, Started)]
    assert [(e.model, e.provider) for e in started] == [("minimal", "acme"), ("minimal", None)]


# --- settings the model refuses ------------------------------------------------------------------------


def test_settings_under_the_declared_least_max_tokens_are_build_errors_naming_the_method() -> None:
    model = Minimal(Capabilities(min_max_tokens=100))
    with pytest.raises(ConfigurationError, match=r"^Desk\.brief: max_tokens \(50\) is below 100"):
        agentrt.build(Desk, model=model)
    with pytest.raises(ConfigurationError, match=r"^Chat: max_tokens \(99\) is below 100"):
        agentrt.build(Chat, model=model, settings=ModelSettings(max_tokens=99))
    agentrt.build(Chat, model=model, settings=ModelSettings(max_tokens=100))
    agentrt.build(Chat, model=model)  # the model's own default applies


def test_a_temperature_other_than_the_declared_one_is_a_build_error_naming_the_method() -> None:
    model = Minimal(Capabilities(fixed_temperature=1))
    with pytest.raises(ConfigurationError, match=r"^Desk\.warm: the model takes no temperature but 1"):
        agentrt.build(Desk, model=model, settings=ModelSettings(temperature=1))  # the method's wins
    with pytest.raises(ConfigurationError, match=r"^Chat: the model takes no temperature but 1.*got 0"):
        agentrt.build(Chat, model=model, settings=ModelSettings(temperature=0))
    agentrt.build(Chat, model=model, settings=ModelSettings(temperature=1))


def test_without_declared_limits_any_settings_build() -> None:
    agentrt.build(Desk, model=Minimal(), settings=ModelSettings(max_tokens=1, temperature=0.3))


# --- the old attributes ----------------------------------------------------------------------------


class OldDeadline(Minimal):
    handles_deadline = True


class OldProvider(Minimal):
    def __init__(self) -> None:
        super().__init__()
        self.provider = "acme"


class OldCheck(Minimal):
    def check_settings(self, settings: ModelSettings, where: str) -> None:
        raise AssertionError("never called")


@pytest.mark.parametrize(
    ("model", "moved"),
    [
        (OldDeadline(), r"handles_deadline \(now Capabilities\.handles_deadline\)"),
        (OldProvider(), r"provider \(now Capabilities\.provider\)"),
        (OldCheck(), r"check_settings \(declare the settings it refuses instead: Capabilities\.min_max"),
    ],
)
def test_a_model_that_sets_an_old_attribute_is_refused_with_where_it_moved(model: Any, moved: str) -> None:
    with pytest.raises(ConfigurationError, match=moved):
        agentrt.build(Chat, model=model)


class OwnProvider(Minimal):
    """A model whose `provider` is its own business (not a name): not the old declaration."""

    @property
    def provider(self) -> str:
        raise AssertionError("build reads no attribute but name, capabilities and stream")

    handles_deadline = None
    check_settings = "mine"


async def test_attributes_of_those_names_and_other_kinds_are_the_models_own() -> None:
    assert await agentrt.build(Chat, model=OwnProvider()).ask("q") == "Hello there"
