"""router.normalize: the four blank-space folds, what is kept, and errors."""

from __future__ import annotations

import unicodedata

import pytest

import router


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("  How   do I  reset it? ", "How do I reset it?"),
        ("a\u3000b\u00a0c\u2009 d\n\n", "a b c d"),
        ("\n \nfirst  line\nsecond  line\r\n", "first line\nsecond line"),
        ("   three spaces", "three spaces"),
        ("    four spaces  is code", "    four spaces  is code"),
        ("  a\n  b", "  a\n  b"),
        ("Fix:\n```\nx  =  1\n```\nthen  run", "Fix:\n```\nx  =  1\n```\nthen run"),
        ("Run `a  b`  now\n\nok  then", "Run `a  b`  now\n\nok then"),
        # CR LF is one break (as str.splitlines has it), not a blank line between two.
        ("`x = 1`\r\nif  a  ==  b:\r\nis `y` set?", "`x = 1`\r\nif  a  ==  b:\r\nis `y` set?"),
        ("", ""),
        (" \n\t\u2028 ", "\t"),
    ],
)
def test_folds(text: str, expected: str) -> None:
    assert router.normalize(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "What is 3²?",
        "x₂ + ½",
        "Ⅻ",
        "ＨＥＬＬＯ",
        "Straße",
        "ﬁne",
        "\u212a",
        "Why?!",
        "a\tb",
        "MiXeD",
    ],
)
def test_everything_but_blank_space_is_kept(text: str) -> None:
    assert router.normalize(text) == text


def test_long_text_released_gil_path_matches_short() -> None:
    text = "Hello   World. " * 500
    assert router.normalize(text) == ("Hello World. " * 500).strip()


def test_lone_surrogate_is_a_typed_error() -> None:
    with pytest.raises(router.InvalidArgumentError, match="surrogate"):
        router.normalize("a\ud800b")


def test_wrong_type_is_type_error() -> None:
    with pytest.raises(TypeError):
        router.normalize(b"bytes")  # type: ignore[arg-type]


def test_old_options_are_gone() -> None:
    with pytest.raises(TypeError):
        router.normalize("x", strip_punctuation=True)  # type: ignore[call-arg]


def test_docstring_visible() -> None:
    assert "blank space" in (router.normalize.__doc__ or "")


def test_space_separators_are_exactly_unicode_zs() -> None:
    for code in range(0x3001):
        c = chr(code)
        folded = router.normalize(f"a{c}{c}b") == "a b"
        assert folded == (unicodedata.category(c) == "Zs"), hex(code)
