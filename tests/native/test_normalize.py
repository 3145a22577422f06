"""router.normalize: the four blank-space folds, the blank space kept, and errors."""

from __future__ import annotations

import unicodedata

import pytest

import router


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("  How   do I  reset it? ", "How do I reset it?"),
        ("a\u3000b\u00a0c\u2009 d\n\n", "a b c d"),
        ("\n \nfirst  line\nsecond line\nthird line\r\n", "first line\nsecond line\nthird line"),
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


@pytest.mark.parametrize(
    "text",
    [
        # Markdown's hard line break: two or more spaces before a line break (and one is kept).
        "foo  \nbar",
        "foo \nbar",
        "foo\u00a0  \r\nbar",
        "a  \tb",
        # From the line holding the first quote mark on, a run may be inside a quotation.
        'How many spaces are between the quotes: "a     b"?',
        "Say \u201ca  b\u201d",
        "\u300ca  b\u300d",
        "\u00aba  b\u00bb",
        "What does len('a  b') return?",
        'Quote:\n\n"one\n\ntwo   three',
        # Space-aligned columns: a paragraph of 2+ lines, at least half with a run.
        "Name   Age  City\nBob         Rome\nAlice  30   Paris",
        "Name Age City\nBob      Rome",
    ],
)
def test_blank_space_that_may_mean_something_is_kept(text: str) -> None:
    assert router.normalize(text) == text


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Count  these.\n\nSay 'a  b'\n\nthen  stop", "Count these.\n\nSay 'a  b'\n\nthen  stop"),
        ("Don't  panic, it\u2019s   fine", "Don't panic, it\u2019s fine"),
        ("a  b  \nc d\ne f", "a b  \nc d\ne f"),
        ("a  b\nc  d\n\ne  f", "a  b\nc  d\n\ne f"),
    ],
)
def test_prose_around_kept_blank_space_still_folds(text: str, expected: str) -> None:
    assert router.normalize(text) == expected


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
