"""`OpenAIModerationModel` (`/v1/moderations`) against a scripted endpoint answering with the bytes
OpenAI sends."""

from __future__ import annotations

import logging
from typing import Any

import anyio
import httpx
import orjson
import pytest
from cassettes import load
from json_server import SERVER_ERROR, Body, Script, check_error, echoing_key, key_shown, rate_limited, respond

import agentrt
import agentrt.moderation
from agentrt import (
    AuthenticationError,
    BadRequestError,
    ModelError,
    ModelNotFoundError,
    ModelResponseError,
    ModerationError,
    RateLimitError,
    ServerError,
    TokenStream,
)
from agentrt.models import RetryPolicy
from agentrt.models.openai import OpenAIChatModel
from agentrt.moderation._types import Moderation, ModerationModel
from agentrt.moderation.openai import OpenAIModerationModel

KEY = "sk-proj-MODERATE-9a2b7c1d4f"
BASE = "https://api.openai.test/v1"
HEADERS = {
    "content-type": "application/json",
    "openai-organization": "user-3xkq7xj0pxqk2sdtq0bgyvjm",
    "openai-processing-ms": "143",
    "openai-version": "2020-10-01",
    "x-request-id": "req_3e4b5c6d7e8f90a1b2c3d4e5f6a7b8c9",
}

# omni-moderation-latest on a threat (flagged) and on a harmless sentence, as OpenAI writes it: every
# category, in the API's own order, with its score and the input types it applies to.
CATEGORIES = [
    "harassment",
    "harassment/threatening",
    "sexual",
    "hate",
    "hate/threatening",
    "illicit",
    "illicit/violent",
    "self-harm/intent",
    "self-harm/instructions",
    "self-harm",
    "sexual/minors",
    "violence",
    "violence/graphic",
]
THREAT_FLAGS = {"harassment": True, "harassment/threatening": True, "violence": True}
THREAT_SCORES = [
    "0.8189693396524808",
    "0.804985420696006",
    "1.0261470426059549e-05",
    "0.003924965567176531",
    "0.0008040406006713217",
    "0.0004149787105039909",
    "0.0006137493930399993",
    "0.0001916628669061586",
    "2.1907786922264303e-06",
    "0.00017561136999999998",
    "8.139692624947503e-07",
    "0.9045401364278955",
    "0.0006637557238713358",
]
HARMLESS_SCORES = [
    "4.450850519411503e-08",
    "1.602810987828144e-07",
    "1.4738981974494932e-06",
    "6.339210403977636e-07",
    "4.450850519411503e-08",
    "2.97731143841062e-06",
    "2.4682904407607285e-06",
    "2.72647027069593e-07",
    "8.059446204294678e-08",
    "2.4439928455892955e-07",
    "1.602810987828144e-07",
    "4.495181578513688e-07",
    "3.726639284186561e-07",
]
TEXT_AND_IMAGE = {
    "sexual",
    "self-harm/intent",
    "self-harm/instructions",
    "self-harm",
    "violence",
    "violence/graphic",
}


def input_types(category: str) -> str:
    kinds = ["text", "image"] if category in TEXT_AND_IMAGE else ["text"]
    return "[\n" + ",\n".join(f'          "{kind}"' for kind in kinds) + "\n        ]"


def result(flags: dict[str, bool], scores: list[str]) -> str:
    def block(name: str, lines: list[str]) -> str:
        return f'      "{name}": {{\n' + ",\n".join(lines) + "\n      }"

    flagged = "true" if any(flags.values()) else "false"
    return (
        "    {\n"
        f'      "flagged": {flagged},\n'
        + block("categories", [f'        "{c}": {str(flags.get(c, False)).lower()}' for c in CATEGORIES])
        + ",\n"
        + block("category_scores", [f'        "{c}": {s}' for c, s in zip(CATEGORIES, scores, strict=True)])
        + ",\n"
        + block(
            "category_applied_input_types",
            [f'        "{c}": {input_types(c)}' for c in CATEGORIES],
        )
        + "\n    }"
    )


def answer(*results: str) -> bytes:
    return (
        "{\n"
        '  "id": "modr-970d409ef3bef3b70c73d8232df86e7d",\n'
        '  "model": "omni-moderation-latest",\n'
        '  "results": [\n' + ",\n".join(results) + "\n  ]\n"
        "}\n"
    ).encode()


THREAT = result(THREAT_FLAGS, THREAT_SCORES)
HARMLESS = result({}, HARMLESS_SCORES)


