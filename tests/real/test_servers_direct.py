"""The OpenAI SDK straight at the real servers (no router): what the router will sit in front of."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from openai import OpenAI
from tokenizers import Tokenizer

from tests.real.model import ModelFiles
from tests.real.servers import MODEL_ALIAS
from tests.support import Proc

pytestmark = pytest.mark.real

CHAT_SERVERS = ("llama-server", "llama-cpp-python")
MESSAGES: list[Any] = [{"role": "user", "content": "Tell me about the sea."}]
TEXTS = (
    "Hello, world!",
    "The router fails over to the next region.",
    "héllo wörld — naïve café, 日本語, emoji 🙂🚀",
    "  leading spaces,\ttabs\nand\n\nnewlines  ",
    "12345 + 678 = 13023; it's we'll they're",
)


@pytest.fixture(params=CHAT_SERVERS)
def chat_server(request: pytest.FixtureRequest) -> Proc:
    name = "llama_server" if request.param == "llama-server" else "llama_cpp_server"
    proc: Proc = request.getfixturevalue(name)
    return proc


@pytest.fixture(params=CHAT_SERVERS)
def embed_server(request: pytest.FixtureRequest) -> Proc:
    name = "llama_server_embed" if request.param == "llama-server" else "llama_cpp_server_embed"
    proc: Proc = request.getfixturevalue(name)
    return proc


# Every SDK client a test opens, closed after it (an unclosed one's sockets warn, as errors, in
# whatever test the garbage collector happens to run in).
_OPEN: list[OpenAI] = []


def client(proc: Proc) -> OpenAI:
    opened = OpenAI(base_url=proc.url + "/v1", api_key="x", max_retries=0, timeout=60)
    _OPEN.append(opened)
    return opened


@pytest.fixture(autouse=True)
def _close_clients() -> Iterator[None]:
    yield
    while _OPEN:
        _OPEN.pop().close()


def post_json(url: str, body: dict[str, Any]) -> Any:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


def test_models(chat_server: Proc) -> None:
    ids = [model.id for model in client(chat_server).models.list()]
    assert MODEL_ALIAS in ids


def test_chat_non_stream(chat_server: Proc) -> None:
    done = client(chat_server).chat.completions.create(
        model=MODEL_ALIAS, messages=MESSAGES, max_tokens=8, temperature=0, seed=7
    )
    choice = done.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content
    assert choice.finish_reason == "length"
    assert done.usage is not None
    assert done.usage.completion_tokens == 8


def test_chat_stream_matches_non_stream(chat_server: Proc) -> None:
    api = client(chat_server)
    whole = api.chat.completions.create(
        model=MODEL_ALIAS, messages=MESSAGES, max_tokens=8, temperature=0, seed=7
    )
    stream = api.chat.completions.create(
        model=MODEL_ALIAS, messages=MESSAGES, max_tokens=8, temperature=0, seed=7, stream=True
    )
    parts: list[str] = []
    finish: list[str] = []
    for chunk in stream:
        for choice in chunk.choices:
            parts.append(choice.delta.content or "")
            if choice.finish_reason:
                finish.append(choice.finish_reason)
    assert "".join(parts) == whole.choices[0].message.content
    assert finish == ["length"]


def test_completions(chat_server: Proc) -> None:
    done = client(chat_server).completions.create(
        model=MODEL_ALIAS, prompt="Once upon a time", max_tokens=8, temperature=0
    )
    assert done.choices[0].text
    assert done.choices[0].finish_reason == "length"
    assert done.usage is not None
    assert done.usage.completion_tokens == 8


def test_temperature_zero_is_deterministic(chat_server: Proc) -> None:
    api = client(chat_server)
    texts = {
        api.chat.completions.create(
            model=MODEL_ALIAS, messages=MESSAGES, max_tokens=16, temperature=0, seed=1
        )
        .choices[0]
        .message.content
        for _ in range(2)
    }
    assert len(texts) == 1


def test_seeded_sampling_is_deterministic(chat_server: Proc) -> None:
    api = client(chat_server)
    texts = {
        api.completions.create(
            model=MODEL_ALIAS, prompt="The sea", max_tokens=16, temperature=0.8, seed=42
        )
        .choices[0]
        .text
        for _ in range(2)
    }
    assert len(texts) == 1


def test_embeddings(embed_server: Proc) -> None:
    done = client(embed_server).embeddings.create(
        model=MODEL_ALIAS, input=["the sea", "a mountain"]
    )
    assert [item.index for item in done.data] == [0, 1]
    assert {len(item.embedding) for item in done.data} == {512}
    assert done.data[0].embedding != done.data[1].embedding


@pytest.mark.parametrize("text", TEXTS)
def test_llama_server_tokenize_matches_tokenizer_json(
    llama_server: Proc, real_model: ModelFiles, text: str
) -> None:
    hf = Tokenizer.from_file(str(real_model.tokenizer_json))
    tokens = post_json(llama_server.url + "/tokenize", {"content": text})["tokens"]
    assert tokens == hf.encode(text).ids


@pytest.mark.parametrize("text", TEXTS)
def test_llama_cpp_python_tokenize_matches_tokenizer_json(
    llama_cpp_server: Proc, real_model: ModelFiles, text: str
) -> None:
    hf = Tokenizer.from_file(str(real_model.tokenizer_json))
    body = {"model": MODEL_ALIAS, "input": text}
    tokens = post_json(llama_cpp_server.url + "/extras/tokenize", body)["tokens"]
    assert tokens == hf.encode(text).ids


def test_special_tokens_match(llama_server: Proc, real_model: ModelFiles) -> None:
    hf = Tokenizer.from_file(str(real_model.tokenizer_json))
    text = "<|im_start|>user\nhi<|im_end|>\n"
    body = {"content": text, "parse_special": True}
    tokens = post_json(llama_server.url + "/tokenize", body)["tokens"]
    assert tokens == hf.encode(text).ids


@pytest.mark.timeout(300)
def test_long_stream(chat_server: Proc) -> None:
    """400 tokens at temperature 0: the model never picks a special token, so all 400 arrive,
    one content chunk per token (every token is ASCII). llama-server adds the usage chunk that
    stream_options asks for; llama-cpp-python ignores stream_options."""
    stream = client(chat_server).chat.completions.create(
        model=MODEL_ALIAS,
        messages=MESSAGES,
        max_tokens=400,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    pieces = 0
    finish: list[str] = []
    usage = None
    for chunk in stream:
        for choice in chunk.choices:
            pieces += bool(choice.delta.content)
            if choice.finish_reason:
                finish.append(choice.finish_reason)
        if chunk.usage is not None:
            usage = chunk.usage
    assert finish == ["length"]
    assert pieces == 400
    if "llama_cpp.server" in chat_server.args:
        assert usage is None
    else:
        assert usage is not None
        assert usage.completion_tokens == 400
