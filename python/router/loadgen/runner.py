"""I/O: closed- and open-loop drivers, bounded by duration and count; they stop by themselves."""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Callable, Mapping

import aiohttp
import msgspec

from router.loadgen.client import send
from router.loadgen.progress import Progress
from router.loadgen.sample import Planned, Sample
from router.loadgen.schedule import poisson_schedule
from router.loadgen.sse import Endpoint

RequestFactory = Callable[[int], Planned]


class LoadSpec(msgspec.Struct, frozen=True, kw_only=True):
    """How much load and for how long; whichever of duration and count comes first ends a run."""

    concurrency: int = 8  # closed loop: workers; open loop: cap on requests in flight
    rate: float | None = None  # requests/s; set means open loop (Poisson arrivals)
    duration_s: float = 10.0
    max_requests: int = 1000
    timeout_s: float = 30.0  # per request, whole response
    grace_s: float = 10.0  # after duration, how long requests in flight may still finish
    endpoint: Endpoint = "chat"
    stream: bool = True
    seed: int = 0

    def validate(self) -> None:
        """Raise ValueError for a spec that would not be bounded or cannot run."""
        if self.concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        if self.rate is not None and not 0 < self.rate < math.inf:
            raise ValueError("rate must be a positive finite number")
        if not 0 < self.duration_s < math.inf:
            raise ValueError("duration must be positive and finite")
        if self.max_requests < 1:
            raise ValueError("max_requests must be >= 1")
        # Comparisons with NaN are all false: each bound is written so that NaN fails it.
        if not 0 < self.timeout_s < math.inf:
            raise ValueError("timeout must be positive and finite")
        if not 0 <= self.grace_s < math.inf:
            raise ValueError("grace must be non-negative and finite")


class RunResult(msgspec.Struct, kw_only=True):
    """Everything one run recorded."""

    name: str
    spec: LoadSpec
    wall_s: float
    samples: list[Sample]


class _Run:
    def __init__(
        self, spec: LoadSpec, factory: RequestFactory, session: aiohttp.ClientSession
    ) -> None:
        self.spec = spec
        self.factory = factory
        self.session = session
        self.samples: list[Sample] = []
        self.sent = 0
        self.errors = 0
        self.in_flight = 0
        self.failure: BaseException | None = None
        self.t0 = time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def record(self, sample: Sample) -> None:
        self.samples.append(sample)
        self.errors += sample.error is not None

    async def one(self, index: int, start_s: float) -> None:
        planned = self.factory(index)
        self.sent += 1
        self.in_flight += 1
        try:
            sample = await send(
                self.session,
                planned,
                endpoint=self.spec.endpoint,
                stream=self.spec.stream,
                timeout_s=self.spec.timeout_s,
                start_s=start_s,
                t0=self.t0,
            )
        except asyncio.CancelledError:
            # Cut off by the run's hard end: recorded, so counts always add up.
            self.record(
                Sample(
                    start_s=start_s,
                    total_s=self.elapsed() - start_s,
                    error="unfinished",
                    label=planned.label,
                )
            )
            raise
        finally:
            self.in_flight -= 1
        self.record(sample)

    async def closed_loop(self) -> None:
        counter = 0

        async def worker() -> None:
            nonlocal counter
            while counter < self.spec.max_requests and self.elapsed() < self.spec.duration_s:
                index = counter
                counter += 1
                await self.one(index, self.elapsed())

        await self._drain([asyncio.create_task(worker()) for _ in range(self.spec.concurrency)])

    async def open_loop(self, rate: float) -> None:
        offsets = poisson_schedule(
            rate, self.spec.duration_s, self.spec.max_requests, random.Random(self.spec.seed)
        )
        tasks: set[asyncio.Task[None]] = set()
        for index, offset in enumerate(offsets):
            delay = offset - self.elapsed()
            if delay > 0:
                await asyncio.sleep(delay)
            if self.in_flight >= self.spec.concurrency:
                # The generator, not the server, would be the bottleneck: say so, don't queue.
                self.sent += 1
                self.record(Sample(start_s=offset, total_s=0.0, error="client_saturated"))
                continue
            task = asyncio.create_task(self.one(index, offset))
            tasks.add(task)
            task.add_done_callback(self._finished(tasks))
        await self._drain(list(tasks))
        if self.failure is not None:
            raise self.failure

    def _finished(self, tasks: set[asyncio.Task[None]]) -> Callable[[asyncio.Task[None]], None]:
        def done(task: asyncio.Task[None]) -> None:
            tasks.discard(task)
            if not task.cancelled() and task.exception() is not None and self.failure is None:
                self.failure = task.exception()

        return done

    async def _drain(self, tasks: list[asyncio.Task[None]]) -> None:
        remaining = self.spec.duration_s + self.spec.grace_s - self.elapsed()
        if tasks:
            done, pending = await asyncio.wait(tasks, timeout=max(remaining, 0.0))
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            for task in done:
                task.result()  # a bug in a request factory surfaces instead of vanishing


async def run_load(
    name: str,
    spec: LoadSpec,
    factory: RequestFactory,
    *,
    headers: Mapping[str, str] | None = None,
    progress: Progress | None = None,
) -> RunResult:
    """Run one bounded load and return every sample it recorded."""
    spec.validate()
    # Our own caps bound the connections; aiohttp's default limit of 100 would queue silently.
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(
        connector=connector,
        headers={"content-type": "application/json", **(headers or {})},
    ) as session:
        state = _Run(spec, factory, session)
        ticker = asyncio.create_task(_tick(state, progress)) if progress else None
        try:
            if spec.rate is None:
                await state.closed_loop()
            else:
                await state.open_loop(spec.rate)
        finally:
            if ticker is not None:
                ticker.cancel()
                await asyncio.gather(ticker, return_exceptions=True)
        wall = state.elapsed()
    if progress is not None:
        _report(state, progress, force=True)
        progress.finish()
    state.samples.sort(key=lambda s: s.start_s)
    return RunResult(name=name, spec=spec, wall_s=wall, samples=state.samples)


def _report(state: _Run, progress: Progress, *, force: bool = False) -> None:
    progress.update(
        state.elapsed(),
        sent=state.sent,
        done=len(state.samples),
        errors=state.errors,
        in_flight=state.in_flight,
        force=force,
    )


async def _tick(state: _Run, progress: Progress) -> None:
    while True:
        await asyncio.sleep(min(progress.interval_s, 0.25))
        _report(state, progress)
