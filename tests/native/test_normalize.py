"""router.normalize: behaviour, options and errors."""

from __future__ import annotations

import pytest

import router


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("  Hello\t\n  World!!  ", "hello world"),
        ("ＨＥＬＬＯ", "hello"),
        ("Straße", "strasse"),
        ("ﬁne", "fine"),
        ("\u212a", "k"),
        ("a\u3000b\u00a0c\u2028d", "a b c d"),
        ("What is Rust？", "what is rust"),
        ("", ""),
    ],
)
def test_normalize_defaults(text: str, expected: str) -> None:
    assert router.normalize(text) == expected


def test_punctuation_kept_when_disabled() -> None:
    assert router.normalize("Why?  ", strip_punctuation=False) == "why?"


def test_filler_removed_only_when_other_words_remain() -> None:
    assert (
        router.normalize("Please, tell me a joke, thanks!", strip_filler=True) == "tell me a joke"
    )
    assert router.normalize("thanks", strip_filler=True) == "thanks"
    assert router.normalize("no thanksgiving", strip_filler=True) == "no thanksgiving"
    assert router.normalize("Please, tell me a joke") == "please, tell me a joke"


def test_long_text_released_gil_path_matches_short() -> None:
    text = "Hello   World. " * 500
    assert router.normalize(text) == ("hello world. " * 500).strip().rstrip(".")


def test_lone_surrogate_is_a_typed_error() -> None:
    with pytest.raises(router.InvalidArgumentError, match="surrogate"):
        router.normalize("a\ud800b")


def test_wrong_type_is_type_error() -> None:
    with pytest.raises(TypeError):
        router.normalize(b"bytes")  # type: ignore[arg-type]


def test_docstring_visible() -> None:
    assert "NFKC" in (router.normalize.__doc__ or "")
