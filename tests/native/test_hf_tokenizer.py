"""router.HfTokenizer and router.ChatTemplate against the tokenizers package and Jinja2."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

import router

tokenizers = pytest.importorskip("tokenizers", reason="the tokenizers package is a dev extra")
jinja2_sandbox = pytest.importorskip("jinja2.sandbox", reason="jinja2 is a dev extra")
from tests import tokenizer_files  # noqa: E402  (needs tokenizers)

TEXTS = [
    "",
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog. " * 40,
    "def f(x):\n    return x ** 2  # square\n\n\n",
    "Größe, naïve café — “quotes” and emoji 🎉🚀 and 日本語のテキスト、中文文本。",
    "   leading and trailing whitespace   \n\t ",
    "\n\n\n\t\t   \r\n  ",
    "numbers 1234567890 3.14159 1e-9 0xdeadbeef",
    "I'm sure they'll say we've done it; you're right, it's 'QUOTED'.",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "<s>text</s> and <|eot_id|> <|start_header_id|>",
    "👨‍👩‍👧 🇫🇷 \u200b zero width \ufeff bom \u00a0 nbsp",
    "x" * 5000,
]

KINDS = [
    "byte_level_bpe",
    "llama3_style_bpe",
    "wordpiece",
    "llama2_style_bpe",
    "unigram_metaspace",
]


@pytest.fixture(scope="module", params=KINDS)
def tokenizer_file(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    build = getattr(tokenizer_files, request.param)
    path: Path = build(tmp_path_factory.mktemp("tok") / "tokenizer.json")
    return path


@pytest.fixture(scope="module")
def bpe_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tokenizer_files.byte_level_bpe(tmp_path_factory.mktemp("bpe") / "tokenizer.json")


@pytest.mark.parametrize("add_special_tokens", [False, True])
def test_ids_equal_tokenizers_package(tokenizer_file: Path, add_special_tokens: bool) -> None:
    native = router.HfTokenizer(tokenizer_file)
    reference = tokenizers.Tokenizer.from_file(str(tokenizer_file))
    for text in TEXTS:
        ids = reference.encode(text, add_special_tokens=add_special_tokens).ids
        assert native.encode(text, add_special_tokens=add_special_tokens) == ids, text
        assert native.count(text, add_special_tokens=add_special_tokens) == len(ids), text
    assert native.count_many(TEXTS, add_special_tokens=add_special_tokens) == [
        len(reference.encode(t, add_special_tokens=add_special_tokens).ids) for t in TEXTS
    ]


def test_attributes_and_specials(bpe_file: Path) -> None:
    native = router.HfTokenizer(str(bpe_file))
    assert native.path == str(bpe_file)
    assert native.vocab_size == 600
    assert native.token_to_id("<|im_start|>") == 2
    assert native.token_to_id("no such token here") is None
    # Special tokens written in the text are one token each; BOS only when asked.
    assert native.encode("<|im_start|><|im_end|>") == [2, 3]
    assert native.encode("<|im_start|>", add_special_tokens=True) == [0, 2]
    assert native.count("") == 0
    assert native.count("", add_special_tokens=True) == 1
    assert native.count_many([]) == []
    assert "HfTokenizer(" in repr(native)


def test_truncation_and_padding_in_the_file_are_ignored(bpe_file: Path, tmp_path: Path) -> None:
    reference = tokenizers.Tokenizer.from_file(str(bpe_file))
    reference.enable_truncation(max_length=3)
    reference.enable_padding(length=64)
    truncated = tmp_path / "tokenizer.json"
    reference.save(str(truncated))
    text = TEXTS[2]
    assert router.HfTokenizer(truncated).count(text) == router.HfTokenizer(bpe_file).count(text)
    assert router.HfTokenizer(truncated).count(text) > 64


def test_load_errors_name_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "nope" / "tokenizer.json"
    with pytest.raises(router.TokenizerLoadError, match="cannot read tokenizer file") as info:
        router.HfTokenizer(missing)
    assert info.value.path == str(missing)
    assert str(missing) in str(info.value)
    assert isinstance(info.value, router.NativeError)

    for content in ("not json", "{}", '{"model": {"type": "BPE", "vocab": 3}}', "[1, 2]"):
        bad = tmp_path / "bad.json"
        bad.write_text(content)
        with pytest.raises(router.TokenizerLoadError, match="cannot load tokenizer file") as info:
            router.HfTokenizer(bad)
        assert info.value.path == str(bad)
    with pytest.raises(router.TokenizerLoadError):
        router.HfTokenizer(tmp_path)


def test_argument_types(bpe_file: Path) -> None:
    native = router.HfTokenizer(bpe_file)
    with pytest.raises(TypeError):
        native.count(b"bytes")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        native.count_many("not a list")  # type: ignore[arg-type]
    with pytest.raises(router.InvalidArgumentError, match="surrogate"):
        native.count("lone \ud800 surrogate")
    with pytest.raises(router.InvalidArgumentError, match="surrogate"):
        native.count_many(["ok", "\udfff"])


def test_word_level_without_unknown_token_is_an_encode_error(tmp_path: Path) -> None:
    reference = tokenizers.Tokenizer(tokenizers.models.WordLevel({"a": 0}))
    reference.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    path = tmp_path / "tokenizer.json"
    reference.save(str(path))
    native = router.HfTokenizer(path)
    assert native.count("a a") == 2
    with pytest.raises(router.TokenizeError):
        native.count("b")


# Chat templates: rendered with Jinja2 the way transformers does (sandboxed, trim_blocks,
# lstrip_blocks, loop controls, raise_exception, tojson as json.dumps) as the reference.

CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# Meta-Llama-3-8B-Instruct's template.
LLAMA3 = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
    "{% endif %}"
)

# Qwen 2.5 style: tools as JSON, tool calls, tool responses grouped, Python string methods.
QWEN_STYLE = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools><|im_end|>\\n" }}
{%- elif messages[0]['role'] == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
{%- endif %}
{%- set ns = namespace(turns=0) %}
{%- for message in messages %}
    {%- if message.role == "system" %}{% continue %}{% endif %}
    {%- if message.role not in ["user", "assistant", "tool"] %}
        {{- raise_exception("unknown role " + message.role) }}
    {%- endif %}
    {%- set ns.turns = ns.turns + 1 %}
    {%- if message.role == "user" or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content.strip() + '<|im_end|>\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}{{- '\\n' + message.content }}{%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' + tool_call.name + '", "arguments": ' }}
            {{- tool_call.arguments }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- else %}
        {%- if loop.first or messages[loop.index0 - 1].role != "tool" %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}
        {%- if loop.last or messages[loop.index0 + 1].role != "tool" %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

CHAT: dict[str, Any] = {
    "model": "m",
    "messages": [
        {"role": "system", "content": "You are terse.  "},
        {"role": "user", "content": "  What's the weather in Paris — and in 東京? 🎉  "},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "18°C, cloudy"},
        {"role": "tool", "tool_call_id": "c2", "content": "25°C"},
        {
            "role": "user",
            "content": [{"type": "text", "text": "Thanks."}, {"type": "text", "text": "Bye"}],
        },
    ],
    "tools": [
        {
            "type": "function",
            "function": {
                "name": "weather",
                "description": "Current weather «city»",
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string", "enum": ["Paris", "東京"]}},
                    "required": ["city"],
                },
            },
        }
    ],
}


def _raise(message: str) -> None:
    raise ValueError(message)


def jinja_render(
    template: str,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    add_generation_prompt: bool,
    bos_token: str = "<s>",
) -> str:
    """What transformers' apply_chat_template(tokenize=False) renders."""
    env = jinja2_sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = lambda x, indent=None: json.dumps(x, ensure_ascii=False, indent=indent)
    env.globals["raise_exception"] = _raise
    return env.from_string(template).render(
        messages=messages,
        tools=tools,
        documents=None,
        add_generation_prompt=add_generation_prompt,
        bos_token=bos_token,
        eos_token="</s>",
    )


