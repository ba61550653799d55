"""An outside review of retrieval and moderation (issue 14): what the issue and the README promise,
tried with odd inputs, odd timings and combinations.

Each defect the review found is a test here (fixed since; the comments say what was wrong); each states
the expected behaviour. The others are regression tests for behaviour that held up
and that the feature's own tests do not cover.
"""

from __future__ import annotations

import gc
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import anyio
import httpx
import orjson
import pytest
from json_server import Body
from pydantic import BaseModel
from starlette.applications import Starlette
from starlette.routing import Route

import agentrt
import agentrt.sse
from agentrt import (
    Budget,
    BudgetExceededError,
    ConfigurationError,
    MemoryId,
    ModerationError,
    ModerationFailedError,
    PartialStream,
    RetrievalError,
    Retrieved,
    TokenStream,
    Usage,
    UserMessage,
)
from agentrt.guardrails import input_guardrails, output_guardrails, partial_text, success, success_with
from agentrt.memory import InMemoryStore, window
from agentrt.models.openai import OpenAIChatModel
from agentrt.moderation import Moderation, moderate
from agentrt.moderation.openai import OpenAIModerationModel
from agentrt.rag import BM25Retriever, Content, Query, Retrieval, SQLiteVectorIndex
from agentrt.testing import Delay, ScriptedModel

pytestmark = pytest.mark.virtual_clock


# --- helpers -----------------------------------------------------------------------------------


class Answer(BaseModel):
    answer: str


class Judge:
    """A moderation model that flags texts containing `bad`, after `delay` seconds (virtual time);
    `answer`, when given, is returned as it is (a moderation model that returns junk)."""

    name = "judge"

    def __init__(self, bad: str = "bad", *, delay: float = 0.0, answer: Any = None) -> None:
        self.bad = bad
        self.delay = delay
        self.answer = answer

    async def moderate(self, texts: Sequence[str]) -> list[Moderation]:
        await anyio.sleep(self.delay)
        if self.answer is not None:
            return self.answer  # type: ignore[no-any-return]
        return [Moderation(self.bad in text, {"hate": self.bad in text}) for text in texts]


@moderate
class Moderated:
    async def ask(self, question: str) -> str: ...

    async def stream(self, question: str) -> TokenStream: ...


class Plain:
    async def ask(self, question: str) -> str: ...

    async def stream(self, question: str) -> TokenStream: ...


class Docs:
    async def ask(self, question: str) -> agentrt.Result[str]: ...

    async def stream(self, question: str) -> TokenStream: ...


class Chat:
    async def chat(self, conversation: Annotated[str, MemoryId], question: str) -> str: ...

    async def stream(self, conversation: Annotated[str, MemoryId], question: str) -> TokenStream: ...


async def pets(query: Query) -> list[Content]:
    return [Content("Dogs travel at half fare.", {"source": "pets.md"}, 1.0, "pets#0")]


def client(handler: Any) -> httpx.AsyncClient:
    app = Starlette(routes=[Route("/chat", handler, methods=["POST"])])
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")


def protocol_body(protocol: str, text: str, field: str = "question") -> dict[str, Any]:
    if protocol == "agentrt":
        return {field: text}
    if protocol == "vercel-ui":
        return {
            "id": "chat-1",
            "messages": [{"id": "u1", "role": "user", "parts": [{"type": "text", "text": text}]}],
            "trigger": "submit-message",
        }
    return {
        "threadId": "t1",
        "runId": "r1",
        "state": {},
        "messages": [{"id": "u1", "role": "user", "content": text}],
        "tools": [],
        "context": [],
        "forwardedProps": {},
    }


def sse_events(text: str) -> list[str]:
    return [
        line[len("event: ") :]
        for line in text.replace("\r\n", "\n").split("\n")
        if line.startswith("event: ")
    ]


# --- moderation: the race --------------------------------------------------------------------


