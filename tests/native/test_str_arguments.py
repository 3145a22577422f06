"""One rule for every str argument of the native module: a lone surrogate (a str with no UTF-8)
is InvalidArgumentError naming the argument, never UnicodeEncodeError."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

import router

LONE = "\ud800"
BUCKET_LIMITS = {"requests_per_minute": 1.0, "tokens_per_minute": 1.0}


def _bucket() -> router.BucketTable:
    table = router.BucketTable()
    table.set_limits("k", **BUCKET_LIMITS)
    return table


def _prober() -> router.Prober:
    prober = router.Prober()
    prober.upsert_region("r", "http://127.0.0.1:9")
    return prober


# (what is called, the argument the error must name)
CALLS: dict[str, tuple[Callable[[], object], str]] = {
    "fingerprint namespace": (lambda: router.fingerprint(b"{}", namespace=LONE), "namespace"),
    "fingerprint level": (lambda: router.fingerprint(b"{}", level=LONE), "level"),
    "fingerprint_hex namespace": (
        lambda: router.fingerprint_hex(b"{}", namespace=LONE),
        "namespace",
    ),
    "canonical level": (lambda: router.canonical(b"{}", level=LONE), "level"),
    "count_tokens encoding": (lambda: router.count_tokens("x", LONE), "encoding"),
    "count_request_tokens encoding": (
        lambda: router.count_request_tokens(b"{}", LONE),
        "encoding",
    ),
    "encoding_for_model": (lambda: router.encoding_for_model(LONE), "model"),
    "set_limits": (lambda: router.BucketTable().set_limits(LONE, **BUCKET_LIMITS), "key"),
    "try_acquire": (lambda: _bucket().try_acquire(LONE), "key"),
    "reconcile": (lambda: _bucket().reconcile(LONE, 1, 1), "key"),
    "refund": (lambda: _bucket().refund(LONE), "key"),
    "ChatTemplate template": (lambda: router.ChatTemplate(LONE), "template"),
    "ChatTemplate bos_token": (lambda: router.ChatTemplate("x", bos_token=LONE), "bos_token"),
    "ChatTemplate eos_token": (lambda: router.ChatTemplate("x", eos_token=LONE), "eos_token"),
    "HfTokenizer path": (lambda: router.HfTokenizer(LONE), "path"),
    "Prober path": (lambda: router.Prober(path=LONE), "path"),
    "Prober fallback_path": (lambda: router.Prober(fallback_path=LONE), "fallback_path"),
    "Prober ca_file": (lambda: router.Prober(ca_file=LONE), "ca_file"),
    "configure path": (lambda: router.Prober().configure(path=LONE), "path"),
    "upsert_region name": (lambda: router.Prober().upsert_region(LONE, "http://h"), "name"),
    "upsert_region url": (lambda: router.Prober().upsert_region("r", LONE), "url"),
    "upsert_region path": (
        lambda: router.Prober().upsert_region("r", "http://h", path=LONE),
        "path",
    ),
    "remove_region": (lambda: router.Prober().remove_region(LONE), "name"),
    "report region": (lambda: _prober().report(LONE, "timeout"), "region"),
    "report outcome": (lambda: _prober().report("r", LONE), "outcome"),
}


@pytest.mark.parametrize("case", sorted(CALLS))
def test_lone_surrogate_is_invalid_argument_naming_it(case: str) -> None:
    call, name = CALLS[case]
    with pytest.raises(router.InvalidArgumentError, match=rf"^{name} .*\(lone surrogate\)"):
        call()


def test_token_to_id_follows_the_rule(tmp_path: Path) -> None:
    pytest.importorskip("tokenizers", reason="the tokenizers package is a dev extra")
    from tests import tokenizer_files

    tokenizer = router.HfTokenizer(tokenizer_files.byte_level_bpe(tmp_path / "tokenizer.json"))
    with pytest.raises(router.InvalidArgumentError, match=r"^token .*\(lone surrogate\)"):
        tokenizer.token_to_id(LONE)


def test_defaults_and_types_are_unchanged() -> None:
    assert router.fingerprint(b"{}") == router.fingerprint(b"{}", namespace="", level="exact")
    assert router.canonical(b"{}") == router.canonical(b"{}", level="exact")
    assert router.ChatTemplate("{{ bos_token }}").bos_token == ""
    with pytest.raises(TypeError):
        router.fingerprint(b"{}", namespace=None)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        router.BucketTable().set_limits(7, **BUCKET_LIMITS)  # type: ignore[arg-type]
