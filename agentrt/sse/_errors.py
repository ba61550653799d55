"""Errors as a client is told of them: a stable code, an HTTP status and a fixed message per kind
(`classify`, `ERROR_TYPES`), the JSON of an `error` event or of an HTTP error's body (`error_json`),
and the HTTP error responses of a request refused before its stream (`refusal`, `error_response`,
`invalid`; `Refused` carries one out of the request's handling).
"""

from __future__ import annotations

import logging
import math
import typing
from typing import Any, Final

from starlette.responses import JSONResponse

from .._errors import (
    AgentError,
    ApprovalDecisionError,
    ApprovalNotFoundError,
    ApprovalPendingError,
    BudgetExceededError,
    ChatMemoryError,
    ContentRefusedError,
    ContextLengthExceededError,
    ConversationBusyError,
    InputGuardrailError,
    ModelConnectionError,
    ModelError,
    ModelTimeoutError,
    ModerationError,
    ModerationFailedError,
    OutputGuardrailError,
    OutputParsingError,
    OverloadedError,
    RateLimitError,
    RetrievalError,
    ServerError,
    ToolError,
    ToolLoopLimitError,
)
from ._encoder import approval_json

if typing.TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from pydantic import ValidationError
    from starlette.requests import Request
    from starlette.responses import Response

    from .._spec import MethodSpec

logger = logging.getLogger("agentrt")
_T = typing.TypeVar("_T")

# What a client is told of an error: a stable code, an HTTP status (for an error before the stream)
# and a fixed message per kind, never the exception's own text (which may carry a tool's data, a
# provider's body or a key fragment) nor its class name. The error itself goes to the log. First match.
_SAFE: Final[tuple[tuple[type[BaseException], str, int, str], ...]] = (
    (InputGuardrailError, "input_refused", 400, "the request was refused by an input guardrail"),
    (ModerationFailedError, "moderation_unavailable", 503, "the request could not be moderated"),
    (ModerationError, "moderated", 400, "the request was refused by moderation"),
    (RetrievalError, "retrieval_failed", 502, "the documents could not be searched"),
    (OutputGuardrailError, "output_refused", 502, "the answer was refused by an output guardrail"),
    (ContextLengthExceededError, "context_length_exceeded", 400, "the conversation is too long"),
    (RateLimitError, "rate_limited", 429, "the model is rate limited; try again later"),
    (ConversationBusyError, "conversation_busy", 409, "the conversation is busy with another request"),
    (BudgetExceededError, "budget_exceeded", 400, "the request's budget was exhausted"),
    (ContentRefusedError, "content_refused", 502, "the model refused to answer"),
    (OverloadedError, "model_unavailable", 503, "the model is overloaded; try again later"),
    (ModelConnectionError, "model_unavailable", 502, "the model could not be reached"),
    (ModelTimeoutError, "model_unavailable", 502, "the model could not be reached"),
    (ServerError, "model_unavailable", 502, "the model could not be reached"),
    (ModelError, "model_error", 502, "the model failed the request"),
    (OutputParsingError, "output_invalid", 502, "the model's answer could not be read"),
    (ToolError, "tool_failed", 502, "a tool failed"),
    (ToolLoopLimitError, "tool_loop_limit", 502, "the model called tools past the limit"),
    (ChatMemoryError, "memory_unavailable", 503, "the conversation could not be loaded or stored"),
    (ApprovalNotFoundError, "approval_not_found", 404, "no turn of this conversation waits as that run"),
    (ApprovalDecisionError, "approval_decision", 400, "the decisions do not fit the pending tool calls"),
    (ApprovalPendingError, "approval_pending", 409, "the conversation waits for a decision on tool calls"),
    (AgentError, "agent_error", 500, "the service failed"),
)
ERROR_TYPES: Final[tuple[str, ...]] = (
    *dict.fromkeys(code for _, code, _, _ in _SAFE),
    "internal_error",
    "invalid_request",
    "unsupported_media_type",
    "body_too_large",
    "no_conversation",
    "memory_id_failed",
    "not_resumable",
    "run_not_found",
    "run_in_progress",
    "run_exists",
    "bad_event_id",
    "no_run",
    "run_expired",
    "run_lost",
    "run_truncated",
    "runs_unavailable",
)
"""Every `type` an error (an `error` event, or the body of an HTTP error) can have."""