async def test_a_pass_while_a_chunk_is_awaited_releases_the_held_text_with_the_next_chunk() -> None:
    # The review found that a pass does not release the held first chunk at once when the model is
    # between chunks: the race is waiting for the model's next chunk, and a read of a model stream
    # cannot be interrupted without closing it (DESIGN §3: nothing is held across the pipeline's
    # `yield`, so the read cannot go on in a task of its own). That is the documented bound (README
    # "Moderation"): a pass releases what was held with the model's next chunk, or its end. Here the
    # first chunk comes at once, the verdict after 1 s, the second chunk after 10 s.
    model = ScriptedModel(["Hel", Delay(10.0), "lo"])
    service = agentrt.build(Moderated, model=model, moderation_model=Judge(delay=1.0))

    start = anyio.current_time()
    stream = await service.stream("hello")
    assert anyio.current_time() - start == pytest.approx(10.0, abs=0.05)
    assert [token async for token in stream] == ["Hel", "lo"]


@pytest.mark.parametrize("view", ["stream", "partial"])
async def test_a_stream_is_cut_at_its_time_budget_while_moderation_is_pending(view: str) -> None:
    # The model answers at once; the moderation endpoint hangs (100 s). The budget is 5 s.
    # Expected (as for the awaited view, and as the README's "Budgets are checked ... during
    # streaming" says): BudgetExceededError at 5 s. Actual: the stream is handed over at 100 s, when
    # the verdict finally comes. Over SSE the endpoint's `budget=` cap is bypassed the same way.
    @moderate
    class Streams:
        async def stream(self, question: str) -> TokenStream: ...

        async def partial(self, question: str) -> PartialStream[Answer]: ...

    script = ["Here you go."] if view == "stream" else ['{"answer": "Here you go."}']
    model = ScriptedModel(script)  # handles_deadline=True, as the HTTP adapters
    service = agentrt.build(
        Streams, model=model, moderation_model=Judge(delay=100.0), budget=Budget(seconds=5)
    )

    start = anyio.current_time()
    with pytest.raises(BudgetExceededError) as caught:
        await getattr(service, view)("hello")
    assert caught.value.limit == "seconds"
    assert anyio.current_time() - start == pytest.approx(5.0, abs=0.05)


async def test_a_budget_that_runs_out_during_the_race_counts_the_response_already_paid_for() -> None:
    # The issue: "usage counted when the model was already paid for". The whole response, with the
    # provider's usage, arrived before the verdict; the 5 s budget runs out waiting for the verdict.
    # Expected: partial.usage == Usage(9, 3), as for a flag (test_moderation.py). Actual: Usage().
    model = ScriptedModel(["Here ", "you ", "go.", Usage(9, 3)])
    service = agentrt.build(
        Moderated, model=model, moderation_model=Judge(delay=100.0), budget=Budget(seconds=5)
    )

    with pytest.raises(BudgetExceededError) as caught:
        await service.ask("hello")
    assert caught.value.partial is not None
    assert caught.value.partial.usage == Usage(9, 3)


@pytest.mark.parametrize("view", ["ask", "stream"])
async def test_a_token_budget_stops_the_response_during_the_race(view: str) -> None:
    # DESIGN §3 / README: token budgets are checked during streaming; the response stops within one
    # chunk of the limit. Without @moderate this holds (the model's stream is closed after ~5 tokens).
    # With @moderate and a moderation model slower than the model, the whole 200-token response is
    # read into the race's buffer (completed=True), the provider's Usage(5, 200) with it, and the
    # BudgetExceededError then reports about 7 estimated output tokens.
    model = ScriptedModel([*(["word "] * 200), Usage(5, 200)])
    service = agentrt.build(
        Moderated, model=model, moderation_model=Judge(delay=2.0), budget=Budget(output_tokens=5)
    )

    async def call() -> None:
        result = await getattr(service, view)("hello")
        if view == "stream":
            async for _ in result:
                pass

    with pytest.raises(BudgetExceededError) as caught:
        await call()
    assert caught.value.limit == "output_tokens"
    assert not model.streams[0].completed  # stopped near its limit, not read to its end


