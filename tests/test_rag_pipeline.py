"""Retrieval in the pipeline: what the model is sent, what memory keeps, sources and events on every
view, concurrency of retrievers, cancellation and budgets during retrieval, error policies."""

from __future__ import annotations

import gc
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import anyio
import pytest

import agentrt
from agentrt import (
    Budget,
    BudgetExceededError,
    CancelledEvent,
    ConfigurationError,
    LifecycleEvent,
    MemoryId,
    Result,
    RetrievalError,
    Retrieved,
    TextContent,
    TokenStream,
    UserMessage,
)
from agentrt.guardrails import input_guardrails, success_with
from agentrt.memory import InMemoryStore, window
from agentrt.moderation import Moderation, moderate
from agentrt.rag import (
    BM25Retriever,
    Content,
    Document,
    Query,
    Retrieval,
    Skipped,
    compressing_transformer,
    expanding_transformer,
    inject,
    reciprocal_rank_fusion,
    retrieval,
    retriever_tool,
)
from agentrt.testing import CallTool, ScriptedModel

CORPUS = Path(__file__).parent / "rag_corpus"


def corpus() -> list[Document]:
    return [
        Document(path.read_text(), {"source": path.name}, id=path.stem)
        for path in sorted(CORPUS.glob("*.md"))
        if path.name != "README.md"
    ]


class Docs:
    async def ask(self, question: str) -> str: ...

    async def stream(self, question: str) -> TokenStream: ...

    async def result(self, question: str) -> Result[str]: ...


class Chat:
    async def chat(self, conversation: Annotated[str, MemoryId], question: str) -> str: ...


class Recording:
    """A retriever that records each query it was asked, whether it finished or was cancelled, and
    answers with fixed contents after `delay` seconds (virtual time)."""

    def __init__(
        self, name: str, contents: list[Content], delay: float = 0.0, error: Exception | None = None
    ):
        self.name = name
        self.contents = contents
        self.delay = delay
        self.error = error
        self.queries: list[Query] = []
        self.finished = 0
        self.cancelled = 0

    async def retrieve(self, query: Query) -> list[Content]:
        self.queries.append(query)
        try:
            if self.delay:
                await anyio.sleep(self.delay)
        except anyio.get_cancelled_exc_class():
            self.cancelled += 1
            raise
        if self.error is not None:
            raise self.error
        self.finished += 1
        return self.contents


def last_user_text(model: ScriptedModel, index: int = -1) -> str:
    message = model.requests[index].messages[-1]
    assert isinstance(message, UserMessage)
    return message.text


QUESTIONS = [
    ("Can I get my money back for a saver ticket?", "refunds", "exchanged once"),
    ("How heavy may my suitcases be?", "luggage", "30 kilograms"),
    ("Does my dog need a muzzle on the night train?", "pets", "muzzle on night trains"),
    ("Can I bring my bicycle on the intercity train?", "bicycles", "bicycle space must be reserved"),
    ("What compensation do I get when my train is 2 hours late?", "delays", "50 percent"),
    ("What is the name of the wireless network on board?", "wifi", "LarkspurNet"),
]


@pytest.mark.parametrize(("question", "document", "passage"), QUESTIONS)
async def test_the_request_carries_the_chunk_that_answers(question: str, document: str, passage: str) -> None:
    retriever = BM25Retriever(corpus(), k=1)
    model = ScriptedModel("An answer.")
    docs = agentrt.build(Docs, model=model, retrieval=Retrieval(retrievers=[retriever], max_results=1))

    result = await docs.result(question)

    sent = last_user_text(model)
    assert sent.startswith(question + "\n\nAnswer using the following information:\n")
    assert passage in sent
    # only the answering document's chunk was injected
    assert [source.metadata["document"] for source in result.sources] == [document]
    assert passage in result.sources[0].text
    assert result.messages[-2] == model.requests[0].messages[-1]  # the transcript has what was sent


