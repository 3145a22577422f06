"""router.count_tokens / count_request_tokens / encoding_for_model."""

from __future__ import annotations

import json

import pytest

import router
from tests import reference


@pytest.mark.parametrize(
    ("model", "encoding"),
    [
        ("gpt-4o", "o200k_base"),
        ("gpt-4o-mini-2024-07-18", "o200k_base"),
        ("gpt-4.1-nano", "o200k_base"),
        ("gpt-5", "o200k_base"),
        ("o1-preview", "o200k_base"),
        ("o3", "o200k_base"),
        ("o4-mini", "o200k_base"),
        ("gpt-4", "cl100k_base"),
        ("gpt-4-turbo", "cl100k_base"),
        ("gpt-3.5-turbo", "cl100k_base"),
        ("text-embedding-3-large", "cl100k_base"),
        ("llama-3.1-8b-instruct", "estimate"),
        ("o10", "estimate"),
        ("", "estimate"),
    ],
)
def test_encoding_for_model(model: str, encoding: str) -> None:
    assert router.encoding_for_model(model) == encoding


def test_known_counts() -> None:
    assert router.count_tokens("hello world", "cl100k_base") == 2
    assert router.count_tokens("", "o200k_base") == 0
    assert router.count_tokens("abcdefghi", "estimate") == 3
    # Special-token text counts as ordinary text, as tiktoken's encode_ordinary does.
    assert router.count_tokens("<|endoftext|>", "cl100k_base") > 1


def test_unknown_encoding() -> None:
    with pytest.raises(router.InvalidArgumentError, match="encoding must be"):
        router.count_tokens("x", "p50k_base")
    with pytest.raises(router.InvalidArgumentError):
        router.count_request_tokens(b"{}", "gpt2")


def test_chat_accounting() -> None:
    chat = {"messages": [{"role": "user", "content": "hello world", "name": "bob"}]}
    # 3 reply priming + 3 per message + role + content + name + 1 for the name.
    assert router.count_request_tokens(json.dumps(chat).encode(), "cl100k_base") == 11


def test_prompt_and_input_forms() -> None:
    def count(value: object) -> int:
        return router.count_request_tokens(json.dumps(value).encode(), "cl100k_base")

    assert count({"prompt": "hello world"}) == 2
    assert count({"prompt": ["hello world", "hello"]}) == 3
    assert count({"input": [1, 2, 3]}) == 3
    assert count({"input": [[1, 2], [3]]}) == 3


def test_request_errors() -> None:
    with pytest.raises(router.RequestShapeError, match="none of"):
        router.count_request_tokens(b"{}", "cl100k_base")
    with pytest.raises(router.RequestDecodeError):
        router.count_request_tokens(b"[1,", "cl100k_base")
    with pytest.raises(router.RequestShapeError):
        router.count_request_tokens(b'{"messages": "hi"}', "estimate")


CORPUS = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog. " * 40,
    "def f(x):\n    return x ** 2  # square\n\n\n",
    "Größe, naïve café — “quotes” and emoji 🎉🚀 and 日本語のテキスト、中文文本。",
    "   leading and trailing whitespace   \n\t ",
    "numbers 1234567890 3.14159 1e-9 0xdeadbeef",
    "I'm sure they'll say we've done it; you're right, it's 'quoted'.",
    "<|endoftext|> <|fim_prefix|> not special here",
]


@pytest.mark.parametrize("encoding", ["cl100k_base", "o200k_base"])
def test_counts_equal_tiktoken_on_corpus(encoding: str) -> None:
    enc = reference.tiktoken_encoding(encoding)
    if enc is None:
        pytest.skip("no tiktoken vocabulary file found in the tiktoken-rs crate sources")
    for text in CORPUS:
        assert router.count_tokens(text, encoding) == len(enc.encode_ordinary(text)), text
    chat = {
        "messages": [
            {"role": "system", "content": CORPUS[1]},
            {"role": "user", "content": [{"type": "text", "text": CORPUS[3]}], "name": "a"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"function": {"name": "f", "arguments": '{"x": 1}'}}],
            },
            {"role": "tool", "content": CORPUS[2], "tool_call_id": "c1"},
        ]
    }
    raw = json.dumps(chat).encode()
    assert router.count_request_tokens(raw, encoding) == reference.count_request_tokens(raw, enc)
    # Prompt text outside the messages: vLLM's documents and template arguments, a prediction.
    chat["documents"] = [{"title": "t", "text": CORPUS[4]}]
    chat["chat_template_kwargs"] = {"context": CORPUS[5]}
    chat["prediction"] = {"type": "content", "content": CORPUS[6]}
    raw = json.dumps(chat).encode()
    assert router.count_request_tokens(raw, encoding) == reference.count_request_tokens(raw, enc)
    fim = json.dumps({"prompt": CORPUS[0], "suffix": CORPUS[1]}).encode()
    assert router.count_request_tokens(fim, encoding) == reference.count_request_tokens(fim, enc)


@pytest.mark.parametrize("encoding", ["cl100k_base", "o200k_base"])
def test_prompt_text_outside_message_text_is_counted_like_the_reference(encoding: str) -> None:
    """Issue 24: a prompt hidden in tool descriptions, a response schema, input_text or
    refusal parts, or an image data URL is counted (images by the image rule)."""
    enc = reference.tiktoken_encoding(encoding)
    if enc is None:
        pytest.skip("no tiktoken vocabulary file found in the tiktoken-rs crate sources")
    hidden = CORPUS[3] * 20
    image = "data:image/png;base64," + "A" * 400_000
    chat = {
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "input_text": hidden},
                    {"type": "refusal", "refusal": hidden},
                    {"type": "image_url", "image_url": {"url": image}},
                    {"type": "image_url", "image_url": {"url": image, "detail": "low"}},
                ],
            }
        ],
        "tools": [{"type": "function", "function": {"name": "f", "description": hidden}}],
        "response_format": {"type": "json_schema", "json_schema": {"schema": {"d": hidden}}},
    }
    raw = json.dumps(chat).encode()
    counted = router.count_request_tokens(raw, encoding)
    assert counted == reference.count_request_tokens(raw, enc)
    four = len(enc.encode_ordinary(hidden)) * 4
    # Four copies of the hidden text and two images, never the 800 kB of image data.
    assert four < counted < four + 2 * reference.IMAGE_TOKENS + 200


def test_preload_then_count() -> None:
    router.preload_tokenizers()
    router.preload_tokenizers()
    assert router.count_tokens("hello world", "o200k_base") == 2