async def moderate(script: Script, texts: list[str], **options: Any) -> list[Moderation]:
    options.setdefault("api_key", KEY)
    async with httpx.AsyncClient(transport=script.transport()) as client:
        model = OpenAIModerationModel(base_url=BASE, client=client, **options)
        return await model.moderate(texts)


# --- the request and the answer ---------------------------------------------------------------------


async def test_the_request_is_byte_exact_and_every_category_is_typed() -> None:
    script = Script(respond(answer(THREAT, HARMLESS), headers=HEADERS))
    verdicts = await moderate(script, ["I am going to hurt you.", "I would like a cup of tea."])
    [request] = script.requests
    assert request.method == "POST"
    assert str(request.url) == "https://api.openai.test/v1/moderations"
    assert request.content == (
        b'{"model":"omni-moderation-latest","input":["I am going to hurt you.","I would like a cup of tea."]}'
    )
    assert request.headers["authorization"] == f"Bearer {KEY}"
    assert request.headers["content-type"] == "application/json"
    assert script.bodies[0].closed

    threat, harmless = verdicts
    assert threat.flagged
    assert threat.model == "omni-moderation-latest"
    assert list(threat.categories) == CATEGORIES  # the provider's names, in its order
    assert dict(threat.categories) == {c: c in THREAT_FLAGS for c in CATEGORIES}
    assert threat.flagged_categories == ("harassment", "harassment/threatening", "violence")
    assert dict(threat.scores) == {c: float(s) for c, s in zip(CATEGORIES, THREAT_SCORES, strict=True)}
    assert threat.scores["violence"] == 0.9045401364278955
    assert all(type(score) is float for score in threat.scores.values())
    assert not harmless.flagged
    assert harmless.flagged_categories == ()
    assert harmless.scores["hate/threatening"] == 4.450850519411503e-08
    with pytest.raises(TypeError):
        threat.categories["violence"] = False  # type: ignore[index]


async def test_an_older_text_model_without_some_categories() -> None:
    # text-moderation-latest sends `null` for the categories it does not judge.
    body = {
        "id": "modr-8fc1e6d2e0a64fd39a5d0e3c5e6b7a10",
        "model": "text-moderation-007",
        "results": [
            {
                "flagged": False,
                "categories": {"sexual": False, "hate": False, "illicit": None, "violence": False},
                "category_scores": {"sexual": 1.2e-05, "hate": 3e-06, "illicit": None, "violence": 0},
            }
        ],
    }
    [verdict] = await moderate(Script(respond(body)), ["hello"], model="text-moderation-latest")
    assert dict(verdict.categories) == {"sexual": False, "hate": False, "violence": False}
    assert dict(verdict.scores) == {"sexual": 1.2e-05, "hate": 3e-06, "violence": 0.0}
    assert all(type(score) is float for score in verdict.scores.values())
    assert verdict.model == "text-moderation-007"


async def test_no_texts_make_no_request_and_one_str_is_refused() -> None:
    script = Script(respond(answer(HARMLESS)))
    assert await moderate(script, []) == []
    with pytest.raises(TypeError):
        await moderate(script, "one text")  # type: ignore[arg-type]
    assert script.requests == []


async def test_the_model_implements_the_protocol_and_shows_no_key() -> None:
    model = OpenAIModerationModel(base_url=BASE, api_key=KEY)
    assert isinstance(model, ModerationModel)
    assert model.name == "omni-moderation-latest"
    assert repr(model) == (
        "OpenAIModerationModel(model='omni-moderation-latest', endpoint='https://api.openai.test/v1/moderations')"
    )
    assert KEY not in repr(model) + repr(vars(model))
    await model.aclose()


# --- retries ----------------------------------------------------------------------------------------


RATE_LIMITED = rate_limited("omni-moderation-latest")


@pytest.mark.virtual_clock
async def test_a_429_is_retried_after_its_retry_after() -> None:
    script = Script(
        respond(RATE_LIMITED, 429, {"retry-after": "3"}), respond(answer(HARMLESS), headers=HEADERS)
    )
    [verdict] = await moderate(script, ["hello"])
    assert not verdict.flagged
    assert script.waits == [pytest.approx(3.0)]
    assert script.requests[0].content == script.requests[1].content


@pytest.mark.virtual_clock
async def test_server_errors_are_retried_then_raised() -> None:
    script = Script(lambda request: respond(SERVER_ERROR, 500))
    with pytest.raises(ServerError):
        await moderate(script, ["hello"], retry=RetryPolicy(max_attempts=3, initial_delay=1, jitter=0))
    assert script.waits == [pytest.approx(1.0), pytest.approx(2.0)]


