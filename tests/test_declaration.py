"""Acceptance 2: every declaration mistake is a ConfigurationError at build or decoration time,
naming `Class.method` and the parameter; none is deferred to the first call."""

from __future__ import annotations

import collections.abc
import inspect
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any

import anyio
import pytest
from pydantic import BaseModel, ConfigDict

import agentrt
from agentrt import (
    ConfigurationError,
    ImageContent,
    MemoryId,
    Result,
    TemplateName,
    TokenStream,
    system_message,
    user_message,
)
from agentrt.testing import ScriptedModel


def build(cls: type[object], **kwargs: object) -> object:
    model = kwargs.pop("model", ScriptedModel())
    return agentrt.build(cls, model=model, **kwargs)  # type: ignore[arg-type]


def test_unknown_template_variable_in_user_message() -> None:
    class Service:
        @user_message("Translate {{text}} into {{langauge}}")
        async def translate(self, text: str, language: str) -> str: ...

    with pytest.raises(ConfigurationError, match=r"Service\.translate") as info:
        build(Service)
    assert "{{langauge}}" in str(info.value)


def test_unknown_template_variable_in_class_system_message_names_each_method() -> None:
    @system_message("You work for {{shop}}.")
    class Service:
        async def chat(self, question: str) -> str: ...

    with pytest.raises(ConfigurationError, match=r"Service\.chat: template variable \{\{shop\}\}"):
        build(Service)
    # The same class builds once the variable is supplied.
    build(Service, variables={"shop": "Acme"})


def test_parameter_that_binds_to_nothing() -> None:
    class Service:
        @user_message("Translate {{text}}")
        async def translate(self, text: str, language: str) -> str: ...

    with pytest.raises(ConfigurationError, match=r"Service\.translate: parameter 'language'"):
        build(Service)


def test_two_free_parameters_without_a_template() -> None:
    class Service:
        async def chat(self, question: str, context: str) -> str: ...

    with pytest.raises(ConfigurationError, match=r"Service\.chat: parameters 'question', 'context'"):
        build(Service)


def test_two_memory_ids() -> None:
    class Service:
        async def chat(
            self,
            user: Annotated[str, MemoryId],
            session: Annotated[str, MemoryId],
            question: str,
        ) -> str: ...

    with pytest.raises(ConfigurationError, match=r"Service\.chat: parameters 'user' and 'session'"):
        build(Service)


def test_non_async_stub_is_rejected_by_build() -> None:
    class Service:
        def chat(self, question: str) -> str: ...

    with pytest.raises(ConfigurationError, match=r"Service\.chat: .*async def"):
        build(Service)


def test_non_async_method_is_rejected_by_the_decorator() -> None:
    with pytest.raises(ConfigurationError, match=r"chat: .*async def"):

        class Service:
            @user_message("{{it}}")
            def chat(self, question: str) -> str: ...


class Opaque:
    """A class pydantic has no schema for."""


@pytest.mark.parametrize(
    ("annotation", "message"),
    [
        (Opaque, r"return type Opaque has no JSON schema"),
        (list[Opaque], r"return type list\[.*Opaque\] has no JSON schema"),
        (collections.abc.Callable[[], int], r"return type .*Callable.* has no JSON schema"),
        (collections.abc.AsyncIterator[Opaque], r"return type .*Opaque.* has no JSON schema"),
    ],
)
def test_unsupported_return_annotation(annotation: object, message: str) -> None:
    async def ask(self: object, question: str) -> None: ...

    ask.__annotations__["return"] = annotation
    service = type("Service", (), {"ask": ask})

    with pytest.raises(ConfigurationError, match=rf"Service\.ask: {message}"):
        build(service)


def test_missing_return_annotation() -> None:
    class Service:
        async def ask(self, question: str): ...  # type: ignore[no-untyped-def]

    with pytest.raises(ConfigurationError, match=r"Service\.ask: declare a return type"):
        build(Service)


def test_result_of_a_stream_is_not_supported() -> None:
    class Service:
        async def ask(self, question: str) -> Result[TokenStream]: ...

    with pytest.raises(ConfigurationError, match=r"Service\.ask: return type Result\[TokenStream\]"):
        build(Service)


def test_malformed_placeholder_is_rejected_by_the_decorator() -> None:
    with pytest.raises(ConfigurationError, match=r"placeholder '\{\{user name\}\}'"):
        user_message("Hello {{user name}}")


def test_variadic_parameters() -> None:
    class Service:
        async def ask(self, *questions: str) -> str: ...

    with pytest.raises(ConfigurationError, match=r"Service\.ask: parameter 'questions'"):
        build(Service)


def test_content_parameter_needs_the_model_capability() -> None:
    class Service:
        async def describe(self, photo: ImageContent) -> str: ...

    model = ScriptedModel(capabilities=agentrt.Capabilities(image_input=False))
    with pytest.raises(ConfigurationError, match=r"Service\.describe: parameter 'photo' .*image_input"):
        build(Service, model=model)


def test_v_on_a_content_or_memory_parameter() -> None:
    class Service:
        async def chat(self, conversation: Annotated[str, MemoryId, TemplateName("c")], q: str) -> str: ...

    with pytest.raises(ConfigurationError, match=r"Service\.chat: parameter 'conversation'"):
        build(Service)


