"""`make demo`: await, stream and Result on one declared service.

For now the demo runs on agentrt's scripted test model (no network, no model server), and says so.
"""

from __future__ import annotations

import anyio

import agentrt
from agentrt.models import Usage
from agentrt.testing import ScriptedModel

from .support import Support, Ticket


def scripted_model() -> ScriptedModel:
    return ScriptedModel(
        ["Order SO-2026-0001 ", "left our warehouse ", "yesterday.", Usage(41, 9)],
        '{"origin": "Bern", "destination": "Basel"}',
        ["It ", "should ", "arrive ", "on ", "Friday.", Usage(58, 5)],
        ["You're welcome!", Usage(70, 3)],
        name="scripted-demo",
    )


async def main() -> None:
    model = scripted_model()
    print("agentrt demo: running on the SCRIPTED test model (agentrt.testing.ScriptedModel).")
    print("Its answers are canned; no model server is contacted.\n")
    support = agentrt.build(Support, model=model, variables={"shop": "Acme Rail"})

    answer: str = await support.chat("user-42", "Where is order SO-2026-0001?")
    print(f"await support.chat(...)   -> {answer!r}")

    ticket: Ticket = await support.ticket("I need to get from Bern to Basel on Friday.")
    print(f"await support.ticket(...) -> {ticket!r}")

    print("async for token in await support.stream(...):")
    stream = await support.stream("user-42", "When will it arrive?")
    async for token in stream:
        print(f"    token {token!r}")
    streamed = await stream.result()
    print(f"    final Result: text={streamed.text!r} usage={streamed.usage}")

    result = await support.chat_result("user-42", "Thanks!")
    print(f"await support.chat_result(...) -> value={result.value!r}")
    print(f"    finish_reason={result.finish_reason} usage={result.usage} model={result.model!r}")

    print("\nWhat the model received (the transcript of the first request):")
    for message in model.requests[0].messages:
        print(f"    {message.role:9} {message.model_dump(exclude={'role'})}")


if __name__ == "__main__":
    anyio.run(main)
