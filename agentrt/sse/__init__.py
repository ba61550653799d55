"""Serving a streaming service method over Server-Sent Events (Starlette, FastAPI).

`endpoint(service.method, ...)` is a Starlette endpoint (`async (request) -> response`): the request's
JSON body is validated against the method's parameters (a pydantic model made from its signature,
without the memory id and option parameters), the memory id comes from the `memory_id` resolver, and
the invocation's events go out as SSE events through sse-starlette's `EventSourceResponse`:

| event | data |
|---|---|
| `token` | `{"text": ...}`, a text delta |
| `thinking` | `{"text": ...}`, only with `thinking=True` |
| `tool_call` | `{"id", "name"}` (and `"arguments"` with `tool_details=True`) |
| `tool_result` | `{"id", "name", "outcome"}` (and `"result"` with `tool_details=True`) |
| `reset` | `{"reason", "attempt"}`: discard the text shown so far |
| `retrieved` | `{"queries", "sources": [{"id", "text", "metadata", "score"}]}`: what retrieval injected |
| `guardrail` | `{"guardrail", "kind", "verdict", "attempt"}` |
| `done` | the `Result`: text, value (as JSON), usage, finish reason, tool executions, sources, attempts |
| `approval_required` | `{"run_id", "calls": [{"id", "name", "arguments"}], "expires_at"}` (not `done`) |
| `error` | `{"type", "message"}`: the error's type and a fixed, safe message (the error itself is logged) |

`approval_required` ends a turn that stopped before tool calls that wait for a human's decision.

Every event has an `id` (1, 2, ...; `{run_id}:{seq}` for an endpoint with a run manager, see
`agentrt.runs`). `EVENTS` maps each event's name to the shape of its data (a
`TypedDict`), and `event_schema()` gives their JSON schemas.

Errors before the model accepted the request (a bad body, an input guardrail, a rate limit, an
exceeded context, a busy conversation) are HTTP error responses with a JSON body
`{"error": {"type", "message"}}` (and `Retry-After` for 429), not a 200 stream. A client that
disconnects cancels the invocation: sse-starlette cancels the task that reads it, which closes the
model stream; the turn is stored if and only if the answer's final event was written to the
connection before the server learned that the client was gone (see `_response`).
With a run manager (`runs=`), a run may instead go on without its client
(`on_disconnect="detach"`), and a client resumes it with `Last-Event-ID`.

A turn that stopped for approval is resumed over the same endpoint: a request whose body is only
`{"approval": {"run_id": ..., "decisions": {"<call id>": {"approve": true} | {"approve": true,
"arguments": {...}} | {"approve": false, "reason": ...}}}}` goes on with the turn `run_id` of the
request's conversation (the `memory_id` resolver's, as for any request), and streams what follows
as any request does (the decided calls' `tool_result`, the answer, `done` or another
`approval_required`). A run that is not pending on that conversation (unknown, resumed already,
another's) is a 404 `approval_not_found`; decisions that do not fit its calls (one missing, one for
a call it did not ask about, an edit the tool's schema refuses) a 400 `approval_decision`, and
nothing runs; a new message on a conversation whose turn waits is a 409 `approval_pending` that
carries the pending turn (`run_id`, `calls`, `expires_at`). The client protocols resume in their
own way (see `endpoint`).

`stream_response(stream, ...)` is the lower-level part: the SSE response for a `TokenStream` (or
`PartialStream`) the caller already has.

The package's modules: `_endpoint` (`endpoint`: its options, its protocol, its routes), `_handler`
(a request, step by step), `_wire` (what a protocol is) and one module a protocol (`_native`,
`_vercel`, `_agui`: its request and its encoder), `_encoder` (what their encoders share),
`_response` (the response loop of every protocol, and a stop), `_runs` (a run's log: written as the
response goes, read by a resume), `_errors` (errors as a client is told of them).
"""

from ._endpoint import Endpoint, Protocol, endpoint
from ._errors import ERROR_TYPES
from ._native import EVENTS, event_schema, result_json
from ._response import stream_response

__all__ = [
    "ERROR_TYPES",
    "EVENTS",
    "Endpoint",
    "Protocol",
    "endpoint",
    "event_schema",
    "result_json",
    "stream_response",
]
