"""Limits shared by router instances: a token bucket per key in Redis, one atomic Lua call."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import NoScriptError, RedisError

if TYPE_CHECKING:
    from router.config import LimitsConfig

log = logging.getLogger("router")

# Two buckets (requests, tokens) in one hash, refilled from Redis TIME so every instance shares
# one clock. KEYS[1] the hash; ARGV: request capacity, requests/s, token capacity, tokens/s,
# requests wanted, tokens wanted. Both are taken or neither. Returns allowed (0/1), retry-after
# ms, remaining requests, remaining tokens, ms until each bucket is full again.
_ACQUIRE = """
local rcap = tonumber(ARGV[1]); local rrate = tonumber(ARGV[2])
local tcap = tonumber(ARGV[3]); local trate = tonumber(ARGV[4])
local nr = tonumber(ARGV[5]); local nt = tonumber(ARGV[6])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local s = redis.call('HMGET', KEYS[1], 'r', 't', 'ts')
local r = tonumber(s[1]) or rcap
local k = tonumber(s[2]) or tcap
local dt = math.max(0, now - (tonumber(s[3]) or now))
r = math.min(rcap, r + dt * rrate)
k = math.min(tcap, k + dt * trate)
local wait = 0
if r < nr then wait = math.max(wait, (nr - r) / rrate) end
if nt > 0 and k < nt then wait = math.max(wait, (nt - k) / trate) end
local allowed = 0
if wait == 0 then
  allowed = 1
  r = r - nr
  k = k - nt
end
redis.call('HSET', KEYS[1], 'r', r, 't', k, 'ts', now)
local rfull = (rcap - r) / rrate
local tfull = (tcap - k) / trate
redis.call('PEXPIRE', KEYS[1], math.ceil(math.max(rfull, tfull) * 1000) + 1000)
return {allowed, math.ceil(wait * 1000), math.floor(math.max(r, 0)), math.floor(math.max(k, 0)),
        math.ceil(rfull * 1000), math.ceil(tfull * 1000)}
"""

# Adjust a key's token bucket by ARGV[3] tokens (positive gives back, negative takes more), after
# refilling it like _ACQUIRE; a debt is bounded by one bucket so one huge answer cannot block a
# key for long. ARGV: token capacity, tokens/s, delta. A missing key (expired, Redis restarted)
# is left alone.
_ADJUST = """
local tcap = tonumber(ARGV[1]); local trate = tonumber(ARGV[2]); local delta = tonumber(ARGV[3])
local s = redis.call('HMGET', KEYS[1], 't', 'ts')
if not s[1] then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local dt = math.max(0, now - (tonumber(s[2]) or now))
local k = math.min(tcap, tonumber(s[1]) + dt * trate)
k = math.max(-tcap, math.min(tcap, k + delta))
redis.call('HSET', KEYS[1], 't', k, 'ts', now)
return 1
"""

# Failures that mean "Redis is not answering", as opposed to a bug in our call.
_OUTAGE = (RedisError, OSError, TimeoutError)


@dataclass(frozen=True, slots=True)
class Rates:
    """One key's limits as bucket parameters."""

    request_capacity: float
    requests_per_s: float
    token_capacity: float
    tokens_per_s: float


@dataclass(frozen=True, slots=True)
class Decision:
    """Redis's answer for one acquire."""

    allowed: bool
    retry_after_s: float
    remaining_requests: int
    remaining_tokens: int
    reset_requests_s: float
    reset_tokens_s: float


@dataclass(slots=True)
class _Call:
    """One script call waiting for the next pipeline; `done` is None when nobody waits."""

    script: str
    key: str
    args: tuple[float | int, ...]
    done: asyncio.Future[list[int]] | None


