"""Coverage-guided fuzzing (atheris/libFuzzer) of the native parsing and normalization entry points.

    python fuzz/fuzz_native.py -max_total_time=60 fuzz/corpus

Any exception other than router.NativeError (or a crash, a panic, a hang) is a finding.
"""

from __future__ import annotations

import sys

import atheris

with atheris.instrument_imports():
    from router import native

_ENCODINGS = ("cl100k_base", "o200k_base", "estimate")
_LEVELS = ("exact", "normalized")


def one_input(data: bytes) -> None:
    """Feed one fuzzer input to every native entry point that parses or normalizes."""
    fdp = atheris.FuzzedDataProvider(data)
    choice = fdp.ConsumeIntInRange(0, 2)
    try:
        if choice == 0:
            rest = fdp.ConsumeBytes(fdp.remaining_bytes())
            for level in _LEVELS:
                key = native.fingerprint(rest, namespace="fuzz", level=level)
                assert len(key) == 16
                native.canonical(rest, level=level)
        elif choice == 1:
            rest = fdp.ConsumeBytes(fdp.remaining_bytes())
            for encoding in _ENCODINGS:
                assert native.count_request_tokens(rest, encoding) >= 0
        else:
            text = fdp.ConsumeUnicodeNoSurrogates(fdp.remaining_bytes())
            once = native.normalize(text)
            assert native.normalize(once) == once, "normalize is not idempotent"
            for encoding in _ENCODINGS:
                assert native.count_tokens(text, encoding) >= 0
    except native.NativeError:
        pass


def main() -> None:
    """Run libFuzzer with the command-line flags given (e.g. -max_total_time=N)."""
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
