"""Retrieval and moderation over `agentrt.sse.endpoint`: the `retrieved` event (and Vercel's
`source-document` parts), a flagged request as an HTTP error before any stream, a flagged answer as
an `error` event with no token before it."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Annotated, Any

import anyio
import httpx
import pytest
from pydantic import BaseModel, TypeAdapter
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.routing import Route

import agentrt
import agentrt.sse
from agentrt import Budget, MemoryId, PartialStream, TokenStream
from agentrt.moderation import Moderation, moderate
from agentrt.rag import Content, Query, Retrieval
from agentrt.testing import Hang, ScriptedModel


class Judge:
    name = "judge"

    def __init__(self, *bad: str) -> None:
        self.bad = bad

    async def moderate(self, texts: Sequence[str]) -> list[Moderation]:
        return [
            Moderation(any(b in t for b in self.bad), {"hate": any(b in t for b in self.bad)}) for t in texts
        ]


async def handbook(query: Query) -> list[Content]:
    return [
        Content("Dogs travel at half fare.", {"source": "pets.md", "page": 2}, 1.5, "pets#0"),
        Content("Bikes cost 5 euros.", {"source": "bicycles.md"}, 0.5, "bicycles#0"),
    ]


class Desk:
    async def chat(self, conversation: Annotated[str, MemoryId], question: str) -> TokenStream: ...

    @moderate
    async def moderated(self, conversation: Annotated[str, MemoryId], question: str) -> TokenStream: ...

    @moderate(answer=True)
    async def checked(self, conversation: Annotated[str, MemoryId], question: str) -> TokenStream: ...


def user(request: Request) -> str:
    return "ada"


def parse_sse(text: str) -> list[dict[str, Any]]:
    events = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        fields: dict[str, Any] = {}
        for line in block.split("\n"):
            if line and not line.startswith(":"):
                name, _, value = line.partition(":")
                fields[name] = value[1:] if value.startswith(" ") else value
        if "data" in fields:
            fields["data"] = json.loads(fields["data"])
            events.append(fields)
    return events


def client(handler: Any) -> httpx.AsyncClient:
    app = Starlette(routes=[Route("/chat", handler, methods=["POST"])])
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")


def service(model: ScriptedModel) -> Desk:
    return agentrt.build(
        Desk,
        model=model,
        memory=agentrt.memory.window(),
        retrieval=Retrieval(retrievers=[handbook]),
        moderation_model=Judge("hate"),
    )


async def test_the_retrieved_event_comes_before_the_tokens() -> None:
    svc = service(ScriptedModel(["Half ", "fare."]))
    async with client(agentrt.sse.endpoint(svc.chat, memory_id=user)) as http:
        response = await http.post("/chat", json={"question": "dog fare?"})
    events = parse_sse(response.text)
    assert [e["event"] for e in events] == ["retrieved", "token", "token", "done"]
    retrieved = events[0]["data"]
    assert retrieved == {
        "queries": ["dog fare?"],
        "sources": [
            {
                "id": "pets#0",
                "text": "Dogs travel at half fare.",
                "metadata": {"source": "pets.md", "page": 2},
                "score": retrieved["sources"][0]["score"],
            },
            {
                "id": "bicycles#0",
                "text": "Bikes cost 5 euros.",
                "metadata": {"source": "bicycles.md"},
                "score": retrieved["sources"][1]["score"],
            },
        ],
    }
    # the shape its schema says
    TypeAdapter(agentrt.sse.EVENTS["retrieved"]).validate_python(retrieved, strict=True)


async def test_the_done_event_has_the_result_s_sources() -> None:
    svc = service(ScriptedModel(["Half ", "fare."]))
    async with client(agentrt.sse.endpoint(svc.chat, memory_id=user)) as http:
        response = await http.post("/chat", json={"question": "dog fare?"})
    events = parse_sse(response.text)
    retrieved, done = events[0]["data"], events[-1]["data"]
    assert events[-1]["event"] == "done"
    # What `Result.sources` has, as the `retrieved` event sent it: a client that joins late, or
    # keeps only the result, still knows what the answer was grounded on.
    assert done["sources"] == retrieved["sources"]
    assert [s["id"] for s in done["sources"]] == ["pets#0", "bicycles#0"]
    TypeAdapter(agentrt.sse.EVENTS["done"]).validate_python(done, strict=True)


async def test_ag_ui_s_result_has_the_sources_without_their_text() -> None:
    svc = service(ScriptedModel(["Half fare."]))
    handler = agentrt.sse.endpoint(svc.chat, memory_id=user, protocol="ag-ui")
    body = {"threadId": "t", "runId": "r", "messages": [{"id": "u1", "role": "user", "content": "dog fare?"}]}
    async with client(handler) as http:
        response = await http.post("/chat", json=body)
    frames = [json.loads(f[6:]) for f in response.text.split("\n\n") if f.startswith("data: ")]
    [custom] = [f for f in frames if f["type"] == "CUSTOM"]
    finished = frames[-1]
    assert finished["type"] == "RUN_FINISHED"
    assert (
        finished["result"]["sources"]
        == custom["value"]
        == [
            {"sourceId": "pets#0", "title": "pets.md", "filename": "pets.md"},
            {"sourceId": "bicycles#0", "title": "bicycles.md", "filename": "bicycles.md"},
        ]
    )
    assert "Dogs travel" not in response.text


async def test_vercel_clients_get_source_document_parts_without_the_text() -> None:
    svc = service(ScriptedModel(["Half fare."]))
    handler = agentrt.sse.endpoint(svc.chat, memory_id=user, protocol="vercel-ui")
    body = {
        "id": "chat-1",
        "messages": [{"id": "u1", "role": "user", "parts": [{"type": "text", "text": "dog fare?"}]}],
        "trigger": "submit-message",
    }
    async with client(handler) as http:
        response = await http.post("/chat", json=body)
    frames = [f[6:] for f in response.text.split("\n\n") if f.startswith("data: ")]
    chunks = [json.loads(f) for f in frames if f != "[DONE]"]
    sources = [c for c in chunks if c["type"] == "source-document"]
    assert sources == [
        {
            "type": "source-document",
            "sourceId": "pets#0",
            "mediaType": "text/plain",
            "title": "pets.md",
            "filename": "pets.md",
        },
        {
            "type": "source-document",
            "sourceId": "bicycles#0",
            "mediaType": "text/plain",
            "title": "bicycles.md",
            "filename": "bicycles.md",
        },
    ]
    assert chunks.index(sources[0]) < [c["type"] for c in chunks].index("text-start")
    assert "Dogs travel" not in response.text


async def test_a_flagged_request_is_refused_before_any_stream_and_closes_the_model() -> None:
    model = ScriptedModel(["I ", Hang()])
    svc = service(model)
    # The model hangs after its first chunk: without the flag's cancellation the request would never
    # end, so it is bounded (a failure, not a hung suite).
    with anyio.fail_after(10):
        async with client(agentrt.sse.endpoint(svc.moderated, memory_id=user)) as http:
            response = await http.post("/chat", json={"question": "hate speech please"})
    assert response.status_code == 400
    assert response.json() == {
        "error": {"type": "moderated", "message": "the request was refused by moderation"}
    }
    assert model.streams[0].closed and not model.streams[0].completed
    assert await agentrt.memory.access(svc).read("ada") == []


async def test_a_flagged_answer_is_an_error_event_with_no_token_before_it() -> None:
    svc = service(ScriptedModel(["So much ", "hate."]))
    async with client(agentrt.sse.endpoint(svc.checked, memory_id=user)) as http:
        response = await http.post("/chat", json={"question": "tell me"})
    events = parse_sse(response.text)
    assert [e["event"] for e in events] == ["retrieved", "error"]
    assert events[-1]["data"] == {"type": "moderated", "message": "the request was refused by moderation"}
    assert "hate" not in response.text
    assert await agentrt.memory.access(svc).read("ada") == []


# --- services and bodies of every protocol ------------------------------------------------------------------


class Answer(BaseModel):
    answer: str


class Docs:
    async def ask(self, question: str) -> agentrt.Result[str]: ...

    async def stream(self, question: str) -> TokenStream: ...


async def pets(query: Query) -> list[Content]:
    return [Content("Dogs travel at half fare.", {"source": "pets.md"}, 1.0, "pets#0")]


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


# --- a flagged request is refused before any stream, on every protocol --------------------------------------


class SlowJudge(Judge):
    """`Judge`, with verdicts that take `delay` seconds (virtual time)."""

    def __init__(self, *bad: str, delay: float) -> None:
        super().__init__(*bad)
        self.delay = delay

    async def moderate(self, texts: Sequence[str]) -> list[Moderation]:
        await anyio.sleep(self.delay)
        return await super().moderate(texts)


@pytest.mark.virtual_clock
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
        Desk,
        model=model,
        moderation_model=SlowJudge("bad", delay=2.0),
        retrieval=Retrieval(retrievers=[pets]),
    )
    handler = agentrt.sse.endpoint(getattr(service, method), protocol=protocol)
    async with client(handler) as http:
        response = await http.post("/chat", json=protocol_body(protocol, "bad words"))
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "moderated"
    assert "SECRET" not in response.text and "Dogs travel" not in response.text
    assert model.streams[0].closed


# --- retrieved contents over SSE: odd metadata, AG-UI sources, errors before the stream ---------------------


@pytest.mark.virtual_clock
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


@pytest.mark.virtual_clock
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


@pytest.mark.virtual_clock
async def test_ag_ui_clients_get_the_sources() -> None:
    service = agentrt.build(Docs, model=ScriptedModel("Half."), retrieval=Retrieval(retrievers=[pets]))
    handler = agentrt.sse.endpoint(service.stream, protocol="ag-ui")
    async with client(handler) as http:
        response = await http.post("/chat", json=protocol_body("ag-ui", "dog fare?"))
    assert response.status_code == 200
    assert "pets#0" in response.text  # e.g. a CUSTOM event, or the sources in RUN_FINISHED


@pytest.mark.virtual_clock
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