@pytest.mark.parametrize("answer", [[None], [{"flagged": True}], ["flagged"]])
@pytest.mark.parametrize("which", ["input", "answer"])
async def test_junk_verdicts_are_a_moderation_failure(answer: Any, which: str) -> None:
    # Wrong counts and raised exceptions are ModerationFailedError (on_error="fail"); junk verdicts
    # of the right count should be too, never an exception group reaching the caller.
    class Answers:
        @moderate(answer=True)
        async def ask(self, question: str) -> str: ...

    class Inputs:
        @moderate
        async def ask(self, question: str) -> str: ...

    judge = Judge(answer=answer)
    if which == "answer":  # the user's message passes; the answer's verdict is junk

        class Sequenced(Judge):
            calls = 0

            async def moderate(self, texts: Sequence[str]) -> list[Moderation]:
                Sequenced.calls += 1
                return [Moderation(False)] if Sequenced.calls == 1 else answer  # type: ignore[no-any-return]

        judge = Sequenced()
    service = agentrt.build(
        Answers if which == "answer" else Inputs, model=ScriptedModel("Fine."), moderation_model=judge
    )
    with pytest.raises(ModerationFailedError):
        await service.ask("hello")


class Interrupt(BaseException):
    """Stands for KeyboardInterrupt / SystemExit raised inside a moderation model."""


async def test_a_base_exception_from_the_moderation_model_is_not_wrapped_in_a_group() -> None:
    class Raising:
        name = "raising"

        async def moderate(self, texts: Sequence[str]) -> list[Moderation]:
            await anyio.sleep(0.5)
            raise Interrupt

    service = agentrt.build(Moderated, model=ScriptedModel([Delay(1.0), "x"]), moderation_model=Raising())
    with pytest.raises(Interrupt):
        await service.ask("hello")


def test_a_moderation_model_class_is_refused_at_build() -> None:
    # DESIGN §3, definition-time validation. `@moderate(model=Judge, on_error="allow")` builds, and
    # then `await service.ask("bad")` returns the model's answer unmoderated (Judge.moderate([text])
    # is a TypeError, which "allow" lets through).
    with pytest.raises(ConfigurationError, match="a class"):
        moderate(model=Judge, on_error="allow")  # type: ignore[call-overload]

    class Careless:
        @moderate
        async def ask(self, question: str) -> str: ...

    with pytest.raises(ConfigurationError, match="a class"):
        agentrt.build(Careless, model=ScriptedModel("unmoderated"), moderation_model=Judge)  # type: ignore[arg-type]


@pytest.mark.parametrize("delay", [0.0, 0.5, 5.0])
@pytest.mark.parametrize("method", ["plain", "chunked", "optimistic", "partial", "tool_round"])
async def test_no_text_of_a_flagged_call_reaches_a_reader_or_listener(method: str, delay: float) -> None:
    # Regression: flagged input on every streaming shape (release policies, PartialStream, a first
    # response that calls a tool), with moderation faster than, about as fast as, and slower than the
    # model: nothing of the answer reaches the reader or listeners, the model stream is closed,
    # nothing is stored, and the conversation is released for the next turn.
    @partial_text
    def passes(request: object) -> agentrt.guardrails.GuardrailResult:
        return success()

    @agentrt.tool
    async def lookup(query: str) -> str:
        """Look something up."""
        ran.append(query)
        return "SECRET tool result"

    class Shapes:
        @moderate
        async def plain(self, c: Annotated[str, MemoryId], q: str) -> TokenStream: ...

        @moderate
        @output_guardrails(passes, release="chunked")
        async def chunked(self, c: Annotated[str, MemoryId], q: str) -> TokenStream: ...

        @moderate
        @output_guardrails(passes, release="optimistic")
        async def optimistic(self, c: Annotated[str, MemoryId], q: str) -> TokenStream: ...

        @moderate
        async def partial(self, c: Annotated[str, MemoryId], q: str) -> PartialStream[Answer]: ...

        @moderate
        async def tool_round(self, c: Annotated[str, MemoryId], q: str) -> TokenStream: ...

    ran: list[str] = []
    scripts: dict[str, list[Any]] = {
        "plain": ["SECRET one. ", "SECRET two.", Usage(5, 5)],
        "chunked": ["SECRET one. ", "SECRET two.", Usage(5, 5)],
        "optimistic": ["SECRET one. ", "SECRET two.", Usage(5, 5)],
        "partial": ['{"answer": "SECR', 'ET"}', Usage(5, 5)],
        "tool_round": ["SECRET ", agentrt.testing.CallTool("lookup", {"query": "q"})],
    }
    events: list[object] = []
    model = ScriptedModel([Delay(1.0), *scripts[method]], "fine")
    store = InMemoryStore()
    service = agentrt.build(
        Shapes,
        model=model,
        memory=window(max_messages=20, store=store),
        moderation_model=Judge(delay=delay),
        tools=[lookup],
        listeners=[events.append],
    )

    with pytest.raises(ModerationError) as caught:
        await getattr(service, method)("ada", "bad things")
    assert caught.value.flagged == "input"
    assert "SECRET" not in repr(events)
    assert ran == []
    assert model.streams[0].closed
    assert await agentrt.memory.access(service).read("ada") == []
    with anyio.fail_after(50):  # the conversation was released (the verdict takes up to 5 s)
        with pytest.raises(ModerationError):
            await service.plain("ada", "bad again")


