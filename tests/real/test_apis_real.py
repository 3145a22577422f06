"""The Responses API and Anthropic's Messages API on llama.cpp's llama-server, which serves
both, through the router: the `openai` and `anthropic` SDKs as clients, answers equal to the
server's own, exact prompt counts, a SIGKILL mid-stream ending in each API's own failure."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from router.access.auth import ANONYMOUS_TENANT
from router.access.limits import Limiter
from router.access.tokenizers import ModelTokenizer
from router.config import TokenizerConfig
from router.core.request import MESSAGES, RESPONSES, parse_body
from tests.real.conftest import RealFactory
from tests.real.model import CHAT_TEMPLATE
from tests.real.servers import MODEL_ALIAS
from tests.real.test_router_real import (
    _OPEN,
    _close_clients,  # noqa: F401  (autouse: closes every SDK client after its test)
    region,
    router_for,
    sdk,
    wait_healthy,
)
from tests.support import Proc

pytestmark = pytest.mark.real


def _openai(proc: Proc) -> openai.OpenAI:
    return sdk(proc)


def _anthropic(proc: Proc) -> anthropic.Anthropic:
    client = anthropic.Anthropic(base_url=proc.url, api_key="x", max_retries=0, timeout=180)
    _OPEN.append(client)  # type: ignore[arg-type]  (closed like the openai clients)
    return client


@pytest.fixture
def routed(llama_server: Proc, tmp_path: Path) -> Iterator[Proc]:
    started: list[Proc] = []
    router = router_for(tmp_path, started, region("a", llama_server, "llama-server"))
    wait_healthy(router, "a")
    yield router
    for proc in started:
        proc.kill()


ASK: dict[str, Any] = {"model": MODEL_ALIAS, "temperature": 0}


def test_responses_through_the_router_equal_direct(llama_server: Proc, routed: Proc) -> None:
    asked = {**ASK, "input": "Tell me about the sea.", "max_output_tokens": 12, "store": False}
    direct = _openai(llama_server).responses.create(**asked)
    through = _openai(routed).responses.create(**asked)
    assert through.output_text == direct.output_text
    assert through.output_text
    events = list(_openai(routed).responses.create(**asked, stream=True))
    assert events[0].type == "response.created"
    assert events[-1].type == "response.completed"
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == direct.output_text


def test_messages_through_the_router_equal_direct(llama_server: Proc, routed: Proc) -> None:
    asked: dict[str, Any] = {
        "model": MODEL_ALIAS,
        "max_tokens": 12,
        "system": "You are terse.",
        "messages": [{"role": "user", "content": "Tell me about the sea."}],
        "extra_body": {"temperature": 0},
    }
    direct = _anthropic(llama_server).messages.create(**asked)
    through = _anthropic(routed).messages.create(**asked)
    assert through.content == direct.content
    assert through.stop_reason == "max_tokens"
    with _anthropic(routed).messages.stream(**asked) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == direct.content[0].text  # type: ignore[union-attr]
    assert final.stop_reason == "max_tokens"


def test_prompt_counts_through_the_router_equal_direct(llama_server: Proc, routed: Proc) -> None:
    messages = [{"role": "user", "content": "Tell me about the sea."}]
    direct = _anthropic(llama_server).messages.count_tokens(model=MODEL_ALIAS, messages=messages)  # type: ignore[arg-type]
    through = _anthropic(routed).messages.count_tokens(model=MODEL_ALIAS, messages=messages)  # type: ignore[arg-type]
    assert through.input_tokens == direct.input_tokens > 0
    asked = {"model": MODEL_ALIAS, "input": "Tell me about the sea.", "instructions": "Be terse."}
    counted = _openai(routed).responses.input_tokens.count(**asked)
    assert (
        counted.input_tokens
        == _openai(llama_server).responses.input_tokens.count(**asked).input_tokens
    )


def test_a_llama_cpp_python_region_serves_neither(llama_cpp_server: Proc, tmp_path: Path) -> None:
    started: list[Proc] = []
    router = router_for(tmp_path, started, region("a", llama_cpp_server, "llama-cpp-python"))
    try:
        with pytest.raises(openai.NotFoundError) as missing:
            _openai(router).responses.create(model=MODEL_ALIAS, input="hi", store=False)
        assert missing.value.code == "endpoint_not_served"
        with pytest.raises(anthropic.NotFoundError):
            _anthropic(router).messages.create(
                model=MODEL_ALIAS, max_tokens=4, messages=[{"role": "user", "content": "hi"}]
            )
    finally:
        for proc in started:
            proc.kill()


def test_exact_prompt_counts_equal_llama_servers_own(
    llama_server: Proc, real_model: Any, tmp_path: Path
) -> None:
    """Responses and Messages prompts, counted as the chat request they render to with the tier
    model's tokenizer.json and chat template, equal the server's reported input tokens."""
    template = tmp_path / "template.jinja"
    template.write_text(CHAT_TEMPLATE)
    counter = ModelTokenizer(
        MODEL_ALIAS,
        TokenizerConfig(file=str(real_model.tokenizer_json), chat_template=str(template)),
    )
    limiter = Limiter([ANONYMOUS_TENANT], tokenizers={MODEL_ALIAS: counter})
    text = "héllo wörld, naïve café 🙂 — 12345"
    responses: list[dict[str, Any]] = [
        {"input": "Tell me about the sea."},
        {"input": text, "instructions": "You are terse."},
        {
            "input": [
                {"role": "user", "content": [{"type": "input_text", "text": "First."}]},
                # llama-server needs the type of an assistant item ("Cannot determine type").
                {"type": "message", "role": "assistant", "content": "Second."},
                {"role": "user", "content": text},
            ]
        },
    ]
    for body in responses:
        asked = {**ASK, **body, "max_output_tokens": 1, "store": False}
        done = _openai(llama_server).responses.create(**asked)
        assert done.usage is not None
        parsed = parse_body(RESPONSES, json.dumps(asked).encode())
        assert limiter.estimate_parts(parsed)[1] == done.usage.input_tokens, body
    messages: list[dict[str, Any]] = [
        {"messages": [{"role": "user", "content": "Tell me about the sea."}]},
        {"system": "You are terse.", "messages": [{"role": "user", "content": text}]},
        {
            "system": [{"type": "text", "text": "You are terse."}],
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "First."}]},
                {"role": "assistant", "content": "Second."},
                {"role": "user", "content": text},
            ],
        },
    ]
    for body in messages:
        asked = {"model": MODEL_ALIAS, **body, "max_tokens": 1}
        done = _anthropic(llama_server).messages.create(**asked)
        usage = done.usage
        served = usage.input_tokens + (usage.cache_read_input_tokens or 0)
        parsed = parse_body(MESSAGES, json.dumps(asked).encode())
        assert limiter.estimate_parts(parsed)[1] == served, body


@pytest.mark.timeout(300)
def test_sigkill_mid_stream_ends_each_api_in_its_own_failure(
    start_real: RealFactory, tmp_path: Path
) -> None:
    """No continuation for these APIs: a region SIGKILLed mid-answer ends the Responses stream
    with response.failed and the Messages stream with an error event the SDK raises."""
    started: list[Proc] = []
    try:
        for api in ("responses", "messages"):
            server = start_real("llama-server")
            router = router_for(tmp_path, started, region("a", server, "llama-server"))
            wait_healthy(router, "a")
            if api == "responses":
                events = _openai(router).responses.create(
                    **ASK, input="Tell me about the sea.", max_output_tokens=300, stream=True
                )
                seen = []
                for event in events:
                    seen.append(event.type)
                    if seen.count("response.output_text.delta") == 3:
                        server.kill()
                assert seen[-1] == "response.failed"
                assert "response.completed" not in seen
            else:
                with pytest.raises(anthropic.APIStatusError):
                    _read_killing_after(_anthropic(router), server, 3)
    finally:
        for proc in started:
            proc.kill()


def _read_killing_after(client: anthropic.Anthropic, server: Proc, deltas: int) -> None:
    """Stream a long Messages answer, SIGKILLing its server after `deltas` text deltas."""
    got = 0
    with client.messages.stream(
        model=MODEL_ALIAS,
        max_tokens=300,
        messages=[{"role": "user", "content": "Tell me about the sea."}],
    ) as stream:
        for _ in stream.text_stream:
            got += 1
            if got == deltas:
                server.kill()
    raise AssertionError(f"the stream ended cleanly after {got} deltas")


def _resuming(tmp_path: Path, started: list[Proc], first: Proc, rest: Proc) -> Proc:
    """A router that carries cut streams on: llama-servers `first`, then `rest`."""
    router = router_for(
        tmp_path,
        started,
        region("first", first, "llama-server"),
        region("rest", rest, "llama-server", bias_ms=1000.0),
        extra='[routing]\nmidstream = "resume"\n',
    )
    wait_healthy(router, "first", "rest")
    return router


@pytest.mark.timeout(300)
def test_sigkill_mid_stream_is_continued_on_a_surviving_llama_server(
    start_real: RealFactory, tmp_path: Path
) -> None:
    """A llama-server region SIGKILLed mid-answer; another llama-server continues from the
    text so far (a prefill it answers back first): one stream, one id, nothing lost or
    duplicated, the whole answer's usage."""
    started: list[Proc] = []
    try:
        first = start_real("llama-server")
        rest = start_real("llama-server")
        router = _resuming(tmp_path, started, first, rest)
        asked = {**ASK, "input": "Tell me about the sea.", "max_output_tokens": 120, "store": False}
        events = []
        for event in _openai(router).responses.create(**asked, stream=True):
            events.append(event)
            if [e.type for e in events].count("response.output_text.delta") == 10:
                first.kill()
        kinds = [e.type for e in events]
        assert kinds.count("response.created") == 1
        assert kinds[-1] == "response.completed"
        text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
        final = events[-1].response
        assert final.id == events[0].response.id
        assert final.output_text == text
        assert final.usage is not None
        # The continuation's usage, rewritten to cover the whole answer.
        assert final.usage.output_tokens >= 120 - 2
        assert "resuming on rest" in router.output()  # it was cut, and continued

        first = start_real("llama-server")
        router = _resuming(tmp_path, started, first, rest)
        pieces = []
        with _anthropic(router).messages.stream(
            model=MODEL_ALIAS,
            max_tokens=120,
            messages=[{"role": "user", "content": "Tell me about the sea."}],
        ) as stream:
            for piece in stream.text_stream:
                pieces.append(piece)
                if len(pieces) == 10:
                    first.kill()
            message = stream.get_final_message()
        assert message.content[0].text == "".join(pieces)  # type: ignore[union-attr]
        assert message.stop_reason == "max_tokens"
        assert message.usage.output_tokens >= 120 - 2
        assert "resuming on rest" in router.output()
    finally:
        for proc in started:
            proc.kill()


