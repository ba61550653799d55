"""An endpoint's requests (`Handler`, one per `endpoint(...)`): a request read by its protocol, its
conversation resolved, the method called (or a waiting turn resumed), and its response; a run
stopped (`stop`) or resumed from its log (`resume_run`). Each step is a method of its own.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import typing
from typing import Any

import anyio
import orjson
from pydantic import ValidationError
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.responses import JSONResponse, Response

from .._budget import Budget
from .._options import call_options
from .._pipeline._turn import DEFER_COMMIT
from .._resume import resume
from ..memory._memory import memory_key
from ..runs import RunLog, RunRecord
from . import _runs
from ._encoder import Sent
from ._errors import Refused, error_response, from_log, invalid, invalid_at, refusal
from ._request import StopRequest, cancel_on_disconnect, is_json, read_body
from ._response import Run, respond, stream_response
from ._wire import Undecidable, Unreadable

if typing.TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from starlette.requests import Request

    from .._spec import MethodSpec
    from .._stream import PartialStream, TokenStream
    from ._encoder import Encoder
    from ._runs import Disconnect
    from ._wire import Asked, Wire

logger = logging.getLogger("agentrt")


class Handler:
    """The requests of one endpoint: `handle` (a `POST`), `resume_get` and `stop`, and the runs it
    streams itself (`local`: without a run manager, and those not yet handed to it)."""

    __slots__ = (
        "budget",
        "local",
        "max_body",
        "memory_id",
        "method",
        "on_disconnect",
        "ping",
        "runs",
        "send_timeout",
        "settings",
        "spec",
        "takes_thread",
        "wire",
    )

    def __init__(
        self,
        method: Callable[..., Awaitable[TokenStream | PartialStream[Any]]],
        wire: Wire,
        *,
        memory_id: Callable[..., Any] | None,
        budget: Budget | None,
        ping: float | None,
        send_timeout: float | None,
        max_body: int,
        on_disconnect: Disconnect,
    ) -> None:
        self.method = method
        self.wire = wire
        self.settings = wire.settings
        self.spec = wire.settings.spec
        self.runs = wire.settings.runs
        self.memory_id = memory_id
        self.takes_thread = memory_id is not None and _positional_arity(memory_id) >= 2
        self.budget = budget
        self.ping = ping
        self.send_timeout = send_timeout
        self.max_body = max_body
        self.on_disconnect = on_disconnect
        self.local: dict[tuple[Any, str], Run] = {}

    async def owner_of(self, request: Request, thread: str | None) -> Any:
        """The request's memory id, from the resolver. Raises `Refused` for a resolver that failed
        or named no conversation; an exception the app handles itself (an `HTTPException`) goes on."""
        spec = self.spec
        if spec.memory_param is None:
            return None
        memory_id = self.memory_id
        assert memory_id is not None
        try:
            conversation = memory_id(request, thread) if self.takes_thread else memory_id(request)
            if inspect.isawaitable(conversation):
                conversation = await conversation
        except Exception as error:
            if _handled_by_app(request, error):
                raise
            logger.error(
                "agentrt.sse: %s: the memory_id resolver failed: %s: %s",
                spec.qualname,
                type(error).__name__,
                error,
                exc_info=error,
            )
            raise Refused(
                refusal(500, "memory_id_failed", "the request's conversation could not be resolved")
            ) from None
        if _blank(conversation):
            # Every such request would share one conversation (all clients without the header).
            logger.warning(
                "agentrt.sse: %s: the memory_id resolver gave %r: the request is refused",
                spec.qualname,
                conversation,
            )
            raise Refused(refusal(400, "no_conversation", "the request names no conversation"))
        try:
            # What memory takes (hashable, JSON): checked here, as the runs key their owner by it
            # before memory sees it, so that every protocol answers the same, with or without runs.
            memory_key("", conversation, spec.qualname)
        except TypeError as error:
            logger.error(
                "agentrt.sse: %s: the memory_id resolver's answer is refused: %s", spec.qualname, error
            )
            raise Refused(
                refusal(500, "memory_id_failed", "the request's conversation could not be resolved")
            ) from None
        return conversation

    async def handle(self, request: Request) -> Response:
        """A request: read by the protocol, its conversation resolved, then the stream's response."""
        if not is_json(request):
            return refusal(415, "unsupported_media_type", "the request body must be application/json")
        if "last-event-id" in request.headers:
            if self.runs is None:
                return refusal(409, "not_resumable", "the stream cannot be resumed; send a new request")
            return await self.resume_run(request)
        asked = await self.read(request)
        if isinstance(asked, Response):
            return asked
        cap = self.budget
        if asked.budget is not None:
            cap = Budget(**asked.budget.model_dump(exclude_none=True)).tighter(cap)
        owner = await self.owner_of(request, asked.thread)
        values = asked.values
        if self.spec.memory_param is not None:
            values[self.spec.memory_param] = owner
        positional = [values.pop(name, default) for name, default in self.wire.body.positional]
        started = await self.wire.encoder(asked)
        run: Run | None = None
        run_id: str | None = None
        key: tuple[Any, str] | None = None
        if started is not None:
            run_id = started[1]
            key = (owner, run_id)
            if key in self.local:  # AG-UI's client names its runs: the same one twice at once is a mistake
                return refusal(409, "run_in_progress", "a run with this id is streaming")
            run = Run()
            self.local[key] = run  # from now on `stop` finds it, also while the model has not answered
        forget = self._forgetting(key, run)
        resuming = asked.resuming
        opened: Callable[[], Awaitable[TokenStream | PartialStream[Any]]]
        if resuming is None:
            opened = functools.partial(self.method, *positional, **values)
        else:  # the conversation is the resolver's: another's run is not found
            where = {"memory_id": owner} if self.spec.memory_param is not None else {}
            service = self.method.__self__  # type: ignore[attr-defined]
            opened = functools.partial(resume, service, resuming.run_id, resuming.decisions, **where)
        stream: TokenStream | PartialStream[Any] | None = None
        try:
            stream, failure = await self.call(request, run, cap, opened)
            if failure is not None:
                forget()
                return error_response(self.spec, failure)
            if stream is None and not (run is not None and run.stopped):
                forget()  # the client went away before the model answered
                return Response(status_code=499)
            if started is None:
                assert stream is not None
                settings = self.settings
                return stream_response(
                    stream,
                    thinking=settings.thinking,
                    tool_details=settings.tool_details,
                    ping=self.ping,
                    send_timeout=self.send_timeout,
                )
            assert run is not None
            assert run_id is not None
            if self.runs is not None:
                return await self.start_run(stream, started[0], run, run_id, owner, asked.thread, forget)
            return respond(
                stream,
                started[0],
                run,
                ping=self.ping,
                headers={"agentrt-run-id": run_id},
                send_timeout=self.send_timeout,
                forget=forget,
            )
        except BaseException:
            # Cancelled from outside (a shutdown, a timeout around the app), or the response could
            # not be made: no one reads the stream, and the run is no longer there to stop.
            forget()
            if stream is not None:
                with anyio.CancelScope(shield=True):
                    await stream.aclose()
            raise

    async def read(self, request: Request) -> Asked | Response:
        """The request's body (at most `max_body` bytes), as its protocol reads it; or the error
        response that refuses it."""
        max_body = self.max_body
        try:
            raw = await read_body(request, max_body)
        except ClientDisconnect:  # the client left while sending its body
            return Response(status_code=499)
        if raw is None:
            return refusal(413, "body_too_large", f"the request body is larger than {max_body} bytes")
        request._body = raw  # what `request.body()` and `.json()` read (e.g. in a resolver)
        try:
            return self.wire.read(raw)
        except ValidationError as error:
            return invalid(error)
        except Unreadable as error:
            return invalid_at(error.where, str(error))
        except Undecidable as error:
            return error.response()

    def _forgetting(self, key: tuple[Any, str] | None, run: Run | None) -> Callable[[], None]:
        """What makes `run` no longer stoppable here (its end was sent, or it never began)."""
        local = self.local

        def forget() -> None:
            if run is not None and key is not None and local.get(key) is run:
                del local[key]

        return forget

    async def call(
        self,
        request: Request,
        run: Run | None,
        cap: Budget | None,
        opened: Callable[[], Awaitable[TokenStream | PartialStream[Any]]],
    ) -> tuple[TokenStream | PartialStream[Any] | None, Exception | None]:
        """The stream `opened` gives (the method's, or a resumed turn's), or the error it raised;
        no stream if the client went away or `run` was stopped before the model answered."""
        stream = failure = None
        try:
            async with anyio.create_task_group() as group:
                # The model may take long to accept the request (a busy conversation, a slow first
                # token): a client that leaves meanwhile, or a stop, cancels it. A `"detach"` run
                # goes on: its response hears of the hang-up and hands it to the manager.
                if self.on_disconnect == "cancel":
                    group.start_soon(cancel_on_disconnect, request, group.cancel_scope)
                if run is not None:
                    run.scope = group.cancel_scope
                # stored once the final event was sent (a detached run stores its turn as it ends)
                deferring = DEFER_COMMIT.set(self.on_disconnect == "cancel")
                try:
                    with call_options(budget_cap=cap) if cap is not None else contextlib.nullcontext():
                        stream = await opened()
                except Exception as error:  # raised here, not from the task group (no exception group)
                    failure = error
                finally:
                    DEFER_COMMIT.reset(deferring)
                group.cancel_scope.cancel()
        except BaseException:
            # Cancelled from outside as the task group closed: the stream was made, and is nobody's.
            if stream is not None:
                with anyio.CancelScope(shield=True):
                    await stream.aclose()
            raise
        if run is not None:
            run.scope = None
        return stream, failure

    async def start_run(
        self,
        stream: TokenStream | PartialStream[Any] | None,
        encoder: Encoder,
        run: Run,
        run_id: str,
        owner: Any,
        thread: str | None,
        forget: Callable[[], None],
    ) -> Response:
        """Open the run's log and answer with the response that reads the stream into it (see
        `respond`'s `tee`)."""
        runs = self.runs
        assert runs is not None
        stop_live = run.stop  # one object: `release` and the manager compare it by identity
        try:
            runs.require()
            try:
                runs.reserve(run_id, stop_live)  # a stop from another worker once the record is there
            except ValueError:  # an AG-UI client's run id, another request's since the endpoint looked
                raise Refused(
                    refusal(409, "run_exists", "a run with this id was started already; name a new one")
                ) from None
            record = RunRecord(run_id, self._owner_key(owner), thread)
            await from_log(self.spec, runs.log.open(record), opening=True)
        except BaseException:
            forget()
            runs.release(run_id, stop_live)
            with anyio.CancelScope(shield=True):
                if stream is not None:
                    await stream.aclose()
            raise
        sent = Sent() if self.wire.logs_sent else None
        tee = _runs.Tee(runs, run_id, encoder, self.on_disconnect, stop_live, sent)
        return respond(
            stream,
            encoder,
            run,
            ping=self.ping,
            headers={"agentrt-run-id": run_id},
            send_timeout=self.send_timeout,
            forget=forget,
            tee=tee,
        )

    async def resume_run(self, request: Request, thread: str | None = None) -> Response:
        """A reader of a run's log: after `Last-Event-ID` (`{run}:{seq}`), or from its start for
        `?run=` or the active run of the client's conversation `thread` (Vercel's resume GET)."""
        spec = self.spec
        assert self.runs is not None
        log = self.runs.log
        last = request.headers.get("last-event-id")
        after = 0
        run_id: str | None
        if last is not None:
            parsed = _runs.parse_event_id(last)
            if parsed is None:
                return refusal(400, "bad_event_id", "Last-Event-ID is not an id this endpoint sent")
            run_id, after = parsed
        else:
            run_id = request.query_params.get("run")
        if run_id is None and thread is None:
            return refusal(400, "no_run", "name the run: a Last-Event-ID header or ?run=")
        record = await from_log(spec, log.find(run_id)) if run_id is not None else None
        if run_id is not None and record is None:
            return refusal(404, "run_not_found", "no such run of this user (or it has expired)")
        # A named run's conversation is its own: the resolver combines it with the request's
        # user (a two-argument resolver), so another user's request names another conversation.
        owner = await self.owner_of(request, record.thread if record is not None else thread)
        key = self._owner_key(owner)
        if run_id is None:
            assert thread is not None
            run_id = await from_log(spec, log.active(key, thread))
            if run_id is None:
                return Response(status_code=204)  # no stream to resume (the Vercel client's "none")
            record = await from_log(spec, log.find(run_id))
        if record is None or record.owner != key:  # another's run is not found, not forbidden
            return refusal(404, "run_not_found", "no such run of this user (or it has expired)")
        if after and await _past_the_end(spec, log, run_id, after):
            return refusal(400, "bad_event_id", "Last-Event-ID is past the run's last event")
        return _runs.response(
            log,
            run_id,
            after,
            self.wire.blank(),
            ping=self.ping,
            headers={"agentrt-run-id": run_id},
            send_timeout=self.send_timeout,
        )

    async def resume_get(self, request: Request) -> Response:
        """`GET`: resume a run (see `resume_run`); a `{id}` path parameter names the client's
        conversation (the Vercel client's `GET {api}/{chatId}/stream`)."""
        if self.runs is None:
            return refusal(409, "not_resumable", "the endpoint keeps no runs (runs=...)")
        thread = request.path_params.get("id")
        return await self.resume_run(request, thread if isinstance(thread, str) else None)

    async def stop(self, request: Request) -> Response:
        """Stop a run of this endpoint by its id (`{"runId": ...}`), for the user who started it. Its
        body is read as the endpoint's is: JSON only (a cross-site form could stop a user's run),
        at most `max_body` bytes."""
        if not is_json(request):
            return refusal(415, "unsupported_media_type", "the request body must be application/json")
        try:
            raw = await read_body(request, self.max_body)
        except ClientDisconnect:
            return Response(status_code=499)
        if raw is None:
            return refusal(413, "body_too_large", f"the request body is larger than {self.max_body} bytes")
        request._body = raw  # what a resolver's `request.body()` reads
        try:
            asked = StopRequest.model_validate_json(raw or b"{}")
        except ValidationError as error:
            return invalid(error)
        owner = await self.owner_of(request, asked.threadId)
        run = self.local.get((owner, asked.runId))
        if run is None:
            runs = self.runs
            if runs is not None:
                record = await from_log(self.spec, runs.log.find(asked.runId))
                if (
                    record is not None
                    and record.owner == self._owner_key(owner)
                    and await from_log(self.spec, runs.stop(asked.runId))  # False: it ended
                ):
                    return JSONResponse({"stopped": asked.runId}, status_code=202)
            return refusal(404, "run_not_found", "no such run of this user is streaming")
        run.stop()
        return JSONResponse({"stopped": asked.runId}, status_code=202)

    def _owner_key(self, owner: Any) -> str:
        """A run's owner as its log keeps it: the endpoint (its protocol and method) and the
        conversation's memory id, as JSON. Endpoints share a run manager: one's runs are not read or
        stopped through another (its frames are another protocol's; its memory ids mean other
        things)."""
        spec = self.spec
        if spec.memory_param is None:
            return orjson.dumps([self.wire.name, spec.qualname]).decode()
        return orjson.dumps([self.wire.name, spec.qualname, owner], default=str).decode()