@pytest.mark.virtual_clock
async def test_nothing_is_retried_after_a_2xx() -> None:
    script = Script(lambda request: respond(b'{"id": "modr-1", "results": []}'))
    with pytest.raises(ModelResponseError):
        await moderate(script, ["hello"])
    assert len(script.requests) == 1


# --- errors -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "body", "kind"),
    [
        (400, load("35").body, BadRequestError),
        (401, load("37").body, AuthenticationError),
        (404, load("38").body, ModelNotFoundError),
        (429, RATE_LIMITED, RateLimitError),
        (500, SERVER_ERROR, ServerError),
    ],
)
async def test_error_statuses_map_to_their_kinds(status: int, body: bytes, kind: type[ModelError]) -> None:
    errors: list[Any] = []
    script = Script(respond(body, status, {"x-request-id": "req_e1"}))
    with pytest.raises(kind) as info:
        await moderate(script, ["hello"], retry=RetryPolicy.never(), on_error=errors.append)
    check_error(info.value, kind, body, status=status, endpoint=f"{BASE}/moderations", reported=errors)


async def test_the_key_reaches_no_error_no_event_and_no_log(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    events: list[Any] = []
    script = Script(echoing_key(KEY))
    with pytest.raises(AuthenticationError) as info:
        await moderate(script, ["hello"], on_request=events.append, on_error=events.append)
    assert script.requests[0].headers["authorization"] == f"Bearer {KEY}"  # sent, only there
    assert info.value.message == "Incorrect API key provided: ***."
    assert key_shown(KEY, info.value, caplog.text, *events) == []


# --- cancellation -----------------------------------------------------------------------------------


@pytest.mark.virtual_clock
async def test_cancelling_while_the_answer_arrives_closes_the_response() -> None:
    script = Script(respond(b'{\n  "id": "modr-1",\n  "results": [', hang=True))
    async with httpx.AsyncClient(transport=script.transport()) as client:
        model = OpenAIModerationModel(base_url=BASE, client=client)
        with anyio.move_on_after(5) as scope:
            await model.moderate(["hello"])
        # No await between the cancellation unwinding and this line: closed within the same turn.
        [body] = script.bodies
        assert body.closed
    assert scope.cancelled_caught


# --- malformed answers ------------------------------------------------------------------------------


def verdict(**fields: Any) -> dict[str, Any]:
    return {"flagged": False, "categories": {"hate": False}, "category_scores": {"hate": 0.1}, **fields}


@pytest.mark.parametrize(
    ("body", "found"),
    [
        (b"", "not JSON"),
        (b'"ok"', "the response is a string, not an object"),
        (b'{"id": "modr-1", "model": "omni-moderation-latest"}', "`results` is null, not a list"),
        (orjson.dumps({"results": [verdict()]}), "1 results for 2 inputs"),
        (orjson.dumps({"results": [verdict(), 1]}), "a result is a number, not an object"),
        (orjson.dumps({"results": [verdict(), verdict(flagged="no")]}), "`flagged` is a string"),
        (orjson.dumps({"results": [verdict(), verdict(categories=[])]}), "`categories` is a list"),
        (orjson.dumps({"results": [verdict(), verdict(categories={"hate": 1})]}), "flag is a number"),
        (
            orjson.dumps({"results": [verdict(), verdict(category_scores={"hate": "0.1"})]}),
            "score is a string, not a number",
        ),
        (
            orjson.dumps({"results": [verdict(), verdict(category_scores={"hate": True})]}),
            "score is a boolean",
        ),
    ],
)
async def test_malformed_answers_are_response_errors(body: bytes, found: str) -> None:
    errors: list[Any] = []
    script = Script(lambda request: respond(body))
    with pytest.raises(ModelResponseError) as info:
        await moderate(script, ["a", "b"], on_error=errors.append)
    assert found in str(info.value)
    assert info.value.body == (body.decode() or None)
    assert [event.error for event in errors] == [info.value]
    assert len(script.requests) == 1


async def test_an_error_object_in_a_2xx_answer_is_raised_as_its_kind() -> None:
    body = b'{"error": {"message": "The server is overloaded", "type": "server_error"}}'
    with pytest.raises(ServerError):
        await moderate(Script(respond(body)), ["a"])


# --- a flag closes the chat response of the OpenAI adapter --------------------------------------------------


@agentrt.moderation.moderate
class Moderated:
    async def ask(self, question: str) -> str: ...

    async def stream(self, question: str) -> TokenStream: ...


@pytest.mark.virtual_clock
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