async def test_sources_and_the_retrieved_event_on_every_view() -> None:
    found = [Content("Dogs travel at half fare.", {"source": "pets.md"}, 2.5, "pets#0")]
    retriever = Recording("pets", found)
    events: list[LifecycleEvent] = []
    model = ScriptedModel("Half.", "Half.", "Half.")
    docs = agentrt.build(
        Docs, model=model, retrieval=Retrieval(retrievers=[retriever]), listeners=[events.append]
    )

    assert await docs.ask("dog fare?") == "Half."
    result = await docs.result("dog fare?")
    assert result.sources == tuple(reciprocal_rank_fusion([found]))
    assert result.sources[0].id == "pets#0"
    stream = await docs.stream("dog fare?")
    streamed = [event async for event in stream.events()]

    retrieved = [e for e in events if isinstance(e, Retrieved)]
    assert len(retrieved) == 3  # listeners, on all three views
    assert all(e.queries == ("dog fare?",) for e in retrieved)
    in_stream = [e for e in streamed if isinstance(e, Retrieved)]
    assert len(in_stream) == 1
    assert in_stream[0].contents == result.sources
    # before the first request's response: Started, Retrieved, RequestIssued, ...
    kinds = [type(e).__name__ for e in streamed]
    assert kinds.index("Retrieved") < kinds.index("RequestIssued") < kinds.index("TextDelta")
    final = await stream.result()
    assert final.sources == result.sources


async def test_memory_stores_the_users_message_not_the_augmented_one() -> None:
    store = InMemoryStore()
    retriever = Recording("faq", [Content("Wi-Fi is called LarkspurNet.", id="wifi#0")])
    model = ScriptedModel("It is LarkspurNet.", "You are welcome.")
    chat = agentrt.build(
        Chat,
        model=model,
        memory=window(max_messages=20, store=store),
        retrieval=Retrieval(retrievers=[retriever]),
    )

    await chat.chat("ada", "What is the Wi-Fi called?")
    await chat.chat("ada", "Thanks!")

    stored = await agentrt.memory.access(chat).read("ada")
    users = [m for m in stored if isinstance(m, UserMessage)]
    assert [m.text for m in users] == ["What is the Wi-Fi called?", "Thanks!"]
    # the model saw the augmented message, and the second turn's history has the plain one
    assert "LarkspurNet" in last_user_text(model, 0)
    history = model.requests[1].messages
    assert isinstance(history[0], UserMessage)
    assert history[0].text == "What is the Wi-Fi called?"
    assert "LarkspurNet" in last_user_text(model, 1)  # retrieved again for the new turn
    # the retriever saw the history of the conversation with the second query
    assert retriever.queries[1].history == tuple(stored[:2])
    assert retriever.queries[1].memory_id == "ada"


@pytest.mark.virtual_clock
async def test_two_retrievers_run_concurrently() -> None:
    slow_a = Recording("a", [Content("alpha", id="a")], delay=1.0)
    slow_b = Recording("b", [Content("beta", id="b")], delay=1.0)
    model = ScriptedModel("ok")
    docs = agentrt.build(Docs, model=model, retrieval=Retrieval(retrievers=[slow_a, slow_b]))

    start = anyio.current_time()
    result = await docs.result("q")
    elapsed = anyio.current_time() - start

    assert elapsed == pytest.approx(1.0, abs=0.05)  # not 2 s: the two ran at once
    assert {s.text for s in result.sources} == {"alpha", "beta"}
    assert slow_a.finished == slow_b.finished == 1