async def _past_the_end(spec: MethodSpec, log: RunLog, run: str, after: int) -> bool:
    """Whether `after` is past the last frame of `run` so far (an id the run never sent: a reader
    after it would wait, then skip every frame up to it). A log without `last_seq` is not asked."""
    last_seq = getattr(log, "last_seq", None)
    if last_seq is None:
        return False
    last: int | None = await from_log(spec, last_seq(run))
    return last is not None and after > last


def _blank(memory_id: Any) -> bool:
    """Whether a memory id names no one: `None`, `""`, or a tuple with such a part."""
    if isinstance(memory_id, tuple):
        return any(_blank(part) for part in memory_id)
    return memory_id is None or memory_id == ""


def _handled_by_app(request: Request, error: Exception) -> bool:
    """Whether the app answers `error` itself: an `HTTPException`, or a type it has an exception
    handler for (Starlette's `ExceptionMiddleware` puts its handlers in the scope)."""
    if isinstance(error, HTTPException):
        return True
    handlers = request.scope.get("starlette.exception_handlers")
    if not handlers:
        return False
    return any(kind in handlers[0] for kind in type(error).__mro__)


def _positional_arity(function: Callable[..., Any]) -> int:
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return 1
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    if any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in parameters):
        return 2
    return sum(1 for p in parameters if p.kind in kinds)