def test_build_variable_that_shadows_a_parameter() -> None:
    class Service:
        @user_message("{{question}}")
        async def ask(self, question: str) -> str: ...

    with pytest.raises(ConfigurationError, match=r"Service\.ask: build variable 'question'"):
        build(Service, variables={"question": "x"})


def test_class_without_stubs() -> None:
    class Service:
        async def helper(self) -> str:
            return "implemented"

    with pytest.raises(ConfigurationError, match="Service declares no service methods"):
        build(Service)


def test_a_decorated_method_with_a_body() -> None:
    class Service:
        @user_message("{{it}}")
        async def ask(self, question: str) -> str:
            return question

    with pytest.raises(ConfigurationError, match=r"Service\.ask: a service method's body"):
        build(Service)


def test_model_that_is_not_a_chat_model() -> None:
    class Service:
        async def ask(self, question: str) -> str: ...

    with pytest.raises(ConfigurationError, match="is not a ChatModel"):
        agentrt.build(Service, model=object())  # type: ignore[arg-type]


def test_nothing_is_checked_at_call_time_that_build_could_check() -> None:
    # A well-declared service builds; what remains for call time is only about argument values.
    class Service:
        async def ask(self, question: str) -> str: ...

        async def stream(self, question: str) -> AsyncIterator[str]: ...

        async def helper(self) -> str:
            return "kept"

    service = build(Service)
    assert inspect.iscoroutinefunction(service.ask)  # type: ignore[attr-defined]
    assert str(inspect.signature(service.ask)) == "(question: 'str') -> 'str'"  # type: ignore[attr-defined]


async def test_wrong_arguments_raise_type_error_naming_the_method() -> None:
    class Service:
        async def ask(self, question: str) -> str: ...

    service = build(Service)
    with pytest.raises(TypeError, match=r"Service\.ask\(\): missing a required argument"):
        await service.ask()  # type: ignore[attr-defined]


def test_stub_bodies_that_count_as_stubs() -> None:
    from agentrt._stubs import is_stub

    async def dots() -> None: ...

    async def documented() -> None:
        """Only a docstring."""

    async def passes() -> None:
        pass

    async def not_implemented() -> None:
        raise NotImplementedError

    async def not_implemented_call() -> None:
        raise NotImplementedError("agentrt implements this")

    async def real() -> int:
        return 1

    async def raises_other() -> None:
        raise ValueError

    async def documented_dots() -> None:
        """A docstring, then the dots."""
        ...

    async def returns_text() -> str:
        return "text"

    async def documented_real() -> int:
        """A docstring does not make a body a stub."""
        return 1

    async def awaits() -> None:
        await anyio.lowlevel.checkpoint()

    def sync_dots() -> None: ...

    async def from_none() -> None:
        raise NotImplementedError("agentrt implements this") from None

    async def dots_then_pass() -> None:
        ...
        pass

    async def returns_none() -> None:
        return None

    async def returns() -> None:
        return

    stubs = [
        dots,
        documented,
        passes,
        not_implemented,
        not_implemented_call,
        documented_dots,
        sync_dots,
        from_none,
        dots_then_pass,
    ]
    assert [f.__name__ for f in stubs if not is_stub(f)] == []
    bodies = [real, raises_other, returns_text, documented_real, awaits, returns_none, returns]
    assert [f.__name__ for f in bodies if is_stub(f)] == []


class Plan(BaseModel):
    model_config = ConfigDict(arbitrary_types_allowed=True)
    step: Callable[[], None] | None = None


def test_a_return_model_without_a_json_schema_names_the_method() -> None:
    class Service:
        async def plan(self, goal: str) -> Plan: ...

    with pytest.raises(ConfigurationError, match=r"Service\.plan: return type Plan has no JSON schema"):
        build(Service)


@pytest.mark.parametrize("wrapper", [staticmethod, classmethod])
def test_static_and_class_method_stubs_are_rejected(wrapper: type) -> None:
    async def ask(question: str) -> str: ...

    service = type("Service", (), {"ask": wrapper(ask)})

    with pytest.raises(ConfigurationError, match=rf"Service\.ask: .*not a {wrapper.__name__}"):
        build(service)


async def test_an_abc_with_abstract_stubs_builds() -> None:
    import abc

    class Abstract(abc.ABC):
        @abc.abstractmethod
        async def ask(self, question: str) -> str: ...

        async def helper(self) -> str | None:
            return None  # a real method, not a stub

    service = build(Abstract, model=ScriptedModel("hi"))

    assert await service.ask("q") == "hi"
    assert await service.helper() is None


def test_stubs_without_source_are_read_from_bytecode() -> None:
    from agentrt._stubs import is_stub

    namespace: dict[str, Any] = {}
    exec("async def stub(self):\n    raise NotImplementedError from None\n", namespace)
    exec("async def real(self):\n    return 1\n", namespace)

    assert is_stub(namespace["stub"])
    assert not is_stub(namespace["real"])

    # Code compiled under the name of a file whose lines are other lines (as a notebook or a README
    # runner does): its "source" is someone else's, and the bytecode decides.
    exec(compile("async def stub(self):\n    ...\n", __file__, "exec"), namespace)
    exec(compile("\n\nasync def real(self):\n    return 1\n", __file__, "exec"), namespace)
    assert is_stub(namespace["stub"])
    assert not is_stub(namespace["real"])