@pytest.mark.virtual_clock
async def test_cancelling_the_caller_during_retrieval_cancels_the_retrievers() -> None:
    store = InMemoryStore()
    hanging = Recording("slow", [Content("x")], delay=100.0)
    other = Recording("other", [Content("y")], delay=100.0)
    events: list[LifecycleEvent] = []
    model = ScriptedModel("never")
    chat = agentrt.build(
        Chat,
        model=model,
        memory=window(max_messages=10, store=store),
        retrieval=Retrieval(retrievers=[hanging, other]),
        listeners=[events.append],
    )

    with anyio.move_on_after(1.0) as scope:
        await chat.chat("ada", "hello")

    assert scope.cancelled_caught
    assert hanging.cancelled == other.cancelled == 1
    assert hanging.finished == other.finished == 0
    assert model.requests == []  # the model was never asked
    assert isinstance(events[-1], CancelledEvent)
    assert await agentrt.memory.access(chat).read("ada") == []
    # the conversation was released: the next turn runs
    hanging.delay = other.delay = 0
    model2 = ScriptedModel("hi")
    chat2 = agentrt.build(
        Chat,
        model=model2,
        memory=window(max_messages=10, store=store),
        retrieval=Retrieval(retrievers=[hanging]),
    )
    with anyio.fail_after(5):
        assert await chat2.chat("ada", "hello") == "hi"


@pytest.mark.virtual_clock
@pytest.mark.parametrize("view", ["ask", "stream"])
async def test_a_time_budget_that_runs_out_during_retrieval(view: str) -> None:
    slow = Recording("slow", [Content("x")], delay=10.0)
    model = ScriptedModel("never")
    docs = agentrt.build(Docs, model=model, retrieval=Retrieval(retrievers=[slow]), budget=Budget(seconds=2))

    start = anyio.current_time()
    call = docs.ask("q") if view == "ask" else docs.stream("q")
    with pytest.raises(BudgetExceededError) as caught:
        await call

    assert caught.value.limit == "seconds"
    assert anyio.current_time() - start == pytest.approx(2.0, abs=0.05)
    assert slow.cancelled == 1
    assert model.requests == []


@pytest.mark.virtual_clock
async def test_a_retriever_past_its_timeout_fails_the_call_or_is_skipped() -> None:
    slow = Recording("slow", [Content("late")], delay=5.0)
    quick = Recording("quick", [Content("on time", id="q")])
    model = ScriptedModel("ok")
    failing = agentrt.build(Docs, model=model, retrieval=Retrieval(retrievers=[slow, quick], timeout=1.0))

    start = anyio.current_time()
    with pytest.raises(RetrievalError) as caught:
        await failing.ask("q")
    assert caught.value.retriever == "slow"
    assert "within 1.0 s" in str(caught.value)
    assert anyio.current_time() - start == pytest.approx(1.0, abs=0.05)
    assert model.requests == []

    events: list[LifecycleEvent] = []
    skipping = agentrt.build(
        Docs,
        model=model,
        retrieval=Retrieval(retrievers=[slow, quick], timeout=1.0, on_error="skip"),
        listeners=[events.append],
    )
    result = await skipping.result("q")
    assert [s.text for s in result.sources] == ["on time"]
    assert "on time" in last_user_text(model) and "late" not in last_user_text(model)
    (retrieved,) = [e for e in events if isinstance(e, Retrieved)]
    assert retrieved.skipped == (Skipped("slow", "q", "timeout"),)


async def test_a_failing_retriever_is_a_retrieval_error_with_its_cause() -> None:
    broken = Recording("index", [], error=OSError("index file missing"))
    model = ScriptedModel("never")
    docs = agentrt.build(Docs, model=model, retrieval=Retrieval(retrievers=[broken]))

    with pytest.raises(RetrievalError) as caught:
        await docs.ask("q")
    assert caught.value.retriever == "index"
    assert isinstance(caught.value.__cause__, OSError)
    assert "index file missing" not in str(caught.value)  # the cause's text stays in the cause
    assert model.requests == []

    skipping = agentrt.build(
        Docs, model=ScriptedModel("fine"), retrieval=Retrieval(retrievers=[broken], on_error="skip")
    )
    result = await skipping.result("q")
    assert result.value == "fine" and result.sources == ()


