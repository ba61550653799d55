"""Chat memory: a store, a window and a lock per conversation.

A turn opens its conversation (locks it, loads it), and at its end either commits (one atomic write
of the user message, the tool exchanges and the answer) or writes nothing; either way it releases the
lock. Turns on one conversation therefore run one after another, each seeing the one before; turns
on different conversations never wait for each other.

The lock within a process is a FIFO queue per conversation that any task may release: the task that
closes a stream is not always the one that opened it (a stream abandoned by its reader is closed by
its finalizer), and an `anyio.Lock` must be released by its owner. Like a lock re-acquired by its
owner, a task that starts a turn on a conversation a turn of its own still holds (a stream it broke
out of and kept) gets `ConversationReentryError` at once: nothing else would ever close that stream,
so waiting would never end. Across processes, a shared store adds its own lease (see
`SharedChatMemoryStore`).
"""

from __future__ import annotations

import inspect
import logging
import math
import os
import warnings
from collections import Counter
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

import anyio
import orjson

from .._backend import complete as complete  # re-exported: the pipeline's approvals use it
from .._backend import current_task
from .._errors import ConfigurationError, ConversationBusyError, ConversationReentryError
from .._messages import SystemMessage, ToolResultMessage
from ._inmemory import DEFAULT_MAX_CONVERSATIONS, InMemoryStore
from ._locks import _acquire, _Holder, _locks_for, _Queue, _release
from ._store import ChatMemoryStore, SharedChatMemoryStore
from ._window import TokenCounter, estimate_message_tokens, window_start

if TYPE_CHECKING:
    from collections.abc import Sequence

    from .._messages import ChatMessage

__all__ = ["DEFAULT_MEMORY_ID", "ChatMemory", "Conversation", "Memory", "memory_key", "window"]

DEFAULT_MEMORY_ID: Final = "default"
"""The conversation of methods without a `MemoryId` parameter."""

logger = logging.getLogger("agentrt.memory")

LEASE_OWNER: Final[ContextVar[str | None]] = ContextVar("agentrt_lease_owner", default=None)
"""The owner of the shared store's locks taken in this context (else a random one per lock): a
durable turn's, so that a worker recovering the turn takes over the lock its dead worker held."""

_FIRST_POLL: Final = 0.002  # seconds between tries of a shared store's lock, doubling up to _LAST_POLL
_LAST_POLL: Final = 0.1