class RedisBuckets:
    """Atomic per-key buckets in Redis, with outage detection and recovery in the background.

    Calls made in the same event-loop turn go to Redis in one pipeline on one connection, so a
    burst of requests costs a round trip, not a connection each.
    """

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = 0.25,
        retry_s: float = 1.0,
        prefix: str = "router:rl:",
        max_batch: int = 256,
    ) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self.retry_s = retry_s
        self.prefix = prefix
        self.max_batch = max_batch
        # No client-side retries: a slow or absent Redis must cost one short timeout, not several.
        self._client = aioredis.Redis.from_url(
            url,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            retry=Retry(NoBackoff(), 0),
            retry_on_timeout=False,
            health_check_interval=0,
        )
        self._scripts = {name: _sha1(text) for name, text in _SCRIPTS.items()}
        self._queue: list[_Call] = []
        self._flusher: asyncio.Task[None] | None = None
        self.available = True
        self._recovery: asyncio.Task[None] | None = None
        self.outages = 0

    @classmethod
    def from_config(cls, config: LimitsConfig) -> RedisBuckets:
        """Build from the `[limits]` section."""
        return cls(
            config.redis_url,
            timeout_s=config.redis_timeout_ms / 1000,
            retry_s=config.redis_retry_s,
            prefix=config.redis_key_prefix,
        )

    def key(self, key_id: str) -> str:
        """The Redis key holding `key_id`'s buckets."""
        return self.prefix + key_id

    async def acquire(self, key_id: str, rates: Rates, tokens: int) -> Decision | None:
        """Take one request and `tokens` from the shared buckets; None while Redis is out."""
        if not self.available:
            return None
        args = (
            rates.request_capacity,
            rates.requests_per_s,
            rates.token_capacity,
            rates.tokens_per_s,
            1,
            tokens,
        )
        done: asyncio.Future[list[int]] = asyncio.get_running_loop().create_future()
        self._submit(_Call("acquire", self.key(key_id), args, done))
        try:
            async with asyncio.timeout(self.timeout_s):
                raw = await asyncio.shield(done)
        except _OUTAGE as exc:
            done.cancel()  # the pipeline, if it ever answers, finds nobody waiting
            self._outage(exc)
            return None
        allowed, wait_ms, rem_r, rem_t, reset_r, reset_t = (int(v) for v in raw)
        return Decision(
            allowed=bool(allowed),
            retry_after_s=wait_ms / 1000,
            remaining_requests=rem_r,
            remaining_tokens=rem_t,
            reset_requests_s=reset_r / 1000,
            reset_tokens_s=reset_t / 1000,
        )

    def adjust_later(self, key_id: str, rates: Rates, delta_tokens: int) -> None:
        """Give back (or take more) tokens once usage is known, without making the caller wait."""
        if self.available and delta_tokens != 0:
            args = (rates.token_capacity, rates.tokens_per_s, delta_tokens)
            self._submit(_Call("adjust", self.key(key_id), args, None))

    def _submit(self, call: _Call) -> None:
        self._queue.append(call)
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.get_running_loop().create_task(self._flush())

    async def _flush(self) -> None:
        """Send queued calls in pipelines until the queue is empty."""
        while self._queue:
            batch, self._queue = self._queue[: self.max_batch], self._queue[self.max_batch :]
            try:
                results = await self._run(batch)
            except _OUTAGE as exc:
                for call in batch:
                    if call.done is not None and not call.done.done():
                        call.done.set_exception(exc)
                if not any(call.done is not None for call in batch):
                    self._outage(exc)
                continue
            for call, result in zip(batch, results, strict=True):
                if call.done is None or call.done.done():
                    continue
                if isinstance(result, BaseException):
                    call.done.set_exception(result)
                else:
                    call.done.set_result(result)

    async def _run(self, batch: list[_Call]) -> list[Any]:
        """One pipeline of EVALSHAs; scripts Redis forgot (a restart) are loaded and re-run."""
        results = await self._pipeline(batch)
        missing = [i for i, r in enumerate(results) if isinstance(r, NoScriptError)]
        if missing:
            for name, text in _SCRIPTS.items():
                await self._client.script_load(text)
                self._scripts[name] = _sha1(text)
            again = await self._pipeline([batch[i] for i in missing])
            for i, result in zip(missing, again, strict=True):
                results[i] = result
        return results

    async def _pipeline(self, batch: list[_Call]) -> list[Any]:
        pipe = self._client.pipeline(transaction=False)
        for call in batch:
            pipe.evalsha(self._scripts[call.script], 1, call.key, *call.args)
        async with asyncio.timeout(self.timeout_s):
            results: list[Any] = await pipe.execute(raise_on_error=False)
        return results

    def _outage(self, exc: BaseException) -> None:
        """Switch to local-only limits and start probing for Redis's return (logged once)."""
        if not self.available:
            return
        self.available = False
        self.outages += 1
        log.warning(
            "global limits: redis at %s unreachable (%s: %s); serving with local limits only "
            "until it answers again",
            self.url,
            type(exc).__name__,
            exc,
        )
        self._recovery = asyncio.get_running_loop().create_task(self._recover())

    async def _recover(self) -> None:
        """Ping every retry_s until Redis answers, then resume global limits."""
        began = time.monotonic()
        # Connections from before the outage may be dead (a restart): start afresh.
        with contextlib.suppress(*_OUTAGE):
            await self._client.connection_pool.disconnect()
        while True:
            await asyncio.sleep(self.retry_s)
            try:
                async with asyncio.timeout(self.timeout_s):
                    await self._client.ping()
            except _OUTAGE:
                continue
            self.available = True
            log.warning(
                "global limits: redis at %s answers again after %.1f s; global limits resumed",
                self.url,
                time.monotonic() - began,
            )
            return

    async def close(self) -> None:
        """Stop background work and close connections."""
        tasks = [t for t in (self._flusher, self._recovery) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, *_OUTAGE):
                await task
        with contextlib.suppress(*_OUTAGE):
            await self._client.aclose()


def _sha1(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()


_SCRIPTS = {"acquire": _ACQUIRE, "adjust": _ADJUST}
