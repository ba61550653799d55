"""Calling a built service type-checks against the stubs (mypy --strict, as users run it)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from typecheck import mypy


@pytest.mark.xdist_group("mypy")  # one cache: the first run analyses agentrt, the others reuse it
def test_built_service_methods_type_check_against_their_stubs(tmp_path: Path, mypy_cache: Path) -> None:
    source = textwrap.dedent(
        """
        from __future__ import annotations

        import agentrt
        from agentrt.testing import ScriptedModel
        from examples.support import Support, Ticket


        async def use() -> None:
            support = agentrt.build(Support, model=ScriptedModel())
            answer: str = (await support.chat("user-1", "hi")).value
            ticket: Ticket = (await support.ticket("Bern to Basel")).value
            result = await support.chat("user-1", "hi")
            usage: int = result.usage.total_tokens
            async for token in await support.stream("user-1", "hi"):
                print(token.upper())
            wrong: int = (await support.chat("user-1", "hi")).value  # line 17
            await support.chat("user-1")  # line 18
        """
    )
    target = tmp_path / "use_support.py"
    target.write_text(source)

    stdout, status = mypy(target, mypy_cache)

    errors = [line for line in stdout.splitlines() if ": error:" in line]
    assert status == 1
    assert len(errors) == 2, stdout
    assert ":17: error: Incompatible types in assignment" in errors[0]
    assert ':18: error: Missing positional argument "question"' in errors[1]


@pytest.mark.xdist_group("mypy")  # one cache: the first run analyses agentrt, the others reuse it
def test_every_callback_that_may_be_async_type_checks_as_async(tmp_path: Path, mypy_cache: Path) -> None:
    source = textwrap.dedent(
        """
        from __future__ import annotations

        from collections.abc import Iterable

        import agentrt
        from agentrt.testing import ScriptedModel
        from agentrt.tools import ToolFailure
        from agentrt import ToolSettings


        class Chat:
            async def chat(self, question: str) -> str:
                raise NotImplementedError


        async def system(memory_id: object) -> str | None:
            return f"You talk to {memory_id}."


        def sync_system(memory_id: object) -> str:
            return "Be brief."


        async def provide(request: agentrt.ToolRequest) -> Iterable[object]:
            return []


        async def on_error(failure: ToolFailure) -> str:
            return f"{failure.tool} failed"


        def build() -> None:
            agentrt.build(Chat, model=ScriptedModel(), system_message=system)
            agentrt.build(Chat, model=ScriptedModel(), system_message=sync_system)
            agentrt.build(
                Chat,
                model=ScriptedModel(),
                tool_provider=provide,
                tool_settings=ToolSettings(on_error=on_error),
            )
        """
    )
    target = tmp_path / "use_callbacks.py"
    target.write_text(source)

    stdout, status = mypy(target, mypy_cache)

    assert status == 0, stdout


@pytest.mark.xdist_group("mypy")  # one cache: the first run analyses agentrt, the others reuse it
def test_a_model_of_name_capabilities_and_stream_is_a_chat_model_with_declared_fields(
    tmp_path: Path, mypy_cache: Path
) -> None:
    # A user's model needs these three members only; what it says of itself is typed data in its
    # capabilities (the pipeline reads no optional attribute).
    source = textwrap.dedent(
        """
        from __future__ import annotations

        from collections.abc import AsyncIterator

        import agentrt
        from agentrt import Capabilities, ChatModel, ModelRequest, TextDelta


        class Mine:
            name = "mine"
            capabilities = Capabilities(handles_deadline=True, provider="acme", min_max_tokens=16)

            async def stream(self, request: ModelRequest) -> AsyncIterator[agentrt.models.ModelChunk]:
                yield TextDelta("hi")


        class Chat:
            async def ask(self, question: str) -> str:
                raise NotImplementedError


        model: ChatModel = Mine()
        service = agentrt.build(Chat, model=Mine())
        deadline: bool = model.capabilities.handles_deadline
        provider: str | None = model.capabilities.provider
        least: int | None = model.capabilities.min_max_tokens
        temperature: float | None = model.capabilities.fixed_temperature
        wrong: str = model.capabilities.handles_deadline  # line 29
        """
    )
    target = tmp_path / "use_model.py"
    target.write_text(source)

    stdout, status = mypy(target, mypy_cache)

    errors = [line for line in stdout.splitlines() if ": error:" in line]
    assert status == 1
    assert len(errors) == 1, stdout
    assert ":29: error: Incompatible types in assignment" in errors[0]
