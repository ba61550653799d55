"""The in-memory store: conversations in a dict, for development and single-process apps."""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from typing import TYPE_CHECKING, Final

from ._store import TURNS_REMEMBERED

if TYPE_CHECKING:
    from collections.abc import Sequence

    from .._messages import ChatMessage

__all__ = ["DEFAULT_MAX_CONVERSATIONS", "InMemoryStore"]

DEFAULT_MAX_CONVERSATIONS: Final = 10_000
"""The bound of the store `memory.window()` makes when it is given none: the least recently used
conversations beyond it are forgotten, so a long-running server does not keep every conversation it
ever saw."""

LARGE: Final = 100_000
"""An unbounded store (no `max_conversations`, no `ttl`) that grows past this many conversations logs
one warning: it is probably a server that forgets nothing."""

logger = logging.getLogger("agentrt.memory")


class InMemoryStore:
    """Conversations in this process's memory, lost when it exits.

    - `max_conversations`: keep at most this many; the least recently used (loaded or written) is
      evicted first.
    - `ttl`: forget a conversation not used for this many seconds.

    With neither, nothing is ever forgotten: past `LARGE` (100,000) conversations the store logs one
    warning on the `agentrt.memory` logger. (`memory.window()` without a store bounds its own at
    `DEFAULT_MAX_CONVERSATIONS`.)

    Messages are immutable values, so a store keeps them as they are (no copy, no serialization): a
    turn costs a few dictionary operations. Writes are plain code with no await, so they are atomic.
    Turns are serialized by the memory's lock per conversation, within one event loop; a conversation
    evicted (by the bound or the TTL) while a turn on it runs loses its older messages.
    """

    __slots__ = (
        "__weakref__",
        "_clock",
        "_data",
        "_pending",
        "_turns",
        "_warned",
        "max_conversations",
        "ttl",
    )

    def __init__(self, *, max_conversations: int | None = None, ttl: float | None = None) -> None:
        if max_conversations is not None and (
            not isinstance(max_conversations, int)
            or isinstance(max_conversations, bool)
            or max_conversations < 1
        ):
            raise ValueError(f"max_conversations must be a positive int or None, got {max_conversations!r}")
        if ttl is not None and (isinstance(ttl, bool) or not isinstance(ttl, int | float) or not ttl > 0):
            raise ValueError(f"ttl must be a positive number of seconds or None, got {ttl!r}")
        self.max_conversations = max_conversations
        self.ttl = ttl
        self._clock = time.monotonic
        self._warned = False
        # key -> (messages, when it expires); ordered from least to most recently used.
        self._data: OrderedDict[str, tuple[tuple[ChatMessage, ...], float]] = OrderedDict()
        # key -> (run id, data): turns waiting for approval; not bounded by the conversations' bound
        # (a waiting turn is not forgotten while a human decides), removed when taken.
        self._pending: dict[str, tuple[str, bytes]] = {}
        # key -> the ids of the turns last committed with one (`commit(turn=...)`), oldest first;
        # forgotten with the conversation (deleted, evicted or expired).
        self._turns: dict[str, tuple[str, ...]] = {}

    def __repr__(self) -> str:
        return (
            f"InMemoryStore({len(self._data)} conversations, max_conversations={self.max_conversations}, "
            f"ttl={self.ttl})"
        )

    def __len__(self) -> int:
        """Conversations kept now (expired ones included until they are next touched)."""
        return len(self._data)

    def _get(self, key: str) -> tuple[ChatMessage, ...]:
        entry = self._data.get(key)
        if entry is None:
            return ()
        if self.ttl is not None:
            now = self._clock()
            if entry[1] <= now:
                del self._data[key]
                self._turns.pop(key, None)
                return ()
            self._data[key] = (entry[0], now + self.ttl)
        self._data.move_to_end(key)
        return entry[0]

    def _put(self, key: str, messages: tuple[ChatMessage, ...]) -> None:
        data = self._data
        ttl = self.ttl
        now = self._clock() if ttl is not None else 0.0
        data[key] = (messages, now + ttl if ttl is not None else 0.0)
        data.move_to_end(key)
        if ttl is not None:  # the least recently used come first: drop the expired among them
            while data:
                oldest, (_, expires) = next(iter(data.items()))
                if expires > now:
                    break
                del data[oldest]
                self._turns.pop(oldest, None)
        bound = self.max_conversations
        if bound is not None:
            while len(data) > bound:
                self._turns.pop(data.popitem(last=False)[0], None)
        elif ttl is None and len(data) > LARGE and not self._warned:
            self._warned = True
            logger.warning(
                "an InMemoryStore without max_conversations or ttl holds %d conversations and forgets "
                "none of them; bound it (InMemoryStore(max_conversations=..., ttl=...))",
                len(data),
            )

    async def load(self, key: str) -> list[ChatMessage]:
        return list(self._get(key))

    async def commit(
        self,
        key: str,
        messages: Sequence[ChatMessage],
        *,
        drop: int = 0,
        owner: str | None = None,
        turn: str | None = None,
    ) -> None:
        stored = self._get(key)
        if turn is not None:
            turns = self._turns.get(key, ())
            if turn in turns:
                return  # this turn is stored already
            self._turns[key] = (*turns[1 - TURNS_REMEMBERED :], turn)
        self._put(key, (*stored[drop:], *messages))

    async def replace(self, key: str, messages: Sequence[ChatMessage], *, owner: str | None = None) -> None:
        self._put(key, tuple(messages))

    async def delete(self, key: str, *, owner: str | None = None) -> None:
        self._data.pop(key, None)
        self._turns.pop(key, None)

    async def save_pending(self, key: str, run: str, data: bytes, *, owner: str | None = None) -> None:
        self._pending[key] = (run, data)

    async def load_pending(self, key: str) -> tuple[str, bytes] | None:
        return self._pending.get(key)

    async def take_pending(self, key: str, run: str, *, owner: str | None = None) -> bytes | None:
        found = self._pending.get(key)
        if found is None or found[0] != run:
            return None
        del self._pending[key]
        return found[1]
