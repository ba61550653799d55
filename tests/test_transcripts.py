"""Acceptance 1: what a service sends the model, exactly, for each way of declaring prompts."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel

import agentrt
from agentrt import (
    ImageContent,
    MemoryId,
    ModelSettings,
    SystemMessage,
    TemplateName,
    TextContent,
    UserMessage,
    system_message,
    user_message,
)
from agentrt.models import JsonSchemaFormat
from agentrt.testing import ScriptedModel


@system_message("You are a support assistant for {{shop}}.")
class Support:
    async def chat(self, conversation: Annotated[str, MemoryId], question: str) -> str: ...

    @system_message("You translate into {{language}}.")
    @user_message("Translate: {{text}}")
    async def translate(self, text: str, language: str) -> str: ...

    @user_message("Summarize in one line: {{it}}")
    async def summarize(self, document: str) -> str: ...

    @user_message("Tell me about {{topic}} for {{audience}}.")
    async def explain(
        self,
        subject: Annotated[str, TemplateName("topic")],
        audience: Annotated[str, TemplateName("audience")],
    ) -> str: ...

    @user_message("What is in this picture, {{name}}?")
    async def describe(self, name: str, photo: ImageContent) -> str: ...


async def test_class_system_message_with_build_variables_and_plain_user_message() -> None:
    model = ScriptedModel("ok")
    support = agentrt.build(Support, model=model, variables={"shop": "Acme"})

    assert await support.chat("user-42", "Where is my order?") == "ok"

    assert model.requests[0].messages == (
        SystemMessage(text="You are a support assistant for Acme."),
        UserMessage(contents=(TextContent(text="Where is my order?"),)),
    )


async def test_method_system_message_wins_over_class_and_sees_method_variables() -> None:
    model = ScriptedModel("Hallo")
    support = agentrt.build(Support, model=model, variables={"shop": "Acme"})

    await support.translate("Hello", language="German")

    assert model.requests[0].messages == (
        SystemMessage(text="You translate into German."),
        UserMessage.of("Translate: Hello"),
    )


async def test_it_names_the_only_parameter() -> None:
    model = ScriptedModel("short")
    support = agentrt.build(Support, model=model, variables={"shop": "Acme"})

    await support.summarize("A long document.")

    assert model.requests[0].messages[-1] == UserMessage.of("Summarize in one line: A long document.")


async def test_v_renames_parameters_for_templates() -> None:
    model = ScriptedModel("...")
    support = agentrt.build(Support, model=model, variables={"shop": "Acme"})

    await support.explain("tides", audience="children")

    assert model.requests[0].messages[-1] == UserMessage.of("Tell me about tides for children.")


async def test_content_parameters_attach_to_the_user_message_after_the_text() -> None:
    model = ScriptedModel("a cat")
    support = agentrt.build(Support, model=model, variables={"shop": "Acme"})
    photo = ImageContent.from_bytes(b"\x89PNG...", "image/png")

    await support.describe("Ada", photo)

    assert model.requests[0].messages[-1] == UserMessage(
        contents=(TextContent(text="What is in this picture, Ada?"), photo)
    )


async def test_values_are_sent_literally_and_never_rendered_again() -> None:
    model = ScriptedModel("a", "b")
    support = agentrt.build(Support, model=model, variables={"shop": "{{shop}} Inc"})

    await support.chat("c", "What does {{shop}} mean? {{ it }}")
    await support.translate("{{language}}", language="{{text}}")

    assert model.requests[0].messages == (
        SystemMessage(text="You are a support assistant for {{shop}} Inc."),
        UserMessage.of("What does {{shop}} mean? {{ it }}"),
    )
    assert model.requests[1].messages == (
        SystemMessage(text="You translate into {{text}}."),
        UserMessage.of("Translate: {{language}}"),
    )


class Plain:
    """Any class of stubs can be built: no base class."""

    async def ask(self, conversation: Annotated[int, MemoryId], question: str) -> str: ...


async def test_system_message_provider_gets_the_memory_id_and_its_text_is_literal() -> None:
    seen: list[object] = []

    def provider(memory_id: object) -> str:
        seen.append(memory_id)
        return f"Conversation {memory_id}: {{{{not a template}}}}"

    model = ScriptedModel("fine")
    plain = agentrt.build(Plain, model=model, system_message=provider)

    await plain.ask(7, "Hi")

    assert seen == [7]
    assert model.requests[0].messages == (
        SystemMessage(text="Conversation 7: {{not a template}}"),
        UserMessage.of("Hi"),
    )


async def test_async_system_message_provider_and_provider_ranks_below_class_message() -> None:
    async def provider(memory_id: object) -> str:
        return "from the provider"

    model = ScriptedModel("x", "y")
    plain = agentrt.build(Plain, model=model, system_message=provider)
    support = agentrt.build(Support, model=model, system_message=provider, variables={"shop": "Acme"})

    await plain.ask(1, "a")
    await support.chat("c", "b")

    assert model.requests[0].messages[0] == SystemMessage(text="from the provider")
    assert model.requests[1].messages[0] == SystemMessage(text="You are a support assistant for Acme.")


async def test_a_provider_returning_none_sends_no_system_message() -> None:
    model = ScriptedModel("x")
    plain = agentrt.build(Plain, model=model, system_message=lambda memory_id: None)

    await plain.ask(1, "a")

    assert model.requests[0].messages == (UserMessage.of("a"),)


class Ticket(BaseModel):
    origin: str
    destination: str


class Extractor:
    @user_message("Extract the train ticket from: {{it}}")
    async def ticket(self, text: str) -> Ticket: ...


async def test_pydantic_return_asks_for_a_json_schema_when_the_model_supports_it() -> None:
    model = ScriptedModel('{"origin": "Bern", "destination": "Basel"}')
    extractor = agentrt.build(Extractor, model=model, settings=ModelSettings(temperature=0))

    ticket = await extractor.ticket("Bern to Basel, tomorrow")

    assert ticket == Ticket(origin="Bern", destination="Basel")
    request = model.requests[0]
    assert request.response_format == JsonSchemaFormat(name="Ticket", schema=Ticket.model_json_schema())
    assert request.settings == ModelSettings(temperature=0)
    assert request.messages == (UserMessage.of("Extract the train ticket from: Bern to Basel, tomorrow"),)


async def test_pydantic_return_appends_format_instructions_without_the_capability() -> None:
    model = ScriptedModel(
        'Sure! ```json\n{"origin": "Bern", "destination": "Basel"}\n```',
        capabilities=agentrt.Capabilities(json_schema=False),
    )
    extractor = agentrt.build(Extractor, model=model)

    assert await extractor.ticket("Bern to Basel") == Ticket(origin="Bern", destination="Basel")

    request = model.requests[0]
    assert request.response_format is None
    (message,) = request.messages
    assert isinstance(message, UserMessage)
    first, instructions = message.text.split("\n", 1)
    assert first == "Extract the train ticket from: Bern to Basel"
    assert instructions.startswith("You must answer strictly with a JSON object")
    assert '"origin"' in instructions and '"destination"' in instructions
