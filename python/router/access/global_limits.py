"""Limits shared by router instances, answered locally: each instance leases slices of a key's
global bucket from Redis in the background and admits from them with no network wait."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from router.access.leasing import (
    LeasePolicy,
    credit,
    excess,
    max_slice,
    next_rate,
    target,
    want,
)
from router.native import BucketTable
from router.net.redaction import display_url
from router.net.redis_client import (
    MAX_CONNECTIONS,
    OUTAGE,
    Client,
    hash_tagged,
    key_fault,
    open_redis,
    ping,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from router.config import LimitsConfig

log = logging.getLogger("router")

# A dimension without a configured limit; never runs out.
UNLIMITED = 1 << 40

# The global bucket pair of one key (one hash, one slot), refilled from Redis TIME so every
# instance shares one clock. In one atomic call an instance pays what it admitted on credit
# (owe), gives back what it will not use (back), and takes a new slice (want) out of what is
# there. KEYS[1] the hash; ARGV: request capacity, requests/s, token capacity, tokens/s, owe
# requests, owe tokens, back requests, back tokens, want requests, want tokens. A debt is
# bounded by one bucket. Returns granted requests, granted tokens, remaining requests, remaining
# tokens, ms until each bucket is full again, ms until one more request is there, and the token
# level (negative in debt: how long a request short of tokens waits depends on its size, so the
# instance works it out). Every router sends its own script text with EVAL, and the hash's
# fields and their meaning are unchanged, so routers of different versions may share the keys
# (a rolling upgrade): each reads the answer of the script it sent.
LEASE = """
local rcap = tonumber(ARGV[1]); local rrate = tonumber(ARGV[2])
local tcap = tonumber(ARGV[3]); local trate = tonumber(ARGV[4])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local s = redis.call('HMGET', KEYS[1], 'r', 't', 'ts')
local r = tonumber(s[1]) or rcap
local k = tonumber(s[2]) or tcap
local dt = math.max(0, now - (tonumber(s[3]) or now))
r = math.min(rcap, r + dt * rrate)
k = math.min(tcap, k + dt * trate)
r = math.max(-rcap, math.min(rcap, r - tonumber(ARGV[5]) + tonumber(ARGV[7])))
k = math.max(-tcap, math.min(tcap, k - tonumber(ARGV[6]) + tonumber(ARGV[8])))
local gr = math.max(0, math.min(tonumber(ARGV[9]), math.floor(r)))
local gt = math.max(0, math.min(tonumber(ARGV[10]), math.floor(k)))
r = r - gr
k = k - gt
redis.call('HSET', KEYS[1], 'r', r, 't', k, 'ts', now)
local rfull = (rcap - r) / rrate
local tfull = (tcap - k) / trate
local wait = 0
if r < 1 then wait = (1 - r) / rrate end
redis.call('PEXPIRE', KEYS[1], math.ceil(math.max(rfull, tfull) * 1000) + 1000)
return {gr, gt, math.floor(math.max(r, 0)), math.floor(math.max(k, 0)),
        math.ceil(rfull * 1000), math.ceil(tfull * 1000), math.ceil(wait * 1000), math.floor(k)}
"""


@dataclass(frozen=True, slots=True)
class Rates:
    """One key's limits as bucket parameters."""

    request_capacity: float
    requests_per_s: float
    token_capacity: float
    tokens_per_s: float

    @property
    def requests_limited(self) -> bool:
        return self.request_capacity < UNLIMITED

    @property
    def tokens_limited(self) -> bool:
        return self.token_capacity < UNLIMITED


# (allowed, retry after s, remaining requests, remaining tokens, reset requests s, reset tokens s)
Verdict = tuple[bool, float, int, int, float, float]


