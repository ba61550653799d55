"""A budget of N allows exactly N: N tool calls, N model requests, N output tokens, N input tokens.

Each limit is tried at N (the call succeeds, everything ran) and at N + 1 (the call stops with
`BudgetExceededError` naming the limit, before the step that would pass it). Off-by-one errors in the
account (`>` for `>=`) fail one side or the other. Token counts are the pipeline's estimate (about four
characters a token, never fewer tokens than deltas) unless the model reports usage. The output-token
limit is tried on every path a response streams through: awaited, a plain stream, and streams whose
output guardrails release text by each policy (`buffer`, `chunked`, `optimistic`).
"""

from __future__ import annotations

from typing import Any

import pytest

import agentrt
from agentrt import Budget, BudgetExceededError, TokenStream, Usage, tool
from agentrt.guardrails import GuardrailResult, OutputGuardrailRequest, output_guardrails, success
from agentrt.testing import CallTool, ScriptedModel


class Chat:
    async def ask(self, question: str) -> str: ...

    async def stream(self, question: str) -> TokenStream: ...


class Counter:
    def __init__(self) -> None:
        self.ran: list[str] = []

    @tool("Look up.")
    async def lookup(self, query: str) -> str:
        self.ran.append(query)
        return "ok"


async def call(service: Any, view: str, question: str = "q") -> str:
    if view.startswith("await"):
        text: str = await service.ask(question)
        return text
    async with await service.stream(question) as tokens:
        return "".join([token async for token in tokens])


VIEWS = ["await", "stream"]
# Views whose methods have an output guardrail (that passes everything), by release policy.
GUARDED = ["await:buffer", "stream:buffer", "stream:chunked", "stream:optimistic"]


class Pass:
    partial_text = True
    name = "pass"

    def validate(self, request: OutputGuardrailRequest) -> GuardrailResult:
        return success()


def chat(view: str) -> type:
    """The service class for `view`: `Chat`, or one whose methods release text by a policy."""
    if ":" not in view:
        return Chat
    release: Any = view.partition(":")[2]
    if view.startswith("await"):

        class Awaited:
            @output_guardrails(Pass(), release=release)
            async def ask(self, question: str) -> str: ...

        return Awaited

    class Streamed:
        @output_guardrails(Pass(), release=release)
        async def stream(self, question: str) -> TokenStream: ...

    return Streamed


def rounds(n: int, *, parallel: bool = False) -> list[Any]:
    """A script of `n` tool calls (one round each, or one round of all), then the answer."""
    if parallel:
        return [[CallTool("lookup", {"query": str(i)}, id=f"c{i}") for i in range(n)], "done"]
    return [[CallTool("lookup", {"query": str(i)}, id=f"c{i}")] for i in range(n)] + ["done"]


@pytest.mark.parametrize("view", VIEWS)
@pytest.mark.parametrize("parallel", [False, True], ids=["rounds", "one-round"])
async def test_a_budget_of_n_tool_calls_allows_exactly_n(view: str, parallel: bool) -> None:
    for n in (1, 3):
        counter = Counter()
        model = ScriptedModel(*rounds(n, parallel=parallel))
        service = agentrt.build(Chat, model=model, tools=[counter], budget=Budget(tool_calls=n))
        assert await call(service, view) == "done"
        assert len(counter.ran) == n

        counter = Counter()
        service = agentrt.build(
            Chat,
            model=ScriptedModel(*rounds(n + 1, parallel=parallel)),
            tools=[counter],
            budget=Budget(tool_calls=n),
        )
        with pytest.raises(BudgetExceededError) as info:
            await call(service, view)
        assert info.value.limit == "tool_calls"
        assert len(counter.ran) == (0 if parallel else n)  # the call past the limit never ran
        assert info.value.partial.spent is not None
        assert info.value.partial.spent.tool_calls == len(counter.ran)


@pytest.mark.parametrize("view", VIEWS)
async def test_a_budget_of_n_model_requests_allows_exactly_n(view: str) -> None:
    for n in (1, 3):
        model = ScriptedModel(*rounds(n - 1))
        service = agentrt.build(Chat, model=model, tools=[Counter()], budget=Budget(model_requests=n))
        assert await call(service, view) == "done"
        assert len(model.requests) == n

        model = ScriptedModel(*rounds(n))
        service = agentrt.build(Chat, model=model, tools=[Counter()], budget=Budget(model_requests=n))
        with pytest.raises(BudgetExceededError) as info:
            await call(service, view)
        assert info.value.limit == "model_requests"
        assert len(model.requests) == n  # the request past the limit was not sent
        assert info.value.partial.spent is not None
        assert info.value.partial.spent.model_requests == n


