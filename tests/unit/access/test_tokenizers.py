"""[tokenizers]: a model counted with its own tokenizer.json and chat template."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from router.access.auth import Authenticator, Tenant
from router.access.limits import Limiter, Limits
from router.access.tokenizers import ModelTokenizer, load
from router.access.usage import StreamUsage
from router.config import TokenizerConfig
from router.core.context import RequestContext
from router.core.request import CHAT, COMPLETIONS, parse_body
from router.errors import ConfigError
from router.native import ChatTemplate, HfTokenizer, count_tokens
from tests.tokenizer_files import byte_level_bpe

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    tokenizer = byte_level_bpe(tmp_path / "tokenizer.json")
    template = tmp_path / "template.jinja"
    template.write_text(CHATML)
    return tokenizer, template


def chat_body(model: str = "llama") -> bytes:
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "How far is the moon from the earth, roughly?"},
    ]
    return json.dumps({"model": model, "messages": messages, "max_tokens": 10}).encode()


def test_a_configured_model_is_counted_with_its_template(files: tuple[Path, Path]) -> None:
    tokenizer_file, template_file = files
    config = TokenizerConfig(file=str(tokenizer_file), chat_template=str(template_file))
    exact = load({"llama": config})
    limiter = Limiter([], tokenizers=exact)
    parsed = parse_body(CHAT, chat_body())
    _, prompt, budget = limiter.estimate_parts(parsed)
    rendered = ChatTemplate(CHATML).render(chat_body())
    assert prompt == HfTokenizer(tokenizer_file).count(rendered)
    assert budget == 10
    # Another model still gets the built-in estimate.
    _, other, _ = limiter.estimate_parts(parse_body(CHAT, chat_body("gpt-4o")))
    assert other != prompt


def test_without_a_template_texts_and_a_per_message_overhead(files: tuple[Path, Path]) -> None:
    tokenizer_file, _ = files
    counter = ModelTokenizer("m", TokenizerConfig(file=str(tokenizer_file), per_message=4))
    tok = HfTokenizer(tokenizer_file)
    expected = tok.count("You are terse.") + tok.count(
        "How far is the moon from the earth, roughly?"
    )
    assert counter.count(CHAT, chat_body()) == expected + 2 * 4
    prompt = json.dumps({"model": "m", "prompt": ["one", "two"]}).encode()
    assert counter.count(COMPLETIONS, prompt) == sum(
        tok.count(t, add_special_tokens=True) for t in ("one", "two")
    )


def test_a_missing_file_names_the_field(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"tokenizers\.models\.llama"):
        load({"llama": TokenizerConfig(file=str(tmp_path / "nope.json"))})


def test_a_stream_cut_before_its_usage_is_counted_with_the_models_tokenizer(
    files: tuple[Path, Path],
) -> None:
    """Issue: a stream the client left before its usage event was charged by the 4-bytes-a-token
    estimate, not the model's configured tokenizer (a client could halve its charge)."""
    tokenizer_file, template_file = files
    config = TokenizerConfig(file=str(tokenizer_file), chat_template=str(template_file))
    limiter = Limiter([], tokenizers=load({"llama": config}))
    parsed = parse_body(CHAT, json.dumps({**json.loads(chat_body()), "stream": True}).encode())
    tenant = Tenant(
        key_id="k",
        name="t",
        models=None,
        requests_per_minute=None,
        tokens_per_minute=100_000,
        request_burst=None,
        token_burst=None,
        max_concurrent=None,
        priority=0,
        cache_namespace="t",
    )
    limiter.configure(tenant)
    ctx = RequestContext("req-1", CHAT)
    ctx.parsed, ctx.tenant = parsed, tenant
    asyncio.run(Limits(Authenticator([("00" * 32, tenant)]), limiter).admit(ctx, {}))
    meter = ctx.meter
    assert isinstance(meter, StreamUsage)
    encoding, prompt = meter.encoding, meter.prompt_tokens
    text = ["Größe", " naïve", " café", " 日本語", " 🎉🚀", " tokens"] * 5
    for piece in text:
        delta = {"choices": [{"index": 0, "delta": {"content": piece}}]}
        meter.feed(b"data: " + json.dumps(delta).encode() + b"\n\n")
    counted = HfTokenizer(tokenizer_file).count("".join(text))
    assert meter.used() == prompt + counted
    assert counted != count_tokens("".join(text), encoding)  # the estimate would differ
    # A model without a tokenizer of its own keeps the built-in estimate.
    assert limiter.text_counter(parse_body(CHAT, chat_body("gpt-4o"))) is None
