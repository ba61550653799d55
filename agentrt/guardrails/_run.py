"""Running guardrail chains over a turn."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from .._errors import InputGuardrailError
from .._events import GuardrailVerdict
from .._messages import TextContent, UserMessage
from ._declare import InputGuardrailRequest
from ._results import NO_VALUE, Verdict

if TYPE_CHECKING:
    from collections.abc import Callable

    from .._messages import ChatMessage
    from ._declare import Guardrail

__all__ = ["run_input", "with_text"]


def with_text(message: UserMessage, text: str) -> UserMessage:
    """`message` with its text replaced by `text` (in place of its first text part; attachments kept)."""
    contents: list[object] = []
    placed = False
    for content in message.contents:
        if isinstance(content, TextContent):
            if not placed:
                contents.append(TextContent(text=text))
                placed = True
        else:
            contents.append(content)
    if not placed:
        contents.insert(0, TextContent(text=text))
    return message.model_copy(update={"contents": tuple(contents)})


async def run_input(
    chain: tuple[Guardrail, ...],
    user: UserMessage,
    *,
    invocation_id: str,
    method: str,
    memory_id: object,
    history: tuple[ChatMessage, ...],
    report: Callable[[GuardrailVerdict], None],
) -> UserMessage:
    """Run the input chain over `user`; the user message it leaves (rewritten by `success_with`).

    `InputGuardrailError` with every failure once the chain ends (or at a `fatal`)."""
    request = InputGuardrailRequest(user, method, memory_id, history)
    failures: list[GuardrailVerdict] = []
    for guardrail in chain:
        started = time.perf_counter()
        result = await guardrail.check(request)
        verdict = result.verdict
        if verdict in (Verdict.RETRY, Verdict.REPROMPT):
            raise TypeError(
                f"{method}: input guardrail {guardrail.name} answered {verdict.value}; only output "
                "guardrails can ask the model again (use failure or fatal)"
            )
        if verdict is Verdict.SUCCESS_WITH and result.value is not NO_VALUE:
            raise TypeError(
                f"{method}: input guardrail {guardrail.name} gave a value; only output guardrails can"
            )
        event = GuardrailVerdict(
            invocation_id,
            guardrail.name,
            "input",
            verdict.value,
            result.message,
            time.perf_counter() - started,
        )
        report(event)
        if verdict is Verdict.SUCCESS_WITH:
            assert result.text is not None
            request = InputGuardrailRequest(
                with_text(request.user_message, result.text), method, memory_id, history
            )
        elif verdict is Verdict.FAILURE:
            failures.append(event)
        elif verdict is Verdict.FATAL:
            failures.append(event)
            break
    if failures:
        said = "; ".join(f"{f.guardrail}: {f.message}" for f in failures)
        raise InputGuardrailError(
            f"{method}: the input guardrails refused the user message ({said})", failures=tuple(failures)
        )
    return request.user_message
