"""The machine's one prober (in the supervisor of `router serve --workers N`): it probes every
region once for the machine, takes every worker's passive reports, and publishes the result
(routing.shared_health) that all workers route from."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Sequence

import msgspec

from router.config import HealthConfig, RegionConfig
from router.routing import shared_health
from router.routing.health import Health
from router.routing.selection import AdminState

log = logging.getLogger("router.health")

# How often the table is rewritten: flips and ages reach the workers within this.
PUBLISH_S = 0.05
# How often health flips are logged.
_EVENTS_S = 0.25


class MachineProber:
    """One Health (the native prober and the passive state) for the machine, fed by every
    worker's reports, published every PUBLISH_S."""

    def __init__(
        self, config: HealthConfig, regions: Sequence[RegionConfig], table: str, reports: str
    ) -> None:
        self.health = Health(config, regions)
        shared_health.create(table)
        self._writer = shared_health.TableWriter(table)
        self._reports = reports
        self._server: asyncio.AbstractServer | None = None
        # Each worker's connection: closed at close(), which ends its reader without a cancel.
        self._readers: dict[asyncio.Task[None], asyncio.StreamWriter] = {}
        self._task: asyncio.Task[None] | None = None
        self.received = 0

    def publish(self) -> None:
        """Write the machine's view of every region now."""
        health = self.health
        self._writer.publish(health.probing, health.prober.snapshot(), health.admin_states())

    async def start(self) -> None:
        """Probe, take reports and publish until close(); the first image is out on return."""
        self.health.start()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._reports)
        self._server = await asyncio.start_unix_server(self._receive, self._reports)
        self.publish()
        self._task = asyncio.create_task(self._publishing(), name="router.health.machine")

    def set_admin(self, name: str, state: AdminState) -> None:
        """An operator's drain, disable or enable, applied by every worker: published so a
        worker started later (a restart) keeps it too."""
        if self.health.set_admin(name, state):
            self.publish()

    async def _receive(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One worker's reports, frame by frame, until it goes."""
        task = asyncio.current_task()
        assert task is not None
        self._readers[task] = writer
        try:
            while True:
                (length,) = shared_health.FRAME.unpack(
                    await reader.readexactly(shared_health.FRAME.size)
                )
                batch = shared_health.decode_reports(await reader.readexactly(length))
                self.received += len(batch)
                for region, outcome, connect_s, ttft_s, total_s in batch:
                    with contextlib.suppress(KeyError, ValueError):
                        self.health.report(
                            region, outcome, connect_s=connect_s, ttft_s=ttft_s, total_s=total_s
                        )
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the worker exited
        except msgspec.DecodeError:
            log.warning("a malformed health report frame: dropping that worker's connection")
        finally:
            self._readers.pop(task, None)
            writer.close()

    async def _publishing(self) -> None:
        ticks_per_log = max(1, round(_EVENTS_S / PUBLISH_S))
        tick = 0
        failing = False
        while True:
            await asyncio.sleep(PUBLISH_S)
            try:
                self.publish()
                failing = False
            except Exception:
                # The workers keep routing from the last image; said once, not every tick.
                if not failing:
                    log.exception("publishing region health to the workers failed")
                failing = True
            tick += 1
            if tick % ticks_per_log == 0:
                self.health.log_events()

    async def close(self) -> None:
        """Stop probing and publishing."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._server is not None:
            self._server.close()
        readers = list(self._readers.items())
        for _, writer in readers:
            writer.close()
        if readers:
            await asyncio.wait([task for task, _ in readers], timeout=1.0)
        self.health.stop()
        self.health.log_events()
        self._writer.close()