@pytest.mark.parametrize("protocol", ["agentrt", "vercel-ui", "ag-ui"])
@pytest.mark.parametrize("method", ["plain", "partial"])
async def test_a_flagged_request_is_refused_before_any_stream_on_every_protocol(
    protocol: str, method: str
) -> None:
    # Regression: the model answers in full before the 2 s verdict; every protocol refuses the
    # request with a 400 `moderated`, and no token of the answer is in the body.
    class Desk:
        @moderate
        async def plain(self, question: str) -> TokenStream: ...

        @moderate
        async def partial(self, question: str) -> PartialStream[Answer]: ...

    script = ["SECRET answer."] if method == "plain" else ['{"answer": "SECRET"}']
    model = ScriptedModel(script)
    service = agentrt.build(
        Desk, model=model, moderation_model=Judge(delay=2.0), retrieval=Retrieval(retrievers=[pets])
    )
    handler = agentrt.sse.endpoint(getattr(service, method), protocol=protocol)
    async with client(handler) as http:
        response = await http.post("/chat", json=protocol_body(protocol, "bad words"))
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "moderated"
    assert "SECRET" not in response.text and "Dogs travel" not in response.text
    assert model.streams[0].closed


@pytest.mark.parametrize("view", ["ask", "stream"])
async def test_a_flag_closes_the_http_response_of_the_openai_adapter(view: str) -> None:
    # Regression with the real adapters (OpenAIChatModel streaming, OpenAIModerationModel) over
    # httpx: the chat response sends one chunk then stalls; the moderation endpoint flags after 1 s.
    # The call fails at 1 s and the chat response body is closed.
    bodies: list[Body] = []

    def chunk(data: dict[str, Any]) -> bytes:
        return b"data: " + orjson.dumps(data) + b"\n\n"

    def handler(request: httpx.Request) -> Any:
        if request.url.path.endswith("/moderations"):

            async def later() -> httpx.Response:
                await anyio.sleep(1.0)
                result = {"flagged": True, "categories": {"hate": True}, "category_scores": {"hate": 0.9}}
                return httpx.Response(200, json={"id": "m", "model": "omni", "results": [result]})

            return later()
        delta = {"role": "assistant", "content": "SECRET"}
        first = {"id": "1", "object": "chat.completion.chunk", "model": "m",
                 "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}  # fmt: skip
        body = Body(chunk(first), hang=True)
        bodies.append(body)
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=body)

    http = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    try:
        model = OpenAIChatModel(model="m", base_url="http://x/v1", api_key="k", client=http)
        judge = OpenAIModerationModel(base_url="http://x/v1", api_key="k", client=http)
        service = agentrt.build(Moderated, model=model, moderation_model=judge)
        start = anyio.current_time()
        with pytest.raises(ModerationError) as caught:
            await getattr(service, view)("hello")
        assert anyio.current_time() - start == pytest.approx(1.0, abs=0.05)
        assert caught.value.categories == ("hate",)
        assert bodies[0].closed
    finally:
        await http.aclose()


