"""What `RedisRunLog` (`agentrt._runs_redis`) sends to Redis and reads back: its Lua scripts (each
with the KEYS and ARGV it takes), a batch of the writer's buffered frames as the write script's keys
and arguments (and back in their buffers after a failed write), the entries of an XREAD reply and
their frames, and the subscription to stop requests."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Final, cast

import anyio.from_thread

if TYPE_CHECKING:
    import threading
    from collections.abc import Callable, Container, Mapping

    import redis

logger = logging.getLogger("agentrt.runs")

RETRY_SECONDS: Final = 1.0  # after a failed write or subscription, before the next attempt

WRITE_FRAMES: Final = 2000  # frames written by one script, at most
_WRITE_BYTES: Final = 1 << 20  # and about as many bytes

_NOW = "local t = redis.call('TIME') local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n"

# KEYS: record, index. ARGV: writer, live ms, run id, has owner, owner, has thread, thread.
OPEN = (
    _NOW
    + """
if redis.call('EXISTS', KEYS[1]) == 1 then
  if redis.call('HGET', KEYS[1], 'writer') == ARGV[1] then return 1 end
  return 0
end
redis.call('HSET', KEYS[1], 'writer', ARGV[1], 'seq', 0, 'beat', now)
if ARGV[4] == '1' then redis.call('HSET', KEYS[1], 'owner', ARGV[5]) end
if ARGV[6] == '1' then
  redis.call('HSET', KEYS[1], 'thread', ARGV[7])
  redis.call('ZADD', KEYS[2], tonumber(t[1]) * 1000000 + tonumber(t[2]), ARGV[3])
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
"""
)

# Every run with frames to write (or to end), in one script. KEYS: per run its record, stream and
# index. ARGV: max entries, live ms, ttl ms; then per run: its first frame's seq, the number of
# frames, `1` to end it, its id, and the frames. Frames Redis has (a retried write) are skipped. A run
# whose record is gone (expired) is answered 0, its frames dropped.
WRITE = (
    _NOW
    + """
