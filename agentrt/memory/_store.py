"""The store protocol: where conversations live. Stores only keep messages; windows, locking and
namespacing are the memory's (`ChatMemory`), so a new store is four small async methods.

A conversation is named by a key (a string the memory builds from the service's namespace and the
memory id). A store keeps its messages in order and never loses a field of one (contents, tool
calls, thinking): `messages_to_json` / `messages_from_json` are the round trip to bytes.

A store that several processes share (`SharedChatMemoryStore`) also locks a conversation for an owner:
a lease with an expiry that the store renews while it is held, so a crashed holder's lock expires and
a live holder's does not. Its writes take the owner and are refused (`ConversationLockLostError`) when
the lease is no longer that owner's: a holder that lost its lock can never interleave its messages
with the next holder's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final, Protocol, runtime_checkable

if TYPE_CHECKING:
    from collections.abc import Sequence

    from .._messages import ChatMessage

__all__ = ["TURNS_REMEMBERED", "ChatMemoryStore", "PendingStore", "SharedChatMemoryStore"]

TURNS_REMEMBERED: Final = 100
"""How many committed turn ids a store remembers per conversation (see `ChatMemoryStore.commit`)."""


@runtime_checkable
class ChatMemoryStore(Protocol):
    """Keeps conversations: ordered lists of messages (never a system message), by key.

    Every method is safe to cancel: a write that was cancelled happened entirely or not at all.
    """

    async def load(self, key: str) -> list[ChatMessage]:
        """The conversation's messages, oldest first; `[]` for a conversation never written."""
        ...

    async def commit(
        self,
        key: str,
        messages: Sequence[ChatMessage],
        *,
        drop: int = 0,
        owner: str | None = None,
        turn: str | None = None,
    ) -> None:
        """In one atomic write: remove the first `drop` stored messages, then append `messages`.

        With `owner` (shared stores), only while `owner` holds the conversation's lock; otherwise
        raise `ConversationLockLostError` and change nothing.

        With `turn` (a turn's id; durable turns, `agentrt.durable`), the write also records the id,
        and a commit with an id the conversation already recorded changes nothing and returns: a
        commit run again after a crash between the write and the caller's record of it stores the
        turn once. A store remembers the last `TURNS_REMEMBERED` ids of each conversation, until it
        is deleted. Callers pass `turn` only when they need it: a store of an older agentrt
        without the parameter works as before for every other turn.
        """
        ...

    async def replace(self, key: str, messages: Sequence[ChatMessage], *, owner: str | None = None) -> None:
        """Make the conversation exactly `messages`, in one atomic write (`owner` as in `commit`)."""
        ...

    async def delete(self, key: str, *, owner: str | None = None) -> None:
        """Remove the conversation; a missing one is not an error (`owner` as in `commit`)."""
        ...


@runtime_checkable
class SharedChatMemoryStore(ChatMemoryStore, Protocol):
    """A store several processes share: it also locks conversations across them."""

    async def try_lock(self, key: str, owner: str) -> bool:
        """Take the conversation's lock for `owner` if nobody holds it (or its holder's lease
        expired), or `owner` holds it already (a durable turn going on in another worker after its
        worker died: its owner is the turn's, see `agentrt.durable`); `True` when taken. The store
        renews the lease until `unlock`."""
        ...

    async def unlock(self, key: str, owner: str) -> None:
        """Stop renewing and release the lock if `owner` still holds it (otherwise do nothing)."""
        ...


@runtime_checkable
class PendingStore(Protocol):
    """A store that also keeps turns waiting for a human's approval (see `agentrt.Approvals`): at most
    one per conversation, as bytes, beside the conversation's messages. The built-in stores do.

    `owner` is as in `ChatMemoryStore.commit`: with it (shared stores), a write is done only while
    `owner` holds the conversation's lock, else `ConversationLockLostError`.
    """

    async def save_pending(self, key: str, run: str, data: bytes, *, owner: str | None = None) -> None:
        """Keep `data` as the conversation's pending turn `run` (replacing any other)."""
        ...

    async def load_pending(self, key: str) -> tuple[str, bytes] | None:
        """The conversation's pending turn (its run id and data), or `None`."""
        ...

    async def take_pending(self, key: str, run: str, *, owner: str | None = None) -> bytes | None:
        """In one atomic step: remove the conversation's pending turn if it is `run`, and return its
        data; `None` (and nothing changed) if there is none or it is another run."""
        ...