# --- retrieval -------------------------------------------------------------------------------


async def test_an_async_when_predicate_is_awaited_or_refused() -> None:
    async def never(query: Query) -> bool:
        return False

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the un-awaited coroutine, today
        try:
            retrieval = Retrieval(retrievers=[pets], when=never)  # type: ignore[arg-type]
        except ConfigurationError:
            return  # refused at definition: fine too
        docs = agentrt.build(Docs, model=ScriptedModel("ok"), retrieval=retrieval)
        result = await docs.ask("hello")
        gc.collect()
    assert result.sources == ()  # `when` said no


def _raise(error: Exception) -> Any:
    def fail(*args: object) -> Any:
        raise error

    return fail


async def _content_without_text(query: Query) -> list[Content]:
    return [Content(None)]  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "options",
    [
        {"aggregator": _raise(ValueError("aggregator"))},
        {"aggregator": lambda lists: ["not a Content"]},
        {"injector": _raise(KeyError("injector"))},
        {"injector": lambda message, contents: "not a message"},
        {"when": _raise(ValueError("when"))},
        {"retrievers": [_content_without_text]},
    ],
    ids=[
        "aggregator-raises",
        "aggregator-junk",
        "injector-raises",
        "injector-junk",
        "when-raises",
        "no-text",
    ],
)
async def test_every_failure_of_the_retrieval_pipeline_is_a_retrieval_error(options: dict[str, Any]) -> None:
    options = {"retrievers": [pets], **options}
    model = ScriptedModel("never")
    docs = agentrt.build(Docs, model=model, retrieval=Retrieval(**options))
    with pytest.raises(RetrievalError):
        await docs.ask("hello")
    assert model.requests == []


@pytest.mark.parametrize("view", ["chat", "stream"])
async def test_a_budget_that_runs_out_during_retrieval_releases_the_conversation(view: str) -> None:
    # Regression (memory + retrieval + time budget): cut at 2 s while the retriever takes 10 s, the
    # call raises BudgetExceededError, stores nothing, and the next turn on the conversation runs.
    cancelled: list[str] = []

    async def slow(query: Query) -> list[Content]:
        try:
            await anyio.sleep(10.0)
        except anyio.get_cancelled_exc_class():
            cancelled.append(query.text)
            raise
        return [Content("late")]

    store = InMemoryStore()
    model = ScriptedModel("never")
    chat = agentrt.build(
        Chat,
        model=model,
        memory=window(max_messages=10, store=store),
        retrieval=Retrieval(retrievers=[slow, pets]),
        budget=Budget(seconds=2),
    )
    start = anyio.current_time()
    with pytest.raises(BudgetExceededError) as caught:
        await getattr(chat, view)("ada", "first")
    assert caught.value.limit == "seconds"
    assert anyio.current_time() - start == pytest.approx(2.0, abs=0.05)
    assert cancelled == ["first"]
    assert model.requests == []
    assert await agentrt.memory.access(chat).read("ada") == []
    # the conversation was released: the next turn (same store, same process) runs at once
    chat2 = agentrt.build(
        Chat,
        model=ScriptedModel("hi"),
        memory=window(max_messages=10, store=store),
        retrieval=Retrieval(retrievers=[pets]),
    )
    with anyio.fail_after(5):
        assert await chat2.chat("ada", "second") == "hi"


