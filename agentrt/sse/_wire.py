"""What a protocol an endpoint speaks is (`Wire`): how it reads a request (`Asked`), how it makes
the encoder of a response, and what the three share to do so: the method's parameters as a request
body (`Body`), and a request that resumes a turn waiting for approval (`Resumption`).

Each protocol is one `Wire` in a module of its own (`_native`, `_vercel`, `_agui`), with its
encoder: adding a protocol is adding such a module (and its name in `_endpoint.WIRES`).
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, PydanticUserError, Strict, ValidationError, create_model
from starlette.responses import JSONResponse

from .. import _approval
from .._errors import ConfigurationError
from .._spec import MethodSpec
from ..runs import Runs

if typing.TYPE_CHECKING:
    from ._encoder import Encoder


@dataclass(frozen=True, slots=True)
class Settings:
    """What an endpoint was made with that its protocol reads."""

    spec: MethodSpec
    thinking: bool
    tool_details: bool
    structured: bool
    """The method streams a structured answer (`PartialStream`)."""
    request_budget: bool
    release: str | None
    """When the method's output guardrails release text (`None`: it has none)."""
    gated: bool
    """The method's tool calls may wait for approval (its body then reserves `approval`)."""
    runs: Runs | None


@dataclass(slots=True)
class Asked:
    """A request as its protocol read it."""

    values: dict[str, Any] = dataclasses.field(default_factory=dict)
    """The method's arguments by parameter name (without the memory id); none for a resumption."""
    budget: RequestBudget | None = None
    thread: str | None = None
    """The client's conversation id (Vercel's `id`, AG-UI's `threadId`)."""
    run_id: str | None = None
    """The run the client names (AG-UI's `runId`)."""
    resuming: Resumption | None = None
    envelope: Any = None
    """The protocol's own request (Vercel's, AG-UI's), as validated."""


class Wire:
    """A protocol an endpoint speaks: made once per endpoint (refusing a method it cannot serve),
    it reads each request and makes each response's encoder."""

    __slots__ = ("body", "settings")

    name: ClassVar[str]
    """The endpoint's `protocol`."""
    logs_sent: ClassVar[bool] = True
    """Whether a run's log keeps what it holds of the run's parts (`Sent`), to end it when stopped."""

    def __init__(self, settings: Settings, message: str | None) -> None:
        self.settings = settings
        self.body = self.body_of(message)

    def body_of(self, message: str | None) -> Body:
        """The method's parameters as this protocol's request carries them (`message`: the
        endpoint's `message=`). Raises `ConfigurationError` for a method it cannot serve."""
        raise NotImplementedError

    def read(self, raw: bytes) -> Asked:
        """The request (its body, `raw`). Raises `ValidationError`, `Unreadable`, `Undecidable`, or
        `Refused` (a response of its own)."""
        raise NotImplementedError

    async def encoder(self, asked: Asked) -> tuple[Encoder, str] | None:
        """The encoder of the request's response and the run's id; `None` for a response that is
        not a run (no stop, no log: `stream_response`). May raise `Refused`."""
        raise NotImplementedError

    def blank(self) -> Encoder:
        """An encoder for what a response of a run's log may add itself (its errors)."""
        raise NotImplementedError


class Unreadable(Exception):
    """A request body the protocol cannot read: a 422 `invalid_request` at `where`."""

    def __init__(self, where: tuple[str | int, ...], message: str) -> None:
        super().__init__(message)
        self.where = where


@dataclass(frozen=True, slots=True)
class Resumption:
    """A request that resumes a turn: its run, a decision per call (by the model's call id), and
    for a client protocol the tool-call ids the client has (all of them, and each resumed call's)."""

    run_id: str
    decisions: dict[str, _approval.Decision]
    used: tuple[str, ...] = ()
    wires: tuple[tuple[str, str], ...] = ()
    message_id: str | None = None
    """Vercel: the assistant message the resumed stream continues."""


class Undecidable(Exception):
    """A resume request whose decisions cannot be read: a 400 `approval_decision`, nothing runs."""

    def __init__(self, where: tuple[str | int, ...], message: str, detail: list[Any] | None = None) -> None:
        super().__init__(message)
        if detail is None:
            detail = [{"type": "value_error", "loc": list(where), "msg": message}]
        self.detail = detail

    @classmethod
    def of(cls, error: ValidationError, where: tuple[str | int, ...]) -> Undecidable:
        problems = error.errors(include_url=False, include_context=False, include_input=False)
        detail = [{**problem, "loc": [*where, *problem["loc"]]} for problem in problems]
        return cls(where, "the decisions are invalid", detail)

    def response(self) -> JSONResponse:
        return JSONResponse(
            {
                "error": {"type": "approval_decision", "message": "the approval decisions could not be read"},
                "detail": self.detail,
            },
            status_code=400,
        )


def split_approval(approval: str, where: tuple[str | int, ...]) -> tuple[str, str]:
    """A wire approval id's run id and call id (`"<run id>:<call id>"`, see `_encoder.approval_id`)."""
    run_id, colon, call_id = approval.partition(":")
    if not (colon and run_id and call_id):
        raise Undecidable(where, "not an approval id this server sent ('<run id>:<call id>')")
    return run_id, call_id