@pytest.mark.parametrize("view", VIEWS + GUARDED)
@pytest.mark.parametrize("delta", [1, 4, 8])
async def test_a_budget_of_n_output_tokens_allows_exactly_n_estimated(view: str, delta: int) -> None:
    n = 16
    # Deltas of `delta` characters: a delta spends at least one token, else a token per 4 characters.
    per_delta = max(1, delta // 4)
    fits = n // per_delta  # deltas that take exactly n tokens
    model = ScriptedModel(["x" * delta] * fits)
    service = agentrt.build(chat(view), model=model, budget=Budget(output_tokens=n))
    assert await call(service, view) == "x" * delta * fits

    model = ScriptedModel(["x" * delta] * (fits + 1))
    service = agentrt.build(chat(view), model=model, budget=Budget(output_tokens=n))
    with pytest.raises(BudgetExceededError) as info:
        await call(service, view)
    assert info.value.limit == "output_tokens"
    spent = info.value.partial.spent
    assert spent is not None
    # What the error reports agrees with the limit it names: past it, by the delta that passed it.
    assert spent.output_tokens == n + per_delta
    assert info.value.partial.usage.output_tokens == spent.output_tokens
    assert model.streams[0].closed and not model.streams[0].completed


@pytest.mark.parametrize("view", VIEWS + GUARDED)
async def test_a_budget_of_n_output_tokens_allows_exactly_n_reported(view: str) -> None:
    model = ScriptedModel(["ok", Usage(3, 10)])
    service = agentrt.build(chat(view), model=model, budget=Budget(output_tokens=10))
    assert await call(service, view) == "ok"

    model = ScriptedModel(["ok", Usage(3, 11)])
    service = agentrt.build(chat(view), model=model, budget=Budget(output_tokens=10))
    with pytest.raises(BudgetExceededError) as info:
        await call(service, view)
    assert info.value.limit == "output_tokens"
    assert info.value.partial.usage.output_tokens == 11


@pytest.mark.parametrize("view", VIEWS)
async def test_a_request_larger_than_the_input_token_budget_is_never_sent(view: str) -> None:
    question = "word " * 160  # 800 characters: about 200 tokens
    model = ScriptedModel("never")
    service = agentrt.build(Chat, model=model, budget=Budget(input_tokens=10))
    with pytest.raises(BudgetExceededError) as info:
        await call(service, view, question)
    assert info.value.limit == "input_tokens"
    assert model.requests == []  # not sent, not paid for
    assert info.value.partial.usage == Usage()


@pytest.mark.parametrize("view", VIEWS)
async def test_a_budget_of_n_input_tokens_allows_a_request_of_exactly_n(view: str) -> None:
    n = 50
    model = ScriptedModel("ok")
    service = agentrt.build(Chat, model=model, budget=Budget(input_tokens=n))
    assert await call(service, view, "x" * (4 * n)) == "ok"  # estimated at exactly n tokens

    model = ScriptedModel("ok")
    service = agentrt.build(Chat, model=model, budget=Budget(input_tokens=n))
    with pytest.raises(BudgetExceededError) as info:
        await call(service, view, "x" * (4 * n + 1))  # n + 1 tokens
    assert info.value.limit == "input_tokens"
    assert model.requests == []


@pytest.mark.parametrize("view", VIEWS)
async def test_an_input_token_budget_counts_what_earlier_requests_spent(view: str) -> None:
    # The first request reports 30 input tokens; the second, with the tool's result, would take
    # the account past 40 by its own estimate: it is not sent.
    model = ScriptedModel([CallTool("lookup", {"query": "a"}), Usage(30, 2)], "never")
    counter = Counter()
    service = agentrt.build(Chat, model=model, tools=[counter], budget=Budget(input_tokens=40))
    with pytest.raises(BudgetExceededError) as info:
        await call(service, view, "x" * 40)
    assert info.value.limit == "input_tokens"
    assert len(model.requests) == 1
    assert counter.ran == ["a"]