@dataclass(slots=True)
class Lease:
    """What one instance knows and holds of one key's global buckets."""

    rates: Rates
    credit: int
    seen: float
    # False until Redis first answered: admissions come from `credit` and are owed.
    leased: bool = False
    owe_requests: int = 0
    owe_tokens: int = 0
    # Wanted since the last tick (admitted or not): what the rate estimate is made of.
    demand_requests: int = 0
    demand_tokens: int = 0
    rate_requests: float = 0.0
    rate_tokens: float = 0.0
    # The largest reservation seen: a token slice smaller than one request is useless.
    largest: int = 0
    synced: float = 0.0
    syncing: bool = False
    # The last answer granted less than asked: the key is short globally, so wait for the tick.
    scarce: bool = False
    remaining_requests: int = 0
    remaining_tokens: int = 0
    reset_requests_s: float = 0.0
    reset_tokens_s: float = 0.0
    wait_s: float = 0.0
    # The global token level at the last answer, debt included (negative).
    level_tokens: int = 0
    # What was asked in the call in flight, to be settled with its answer.
    sent: tuple[int, int, int, int] = field(default=(0, 0, 0, 0))


class GlobalLeases:
    """Per-key slices of global buckets held locally (a rate-0 BucketTable), kept topped up
    from Redis by one background task; Redis being out means local limits only, logged once."""

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = 1.0,
        retry_s: float = 1.0,
        prefix: str = "router:rl:",
        policy: LeasePolicy | None = None,
        interval_s: float = 0.25,
        idle_s: float = 10.0,
        max_connections: int = MAX_CONNECTIONS,
        cluster: bool = False,
        clock: Callable[[], float] = time.monotonic,
        fail_open: bool = True,
    ) -> None:
        # What the limiter does while Redis is out (`[limits] on_redis_error`), as the log says.
        self.fail_open = fail_open
        # Where, as the log names it: no credentials.
        self.where = display_url(url)
        self.timeout_s = timeout_s
        self.retry_s = retry_s
        self.prefix = prefix
        self.policy = policy or LeasePolicy()
        self.interval_s = interval_s
        self.idle_s = idle_s
        self.clock = clock
        self._client: Client = open_redis(
            url, timeout_s=timeout_s, max_connections=max_connections, cluster=cluster
        )
        self.allowance = BucketTable()
        self.leases: dict[str, Lease] = {}
        self.available = True
        self.outages = 0
        self.syncs = 0
        self._kick = asyncio.Event()
        self._closing = False
        self._answered = self._estimated = clock()
        self._keeper: asyncio.Task[None] | None = None
        self._recovery: asyncio.Task[None] | None = None
        # Keys whose last call failed on their own data (clock time of it): local limits only
        # for them, tried again every retry_s.
        self.failing: dict[str, float] = {}
        # A key of the call that found Redis out, and its rates: the script run on it (asking
        # for nothing) tells Redis's return, as a PING, which an erroring Redis answers, cannot.
        self._probe: tuple[str, Rates] | None = None

    @classmethod
    def from_config(cls, config: LimitsConfig) -> GlobalLeases:
        """Build from the `[limits]` section."""
        return cls(
            config.redis_url,
            timeout_s=config.redis_timeout_ms / 1000,
            retry_s=config.redis_retry_s,
            prefix=config.redis_key_prefix,
            policy=LeasePolicy(
                horizon_s=config.lease_horizon_s,
                max_fraction=config.lease_max_fraction,
                credit_fraction=config.lease_credit_fraction,
            ),
            interval_s=config.lease_interval_s,
            idle_s=config.lease_idle_s,
            max_connections=config.redis_max_connections,
            cluster=config.redis_cluster,
            fail_open=config.on_redis_error == "open",
        )

    def key(self, key_id: str) -> str:
        """The Redis key holding `key_id`'s buckets, hash-tagged to one Cluster slot."""
        return hash_tagged(self.prefix, key_id)

    # The request path: no await anywhere below until `_sync`.

    def take(self, key: str, rates: Rates, tokens: int) -> Verdict | None:
        """Admit one request and `tokens` from the local slice; None while Redis is out (or,
        for a while, when this key's call failed on its data in Redis)."""
        if not self.available:
            return None
        if self._keeper is None:
            self.start()  # lazily: the first request runs inside the app's event loop
        now = self.clock()
        failed = self.failing.get(key)
        if failed is not None and now - failed < self.retry_s:
            return None
        lease = self.leases.get(key)
        if lease is None or lease.rates != rates:
            lease = self._open(key, rates, now)
        lease.seen = now
        lease.demand_requests += 1
        lease.demand_tokens += tokens
        lease.largest = max(lease.largest, tokens)
        if not lease.leased:
            if lease.credit > 0:
                lease.credit -= 1
                lease.owe_requests += 1
                lease.owe_tokens += tokens
                # No slice and no global level known yet: what this router may still admit is
                # the credit it has left, requests of any size while that lasts (the local
                # bucket, which the limiter also asks, bounds their tokens).
                more_t = UNLIMITED if lease.credit > 0 else 0
                return (True, 0.0, lease.credit, more_t, 0.0, 0.0)
            return (False, self.interval_s, 0, 0, self.interval_s, self.interval_s)
        allowed, _, held_r, held_t, _, _ = self.allowance.try_acquire(key, tokens)
        if not allowed and not lease.scarce and lease.credit > 0:
            # Out of slice, but Redis had more than asked for last time: borrow, pay next call.
            lease.credit -= 1
            lease.owe_requests += 1
            lease.owe_tokens += tokens
            allowed = True
        # Admitted: its slice, plus what the global bucket had left at the last answer (a top-up
        # may bring it) or, when more, the credit it may still borrow (charged to that bucket).
        credit_left = 0 if lease.scarce else lease.credit
        remaining_r = held_r + max(lease.remaining_requests, credit_left)
        remaining_t = lease.remaining_tokens + held_t
        if not lease.scarce and not lease.syncing and self._low(lease, held_r, held_t):
            # Running low while the global bucket has plenty: top up now, not at the tick.
            self._kick.set()
        if allowed:
            return (
                True,
                0.0,
                remaining_r,
                remaining_t,
                lease.reset_requests_s,
                lease.reset_tokens_s,
            )
        retry = max(lease.wait_s, self.interval_s, self._token_wait(lease, tokens, held_t, now))
        # Refused: what this router can admit now is its own slice, whatever the global bucket
        # held at the last sync (other routers' slices, or what Redis keeps back).
        return (False, retry, held_r, held_t, lease.reset_requests_s, lease.reset_tokens_s)

    def settle(self, key: str, reserved: int, used: int) -> None:
        """Real usage of a request admitted from a lease: the difference stays with the slice."""
        lease = self.leases.get(key)
        if lease is None or reserved == used:
            return
        if lease.leased:
            self.allowance.reconcile(key, reserved, used)
        else:
            lease.owe_tokens -= reserved - used

    def _low(self, lease: Lease, held_r: int, held_t: int) -> bool:
        """Whether the slice is down to half its goal, in either dimension (a key limited on
        tokens alone has no requests goal)."""
        if held_r < self._goal_requests(lease) / 2:
            return True
        return lease.rates.tokens_limited and held_t < self._goal_tokens(lease) / 2

    @staticmethod
    def _token_wait(lease: Lease, tokens: int, held_t: int, now: float) -> float:
        """Seconds until the global bucket holds what a refused request's `tokens` lack beyond
        the slice: from its level at the last answer (debt included), refilled since. Other
        instances' takes since that answer are not known here (at most a slice each)."""
        rates = lease.rates
        if not rates.tokens_limited:
            return 0.0
        level = min(
            rates.token_capacity,
            lease.level_tokens + max(0.0, now - lease.synced) * rates.tokens_per_s,
        )
        return max(0.0, tokens - held_t - level) / rates.tokens_per_s

    def _open(self, key: str, rates: Rates, now: float) -> Lease:
        # A tokens-only key: one request on credit, whatever it reserves.
        first = credit(self.policy, rates.request_capacity) if rates.requests_limited else 1
        lease = Lease(rates=rates, credit=first, seen=now, synced=now)
        old = self.leases.get(key)
        if old is not None and old.leased:
            # Limits changed: what was held goes back with the first call under the new ones.
            lease.owe_requests, lease.owe_tokens = old.owe_requests, old.owe_tokens
            lease.leased = True
            # Until the first answer under them, waits count from the last level heard.
            lease.level_tokens, lease.synced = old.level_tokens, old.synced
            self._reshape(key, rates)
        self.leases[key] = lease
        self._kick.set()
        return lease

    def _goal_requests(self, lease: Lease) -> float:
        if not lease.rates.requests_limited:
            return 0.0
        rate = max(lease.rate_requests, lease.demand_requests / self._window())
        return target(self.policy, rate, lease.rates.request_capacity, 1.0)

    def _goal_tokens(self, lease: Lease) -> float:
        if not lease.rates.tokens_limited:
            return 0.0
        rate = max(lease.rate_tokens, lease.demand_tokens / self._window())
        return target(self.policy, rate, lease.rates.token_capacity, float(lease.largest))

    def _window(self) -> float:
        """Seconds the demand counted since the last estimate covers (a quarter interval at
        least, so one early request does not read as a huge rate)."""
        return max(self.clock() - self._estimated, self.interval_s / 4)

    # The allowance table: a rate-0 bucket pair per key whose level is what this instance holds.

    def _reshape(self, key: str, rates: Rates, held_r: float = -1, held_t: float = -1) -> None:
        """Set the key's allowance capacities (levels kept; with held_*, clamped down to them)."""
        cap_r = max_slice(self.policy, rates.request_capacity)
        rpm, burst_r = (0.0, cap_r) if rates.requests_limited else (float(UNLIMITED),) * 2
        tpm, burst_t = (
            (0.0, rates.token_capacity) if rates.tokens_limited else (float(UNLIMITED),) * 2
        )
        if held_r >= 0 or held_t >= 0:
            # A bucket's level is clamped to its capacity: shrink it to clamp, then restore.
            self.allowance.set_limits(
                key,
                requests_per_minute=rpm,
                tokens_per_minute=tpm,
                request_burst=max(0.0, held_r) if rates.requests_limited else burst_r,
                token_burst=max(0.0, held_t) if rates.tokens_limited else burst_t,
            )
        self.allowance.set_limits(
            key,
            requests_per_minute=rpm,
            tokens_per_minute=tpm,
            request_burst=burst_r,
            token_burst=burst_t,
        )

    def _held(self, key: str) -> tuple[int, int]:
        """Whole requests and tokens held for `key` (a peek: take one, then give it back)."""
        allowed, _, held_r, held_t, _, _ = self.allowance.try_acquire(key, 0)
        if allowed:
            self.allowance.refund(key, requests=1, tokens=0)
            held_r += 1
        return held_r, held_t

    # The background side.

    def start(self) -> None:
        """Start the keeper (inside the event loop)."""
        if self._keeper is None:
            self._keeper = asyncio.get_running_loop().create_task(self._keep())

    async def _keep(self) -> None:
        """Every interval (jittered, so instances do not ask in lockstep), or sooner when kicked:
        update rate estimates, then top up, give back and pay for every key that needs it."""
        while not self._closing:
            delay = self.interval_s * random.uniform(0.9, 1.1)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._kick.wait()
            self._kick.clear()
            if self._closing:
                return
            now = self.clock()
            if now - self._estimated >= self.interval_s * 0.9:
                self._estimate(now - self._estimated)
                self._estimated = now
            if self.available:
                await self._sync(now)
            if self.available and now - self._answered >= self.retry_s:
                await self._heartbeat()

    async def _heartbeat(self) -> None:
        """A ping when no key needed Redis for a while, so an outage is noticed (and fail-closed
        keys refused) before the next lease is due, not after."""
        try:
            async with asyncio.timeout(self.timeout_s):
                await ping(self._client)
        except OUTAGE as exc:
            self._outage(exc)
            return
        self._answered = self.clock()

    def _estimate(self, elapsed: float) -> None:
        alpha = self.policy.alpha
        for lease in self.leases.values():
            lease.rate_requests = next_rate(
                lease.rate_requests, lease.demand_requests, elapsed, alpha
            )
            lease.rate_tokens = next_rate(lease.rate_tokens, lease.demand_tokens, elapsed, alpha)
            lease.demand_requests = lease.demand_tokens = 0

    def _plan(
        self, key: str, lease: Lease, now: float
    ) -> tuple[int, int, int, int, int, int] | None:
        """(owe r, owe t, back r, back t, want r, want t) for one key, None when nothing to do."""
        if lease.syncing:
            return None
        idle = now - lease.seen >= self.idle_s
        held_r, held_t = self._held(key) if lease.leased else (0, 0)
        goal_r, goal_t = self._goal_requests(lease), self._goal_tokens(lease)
        back_r = int(excess(held_r, goal_r, idle=idle)) if lease.rates.requests_limited else 0
        back_t = int(excess(held_t, goal_t, idle=idle)) if lease.rates.tokens_limited else 0
        want_r = want_t = 0
        if not idle:
            want_r = int(want(held_r, goal_r)) if lease.rates.requests_limited else 0
            want_t = int(want(held_t, goal_t)) if lease.rates.tokens_limited else 0
        owe_r, owe_t = lease.owe_requests, lease.owe_tokens
        if not lease.leased and owe_r == 0 and not idle:
            want_r = max(want_r, 1) if lease.rates.requests_limited else 0
        if not (owe_r or owe_t or back_r or back_t or want_r or want_t or not lease.leased):
            return None
        if back_r or back_t:
            self._reshape(key, lease.rates, held_r - back_r, held_t - back_t)
        return owe_r, owe_t, back_r, back_t, want_r, want_t

    async def _sync(self, now: float) -> None:
        batch: list[tuple[str, Lease, tuple[int, int, int, int, int, int]]] = []
        for key, lease in list(self.leases.items()):
            plan = self._plan(key, lease, now)
            if plan is None:
                continue
            lease.syncing = True
            lease.owe_requests -= plan[0]
            lease.owe_tokens -= plan[1]
            batch.append((key, lease, plan))
        if not batch:
            return
        try:
            results = await self._call(batch)
        except OUTAGE as exc:
            self._outage(exc, batch[0])
            return
        finally:
            for _, lease, _ in batch:
                lease.syncing = False
        self.syncs += 1
        done = self._answered = self.clock()
        answers = list(zip(batch, results, strict=True))
        failed = [(sent, raw) for sent, raw in answers if isinstance(raw, BaseException)]
        refused = [(sent, raw) for sent, raw in failed if not key_fault(raw)]
        if refused and len(failed) == len(batch):
            # Not one key answered, and not all for their own data: Redis is refusing work.
            self._outage(refused[0][1], refused[0][0])
            return
        # Otherwise what Redis granted is kept, and a key that failed fails alone.
        for (key, lease, plan), raw in answers:
            if isinstance(raw, BaseException):
                self._key_failed(key, lease, raw, done)
            else:
                self._apply(key, lease, plan, [int(v) for v in raw], done)

    def _key_failed(self, key: str, lease: Lease, exc: BaseException, now: float) -> None:
        """One key's call failed while Redis answers: that key alone gets local limits, its
        lease dropped (Redis applied nothing of the call), tried again after retry_s."""
        if self.leases.get(key) is lease:
            del self.leases[key]
        if key not in self.failing:
            log.warning(
                "global limits: key %s failed in redis at %s (%s: %s); local limits only for "
                "it, tried again every %.1f s",
                key,
                self.where,
                type(exc).__name__,
                exc,
                self.retry_s,
            )
        self.failing[key] = now

    def _apply(
        self, key: str, lease: Lease, plan: tuple[int, ...], raw: list[int], now: float
    ) -> None:
        granted_r, granted_t, rem_r, rem_t, reset_r, reset_t, wait_ms, level_t = raw
        if self.leases.get(key) is not lease:
            return  # reopened with new limits meanwhile; what was granted lapses
        if self.failing.pop(key, None) is not None:
            log.warning("global limits: key %s answered again; global limits resumed for it", key)
        if not lease.leased:
            lease.leased = True
            self._reshape(key, lease.rates, 0, 0)
            if lease.owe_tokens < 0:
                # Reservations settled below their estimate while the first call was out: the
                # estimate was charged with it, so the difference is this instance's to use.
                granted_t -= lease.owe_tokens
                lease.owe_tokens = 0
        if granted_r or granted_t:
            self.allowance.refund(key, requests=granted_r, tokens=granted_t)
        lease.scarce = granted_r < plan[4] or granted_t < plan[5]
        if not lease.scarce and lease.rates.requests_limited:
            lease.credit = credit(self.policy, lease.rates.request_capacity)
        lease.remaining_requests, lease.remaining_tokens = rem_r, rem_t
        lease.reset_requests_s, lease.reset_tokens_s = reset_r / 1000, reset_t / 1000
        lease.wait_s = wait_ms / 1000
        lease.level_tokens = level_t
        lease.synced = now

    async def _call(
        self, batch: list[tuple[str, Lease, tuple[int, int, int, int, int, int]]]
    ) -> list[Any]:
        """One pipeline of EVALs (in a Cluster, split by slot by the client): no script cache to
        lose on a restart or a failover."""
        pipe = self._client.pipeline(transaction=False)
        for key, lease, plan in batch:
            r = lease.rates
            args = (r.request_capacity, r.requests_per_s, r.token_capacity, r.tokens_per_s, *plan)
            pipe.eval(LEASE, 1, self.key(key), *args)
        async with asyncio.timeout(self.timeout_s):
            results: list[Any] = await pipe.execute(raise_on_error=False)
        return results

    def _outage(
        self, exc: BaseException, sent: tuple[str, Lease, tuple[int, ...]] | None = None
    ) -> None:
        """Switch to local-only limits and start probing for Redis's return (logged once);
        `sent`: a key of the call that failed, probed with the script itself."""
        if not self.available:
            return
        self.available = False
        self.outages += 1
        log.warning(
            "global limits: redis at %s unreachable or refusing the lease script (%s: %s); %s "
            "until it answers again",
            self.where,
            type(exc).__name__,
            exc,
            "serving with local limits only"
            if self.fail_open
            else "refusing rate-limited keys' requests (503, on_redis_error = closed)",
        )
        self._probe = None if sent is None else (sent[0], sent[1].rates)
        # What was held lapses: Redis may have lost the buckets it came from.
        self.leases.clear()
        self.allowance = BucketTable()
        self._recovery = asyncio.get_running_loop().create_task(self._recover())

    async def _recover(self) -> None:
        """Every retry_s, ping (every master of a Cluster) and run the lease script asking for
        nothing on the probe key, until both answer; then resume global limits."""
        began = time.monotonic()
        while True:
            await asyncio.sleep(self.retry_s)
            try:
                async with asyncio.timeout(self.timeout_s):
                    await ping(self._client)
                if self._probe is not None:
                    async with asyncio.timeout(self.timeout_s):
                        await self._run_probe(*self._probe)
            except OUTAGE:
                continue
            self.available = True
            log.warning(
                "global limits: redis at %s answers again after %.1f s; global limits resumed",
                self.where,
                time.monotonic() - began,
            )
            return

    async def _run_probe(self, key: str, rates: Rates) -> None:
        """The lease script on `key` paying, giving and taking nothing (a refill, as any call
        makes); an error on the key's own data still shows Redis runs scripts."""
        r = rates
        args = (r.request_capacity, r.requests_per_s, r.token_capacity, r.tokens_per_s)
        try:
            await self._client.eval(LEASE, 1, self.key(key), *args, 0, 0, 0, 0, 0, 0)
        except OUTAGE as exc:
            if not key_fault(exc):
                raise

    async def close(self) -> None:
        """Give back what is held (best effort), stop background work and close connections."""
        # A call in flight is let finish: cancelled, what Redis granted in it would be lost.
        self._closing = True
        self._kick.set()
        keeper = self._keeper
        if keeper is not None:
            await asyncio.wait((keeper,), timeout=self.timeout_s * 2)
        tasks = [t for t in (keeper, self._recovery) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, *OUTAGE):
                await task
        if self.available and self.leases:
            for lease in self.leases.values():
                lease.seen = -self.idle_s
                lease.syncing = False
            with contextlib.suppress(*OUTAGE):
                await self._sync(self.clock())
        with contextlib.suppress(*OUTAGE):
            await self._client.aclose()
