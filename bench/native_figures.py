"""Print the issue-2 figures for the native hot path (CPU time per call, best of several rounds).

Run: python -m bench.native_figures   (or python bench/native_figures.py, from the repo root;
takes about half a minute)
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests import reference
from tests.reference import chat_request, prompt_text

import router

ROUNDS = 7


def per_call_ns(fn: Callable[[], object], calls: int) -> tuple[float, float]:
    """(best, median) CPU nanoseconds per call over ROUNDS rounds of `calls` calls."""
    samples = []
    for _ in range(ROUNDS):
        start = time.thread_time_ns()
        for _ in range(calls):
            fn()
        samples.append((time.thread_time_ns() - start) / calls)
    return min(samples), statistics.median(samples)


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def fingerprint_figures() -> None:
    body = chat_request()
    assert router.canonical(body, level="normalized") == reference.canonical(
        body, level="normalized"
    )
    rust = per_call_ns(lambda: router.fingerprint(body, level="normalized"), 20_000)
    exact = per_call_ns(lambda: router.fingerprint(body), 20_000)
    ref = per_call_ns(lambda: reference.fingerprint(body, level="normalized"), 1_000)
    print(f"normalize+fingerprint, {len(body)} B chat request (canonical forms equal)")
    print(f"  rust level=normalized  best {rust[0]:8.0f} ns  median {rust[1]:8.0f} ns")
    print(f"  rust level=exact       best {exact[0]:8.0f} ns  median {exact[1]:8.0f} ns")
    print(f"  python reference       best {ref[0]:8.0f} ns  median {ref[1]:8.0f} ns")
    ratio, median_ratio = ref[0] / rust[0], ref[1] / rust[1]
    print(f"  ratio (best/best)      {ratio:.1f}x   (median/median {median_ratio:.1f}x)")


def bucket_figures() -> None:
    n = 100_000
    table = router.BucketTable()
    keys = [f"tenant-{i:06d}" for i in range(n)]
    for key in keys:
        table.set_limits(key, requests_per_minute=1e9, tokens_per_minute=1e12)
    rng = random.Random(7)
    order = [rng.choice(keys) for _ in range(200_000)]
    # The same key sequence as new str objects laid out in call order, as a server has them: a
    # key just parsed from the request is in cache; only the table's slot is a random read.
    fresh = [key.encode().decode() for key in order]
    assert fresh == order
    assert all(a is not b for a, b in zip(fresh, order, strict=True))
    hot = keys[:1000] * 200
    acquire = table.try_acquire
    lookup = dict.fromkeys(keys, 0).get

    def sweep(seq: list[str], fn: Callable[[str, int], object]) -> tuple[float, float]:
        samples = []
        for _ in range(ROUNDS):
            start = time.thread_time_ns()
            for key in seq:
                fn(key, 10)
            samples.append((time.thread_time_ns() - start) / len(seq))
        return min(samples), statistics.median(samples)

    def empty_loop(seq: list[str]) -> float:
        samples = []
        for _ in range(ROUNDS):
            start = time.thread_time_ns()
            for key in seq:
                len(key)
            samples.append((time.thread_time_ns() - start) / len(seq))
        return min(samples)

    rows = [
        ("uniform random, fresh key objects", sweep(fresh, acquire), sweep(fresh, lookup)),
        ("uniform random, old key objects", sweep(order, acquire), sweep(order, lookup)),
        ("1000 hot keys", sweep(hot, acquire), sweep(hot, lookup)),
    ]
    print(f"try_acquire from Python, {len(table)} live keys (Python for-loop included)")
    print("  (dict.get(key, 10) on a dict of the same keys, same loop, for scale)")
    for label, (best, median), (dict_best, _) in rows:
        print(
            f"  {label:34} best {best:5.0f} ns  median {median:5.0f} ns"
            f"  dict.get {dict_best:5.0f} ns"
        )
    print(f"  (same loop calling len(), best of the same rounds: {empty_loop(order):.0f} ns)")

    # Memory: keys built and dropped one at a time so only the table's share of RSS grows.
    count = 300_000
    fresh = router.BucketTable()
    before = rss_bytes()
    for i in range(count):
        fresh.set_limits(f"user-{i:010d}", requests_per_minute=60, tokens_per_minute=1e5)
    grown = rss_bytes() - before
    key_len = len("user-0000000000")
    per_key = grown / count
    print(f"RSS growth for {count} keys of {key_len} B: {per_key:.0f} B/key")
    print(f"  = {per_key - key_len:.0f} B/key + the key itself")


def token_figures() -> None:
    text = prompt_text()
    for name in ("cl100k_base", "o200k_base"):
        enc = reference.tiktoken_encoding(name)
        if enc is None:
            print(f"token counting ({name}): tiktoken vocabulary not found; skipped")
            continue
        corpus = [text, *(prompt_text(n) for n in (10, 100, 500, 5000))]
        corpus += ["Größe 🎉 日本語", "<|endoftext|> special-looking text", "  \n\n\t x  "]
        same = all(router.count_tokens(t, name) == len(enc.encode_ordinary(t)) for t in corpus)
        rust = per_call_ns(lambda n=name: router.count_tokens(text, n), 2_000)
        tik = per_call_ns(lambda e=enc: len(e.encode_ordinary(text)), 2_000)
        count = router.count_tokens(text, name)
        print(f"token counting, {len(text.encode())} B prompt, {name} ({count} tokens)")
        print(f"  rust (bpe-openai)      best {rust[0]:8.0f} ns  median {rust[1]:8.0f} ns")
        print(
            f"  tiktoken {tiktoken_version()}        best {tik[0]:8.0f} ns  median {tik[1]:8.0f} ns"
        )
        print(
            f"  ratio (best/best)      {tik[0] / rust[0]:.1f}x   identical counts on corpus: {same}"
        )


def tiktoken_version() -> str:
    import tiktoken

    return str(tiktoken.__version__)


def main(argv: Sequence[str] | None = None) -> None:
    """Parse the (no) options, then print every figure."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.parse_args(argv)
    with open("/proc/loadavg") as f:
        print(f"load average at start: {f.read().split()[0]} (CPU time per call is measured)")
    fingerprint_figures()
    bucket_figures()
    token_figures()


if __name__ == "__main__":
    main()
