"""Three points of presence, one region at each, and the round-trip times between them."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

from bench.procs import CacheLevel, Procs, get_json, sim_stats
from tests.support import Proc

POPS: tuple[str, ...] = ("us-east", "eu-west", "ap-south")

# Round-trip times in ms: 10-20 to the co-located region (users are a metro away), 100-180 to
# the far ones (roughly what public clouds show between Virginia, Ireland and Mumbai).
_RTT: dict[frozenset[str], float] = {
    frozenset({"us-east"}): 12.0,
    frozenset({"eu-west"}): 15.0,
    frozenset({"ap-south"}): 18.0,
    frozenset({"us-east", "eu-west"}): 100.0,
    frozenset({"eu-west", "ap-south"}): 130.0,
    frozenset({"us-east", "ap-south"}): 180.0,
}


def rtt_ms(pop: str, region: str) -> float:
    """Round-trip time between users at `pop` and `region` (symmetric)."""
    return _RTT[frozenset({pop, region})]


def nearest(pop: str) -> str:
    """The region with the smallest RTT from `pop`."""
    return min(POPS, key=lambda region: rtt_ms(pop, region))


class Mesh:
    """One sim region process per (PoP, region): each sees that PoP's RTT to the region."""

    def __init__(self, procs: Procs, *, ttft_ms: float, tokens_per_s: float, model: str) -> None:
        self.model = model
        pairs = [(pop, region) for pop in POPS for region in POPS]

        def start(pair: tuple[str, str]) -> Proc:
            pop, region = pair
            return procs.sim_region(
                region,
                rtt_ms=rtt_ms(pop, region),
                ttft_ms=ttft_ms,
                tokens_per_s=tokens_per_s,
                model=model,
            )

        # Started side by side: nine interpreters one after another would take most of a minute.
        with ThreadPoolExecutor(max_workers=len(pairs)) as pool:
            self.sims: dict[tuple[str, str], Proc] = dict(
                zip(pairs, pool.map(start, pairs), strict=True)
            )

    def url(self, pop: str, region: str) -> str:
        """Base URL (…/v1) of `region` as seen from `pop`."""
        return self.sims[(pop, region)].url + "/v1"

    def regions_from(self, pop: str) -> list[tuple[str, str, float]]:
        """(region, URL, bias 0) for a router at `pop`: it must find the nearest by probing."""
        return [(region, self.url(pop, region), 0.0) for region in POPS]

    def routers(
        self, procs: Procs, cache: CacheLevel | None, cache_redis: str | None = None
    ) -> dict[str, str]:
        """One router per PoP with that PoP's view of the regions; their base URLs (…/v1)."""

        def start(pop: str) -> str:
            name = f"{pop}-{cache or 'nocache'}{'-shared' if cache_redis else ''}"
            regions = self.regions_from(pop)
            url = procs.router(
                name, regions, cache=cache, cache_redis=cache_redis, model=self.model
            ).url
            # Unbiased routers pick by measured RTT: a call before every region has one may go
            # to a far region, so no load starts before the probes have measured them all.
            wait_probed(url, POPS)
            return url

        with ThreadPoolExecutor(max_workers=len(POPS)) as pool:
            return {pop: url + "/v1" for pop, url in zip(POPS, pool.map(start, POPS), strict=True)}

    def origin_requests(self) -> dict[str, int]:
        """Generation requests each region's origin has counted so far (all PoPs summed)."""
        totals = dict.fromkeys(POPS, 0)
        for (_, region), proc in self.sims.items():
            totals[region] += sim_stats(proc)["requests"]
        return totals


def wait_probed(router_url: str, regions: Sequence[str], timeout_s: float = 30.0) -> None:
    """Poll the router's /status.json until each of `regions` has a probe RTT; RuntimeError
    after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        status = get_json(router_url + "/status.json")
        rows = status.get("regions", []) if isinstance(status, dict) else []
        rtts = {r.get("name"): r.get("rtt_ms") for r in rows if isinstance(r, dict)}
        if all(rtts.get(name) is not None for name in regions):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{router_url}: no probe RTT for every region after {timeout_s:g} s")
        time.sleep(0.1)


def delta(after: Mapping[str, int], before: Mapping[str, int]) -> dict[str, int]:
    """Per-key difference of two counter snapshots."""
    return {k: after[k] - before.get(k, 0) for k in after}


def netem_probe() -> tuple[bool, str]:
    """Whether `ip netns add` + a netem qdisc work here (root, sch_netem); and why not."""
    import os
    import shutil
    import subprocess

    if os.geteuid() != 0:
        return False, "not root"
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return False, "iproute2 (ip, tc) not installed"
    ns = f"rbench-probe-{os.getpid()}"

    def run(*cmd: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=10, check=False)

    added = run("ip", "netns", "add", ns)
    if added.returncode != 0:
        return False, f"ip netns add: {added.stderr.strip()}"
    try:
        run("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
        tc = run(
            "ip",
            "netns",
            "exec",
            ns,
            "tc",
            "qdisc",
            "add",
            "dev",
            "lo",
            "root",
            "netem",
            "delay",
            "1ms",
        )
        if tc.returncode != 0:
            return False, f"netns works, netem does not: tc: {tc.stderr.strip()}"
        return True, "netns + netem work"
    finally:
        run("ip", "netns", "del", ns)


def delay_method() -> str:
    """The line every RTT scenario prints: which delay it used, and why."""
    ok, why = netem_probe()
    if ok:
        # Not wired: this machine has no sch_netem, so a netem path could not be tested here.
        return f"delay: in-process (sim --rtt-ms); netem is available ({why}) but not wired yet"
    return f"delay: in-process (sim --rtt-ms), because netem is unavailable here: {why}"


def start_failure(exc: BaseException) -> str:
    """The useful line of a process that failed to start: the last line of its log."""
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return lines[-1] if lines else repr(exc)