@pytest.mark.timeout(300)
def test_a_clients_prefill_cut_mid_stream_is_extended_on_a_surviving_llama_server(
    start_real: RealFactory, tmp_path: Path
) -> None:
    """A Messages stream that continues the client's own prefill, SIGKILLed mid-answer: the
    next llama-server gets that prefill extended by the text so far (one assistant turn, not
    two), and its answer-back of it is held back: nothing the client had comes twice."""
    started: list[Proc] = []
    try:
        first = start_real("llama-server")
        rest = start_real("llama-server")
        router = _resuming(tmp_path, started, first, rest)
        prefill = "The sea is"
        pieces: list[str] = []
        had = ""
        with _anthropic(router).messages.stream(
            model=MODEL_ALIAS,
            max_tokens=120,
            messages=[
                {"role": "user", "content": "Tell me about the sea."},
                {"role": "assistant", "content": prefill},
            ],
        ) as stream:
            for piece in stream.text_stream:
                pieces.append(piece)
                if len(pieces) == 10:
                    had = "".join(pieces)
                    first.kill()
            message = stream.get_final_message()
        text = "".join(pieces)
        assert message.content[0].text == text  # type: ignore[union-attr]
        assert "resuming on rest" in router.output()  # it was cut, and continued
        assert text.startswith(had)
        assert len(text) > len(had)
        assert text.count(had) == 1, text  # nothing the client had came again
    finally:
        for proc in started:
            proc.kill()