async def test_when_predicate_transformer_and_router() -> None:
    fares = Recording("fares", [Content("A dog costs half.", id="f1"), Content("Bikes cost 5.", id="f2")])
    rules = Recording(
        "rules", [Content("Dogs wear muzzles.", id="r1"), Content("A dog costs half.", id="f1")]
    )

    def transformer(query: Query) -> list[str]:
        return [f"{query.text} price", f"{query.text} rules"]

    def router(query: Query) -> list[object]:
        return [fares] if query.text.endswith("price") else [rules]

    model = ScriptedModel("a", "b")
    config = Retrieval(
        retrievers=[fares, rules],
        transformer=transformer,
        router=router,
        when=lambda query: not query.text.startswith("hi"),
    )
    docs = agentrt.build(Docs, model=model, retrieval=config)

    result = await docs.result("dog")
    assert [q.text for q in fares.queries] == ["dog price"]
    assert [q.text for q in rules.queries] == ["dog rules"]
    # fused by rank: f1 is in both lists, so first
    assert [s.id for s in result.sources] == ["f1", "r1", "f2"]

    plain = await docs.result("hi there")  # `when` says no: nothing retrieved, the message as it is
    assert plain.sources == ()
    assert last_user_text(model) == "hi there"
    assert len(fares.queries) == 1


def test_reciprocal_rank_fusion() -> None:
    a, b, c = Content("a", id="a"), Content("b", id="b"), Content("c", id="c")
    fused = reciprocal_rank_fusion([[a, b, c], [c, b]], k=1)
    # a: 1/2; b: 1/3 + 1/3; c: 1/4 + 1/2
    assert [x.id for x in fused] == ["c", "b", "a"]
    assert fused[0].score == pytest.approx(0.75)
    assert reciprocal_rank_fusion([]) == []
    # one list: as it is, with the retriever's own scores (repeats dropped)
    scored = [
        Content("a", score=7.5, id="a"),
        Content("b", score=2.0, id="b"),
        Content("a2", score=1.0, id="a"),
    ]
    assert reciprocal_rank_fusion([scored]) == scored[:2]


async def test_the_injector_sends_user_text_and_contents_literally() -> None:
    tricky = Recording("docs", [Content("See {{message}} and {{contents}}.", {"page": 3})])
    model = ScriptedModel("ok")
    docs = agentrt.build(
        Docs,
        model=model,
        retrieval=Retrieval(
            retrievers=[tricky], injector=inject("Q: {{message}}\nDocs:\n{{contents}}", metadata=["page"])
        ),
    )

    await docs.ask("what is {{contents}}?")

    assert (
        last_user_text(model) == "Q: what is {{contents}}?\nDocs:\nSee {{message}} and {{contents}}.\npage: 3"
    )


async def test_attachments_stay_in_the_augmented_message() -> None:
    class Vision:
        async def look(self, picture: agentrt.ImageContent, question: str) -> str: ...

    image = agentrt.ImageContent(url="https://example.invalid/cat.png")
    model = ScriptedModel("a cat")
    service = agentrt.build(
        Vision, model=model, retrieval=Retrieval(retrievers=[Recording("d", [Content("Cats purr.")])])
    )
    await service.look(image, "what is it?")
    sent = model.requests[0].messages[-1]
    assert isinstance(sent, UserMessage)
    assert isinstance(sent.contents[0], TextContent) and "Cats purr." in sent.contents[0].text
    assert image in sent.contents


async def test_retrieval_per_method_and_off() -> None:
    build_level = Recording("build", [Content("from the build")])
    own = Recording("own", [Content("from the method")])

    class Mixed:
        @retrieval(Retrieval(retrievers=[own]))
        async def special(self, question: str) -> str: ...

        @retrieval(None)
        async def plain(self, question: str) -> str: ...

        async def default(self, question: str) -> str: ...

    model = ScriptedModel("1", "2", "3")
    service = agentrt.build(Mixed, model=model, retrieval=Retrieval(retrievers=[build_level]))
    await service.special("q")
    await service.plain("q")
    await service.default("q")
    assert "from the method" in last_user_text(model, 0)
    assert last_user_text(model, 1) == "q"
    assert "from the build" in last_user_text(model, 2)
    assert len(own.queries) == 1 and len(build_level.queries) == 1