@dataclass(frozen=True, slots=True)
class ChatMemory:
    """What `build(..., memory=...)` takes: a store and a window.

    - `store`: where conversations live (by default an `InMemoryStore` that keeps the
      `DEFAULT_MAX_CONVERSATIONS` (10,000) most recently used; `SQLiteStore`, `RedisStore`, or your
      own `ChatMemoryStore`).
    - `max_messages`, `max_tokens`: the window; `None` keeps everything. What falls out of the window
      is removed from the store when the next turn is committed.
    - `counter`: counts a message's tokens for `max_tokens` (`estimate_message_tokens` by default).
    - `namespace`: the first part of every conversation's name in the store. By default the
      service's module and class name, which a rename, a move or a run as a script (`__main__`)
      changes: name it for a store that outlives the process (SQLite, Redis). Services that name the
      same namespace share their conversations.
    - `wait`: the longest a turn waits for its conversation while another turn holds it, in seconds,
      before `ConversationBusyError`; `None` waits as long as the call's time budget allows.
    """

    store: ChatMemoryStore = field(
        default_factory=lambda: InMemoryStore(max_conversations=DEFAULT_MAX_CONVERSATIONS)
    )
    max_messages: int | None = None
    max_tokens: int | None = None
    counter: TokenCounter = estimate_message_tokens
    namespace: str | None = None
    wait: float | None = None

    def __post_init__(self) -> None:
        check_store(self.store)
        for name in ("max_messages", "max_tokens"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ConfigurationError(f"memory {name} must be a positive int or None, got {value!r}")
        if not callable(self.counter):
            raise ConfigurationError(f"memory counter must be callable, got {self.counter!r}")
        if self.namespace is not None and (not isinstance(self.namespace, str) or not self.namespace):
            raise ConfigurationError(f"memory namespace must be a non-empty string, got {self.namespace!r}")
        wait = self.wait
        if wait is not None and (
            isinstance(wait, bool)
            or not isinstance(wait, int | float)
            or not (wait >= 0 and math.isfinite(wait))
        ):
            raise ConfigurationError(f"memory wait must be a number of seconds >= 0 or None, got {wait!r}")


_STORE_METHODS: Final = ("load", "commit", "replace", "delete")
_SHARED_METHODS: Final = ("try_lock", "unlock")


def check_store(store: object) -> None:
    """`ConfigurationError` unless `store` is a store instance whose methods are coroutine functions."""
    if isinstance(store, type):
        raise ConfigurationError(
            f"memory store {store.__name__} is a class: pass an instance, e.g. {store.__name__}()"
        )
    if not isinstance(store, ChatMemoryStore):
        raise ConfigurationError(
            f"memory store {store!r} is not a ChatMemoryStore (async load, commit, replace, delete)"
        )
    names = _STORE_METHODS + (_SHARED_METHODS if isinstance(store, SharedChatMemoryStore) else ())
    for name in names:
        if not inspect.iscoroutinefunction(getattr(store, name)):
            raise ConfigurationError(
                f"memory store {store!r}: {name} must be an async method (async def {name}(...))"
            )


def window(
    *,
    max_messages: int | None = None,
    max_tokens: int | None = None,
    store: ChatMemoryStore | None = None,
    counter: TokenCounter = estimate_message_tokens,
    namespace: str | None = None,
    wait: float | None = None,
) -> ChatMemory:
    """A `ChatMemory` that keeps the newest `max_messages` / `max_tokens` of each conversation.

    Without `store`, conversations live in this process, at most `DEFAULT_MAX_CONVERSATIONS` (10,000)
    of them: the least recently used is forgotten first. Pass `store=InMemoryStore(...)` for another
    bound or a `ttl`.
    """
    return ChatMemory(
        store=store if store is not None else InMemoryStore(max_conversations=DEFAULT_MAX_CONVERSATIONS),
        max_messages=max_messages,
        max_tokens=max_tokens,
        counter=counter,
        namespace=namespace,
        wait=wait,
    )


def memory_key(namespace: str, memory_id: Any, where: str) -> str:
    """The store key of a conversation: the namespace and the memory id as JSON (so `"1"` and `1` are
    different conversations). `TypeError` for an id that is `None`, unhashable or not JSON (a NaN or
    an infinity, which JSON writes as null, in a tuple too)."""
    if memory_id is None:
        raise TypeError(f"{where}: the memory id is None; pass the id of a conversation")
    try:
        hash(memory_id)
        encoded = orjson.dumps(memory_id)
    except TypeError as exc:  # orjson.JSONEncodeError is a TypeError
        raise TypeError(
            f"{where}: memory id {memory_id!r} cannot name a conversation: it must be hashable and "
            f"serializable as JSON (a str, an int, a UUID, ...): {exc}"
        ) from None
    if encoded == b"null" or not _finite(memory_id):  # NaN and infinities encode as null
        raise TypeError(f"{where}: memory id {memory_id!r} cannot name a conversation")
    return f"{namespace}:{encoded.decode()}"


def _finite(memory_id: Any) -> bool:
    """Whether no float in `memory_id` (a tuple's parts too) is NaN or infinite: JSON writes them as
    null, so `("a", nan)` would be `("a", inf)`'s conversation, and `("a", None)`'s."""
    if isinstance(memory_id, float):
        return math.isfinite(memory_id)
    if isinstance(memory_id, tuple):
        return all(_finite(part) for part in memory_id)
    return True


class Memory:
    """A service's chat memory, resolved at build: the `ChatMemory` and the service's namespace."""

    __slots__ = (
        "__weakref__",
        "config",
        "counter",
        "locks",
        "max_messages",
        "max_tokens",
        "namespace",
        "plain",
        "shared",
        "store",
    )

    def __init__(self, config: ChatMemory, namespace: str) -> None:
        """`namespace` is the default, the service's `module.qualname`; `build()` makes this."""
        if (
            config.namespace is None
            and namespace.startswith("__main__.")
            and not isinstance(config.store, InMemoryStore)
        ):
            # The same class imported from its module (by a worker, a test) gets another namespace:
            # both would run, each on its own conversations, and nothing would say so.
            warnings.warn(
                f"{namespace[len('__main__.') :]} is defined in __main__, so its conversations in "
                f"{type(config.store).__name__} are named {namespace!r}: the same class imported from "
                "its module names other conversations. Name them: "
                "agentrt.memory.window(namespace=..., store=...)",
                UserWarning,
                stacklevel=3,
            )
        self.config = config
        self.store = config.store
        self.namespace = config.namespace or namespace
        self.shared = isinstance(config.store, SharedChatMemoryStore)
        self.plain = type(config.store) is InMemoryStore
        """Writes are plain code with no await: nothing can interrupt them."""
        self.max_messages = config.max_messages
        self.max_tokens = config.max_tokens
        self.counter = config.counter
        self.locks = _locks_for(config.store, self)

    def key(self, memory_id: Any, where: str) -> str:
        return memory_key(self.namespace, memory_id, where)

    def start(self, messages: Sequence[ChatMessage]) -> int:
        """Where the window of `messages` starts (at a user message, see `window_start`)."""
        return window_start(messages, self.max_messages, self.max_tokens, self.counter)

    async def open(self, memory_id: Any, where: str) -> Conversation:
        """Lock the conversation of `memory_id` (waiting for the turn that holds it) and load it.

        Raises `ConversationReentryError` at once if a turn of the calling task holds it (see the
        module's docstring), `ConversationBusyError` after the memory's `wait`.
        """
        key = self.key(memory_id, where)
        wait = self.config.wait
        give_up = math.inf if wait is None else anyio.current_time() + wait
        table = self.locks.table()
        holder = _Holder(current_task(), where)
        queue = table.get(key)
        if queue is None:
            table[key] = _Queue(holder)  # free: taken without an await
        else:
            if holder.task is not None and queue.holder.task is holder.task:
                raise ConversationReentryError(
                    f"{where}: conversation {memory_id!r} is held by a turn of this same task "
                    f"({queue.holder.where}), most likely a stream it has not closed; waiting for it "
                    "would never end. Close the stream first (`async with await svc.stream(...) as "
                    "tokens:`), or read it to its end",
                    memory_id=memory_id,
                    holder=queue.holder.where,
                )
            with anyio.CancelScope(deadline=give_up) as scope:
                await _acquire(table, key, holder)
            if scope.cancelled_caught:
                raise ConversationBusyError(
                    f"{where}: conversation {memory_id!r} stayed busy with another turn for {wait} s",
                    memory_id=memory_id,
                )
        conversation = Conversation(self, table, key, memory_id, holder)
        try:
            if self.shared:
                await conversation.lease(where, give_up)
            conversation.stored = await self.store.load(key)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await conversation.release()
            raise
        return conversation


class Conversation:
    """One conversation, locked for one turn (or one write through `MemoryAccess`)."""

    __slots__ = ("_holder", "_table", "held", "key", "memory", "memory_id", "owner", "stored")

    def __init__(
        self, memory: Memory, table: dict[str, _Queue], key: str, memory_id: Any, holder: _Holder
    ) -> None:
        self.memory = memory
        self._table = table
        self._holder = holder
        self.key = key
        self.memory_id = memory_id
        self.held = True
        self.owner: str | None = None
        """The owner token of a shared store's lock, once taken."""
        self.stored: list[ChatMessage] = []
        """The conversation as loaded."""

    def history(self) -> list[ChatMessage]:
        """What the model is sent: the window of the stored conversation."""
        stored = self.stored
        start = self.memory.start(stored)
        return stored[start:] if start else stored

    async def lease(self, where: str, give_up: float) -> None:
        """Take the shared store's lock, trying again until it is free, or until `give_up` (the
        memory's `wait`; the time budget bounds it too)."""
        store = self.memory.store
        assert isinstance(store, SharedChatMemoryStore)
        owner = LEASE_OWNER.get() or os.urandom(16).hex()
        delay = _FIRST_POLL
        while True:
            try:
                taken = await complete(store.try_lock(self.key, owner))
            except BaseException:
                # Cancelled (after the attempt finished) or failed: the lock may be ours; give it back.
                await _unlock(store, self.key, owner)
                raise
            if taken:
                self.owner = owner
                return
            left = give_up - anyio.current_time()
            if left <= 0:
                wait = self.memory.config.wait
                raise ConversationBusyError(
                    f"{where}: conversation {self.memory_id!r} stayed busy with another process's turn "
                    f"for {wait} s",
                    memory_id=self.memory_id,
                )
            await anyio.sleep(min(delay, left))  # at the limit, one last try
            delay = min(delay * 2, _LAST_POLL)

    async def commit(self, messages: Sequence[ChatMessage], turn: str | None = None) -> None:
        """Append the turn and drop what falls out of the window, in one write of the store. With
        `turn` (a durable turn's id), a write the store already made for that turn is not made again
        (see `ChatMemoryStore.commit`)."""
        stored = self.stored
        combined = [*stored, *messages]
        start = self.memory.start(combined)
        kept = len(stored)
        drop = start if start < kept else kept
        appended = messages if start <= kept else messages[start - kept :]
        store = self.memory.store
        write = (
            store.commit(self.key, appended, drop=drop, owner=self.owner)
            if turn is None
            else store.commit(self.key, appended, drop=drop, owner=self.owner, turn=turn)
        )
        await (write if self.memory.plain else complete(write))
        self.stored = combined[start:]

    async def replace(self, messages: Sequence[ChatMessage]) -> None:
        await complete(self.memory.store.replace(self.key, messages, owner=self.owner))
        self.stored = list(messages)

    async def delete(self) -> None:
        await complete(self.memory.store.delete(self.key, owner=self.owner))
        self.stored = []

    def claim(self) -> None:
        """The running task reads the turn's stream from now on: it holds the conversation (a stream
        handed to another task is that task's to close)."""
        self._holder.task = current_task()

    def abandon(self) -> None:
        """The turn's stream was collected unclosed and is being closed from another task: no task
        holds the conversation, so a turn started meanwhile waits for that close. Any thread."""
        self._holder.task = None

    def release_local(self) -> None:
        """Release the lock within the process (the whole lock, for a store that is not shared)."""
        if self.held:
            self.held = False
            _release(self._table, self.key)

    async def release(self) -> None:
        """Release the lock: the shared store's first, then the process's. Call shielded."""
        if not self.held:
            return
        owner = self.owner
        if owner is not None:
            self.owner = None
            store = self.memory.store
            assert isinstance(store, SharedChatMemoryStore)
            try:
                await _unlock(store, self.key, owner)
            finally:
                self.release_local()
        else:
            self.release_local()


async def _unlock(store: SharedChatMemoryStore, key: str, owner: str) -> None:
    """Release a shared store's lock. A failure is logged, not raised: the turn's outcome is already
    decided (stored or not), and a lease that was not released expires by itself."""

    async def bounded() -> None:
        with anyio.move_on_after(10):  # a store that hangs: same as one that is down
            await store.unlock(key, owner)

    try:
        await complete(bounded())
    except Exception:
        logger.warning(
            "could not release the lock of conversation %r; it expires with its lease", key, exc_info=True
        )


def check_history(messages: Sequence[ChatMessage], where: str) -> None:
    """A conversation written through `MemoryAccess` must be one a provider accepts: user, assistant
    and tool result messages only (the system message is rendered per turn), a user message first,
    and each assistant message that calls tools followed at once by exactly one result per call."""
    from .._messages import AssistantMessage, UserMessage

    # Calls of the last assistant message still without a result, counted: some servers repeat an id
    # in parallel calls, and each of those calls has its result.
    pending: Counter[str] = Counter()
    for index, message in enumerate(messages):
        if isinstance(message, ToolResultMessage):
            if pending[message.tool_call_id] <= 0:
                raise ValueError(
                    f"{where}: message {index} answers tool call {message.tool_call_id!r}, which the "
                    "assistant message right before its results did not make (or which is answered already)"
                )
            pending[message.tool_call_id] -= 1
            if not pending[message.tool_call_id]:
                del pending[message.tool_call_id]
            continue
        if pending:
            raise ValueError(f"{where}: tool call(s) {sorted(pending)} have no result before message {index}")
        if isinstance(message, SystemMessage):
            raise ValueError(
                f"{where}: message {index} is a system message; conversations do not store it "
                "(the system message is rendered for each turn)"
            )
        if isinstance(message, AssistantMessage):
            if not index:
                raise ValueError(
                    f"{where}: message 0 is an assistant message; a conversation starts with a user "
                    "message (Anthropic refuses others, and a window would skip it): write a summary as "
                    "a user message"
                )
            pending = Counter(call.id for call in message.tool_calls)
        elif not isinstance(message, UserMessage):
            raise TypeError(f"{where}: message {index} is not a chat message: {message!r}")
    if pending:
        raise ValueError(f"{where}: tool call(s) {sorted(pending)} of the last message have no result")
