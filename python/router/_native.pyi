"""Type stubs for the native extension `router._native` (Rust, pyo3)."""

from typing import final

__all__ = ["NativeError", "Prober", "RegionHealth", "__version__"]

__version__: str

class NativeError(Exception):
    """Root of every error raised by router._native."""

@final
class RegionHealth:
    """One region's health at the moment of `Prober.snapshot()`."""

    @property
    def name(self) -> str: ...
    @property
    def url(self) -> str: ...
    @property
    def healthy(self) -> bool: ...
    @property
    def probed(self) -> bool: ...
    @property
    def ejected(self) -> bool: ...
    @property
    def ejected_for_s(self) -> float: ...
    @property
    def ejected_until(self) -> float | None: ...
    @property
    def ewma_rtt_s(self) -> float | None: ...
    @property
    def rtt_p50_s(self) -> float | None: ...
    @property
    def rtt_p95_s(self) -> float | None: ...
    @property
    def ewma_ttft_s(self) -> float | None: ...
    @property
    def ttft_p50_s(self) -> float | None: ...
    @property
    def ttft_p95_s(self) -> float | None: ...
    @property
    def ewma_total_s(self) -> float | None: ...
    @property
    def ewma_connect_s(self) -> float | None: ...
    @property
    def consecutive_failures(self) -> int: ...
    @property
    def passive_failures(self) -> int: ...
    @property
    def ejections(self) -> int: ...
    @property
    def last_error(self) -> str | None: ...
    @property
    def probes(self) -> int: ...
    @property
    def probe_failures(self) -> int: ...
    @property
    def passive_reports(self) -> int: ...
    @property
    def last_probe_age_s(self) -> float | None: ...
    @property
    def available(self) -> bool:
        """Healthy by active probes and not ejected by passive outcomes."""

@final
class Prober:
    """Health prober: probes every region on its own thread; takes passive reports."""

    def __new__(
        cls,
        *,
        interval_s: float = 1.0,
        jitter: float = 0.1,
        timeout_s: float = 0.8,
        path: str = ...,
        fallback_path: str = ...,
        expected_statuses: list[int] = ...,
        healthy_after: int = 2,
        unhealthy_after: int = 2,
        ewma_alpha: float = 0.3,
        window: int = 64,
        eject_after: int = 5,
        base_ejection_s: float = 5.0,
        max_ejection_s: float = 60.0,
    ) -> Prober: ...
    def configure(
        self,
        *,
        interval_s: float = 1.0,
        jitter: float = 0.1,
        timeout_s: float = 0.8,
        path: str = ...,
        fallback_path: str = ...,
        expected_statuses: list[int] = ...,
        healthy_after: int = 2,
        unhealthy_after: int = 2,
        ewma_alpha: float = 0.3,
        window: int = 64,
        eject_after: int = 5,
        base_ejection_s: float = 5.0,
        max_ejection_s: float = 60.0,
    ) -> None:
        """Replace the probe settings (hot reload); regions and their history are kept."""
    def start(self) -> None:
        """Start the probe thread (idempotent)."""
    def stop(self) -> None:
        """Stop probing and join the thread (idempotent; also done on garbage collection)."""
    @property
    def running(self) -> bool: ...
    def upsert_region(self, name: str, url: str) -> None:
        """Add a region or change its URL (its history resets only when the URL changes)."""
    def remove_region(self, name: str) -> bool:
        """Stop probing a region and forget it; False if it was unknown."""
    def regions(self) -> list[str]:
        """Names of the regions in the table, sorted."""
    def report(
        self,
        region: str,
        outcome: str,
        connect_s: float | None = None,
        ttft_s: float | None = None,
        total_s: float | None = None,
    ) -> bool:
        """Record one proxied attempt's outcome; True if this report ejected the region."""
    def snapshot(self) -> list[RegionHealth]:
        """Every region's health now, sorted by name."""
    def take_events(self) -> list[tuple[str, str, float, str | None]]:
        """Health transitions since the last call: (region, transition, unix time, detail)."""