def _flat(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Content parts joined by newlines, as the native side does (and llama.cpp, vLLM)."""
    out = []
    for m in messages:
        if isinstance(m.get("content"), list):
            m = {**m, "content": "\n".join(p["text"] for p in m["content"] if "text" in p)}
        out.append(m)
    return out


def _sorted(value: Any) -> Any:
    """Objects with sorted keys, as the native side reads them."""
    return json.loads(json.dumps(value, sort_keys=True))


@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("template", [CHATML, LLAMA3, QWEN_STYLE], ids=["chatml", "llama3", "qwen"])
def test_render_equals_jinja2(template: str, add_generation_prompt: bool) -> None:
    chat = CHAT if template is QWEN_STYLE else {**CHAT, "messages": CHAT["messages"][:2]}
    native = router.ChatTemplate(template, "<s>", "</s>")
    expected = jinja_render(
        template,
        _sorted(_flat(chat["messages"])),
        _sorted(chat["tools"]) if template is QWEN_STYLE else None,
        add_generation_prompt,
    )
    body = json.dumps(chat if template is QWEN_STYLE else {"messages": chat["messages"]})
    assert native.render(body.encode(), add_generation_prompt) == expected


def test_known_renders() -> None:
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": " hi "}]
    body = json.dumps(messages).encode()
    assert router.ChatTemplate(CHATML).render(body) == (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\n hi <|im_end|>\n<|im_start|>assistant\n"
    )
    assert router.ChatTemplate(LLAMA3, "<|begin_of_text|>").render(body, False) == (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nS<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
    )


def test_request_forms_render_alike() -> None:
    template = router.ChatTemplate(CHATML)
    chat = {"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "hi"}]}
    anthropic = {
        "system": [{"type": "text", "text": "S"}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
    }
    responses = {"instructions": "S", "input": "hi"}
    items = {
        "instructions": "S",
        "input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}],
    }
    rendered = {
        template.render(json.dumps(b).encode()) for b in (chat, anthropic, responses, items)
    }
    assert len(rendered) == 1


def test_template_errors() -> None:
    with pytest.raises(router.ChatTemplateError, match="syntax"):
        router.ChatTemplate("{% for x in %}")
    template = router.ChatTemplate(QWEN_STYLE)
    with pytest.raises(router.ChatTemplateError, match="unknown role narrator"):
        template.render(b'[{"role": "user", "content": "a"}, {"role": "narrator", "content": "b"}]')
    with pytest.raises(router.RequestDecodeError):
        template.render(b"{")
    with pytest.raises(router.RequestShapeError):
        template.render(b'{"messages": "hi"}')
    with pytest.raises(router.RequestShapeError):
        template.render(b"{}")
    with pytest.raises(TypeError):
        template.render("[]")  # type: ignore[arg-type]
    assert router.ChatTemplate("{{ strftime_now('%Y') }}").render(b"[]") >= "2025"


@pytest.mark.parametrize("add_special_tokens", [False, True])
def test_count_chat_counts_the_rendered_prompt(tmp_path: Path, add_special_tokens: bool) -> None:
    path = tokenizer_files.byte_level_bpe(tmp_path / "tokenizer.json")
    native = router.HfTokenizer(path)
    reference = tokenizers.Tokenizer.from_file(str(path))
    template = router.ChatTemplate(QWEN_STYLE, "<s>", "</s>")
    body = json.dumps(CHAT).encode()
    expected = len(reference.encode(template.render(body), add_special_tokens=False).ids)
    assert native.count_chat(template, body) == expected
    # llama.cpp's way: the post-processor's BOS, not one from the text; here no BOS in the text.
    counted = native.count_chat(template, body, add_special_tokens=add_special_tokens)
    assert counted == expected + add_special_tokens
    no_prompt = native.count_chat(template, body, add_generation_prompt=False)
    assert no_prompt < expected


def test_count_chat_counts_bos_once(tmp_path: Path) -> None:
    path = tokenizer_files.byte_level_bpe(tmp_path / "tokenizer.json")
    native = router.HfTokenizer(path)
    template = router.ChatTemplate("{{ bos_token }}{{ messages[0].content }}", "<s>", "</s>")
    body = b'[{"role": "user", "content": "hello"}]'
    hello = native.count("hello")
    assert native.count_chat(template, body) == hello + 1
    assert native.count_chat(template, body, add_special_tokens=True) == hello + 1


def test_concurrent_counts_agree(bpe_file: Path) -> None:
    # Texts of 1 KiB and more are counted with the GIL released: threads share one tokenizer.
    native = router.HfTokenizer(bpe_file)
    texts = [t * 50 for t in TEXTS[1:6]]
    expected = native.count_many(texts)
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda _: [native.count(t) for t in texts], range(16)))
    assert all(r == expected for r in results)