async def test_retriever_tool() -> None:
    retriever = BM25Retriever(corpus(), k=2)
    model = ScriptedModel(
        [CallTool("search_documents", {"query": "wireless network name"})], "It is LarkspurNet."
    )
    docs = agentrt.build(Docs, model=model, tools=[retriever_tool(retriever, metadata=["source"])])

    result = await docs.result("What is the Wi-Fi called?")

    assert result.value == "It is LarkspurNet."
    (execution,) = result.tool_executions
    assert execution.name == "search_documents"
    tool_result = model.requests[1].messages[-1]
    assert isinstance(tool_result, agentrt.ToolResultMessage)
    assert tool_result.text.startswith("[1] ")
    assert "LarkspurNet" in tool_result.text and "source: wifi.md" in tool_result.text
    spec = model.requests[0].tools[0]
    assert spec.name == "search_documents"
    assert list(spec.parameters["properties"]) == ["query"]  # the context is injected, not offered


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Retrieval(), "give retrievers"),
        (lambda: Retrieval(retrievers=[object()]), "is not a retriever"),
        (lambda: Retrieval(retrievers=[Recording("a", [])], max_results=0), "max_results"),
        (lambda: Retrieval(retrievers=[Recording("a", [])], timeout=-1), "timeout"),
        (lambda: Retrieval(retrievers=[Recording("a", [])], on_error="ignore"), "on_error"),  # type: ignore[arg-type]
        (lambda: inject("{{message}} only"), "needs {{contents}}"),
        (lambda: inject("{{message}} {{contents}} {{other}}"), "takes {{message}} and {{contents}}"),
        (lambda: agentrt.build(Docs, model=ScriptedModel(), retrieval="docs"), "retrieval must be"),  # type: ignore[arg-type]
    ],
)
def test_configuration_errors(make: Any, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        make()


async def test_a_retriever_returning_the_wrong_type_is_a_retrieval_error() -> None:
    async def bad(query: Query) -> Any:
        return ["not a Content"]

    docs = agentrt.build(Docs, model=ScriptedModel("x"), retrieval=Retrieval(retrievers=[bad]))
    with pytest.raises(RetrievalError) as caught:
        await docs.ask("q")
    assert isinstance(caught.value.__cause__, TypeError)


async def test_a_compressing_transformer_makes_a_follow_up_stand_alone() -> None:
    helper = ScriptedModel("How much does a dog ticket cost?")
    retriever = Recording("fares", [Content("Dogs travel at half fare.", id="f")])
    model = ScriptedModel("Dogs may travel.", "Half fare.")
    chat = agentrt.build(
        Chat,
        model=model,
        memory=window(max_messages=20),
        retrieval=Retrieval(retrievers=[retriever], transformer=compressing_transformer(helper)),
    )

    await chat.chat("ada", "Can my dog come?")
    await chat.chat("ada", "How much is it?")

    # the first turn has no history: used as it is, no request
    assert [q.text for q in retriever.queries] == ["Can my dog come?", "How much does a dog ticket cost?"]
    (request,) = helper.requests
    transcript = request.messages[-1].text
    assert transcript.splitlines() == [
        "user: Can my dog come?",
        "assistant: Dogs may travel.",
        "user: How much is it?",
    ]
    # the model is asked the user's own question, augmented
    assert last_user_text(model).startswith("How much is it?\n\n")


async def test_an_expanding_transformer_runs_every_phrasing() -> None:
    helper = ScriptedModel("- dog fare\n\n* price for a dog\ndog fare\n")
    retriever = Recording("fares", [Content("Dogs travel at half fare.", id="f")])
    docs = agentrt.build(
        Docs,
        model=ScriptedModel("Half."),
        retrieval=Retrieval(retrievers=[retriever], transformer=expanding_transformer(helper, n=3)),
    )
    result = await docs.result("how much for my dog")
    assert sorted(q.text for q in retriever.queries) == sorted(
        ["how much for my dog", "dog fare", "price for a dog"]
    )
    assert [s.id for s in result.sources] == ["f"]  # found three times, injected once
    assert "3 different phrasings" in helper.requests[0].messages[0].text


async def test_a_failing_transformer_is_a_retrieval_error() -> None:
    helper = ScriptedModel()  # no scripted answer: the request fails
    docs = agentrt.build(
        Docs,
        model=ScriptedModel("never"),
        retrieval=Retrieval(retrievers=[Recording("a", [])], transformer=expanding_transformer(helper)),
    )
    with pytest.raises(RetrievalError) as caught:
        await docs.ask("q")
    assert caught.value.retriever == "transformer"


# --- services whose answers cite sources, and a retriever of one content ------------------------------------


class CitedDocs:
    async def ask(self, question: str) -> agentrt.Result[str]: ...

    async def stream(self, question: str) -> TokenStream: ...


class StreamingChat:
    async def chat(self, conversation: Annotated[str, MemoryId], question: str) -> str: ...

    async def stream(self, conversation: Annotated[str, MemoryId], question: str) -> TokenStream: ...


async def pets(query: Query) -> list[Content]:
    return [Content("Dogs travel at half fare.", {"source": "pets.md"}, 1.0, "pets#0")]


# --- a `when`, aggregator, injector or retriever that fails or returns junk is a RetrievalError -------------


@pytest.mark.virtual_clock
async def test_an_async_when_predicate_is_awaited_or_refused() -> None:
    async def never(query: Query) -> bool:
        return False

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the un-awaited coroutine, today
        try:
            retrieval = Retrieval(retrievers=[pets], when=never)  # type: ignore[arg-type]
        except ConfigurationError:
            return  # refused at definition: fine too
        docs = agentrt.build(CitedDocs, model=ScriptedModel("ok"), retrieval=retrieval)
        result = await docs.ask("hello")
        gc.collect()
    assert result.sources == ()  # `when` said no


def _raise(error: Exception) -> Any:
    def fail(*args: object) -> Any:
        raise error

    return fail


async def _content_without_text(query: Query) -> list[Content]:
    return [Content(None)]  # type: ignore[arg-type]


@pytest.mark.virtual_clock
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
    docs = agentrt.build(CitedDocs, model=model, retrieval=Retrieval(**options))
    with pytest.raises(RetrievalError):
        await docs.ask("hello")
    assert model.requests == []


# --- budgets during retrieval, no queries, a guardrail's rewrite --------------------------------------------


@pytest.mark.virtual_clock
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
        StreamingChat,
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
        StreamingChat,
        model=ScriptedModel("hi"),
        memory=window(max_messages=10, store=store),
        retrieval=Retrieval(retrievers=[pets]),
    )
    with anyio.fail_after(5):
        assert await chat2.chat("ada", "second") == "hi"