def decide(
    decisions: dict[str, _approval.Decision],
    run: list[str],
    approval: str,
    decision: _approval.Decision,
    where: tuple[str | int, ...],
) -> str:
    """Record `decision` on the call `approval` names (of the one run all answers name)."""
    run_id, call_id = split_approval(approval, where)
    if run and run[0] != run_id:
        raise Undecidable(where, "the answers name more than one run")
    if call_id in decisions:
        raise Undecidable(where, f"call {call_id!r} is answered twice")
    run[:1] = [run_id]
    decisions[call_id] = decision
    return call_id


class RequestBudget(BaseModel):
    """A budget a request asks for (`request_budget=True`): it can only tighten the endpoint's."""

    model_config = ConfigDict(extra="forbid")

    seconds: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = None
    input_tokens: Annotated[int, Strict(), Field(gt=0)] | None = None
    output_tokens: Annotated[int, Strict(), Field(gt=0)] | None = None
    total_tokens: Annotated[int, Strict(), Field(gt=0)] | None = None
    model_requests: Annotated[int, Strict(), Field(gt=0)] | None = None
    tool_calls: Annotated[int, Strict(), Field(gt=0)] | None = None


_BUDGET_FIELD: Final = "agentrt_budget"
"""The body model's field for a request's budget (its JSON name is `budget`)."""


class Body:
    """A method's parameters as a request body (`model`): all but the memory id and the option
    parameters, with their annotations and defaults (and `budget`, with `request_budget`); unknown
    fields are refused. Fields have neutral names (`p0`, ...) and the parameters' names as aliases,
    so that no parameter name can clash with pydantic's own (`model_config`, `json`, `_private`).
    `names` maps field name -> parameter name; `positional` lists the positional-only parameters
    with their defaults, in order.

    For a client protocol: `message` is the parameter the user's message fills (not a field), and
    `envelope` the protocol's own fields (field name -> (type, FieldInfo)), whose JSON names no
    parameter may have."""

    __slots__ = ("budgeted", "message", "model", "names", "positional")

    def __init__(
        self,
        spec: MethodSpec,
        request_budget: bool,
        *,
        message: str | None = None,
        envelope: dict[str, Any] | None = None,
        extra: Literal["forbid", "ignore"] = "forbid",
    ) -> None:
        skipped = {spec.memory_param, message, *(name for name, _ in spec.option_params)}
        hints = typing.get_type_hints(spec.function, include_extras=True)  # resolved at build already
        fields: dict[str, Any] = {}
        names: dict[str, str] = {}
        positional: list[tuple[str, Any]] = []
        for index, (name, parameter) in enumerate(spec.signature.parameters.items()):  # without `self`
            if parameter.kind is inspect.Parameter.POSITIONAL_ONLY:
                positional.append((name, parameter.default))  # an option parameter: its default
            if name in skipped:
                continue
            default = parameter.default if parameter.default is not inspect.Parameter.empty else ...
            field = f"p{index}"
            fields[field] = (hints.get(name, Any), Field(default, alias=name))
            names[field] = name
        if envelope:
            taken = {info.alias for _, info in envelope.values()} & set(names.values())
            if taken:
                raise ConfigurationError(
                    f"{spec.qualname}: the protocol's request has its own {sorted(taken)} field(s); "
                    "rename the parameter(s)"
                )
            fields.update(envelope)
        if request_budget:
            if "budget" in names.values():
                raise ConfigurationError(
                    f"{spec.qualname}: request_budget=True reserves the body's 'budget' field, but the "
                    "method has a parameter of that name"
                )
            fields[_BUDGET_FIELD] = (RequestBudget | None, Field(None, alias="budget"))
        try:
            model = create_model(
                f"{spec.name}_body",
                __config__=ConfigDict(extra=extra, populate_by_name=False, arbitrary_types_allowed=False),
                **fields,
            )
        except PydanticUserError as exc:  # a parameter type pydantic cannot read from JSON
            raise ConfigurationError(
                f"{spec.qualname}: its parameters cannot be read from a JSON body: {str(exc).splitlines()[0]}"
            ) from exc
        self.model: type[BaseModel] = model
        self.names = names
        self.positional = positional
        self.message = message
        self.budgeted = request_budget

    def asked(self, validated: BaseModel, text: str | None = None, **request: Any) -> Asked:
        """The request whose body (or a part of it) `validated` is, and whose user message is `text`
        (a client protocol's); `request`: the rest of `Asked`."""
        # The validated values as they are (a model stays a model), by parameter name.
        values = {name: getattr(validated, field) for field, name in self.names.items()}
        if self.message is not None:
            values[self.message] = text
        budget = getattr(validated, _BUDGET_FIELD) if self.budgeted else None
        return Asked(values, budget, **request)


def message_param(spec: MethodSpec, message: str | None) -> str:
    """The parameter a client protocol's user message fills: `message`, or the one required `str`."""
    skipped = {spec.memory_param, *(name for name, _ in spec.option_params)}
    hints = typing.get_type_hints(spec.function, include_extras=True)
    if message is not None:
        if message not in spec.signature.parameters or message in skipped:
            raise ConfigurationError(f"{spec.qualname}: message={message!r} is not one of its parameters")
        return message
    candidates = [
        name
        for name, parameter in spec.signature.parameters.items()
        if name not in skipped
        and parameter.default is inspect.Parameter.empty
        and hints.get(name, str) is str
    ]
    if len(candidates) != 1:
        raise ConfigurationError(
            f"{spec.qualname}: a client protocol fills one parameter with the user's message; the "
            f"method has {len(candidates)} required str parameters ({', '.join(candidates) or 'none'}): "
            "name it with message="
        )
    return candidates[0]