def classify(error: BaseException) -> tuple[str, int, str]:
    """The code, HTTP status and safe message of an error."""
    if isinstance(error, BudgetExceededError):
        if isinstance(error.__cause__, ConversationBusyError):  # the time ran out waiting for it
            error = error.__cause__
        elif error.limit == "seconds":
            return "budget_exceeded", 504, "the request's time budget ran out"
    for kind, code, status, message in _SAFE:
        if isinstance(error, kind):
            return code, status, message
    return "internal_error", 500, "internal error"


def error_json(error: BaseException) -> dict[str, Any]:
    code, _, message = classify(error)
    data = {"type": code, "message": message}
    if code == "budget_exceeded" and isinstance(error, BudgetExceededError):
        data["limit"] = error.limit
    elif code == "approval_pending" and isinstance(error, ApprovalPendingError):
        data.update(approval_json(error.approval))  # the user's own turn, to decide on
    return data


def refusal(status: int, kind: str, message: str) -> JSONResponse:
    return JSONResponse({"error": {"type": kind, "message": message}}, status_code=status)


def error_response(spec: MethodSpec, error: Exception) -> JSONResponse:
    """An error before the stream started, as an HTTP error. The log record carries the error
    itself (a `ModelError`'s text names the upstream status, endpoint and request id), and for a
    5xx its traceback: this runs after the `except` block, so the error is passed explicitly."""
    code, status, _ = classify(error)
    logger.log(
        logging.WARNING if status < 500 else logging.ERROR,
        "agentrt.sse: %s failed before its stream (%d %s): %s: %s",
        spec.qualname,
        status,
        code,
        type(error).__name__,
        error,
        exc_info=error if status >= 500 else None,
    )
    headers = {}
    if isinstance(error, RateLimitError) and error.retry_after is not None:
        headers["Retry-After"] = str(max(1, math.ceil(error.retry_after)))
    return JSONResponse({"error": error_json(error)}, status_code=status, headers=headers)


def invalid(error: ValidationError, prefix: tuple[str | int, ...] = ()) -> JSONResponse:
    problems = error.errors(include_url=False, include_context=False, include_input=False)
    return JSONResponse(
        {
            "error": {"type": "invalid_request", "message": "the request body is invalid"},
            "detail": [{**problem, "loc": [*prefix, *problem["loc"]]} for problem in problems],
        },
        status_code=422,
    )


def invalid_at(where: tuple[str | int, ...], message: str) -> JSONResponse:
    return JSONResponse(
        {
            "error": {"type": "invalid_request", "message": "the request body is invalid"},
            "detail": [{"type": "value_error", "loc": list(where), "msg": message}],
        },
        status_code=422,
    )


class Refused(Exception):
    """A request refused before its stream, with the error response that says why."""

    def __init__(self, response: Response) -> None:
        super().__init__(response.status_code)
        self.response = response


def answering_refusals(
    route: Callable[[Request], Awaitable[Response]],
) -> Callable[[Request], Awaitable[Response]]:
    """`route`, a `Refused` raised in it answered with its JSON error (a run log's failure, deep in
    the request's handling: see `from_log`)."""

    async def answering(request: Request) -> Response:
        try:
            return await route(request)
        except Refused as refused:
            return refused.response

    answering.__name__, answering.__qualname__, answering.__doc__ = (
        route.__name__,
        route.__qualname__,
        route.__doc__,
    )
    return answering


async def from_log(spec: MethodSpec, call: Awaitable[_T], *, opening: bool = False) -> _T:
    """A call of the run log; its failure (Redis down, say) refuses the request with a 503
    `runs_unavailable`, logged. `opening`: the call is `open`, whose `ValueError` says that the run is
    in the log already (an AG-UI client's run id, opened since the endpoint looked): a 409."""
    try:
        return await call
    except Exception as error:
        if opening and isinstance(error, ValueError):
            raise Refused(
                refusal(409, "run_exists", "a run with this id was started already; name a new one")
            ) from None
        logger.error(
            "agentrt.sse: %s: the run log failed: %s: %s",
            spec.qualname,
            type(error).__name__,
            error,
            exc_info=error,
        )
        raise Refused(
            refusal(503, "runs_unavailable", "the run log is unavailable; try again later")
        ) from None