async def test_a_transformer_that_returns_no_queries_retrieves_nothing() -> None:
    # Regression: "No queries: nothing is retrieved" — the model gets the user's own text, the
    # result has no sources, and the Retrieved event says no query ran.
    asked: list[Query] = []

    async def recording(query: Query) -> list[Content]:
        asked.append(query)
        return [Content("x")]

    events: list[object] = []
    model = ScriptedModel("ok")
    docs = agentrt.build(
        Docs,
        model=model,
        retrieval=Retrieval(retrievers=[recording], transformer=lambda query: []),
        listeners=[events.append],
    )
    result = await docs.ask("plain question")
    assert result.sources == ()
    assert asked == []
    message = model.requests[0].messages[-1]
    assert isinstance(message, UserMessage) and message.text == "plain question"
    (retrieved,) = [e for e in events if isinstance(e, Retrieved)]
    assert retrieved.queries == () and retrieved.contents == ()


async def test_retrieval_sees_the_guardrails_rewrite_and_memory_keeps_it_unaugmented() -> None:
    # Regression (input guardrail rewriting + retrieval + memory + moderation): the retriever and the
    # moderation model see the rewritten text; the model sees it augmented; memory stores the
    # rewritten text without the contents.
    asked: list[str] = []
    judged: list[str] = []

    async def recording(query: Query) -> list[Content]:
        asked.append(query.text)
        return [Content("Dogs travel at half fare.", id="pets#0")]

    class Recording(Judge):
        async def moderate(self, texts: Sequence[str]) -> list[Moderation]:
            judged.extend(texts)
            return await super().moderate(texts)

    def redact(request: Any) -> agentrt.guardrails.GuardrailResult:
        return success_with(request.user_message.text.replace("my-secret", "[redacted]"))

    class Guarded:
        @moderate
        @input_guardrails(redact)
        async def chat(self, conversation: Annotated[str, MemoryId], question: str) -> str: ...

    model = ScriptedModel("Half fare.")
    service = agentrt.build(
        Guarded,
        model=model,
        memory=window(max_messages=10, store=InMemoryStore()),
        retrieval=Retrieval(retrievers=[recording]),
        moderation_model=Recording(),
    )
    assert await service.chat("ada", "dog fare? my-secret") == "Half fare."
    assert asked == judged == ["dog fare? [redacted]"]
    sent = model.requests[0].messages[-1]
    assert isinstance(sent, UserMessage)
    assert sent.text.startswith("dog fare? [redacted]") and "half fare" in sent.text
    stored = await agentrt.memory.access(service).read("ada")
    assert [m.text for m in stored] == ["dog fare? [redacted]", "Half fare."]


# --- retrieval over SSE ----------------------------------------------------------------------


async def test_binary_metadata_does_not_break_the_sse_stream() -> None:
    # The brief's "non-JSON metadata over SSE": a retriever that keeps a raw digest in its metadata.
    # Expected: the answer streams, the metadata value sent in some string form (or left out).
    # Actual: `event: error` {"type": "internal_error"} and no token.
    async def hashed(query: Query) -> list[Content]:
        return [Content("Dogs travel at half fare.", {"source": "pets.md", "sha": b"\xff\xfe\x00"}, 1.0, "p")]

    service = agentrt.build(Docs, model=ScriptedModel("Half."), retrieval=Retrieval(retrievers=[hashed]))
    async with client(agentrt.sse.endpoint(service.stream)) as http:
        response = await http.post("/chat", json={"question": "dog?"})
    assert sse_events(response.text) == ["retrieved", "token", "done"]


@pytest.mark.parametrize(
    "metadata",
    [{1: "int key"}, {"score": float("nan")}, {"when": {"nested": (1, 2)}}, {"o": object()}],
    ids=["int-key", "nan", "nested-tuple", "object"],
)
async def test_odd_but_encodable_metadata_streams_over_sse(metadata: dict[Any, Any]) -> None:
    # Regression: other non-JSON metadata is sent (stringified where need be), the answer streams.
    async def odd(query: Query) -> list[Content]:
        return [Content("Dogs travel at half fare.", metadata, None, "p")]

    service = agentrt.build(Docs, model=ScriptedModel("Half."), retrieval=Retrieval(retrievers=[odd]))
    async with client(agentrt.sse.endpoint(service.stream)) as http:
        response = await http.post("/chat", json={"question": "dog?"})
    assert sse_events(response.text) == ["retrieved", "token", "done"]


