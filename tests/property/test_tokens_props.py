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
