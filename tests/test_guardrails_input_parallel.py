"""Input guardrails declared `parallel=True` run while the model answers the first request (as
openai-agents' parallel guardrails do): the request is sent at once, its chunks are held until the
chain passed, and a refusal cancels the request (its stream closed) with nothing shown or stored.

The model double records its requests and whether each stream was closed; a guardrail double waits
for the model's request before it judges, which only a parallel chain can get past.
"""

from __future__ import annotations

from typing import Annotated, Any

import anyio
import pytest

import agentrt
from agentrt import (
    GuardrailVerdict,
    InputGuardrailError,
    MemoryId,
    ModelRequest,
    TextDelta,
    TokenStream,
)
from agentrt.guardrails import (
    GuardrailResult,
    InputGuardrailRequest,
    failure,
    input_guardrails,
    success,
    success_with,
)
from agentrt.testing import Delay, FunctionModel, ScriptedModel

pytestmark = pytest.mark.virtual_clock  # the model's delays and fail_after take no real time

VIEWS = ["await", "stream"]


def model_of(*script: Any) -> tuple[FunctionModel, anyio.Event]:
    """A model that plays `script` (one response) and sets the event when it gets the request."""
    asked = anyio.Event()

    def respond(request: ModelRequest) -> Any:
        asked.set()
        return list(script)

    return FunctionModel(respond), asked


class AfterTheRequest:
    """Judges once the model has the request (so a chain run before the request would wait forever)."""

    name = "after-the-request"

    def __init__(self, asked: anyio.Event, decide: Any) -> None:
        self.asked = asked
        self.decide = decide
        self.seen: list[str] = []

    async def validate(self, request: InputGuardrailRequest) -> GuardrailResult:
        await self.asked.wait()
        self.seen.append(request.text)
        result: GuardrailResult = self.decide(request)
        return result


def service(model: Any, guardrail: object, parallel: bool = True) -> Any:
    class Chat:
        @input_guardrails(guardrail, parallel=parallel)
        async def ask(self, conversation: Annotated[str, MemoryId], question: str) -> str: ...

        @input_guardrails(guardrail, parallel=parallel)
        async def stream(self, conversation: Annotated[str, MemoryId], question: str) -> TokenStream: ...

    return agentrt.build(Chat, model=model, memory=agentrt.memory.window())


async def run(view: str, svc: Any, shown: list[Any]) -> str:
    if view == "await":
        text: str = await svc.ask("c", "hello")
        return text
    async with await svc.stream("c", "hello") as stream:
        async for event in stream.events():
            shown.append(event)
        return (await stream.result()).text


@pytest.mark.parametrize("view", VIEWS)
async def test_the_model_is_asked_at_once_and_its_answer_released_once_the_chain_passed(view: str) -> None:
    model, asked = model_of("Hi", " there.")
    guardrail = AfterTheRequest(asked, lambda request: success())
    svc = service(model, guardrail)
    shown: list[Any] = []
    with anyio.fail_after(5):
        assert await run(view, svc, shown) == "Hi there."
    assert guardrail.seen == ["hello"]
    stored = await agentrt.memory.access(svc).read("c")
    assert [m.text for m in stored] == ["hello", "Hi there."]
    if view == "stream":
        verdicts = [e for e in shown if type(e) is GuardrailVerdict]
        assert [(v.guardrail, v.kind, v.verdict) for v in verdicts] == [
            ("after-the-request", "input", "success")
        ]


@pytest.mark.parametrize("view", VIEWS)
async def test_a_refusal_cancels_the_request_and_nothing_is_shown_or_stored(view: str) -> None:
    model, asked = model_of("Secret ", Delay(0.5), "answer.")
    guardrail = AfterTheRequest(asked, lambda request: failure("not allowed"))
    svc = service(model, guardrail)
    shown: list[Any] = []
    with anyio.fail_after(5), pytest.raises(InputGuardrailError) as caught:
        await run(view, svc, shown)
    assert [f.message for f in caught.value.failures] == ["not allowed"]
    assert not [e for e in shown if type(e) is TextDelta]  # held until the verdict: never shown
    assert model.streams[0].closed and not model.streams[0].completed  # the request was cancelled
    assert await agentrt.memory.access(svc).read("c") == []


@pytest.mark.parametrize("view", VIEWS)
async def test_a_parallel_chain_may_not_rewrite_the_message_the_model_already_has(view: str) -> None:
    model, asked = model_of("Hi.")
    guardrail = AfterTheRequest(asked, lambda request: success_with("rewritten"))
    svc = service(model, guardrail)
    with anyio.fail_after(5), pytest.raises(TypeError, match="parallel input guardrail rewrote"):
        await run(view, svc, [])
    assert await agentrt.memory.access(svc).read("c") == []


@pytest.mark.parametrize("view", VIEWS)
async def test_without_parallel_the_chain_runs_before_any_request(view: str) -> None:
    model = ScriptedModel(["Hi."])

    def refuse(request: InputGuardrailRequest) -> GuardrailResult:
        return failure("no")

    svc = service(model, refuse, parallel=False)
    with pytest.raises(InputGuardrailError):
        await run(view, svc, [])
    assert model.requests == []


def test_parallel_must_be_a_bool() -> None:
    with pytest.raises(agentrt.ConfigurationError, match="parallel must be a bool"):
        input_guardrails(lambda request: success(), parallel="yes")  # type: ignore[arg-type]