local maxlen, live, ttl = ARGV[1], ARGV[2], ARGV[3]
local a = 4
local out = {}
for r = 1, #KEYS, 3 do
  local rec, log, idx = KEYS[r], KEYS[r + 1], KEYS[r + 2]
  local first, count, ending, id = tonumber(ARGV[a]), tonumber(ARGV[a + 1]), ARGV[a + 2], ARGV[a + 3]
  a = a + 4
  local state = redis.call('HMGET', rec, 'seq', 'ended')
  if not state[1] then
    out[#out + 1] = 0
  else
    local last = tonumber(state[1])
    for i = 0, count - 1 do
      local seq = first + i
      if seq > last then
        redis.call('XADD', log, 'MAXLEN', '~', maxlen, string.format('0-%d', seq), 'f', ARGV[a + i])
        last = seq
      end
    end
    if state[2] == '1' then
      out[#out + 1] = 1
    elseif ending == '1' then
      redis.call('XADD', log, 'MAXLEN', '~', maxlen, string.format('0-%d', last + 1), 'end', '1')
      redis.call('HSET', rec, 'seq', last, 'ended', '1', 'beat', now)
      redis.call('ZREM', idx, id)
      redis.call('PEXPIRE', rec, ttl)
      redis.call('PEXPIRE', log, ttl)
      out[#out + 1] = 1
    else
      redis.call('HSET', rec, 'seq', last, 'beat', now)
      redis.call('PEXPIRE', rec, live)
      redis.call('PEXPIRE', log, live)
      out[#out + 1] = 1
    end
  end
  a = a + count
end
return out
"""
)

# The writer's heartbeat for its runs. KEYS: per run its record and stream, then the indexes.
# ARGV: live ms, the number of runs.
BEAT = (
    _NOW
    + """
local runs = tonumber(ARGV[2])
for r = 1, runs * 2, 2 do
  local state = redis.call('HMGET', KEYS[r], 'beat', 'ended')
  if state[1] and state[2] ~= '1' then
    redis.call('HSET', KEYS[r], 'beat', now)
    redis.call('PEXPIRE', KEYS[r], ARGV[1])
    redis.call('PEXPIRE', KEYS[r + 1], ARGV[1])
  end
end
for i = runs * 2 + 1, #KEYS do redis.call('PEXPIRE', KEYS[i], ARGV[1]) end
return 1
"""
)

# What a reader that waited for nothing needs to know. KEYS: record. ARGV: lost ms.
# 0: no such run (expired), 1: ended, 2: lost (no heartbeat for lost ms), 3: going.
STATE = (
    _NOW
    + """
local state = redis.call('HMGET', KEYS[1], 'ended', 'beat')
if not state[2] then return 0 end
if state[1] == '1' then return 1 end
if now - tonumber(state[2]) > tonumber(ARGV[1]) then return 2 end
return 3
"""
)

# The latest run of a conversation that has not ended and whose writer is alive. KEYS: index.
# ARGV: the records' key prefix, lost ms, has owner, owner.
ACTIVE = (
    _NOW
    + """
local lost = tonumber(ARGV[2])
for _, id in ipairs(redis.call('ZREVRANGE', KEYS[1], 0, -1)) do
  local state = redis.call('HMGET', ARGV[1] .. id, 'ended', 'beat', 'owner')
  if not state[2] then
    redis.call('ZREM', KEYS[1], id)
  elseif state[1] ~= '1' and now - tonumber(state[2]) <= lost
      and ((ARGV[3] == '0' and not state[3]) or state[3] == ARGV[4]) then
    return id
  end
end
return false
"""
)


class Writing:
    """A run this log writes: its frames not yet written (`first` is the seq of `frames[0]`, `size`
    their bytes)."""

    __slots__ = ("ending", "first", "frames", "id", "index", "log", "queued", "record", "size")

    def __init__(self, run: str, record: str, log: str, index: str) -> None:
        self.id = run
        self.record = record
        self.log = log
        self.index = index
        self.frames: list[bytes] = []
        self.first = 1
        self.size = 0
        self.queued = False
        self.ending = False


Batch = list[tuple[Writing, int, list[bytes], bool]]


def take_batch(
    runs: list[Writing], live: Container[str], head: list[str | int]
) -> tuple[Batch, list[str], list[str | int | bytes], int]:
    """Take the next batch of the runs' frames from their buffers (the runs in `live` only): the runs
    taken from (with the seq of their first frame taken, the frames, and whether the batch ends the
    run), the write script's keys and arguments (after `head`), and the bytes taken."""
    taken: Batch = []
    keys: list[str] = []
    args: list[str | int | bytes] = [*head]
    room, size = WRITE_FRAMES, 0
    for writing in runs:
        if room <= 0 or size >= _WRITE_BYTES:
            break
        frames = writing.frames
        if writing.id not in live or not (frames or writing.ending):
            continue
        count = took = 0
        while count < len(frames) and count < room and size + took < _WRITE_BYTES:
            took += len(frames[count])
            count += 1
        size += took
        writing.size -= took
        if count == len(frames):
            writing.frames = []
        else:
            writing.frames = frames[count:]
            frames = frames[:count]
        room -= count
        first = writing.first
        writing.first += count
        ending = writing.ending and not writing.frames
        taken.append((writing, first, frames, ending))
        keys += [writing.record, writing.log, writing.index]
        args += [first, count, "1" if ending else "0", writing.id, *frames]
    return taken, keys, args, size


def put_back(taken: Batch, live: Mapping[str, Writing], queue: list[Writing]) -> int:
    """Put the frames of a batch whose write failed back into their runs' buffers (the runs in
    `live` only), each run on the `queue` once: the bytes put back."""
    put = 0
    for writing, first, frames, _ in taken:
        if live.get(writing.id) is not writing:
            continue  # dropped meanwhile
        writing.frames[:0] = frames
        writing.first = first
        size = sum(map(len, frames))
        writing.size += size
        put += size
        if not writing.queued:
            writing.queued = True
            queue.append(writing)
    return put


def text(value: Any) -> Any:
    return value.decode() if isinstance(value, bytes) else value


def xread_entries(reply: Any) -> list[tuple[bytes, dict[bytes, bytes]]]:
    """The entries of an XREAD reply on one stream (RESP2: `[[key, entries]]`; RESP3: `{key:
    [entries]}`)."""
    if not reply:
        return []
    if isinstance(reply, dict):
        (streams,) = reply.values()
        return cast("list[tuple[bytes, dict[bytes, bytes]]]", streams[0])
    return cast("list[tuple[bytes, dict[bytes, bytes]]]", reply[0][1])


def frames_after(
    after: int, entries: list[tuple[bytes, dict[bytes, bytes]]]
) -> tuple[list[bytes], bool, bool]:
    """The frames of a run's log entries (`xread_entries`) that follow seq `after` one by one, and
    whether a gap (the stream's oldest entries trimmed) or the run's end stopped them."""
    frames: list[bytes] = []
    for entry_id, fields in entries:
        if int(entry_id.rpartition(b"-")[2]) != after + 1:
            return frames, True, False  # trimmed: the stream's oldest entries are gone
        frame = fields.get(b"f")
        if frame is None:
            return frames, False, True
        after += 1
        frames.append(frame)
    return frames, False, False


def relay_stops(
    client: redis.Redis, channel: str, stop: Callable[[str], None], stopping: threading.Event
) -> None:
    """In a worker thread, until `stopping` is set: `stop(run)` (in the event loop's thread) for each
    stop request published on `channel`; a subscription that failed is made again a second later."""
    while not stopping.is_set():
        try:
            pubsub = client.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call]
            try:
                pubsub.subscribe(channel)
                while not stopping.is_set():
                    message = pubsub.get_message(timeout=0.2)
                    if message is not None and message.get("type") == "message":
                        anyio.from_thread.run_sync(stop, text(message["data"]))
            finally:
                pubsub.close()
        except Exception as error:
            if stopping.is_set():
                return
            logger.warning(
                "agentrt.runs: the subscription to stop requests failed (%s: %s); subscribing again",
                type(error).__name__,
                error,
            )
            stopping.wait(RETRY_SECONDS)
