"""Property: exact token counts equal tiktoken's on generated text (when its vocab loads)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import router
from tests import reference

WORDS = st.sampled_from(
    [
        "hello",
        " world",
        "'s",
        "'LL",
        "don't",
        "\n",
        "\r\n",
        "  ",
        "\t",
        "123",
        "4567",
        "ß",
        "日本",
        "🎉",
        "—",
        "...",
        "<|endoftext|>",
        "x" * 30,
        " ?!",
        "Ünïcödé",
        "\u0301",
    ]
)
TEXT = st.one_of(
    st.text(st.characters(exclude_categories=("Cs",)), max_size=60),
    st.lists(WORDS, max_size=20).map("".join),
)

# Fragments aimed at the edges of the split patterns: contractions in every case (and the long s,
# which case-insensitive `s` matches), letters of each general category the o200k pattern tells
# apart (Lu, Lt, Ll, Lm, Lo) next to combining marks, digit runs in several scripts, whitespace
# runs with and without newlines (also at the end of the text), punctuation followed by newlines
# and slashes, CJK and emoji (with ZWJ and variation selectors).
ADVERSARIAL = st.sampled_from(
    [
        "'s",
        "'S",
        "'t",
        "'T",
        "'re",
        "'RE",
        "'rE",
        "'ve",
        "'Ve",
        "'m",
        "'M",
        "'ll",
        "'LL",
        "'lL",
        "'d",
        "'D",
        "'\u017f",
        "'x",
        "'",
        "''",
        "’s",
        "a",
        "Z",
        "hello",
        "HELLO",
        "Hello",
        "hELLO",
        "ǅ",
        "ǈa",
        "ʰ",
        "ʰa",
        "Aʰ",
        "ー",
        "日本語",
        "中文",
        "한국어",
        "ไทย",
        "ελληνικά",
        "Ωmega",
        "кириллица",
        "ß",
        "İ",
        "ﬁ",
        "\u0301",
        "\u0308",
        "e\u0301",
        "E\u0301\u0302",
        "\u0301a",
        "A\u0301b",
        "\u0903",
        "\u20dd",
        "0",
        "12",
        "123",
        "1234567",
        "٣٤٥",
        "१२३",
        "½",
        "Ⅻ",
        "²",
        "３",
        " ",
        "  ",
        "   ",
        "\t",
        "\n",
        "\r\n",
        "\r",
        "\n\n",
        " \n ",
        "\u00a0",
        "\u3000",
        "\u2028",
        "\u0085",
        "\x0b",
        "\x0c",
        "!",
        "?!",
        "...",
        "/",
        "//",
        "!/",
        "-->",
        "#",
        "€",
        "—",
        "“",
        "”",
        "(",
        ")",
        "🎉",
        "🚀",
        "👩\u200d💻",
        "❤\ufe0f",
        "🇫🇷",
        "\u200b",
        "\ufeff",
        "\x00",
    ]
)
ADVERSARIAL_TEXT = st.lists(ADVERSARIAL, max_size=24).map("".join)


@pytest.mark.parametrize("encoding", ["cl100k_base", "o200k_base"])
def test_counts_equal_tiktoken(encoding: str) -> None:
    enc = reference.tiktoken_encoding(encoding)
    if enc is None:
        pytest.skip("no tiktoken vocabulary file found in the tiktoken-rs crate sources")

    @settings(max_examples=200, deadline=None)
    @given(TEXT)
    def check(text: str) -> None:
        assert router.count_tokens(text, encoding) == len(enc.encode_ordinary(text))

    check()


@pytest.mark.parametrize("encoding", ["cl100k_base", "o200k_base"])
def test_counts_equal_tiktoken_on_adversarial_unicode(encoding: str) -> None:
    enc = reference.tiktoken_encoding(encoding)
    if enc is None:
        pytest.skip("no tiktoken vocabulary file found in the tiktoken-rs crate sources")

    @settings(max_examples=1000, deadline=None)
    @given(ADVERSARIAL_TEXT, st.sampled_from(["", " ", "  ", "\n", " \n", "x"]))
    def check(text: str, tail: str) -> None:
        for t in (text, text + tail, tail + text):
            assert router.count_tokens(t, encoding) == len(enc.encode_ordinary(t)), repr(t)

    check()


@pytest.mark.parametrize("encoding", ["cl100k_base", "o200k_base"])
def test_request_counts_equal_reference(encoding: str) -> None:
    enc = reference.tiktoken_encoding(encoding)
    if enc is None:
        pytest.skip("no tiktoken vocabulary file found in the tiktoken-rs crate sources")
    message = st.fixed_dictionaries(
        {"role": st.sampled_from(["system", "user", "assistant"]), "content": TEXT},
        optional={"name": TEXT},
    )

    @settings(max_examples=50, deadline=None)
    @given(st.lists(message, max_size=4))
    def check(messages: list[dict[str, str]]) -> None:
        raw = json.dumps({"model": "m", "messages": messages}).encode()
        assert router.count_request_tokens(raw, encoding) == reference.count_request_tokens(
            raw, enc
        )

    check()


@settings(max_examples=200, deadline=None)
@given(TEXT)
def test_estimate_is_a_quarter_of_the_utf8_bytes(text: str) -> None:
    assert router.count_tokens(text, "estimate") == -(-len(text.encode()) // 4)