@pytest.mark.virtual_clock
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
        CitedDocs,
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


@pytest.mark.virtual_clock
async def test_retrieval_sees_the_guardrails_rewrite_and_memory_keeps_it_unaugmented() -> None:
    # Regression (input guardrail rewriting + retrieval + memory + moderation): the retriever and the
    # moderation model see the rewritten text; the model sees it augmented; memory stores the
    # rewritten text without the contents.
    asked: list[str] = []
    judged: list[str] = []

    async def recording(query: Query) -> list[Content]:
        asked.append(query.text)
        return [Content("Dogs travel at half fare.", id="pets#0")]

    class RecordingJudge:
        name = "judge"

        async def moderate(self, texts: Sequence[str]) -> list[Moderation]:
            judged.extend(texts)
            return [Moderation("bad" in text, {"hate": "bad" in text}) for text in texts]

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
        moderation_model=RecordingJudge(),
    )
    assert await service.chat("ada", "dog fare? my-secret") == "Half fare."
    assert asked == judged == ["dog fare? [redacted]"]
    sent = model.requests[0].messages[-1]
    assert isinstance(sent, UserMessage)
    assert sent.text.startswith("dog fare? [redacted]") and "half fare" in sent.text
    stored = await agentrt.memory.access(service).read("ada")
    assert [m.text for m in stored] == ["dog fare? [redacted]", "Half fare."]