async def test_ag_ui_clients_get_the_sources() -> None:
    service = agentrt.build(Docs, model=ScriptedModel("Half."), retrieval=Retrieval(retrievers=[pets]))
    handler = agentrt.sse.endpoint(service.stream, protocol="ag-ui")
    async with client(handler) as http:
        response = await http.post("/chat", json=protocol_body("ag-ui", "dog fare?"))
    assert response.status_code == 200
    assert "pets#0" in response.text  # e.g. a CUSTOM event, or the sources in RUN_FINISHED


@pytest.mark.parametrize("kind", ["fails", "slow"])
async def test_retrieval_errors_before_the_stream_are_http_errors(kind: str) -> None:
    # Regression: a failing retriever is a 502 `retrieval_failed`, a budget that runs out during
    # retrieval a 504, both before any stream, with no model request.
    async def retriever(query: Query) -> list[Content]:
        if kind == "fails":
            raise OSError("the index is gone")
        await anyio.sleep(100.0)
        return []

    model = ScriptedModel("never")
    service = agentrt.build(
        Docs, model=model, retrieval=Retrieval(retrievers=[retriever]), budget=Budget(seconds=2)
    )
    async with client(agentrt.sse.endpoint(service.stream)) as http:
        response = await http.post("/chat", json={"question": "q"})
    expected = {"fails": (502, "retrieval_failed"), "slow": (504, "budget_exceeded")}[kind]
    assert (response.status_code, response.json()["error"]["type"]) == expected
    assert "the index is gone" not in response.text
    assert model.requests == []


# --- retrievers and indexes ------------------------------------------------------------------


async def test_a_second_writer_cannot_store_another_dimension(tmp_path: Path) -> None:
    path = tmp_path / "vectors.db"
    first, second = SQLiteVectorIndex(path), SQLiteVectorIndex(path)
    reopened = SQLiteVectorIndex(path)
    try:
        assert await first.count() == 0 and await second.count() == 0  # both open, the file empty
        await first.add([Content("three", id="a")], [[1.0, 0.0, 0.0]])
        # Expected: refused, as the same handle would refuse it; actual: stored.
        with pytest.raises(ValueError, match="3-dimensional"):
            await second.add([Content("four", id="b")], [[1.0, 0.0, 0.0, 0.0]])
    finally:
        first.close()
        second.close()
    try:
        assert await reopened.count() == 1  # actual: ValueError, the file is unusable
    finally:
        reopened.close()


def test_bm25_refuses_a_k_that_is_not_an_int() -> None:
    with pytest.raises(ConfigurationError, match="BM25Retriever"):
        BM25Retriever(["dogs and cats"], k=1.5)  # type: ignore[arg-type]


async def test_bm25_with_odd_text() -> None:
    # Regression: empty, blank, stop-word-only, emoji-only, NUL, non-Latin and lone-surrogate texts
    # index and search without error; queries of nothing searchable find nothing.
    texts = [
        "",
        "   ",
        "the and of",
        "🐶🐶",
        "Dogs\x00cats",
        "ÄÖÜ straße",
        "日本語のテキスト。",
        "\ud800 lone surrogate",
        "x" * 3000,
    ]
    retriever = BM25Retriever(texts, k=3)
    for query in ["", "the", "🐶", "\x00", "x" * 3000]:
        assert await retriever.retrieve(Query(query)) == []
    assert [c.text for c in await retriever.retrieve(Query("cats"))] == ["Dogs\x00cats"]
    assert [c.text for c in await retriever.retrieve(Query("straße"))] == ["ÄÖÜ straße"]
    assert [c.text for c in await retriever.retrieve(Query("surrogate"))] == ["\ud800 lone surrogate"]
    empty = BM25Retriever([], k=2)
    await empty.add(["the of and"])  # a corpus without a single token
    assert await empty.retrieve(Query("the")) == []
    await empty.add(["real words here"])
    assert [c.text for c in await empty.retrieve(Query("words"))] == ["real words here"]
