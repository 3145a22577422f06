"""The Responses API and Anthropic's Messages API through a real `router serve`, with the
`openai` and `anthropic` SDKs as clients and simulated regions behind it."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from router.access.auth import hash_key
from tests.integration.conftest import (
    MODEL,
    RouterFactory,
    SimFactory,
    region_toml,
    regions_toml,
    sim_stats,
    start_router,
)
from tests.support import Proc, start_redis


@pytest.fixture
def clients() -> Iterator[list[Any]]:
    """Every SDK client a test opens, closed after it."""
    opened: list[Any] = []
    yield opened
    for client in opened:
        client.close()


def _openai(router: Proc, opened: list[Any], **options: Any) -> openai.OpenAI:
    options.setdefault("api_key", "unused")
    client = openai.OpenAI(base_url=router.url + "/v1", max_retries=0, **options)
    opened.append(client)
    return client


def _anthropic(router: Proc, opened: list[Any], **options: Any) -> anthropic.Anthropic:
    options.setdefault("api_key", "unused")
    client = anthropic.Anthropic(base_url=router.url, max_retries=0, **options)
    opened.append(client)
    return client


def _post(url: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> Any:
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", **(headers or {})},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def _events(raw: bytes) -> list[tuple[str | None, dict[str, Any]]]:
    """(event name, data) of each SSE event of a whole stream body."""
    out = []
    for block in raw.decode().split("\n\n"):
        name = None
        data = None
        for line in block.splitlines():
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                data = line[5:].strip()
        if data is not None and data != "[DONE]":
            out.append((name, json.loads(data)))
    return out


# ---- Responses API ----


def test_responses_whole_and_stream_match_the_region(
    sim_region: SimFactory, router_proc: RouterFactory, clients: list[Any]
) -> None:
    a = sim_region("a")
    router = router_proc(regions_toml(a))
    client = _openai(router, clients)
    direct = _openai(a, clients)
    asked: dict[str, Any] = {"model": MODEL, "input": "Say hello", "store": False}
    whole = client.responses.create(**asked)
    assert whole.status == "completed"
    assert whole.output_text == direct.responses.create(**asked).output_text
    assert whole.usage is not None
    assert whole.usage.input_tokens > 0

    events = list(client.responses.create(**asked, stream=True))
    kinds = [e.type for e in events]
    assert kinds[0] == "response.created"
    assert kinds[-1] == "response.completed"
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == whole.output_text
    # The Responses stream has no [DONE]: the router adds none.
    status, headers, raw = _post(router.url + "/v1/responses", {**asked, "stream": True})
    assert status == 200
    assert headers["Content-Type"].startswith("text/event-stream")
    assert b"[DONE]" not in raw
    assert all(name == data["type"] for name, data in _events(raw))


def test_responses_fail_over_before_the_first_byte(
    sim_region: SimFactory, router_proc: RouterFactory, clients: list[Any]
) -> None:
    a, b = sim_region("a"), sim_region("b")
    router = router_proc("[auth]\nenabled = false\n" + region_toml(a) + region_toml(b, bias_ms=500))
    client = _openai(router, clients, default_headers={"x-sim-fail": "503", "x-sim-only": "a"})
    for stream in (False, True):
        raw = client.responses.with_raw_response.create(
            model=MODEL, input="hi", store=False, stream=stream
        )
        assert raw.headers["x-router-region"] == "b"
        if stream:
            events = list(raw.parse())
            assert events[-1].type == "response.completed"
        else:
            assert raw.parse().status == "completed"
    # The second request goes to a again only if its 503's Retry-After (1 s) ran out first.
    assert 1 <= sim_stats(a)["by_path"]["/v1/responses"] <= 2


def test_responses_stream_cut_mid_way_ends_in_response_failed(
    sim_region: SimFactory, router_proc: RouterFactory, clients: list[Any]
) -> None:
    a = sim_region("a", fail_mode="die-mid-stream", after_tokens=2)
    router = router_proc(regions_toml(a))
    client = _openai(router, clients)
    events = list(client.responses.create(model=MODEL, input="hi", store=False, stream=True))
    assert [e.type for e in events].count("response.output_text.delta") == 2
    last = events[-1]
    assert last.type == "response.failed"
    assert last.response.status == "failed"
    assert last.response.error is not None
    assert "mid-stream" in last.response.error.message
    created = events[0]
    assert created.type == "response.created"
    assert last.response.id == created.response.id
    assert not any(e.type == "response.completed" for e in events)


def test_a_regions_failure_event_before_any_token_fails_over(
    sim_region: SimFactory, router_proc: RouterFactory, clients: list[Any]
) -> None:
    """A Responses or Messages stream whose region sends its error event (or a failed
    response) before any token, for a fault of its own, is taken by the next region: the
    client gets that one's clean stream. One blaming the request is the region's answer."""
    a, b = sim_region("a"), sim_region("b")
    # Every case asks a first: its failures open no circuit and eject nothing here.
    config = (
        "[auth]\nenabled = false\n[routing]\ncircuit_after = 100\n[health]\neject_after = 100\n"
    )
    router = router_proc(config + region_toml(a) + region_toml(b, bias_ms=500))
    responses = {"model": MODEL, "input": "hi", "store": False, "stream": True}
    messages = {
        "model": MODEL,
        "max_tokens": 50,
        "stream": True,
        "messages": [{"role": "user", "content": "hi"}],
    }
    cases = [
        ("/v1/responses", responses, "error-event", "server", "response.completed"),
        ("/v1/responses", responses, "error-event", "rate_limit", "response.completed"),
        ("/v1/responses", responses, "failed-event", "server", "response.completed"),
        ("/v1/messages", messages, "error-event", "overloaded", "message_stop"),
        ("/v1/messages", messages, "error-event", "server", "message_stop"),
        ("/v1/messages", messages, "error-event", "rate_limit", "message_stop"),
    ]
    for path, asked, mode, kind, end in cases:
        faults = {
            "x-sim-fail": mode,
            "x-sim-error-kind": kind,
            "x-sim-after-tokens": "0",
            "x-sim-only": "a",
        }
        failed = sim_stats(a)["injected_failures"]
        status, headers, raw = _post(router.url + path, asked, faults)
        assert (status, headers["x-router-region"]) == (200, "b"), (path, mode, kind, raw[:300])
        kinds = [data["type"] for _, data in _events(raw)]
        assert kinds[-1] == end
        assert "error" not in kinds
        assert "response.failed" not in kinds
        assert sim_stats(a)["injected_failures"] == failed + 1  # a did send its error event
    # With the SDKs: a clean stream from b, and the same text as b's own.
    refused = {"x-sim-fail": "error-event", "x-sim-after-tokens": "0", "x-sim-only": "a"}
    openai_client = _openai(router, clients, default_headers=refused)
    events = list(openai_client.responses.create(model=MODEL, input="hi", store=False, stream=True))
    assert events[-1].type == "response.completed"
    direct = _openai(b, clients).responses.create(model=MODEL, input="hi", store=False)
    assert events[-1].response.output_text == direct.output_text  # type: ignore[union-attr]
    anthropic_client = _anthropic(
        router, clients, default_headers={**refused, "x-sim-error-kind": "overloaded"}
    )
    with anthropic_client.messages.stream(
        model=MODEL, max_tokens=50, messages=[{"role": "user", "content": "hi"}]
    ) as stream:
        text = "".join(stream.text_stream)
        assert stream.get_final_message().stop_reason == "end_turn"
    assert text
    # The request's own fault is every region's: a's error event, relayed as its answer.
    for path, asked, failure in (
        ("/v1/responses", responses, "error"),
        ("/v1/messages", messages, "error"),
    ):
        blamed = {**refused, "x-sim-error-kind": "invalid_request"}
        status, headers, raw = _post(router.url + path, asked, blamed)
        assert (status, headers["x-router-region"]) == (200, "a")
        name, data = _events(raw)[-1]
        assert (name, data["type"]) == (failure, failure)


def test_stored_responses_are_pinned_to_their_region_and_never_cached(
    sim_region: SimFactory, router_proc: RouterFactory, clients: list[Any]
) -> None:
    a, b = sim_region("a"), sim_region("b")
    # a is preferred; b only takes what a refuses.
    config = "[cache]\nenabled = true\n[auth]\nenabled = false\n"
    router = router_proc(config + region_toml(a) + region_toml(b, bias_ms=500))
    client = _openai(router, clients)
    # Made on b (a refuses it), stored there (store defaults to true).
    made = client.responses.with_raw_response.create(
        model=MODEL, input="remember this", extra_headers={"x-sim-fail": "503", "x-sim-only": "a"}
    )
    assert made.headers["x-router-region"] == "b"
    assert made.headers["x-cache"] == "BYPASS"
    first = made.parse()
    before = sim_stats(a)["by_path"].get("/v1/responses", 0)
    for stream in (False, True):
        follow = client.responses.with_raw_response.create(
            model=MODEL, input="and now?", previous_response_id=first.id, stream=stream
        )
        assert follow.headers["x-router-region"] == "b"
        assert follow.headers["x-cache"] == "BYPASS"
        if stream:
            list(follow.parse())
    # A stream's id is pinned from its first event.
    streamed = client.responses.create(
        model=MODEL,
        input="streamed",
        stream=True,
        extra_headers={"x-sim-fail": "503", "x-sim-only": "a"},
    )
    made_id = next(e.response.id for e in streamed if e.type == "response.created")
    again = client.responses.with_raw_response.create(
        model=MODEL, input="x", previous_response_id=made_id
    )
    assert again.headers["x-router-region"] == "b"
    # a saw at most the stream it refused (its Retry-After may send that to b first), none of
    # the pinned ones.
    assert sim_stats(a)["by_path"]["/v1/responses"] - before <= 1


def test_item_references_go_to_the_region_holding_them_and_are_never_cached(
    sim_region: SimFactory, router_proc: RouterFactory, clients: list[Any]
) -> None:
    """An input item referring to a stored item (`item_reference`) is stateful as a
    previous_response_id is: sent to the region that made the item, never cached."""
    a, b = sim_region("a"), sim_region("b")
    # a is preferred; b only takes what a refuses.
    config = "[cache]\nenabled = true\n[auth]\nenabled = false\n"
    router = router_proc(config + region_toml(a) + region_toml(b, bias_ms=500))
    client = _openai(router, clients)
    # A 500: no Retry-After to keep a out of the way afterwards.
    refused = {"x-sim-fail": "500", "x-sim-only": "a"}
    made = client.responses.create(model=MODEL, input="remember this", extra_headers=refused)
    # A stream's items are noted from its terminal event.
    events = list(
        client.responses.create(
            model=MODEL, input="remember that", stream=True, extra_headers=refused
        )
    )
    assert events[-1].type == "response.completed"
    streamed = events[-1].response  # type: ignore[union-attr]
    before = sim_stats(a)["by_path"].get("/v1/responses", 0)
    for item in (made.output[0].id, streamed.output[0].id):
        assert item is not None
        for reference in ({"type": "item_reference", "id": item}, {"id": item}):
            for position in (0, 1):
                given: list[Any] = [{"role": "user", "content": "and now?"}]
                given.insert(position, reference)
                for stream in (False, False, True):
                    raw = client.responses.with_raw_response.create(
                        model=MODEL, input=given, store=False, temperature=0, stream=stream
                    )
                    assert raw.headers["x-router-region"] == "b"
                    assert raw.headers["x-cache"] == "BYPASS"
                    if stream:
                        assert list(raw.parse())[-1].type == "response.completed"
                    else:
                        assert raw.parse().status == "completed"
    # a saw none of them (the two it refused came before `before` was read).
    assert sim_stats(a)["by_path"]["/v1/responses"] - before == 0


def test_responses_with_store_false_are_cached_and_replayed_as_streams(
    sim_region: SimFactory, router_proc: RouterFactory, clients: list[Any]
) -> None:
    a = sim_region("a")
    router = router_proc(regions_toml(a, header="[cache]\nenabled = true\n"))
    client = _openai(router, clients)
    asked: dict[str, Any] = {"model": MODEL, "input": "cache me", "store": False, "temperature": 0}
    outcomes = []
    texts = []
    for _ in range(2):
        raw = client.responses.with_raw_response.create(**asked)
        outcomes.append(raw.headers["x-cache"])
        texts.append(raw.parse().output_text)
    assert outcomes == ["MISS", "HIT"]
    assert texts[0] == texts[1]
    streams = []
    for _ in range(2):
        raw = client.responses.with_raw_response.create(**asked, stream=True)
        outcomes.append(raw.headers["x-cache"])
        streams.append([(e.type, getattr(e, "delta", None)) for e in raw.parse()])
    assert outcomes[2:] == ["MISS", "HIT"]
    assert streams[0] == streams[1]
    assert streams[0][-1][0] == "response.completed"
    assert sim_stats(a)["by_path"]["/v1/responses"] == 2


# ---- Anthropic Messages API ----


def test_messages_whole_and_stream_with_the_anthropic_sdk(
    sim_region: SimFactory, router_proc: RouterFactory, clients: list[Any]
) -> None:
    a = sim_region("a")
    router = router_proc(regions_toml(a))
    client = _anthropic(router, clients, default_headers={"anthropic-beta": "test-2026-01-01"})
    asked: dict[str, Any] = {
        "model": MODEL,
        "max_tokens": 4096,
        "system": "Be brief.",
        "messages": [{"role": "user", "content": "Say hello"}],
    }
    whole = client.messages.create(**asked)
    assert whole.stop_reason == "end_turn"
    text = whole.content[0].text  # type: ignore[union-attr]
    assert text
    with client.messages.stream(**asked) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert streamed == text
    assert final.usage.output_tokens == whole.usage.output_tokens
    # The anthropic-version and -beta headers reach the region; the client's key does not.
    seen = {k.lower(): v for k, v in sim_stats(a)["last_headers"].items()}
    assert "anthropic-version" in seen
    assert seen["anthropic-beta"] == "test-2026-01-01"
    assert "x-api-key" not in seen


def test_messages_errors_are_in_anthropics_shape(
    sim_region: SimFactory, router_proc: RouterFactory, clients: list[Any]
) -> None:
    a = sim_region("a")
    header = f'[auth]\n[[auth.keys]]\nsha256 = "{hash_key("sk-good")}"\ntenant = "t"\n'
    router = router_proc(regions_toml(a, header=header))
    good = _anthropic(router, clients, api_key="sk-good")
    bad = _anthropic(router, clients, api_key="sk-bad")
    message = [{"role": "user", "content": "hi"}]
    with pytest.raises(anthropic.AuthenticationError) as denied:
        bad.messages.create(model=MODEL, max_tokens=5, messages=message)  # type: ignore[arg-type]
    assert denied.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]
    assert good.messages.create(model=MODEL, max_tokens=5, messages=message)  # type: ignore[arg-type]
    status, _, raw = _post(
        router.url + "/v1/messages",
        {"model": MODEL, "messages": message},
        {"x-api-key": "sk-good"},
    )
    body = json.loads(raw)
    assert status == 400
    assert body["type"] == "error"
    assert body["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in body["error"]["message"]
    status, _, raw = _post(
        router.url + "/v1/messages",
        {"model": "nope", "max_tokens": 5, "messages": message},
        {"x-api-key": "sk-good"},
    )
    assert status == 404
    assert json.loads(raw)["error"]["type"] == "not_found_error"
    status, _, raw = _post(
        router.url + "/v1/messages",
        {"model": 1, "max_tokens": 5, "messages": message},
        {"x-api-key": "sk-good"},
    )
    assert status == 400
    assert json.loads(raw)["type"] == "error"
    # A region's own 4xx, relayed as its answer, in Anthropic's shape too (the sim answers
    # OpenAI's), so the SDK raises the matching error.
    with pytest.raises(anthropic.BadRequestError) as refused:
        good.messages.create(
            model=MODEL,
            max_tokens=5,
            messages=message,  # type: ignore[arg-type]
            extra_headers={"x-sim-fail": "bogus"},
        )
    assert refused.value.body["type"] == "error"  # type: ignore[index]
    assert refused.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    assert "unknown x-sim-fail" in refused.value.body["error"]["message"]  # type: ignore[index]


def test_messages_stream_cut_mid_way_raises_in_the_sdk(
    sim_region: SimFactory, router_proc: RouterFactory, clients: list[Any]
) -> None:
    a = sim_region("a", fail_mode="die-mid-stream", after_tokens=2)
    router = router_proc(regions_toml(a))
    client = _anthropic(router, clients)
    got = []
    with (
        pytest.raises(anthropic.APIStatusError) as failed,
        client.messages.stream(
            model=MODEL, max_tokens=50, messages=[{"role": "user", "content": "hi"}]
        ) as stream,
    ):
        got.extend(stream.text_stream)
    assert len(got) == 2
    assert "mid-stream" in str(failed.value)


def test_messages_fail_over_and_cache(
    sim_region: SimFactory, router_proc: RouterFactory, clients: list[Any]
) -> None:
    a, b = sim_region("a"), sim_region("b")
    config = "[cache]\nenabled = true\n[auth]\nenabled = false\n"
    router = router_proc(config + region_toml(a) + region_toml(b, bias_ms=500))
    client = _anthropic(router, clients, default_headers={"x-sim-fail": "500", "x-sim-only": "a"})
    asked: dict[str, Any] = {
        "model": MODEL,
        "max_tokens": 4096,
        "extra_body": {"temperature": 0},
        "messages": [{"role": "user", "content": "cache me"}],
    }
    raw = client.messages.with_raw_response.create(**asked)
    assert raw.headers["x-router-region"] == "b"
    assert raw.headers["x-cache"] == "MISS"
    hit = client.messages.with_raw_response.create(**asked)
    assert hit.headers["x-cache"] == "HIT"
    assert hit.parse().content == raw.parse().content
    texts = []
    for _ in range(2):
        with client.messages.stream(**asked) as stream:
            texts.append("".join(stream.text_stream))
            assert stream.get_final_message().stop_reason == "end_turn"
    assert texts[0] == texts[1] == raw.parse().content[0].text  # type: ignore[union-attr]
    assert sim_stats(b)["by_path"]["/v1/messages"] == 2


# ---- which regions serve what ----


def test_endpoints_per_region_in_models_and_a_clean_404(
    sim_region: SimFactory, router_proc: RouterFactory, clients: list[Any]
) -> None:
    a = sim_region("a", kind="llama-cpp-python")
    b = sim_region("b")
    config = (
        "[auth]\nenabled = false\n"
        + region_toml(a, kind="llama-cpp-python")
        + region_toml(b, models=("other",), endpoints=["chat", "responses"])
    )
    router = router_proc(config)
    client = _openai(router, clients)
    models = {m.id: m.model_extra["endpoints"] for m in client.models.list()}  # type: ignore[index]
    assert models == {MODEL: ["chat", "completions", "embeddings"], "other": ["chat", "responses"]}
    with pytest.raises(openai.NotFoundError) as missing:
        client.responses.create(model=MODEL, input="hi", store=False)
    assert missing.value.code == "endpoint_not_served"
    assert "/v1/responses" not in sim_stats(a)["by_path"]
    status, _, raw = _post(
        router.url + "/v1/messages",
        {"model": "other", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]},
    )
    assert status == 404
    assert json.loads(raw)["error"]["type"] == "not_found_error"
    assert client.responses.create(model="other", input="hi", store=False).status == "completed"


def test_a_slow_first_token_is_hedged_on_both_apis(
    sim_region: SimFactory, router_proc: RouterFactory, clients: list[Any]
) -> None:
    a, b = sim_region("a", ttft_ms=5000), sim_region("b")
    config = (
        '[routing]\nhedge_endpoints = ["/v1/responses", "/v1/messages"]\nhedge_delay_ms = 100.0\n'
        "[auth]\nenabled = false\n"
    )
    router = router_proc(config + region_toml(a) + region_toml(b, bias_ms=500))
    raw = _openai(router, clients).responses.with_raw_response.create(
        model=MODEL, input="hi", store=False, stream=True
    )
    assert raw.headers["x-router-hedged"] == "b"
    assert raw.headers["x-router-region"] == "b"
    assert list(raw.parse())[-1].type == "response.completed"
    whole = _anthropic(router, clients).messages.with_raw_response.create(
        model=MODEL, max_tokens=4096, messages=[{"role": "user", "content": "hi"}]
    )
    assert whole.headers["x-router-hedged"] == "b"
    assert whole.parse().stop_reason == "end_turn"


@pytest.mark.parametrize(
    ("survivor", "continuation"),
    [("vllm", "continue"), ("llama-server", "continue"), ("vllm", "regenerate")],
)
def test_streams_cut_mid_way_are_continued_seamlessly(
    survivor: str,
    continuation: str,
    sim_region: SimFactory,
    router_proc: RouterFactory,
    clients: list[Any],
) -> None:
    """The same guarantee as chat: one stream, one id, nothing duplicated or lost at the seam,
    one end, the usage of the whole answer (llama-server answers the prefill back first; a
    regenerated answer must repeat what the client has)."""
    a = sim_region("a", fail_mode="die-mid-stream", after_tokens=3)
    b = sim_region("b", kind=survivor)
    config = '[routing]\nmidstream = "resume"\n[auth]\nenabled = false\n'
    survivor_toml = region_toml(b, bias_ms=500, continuation=continuation)
    router = router_proc(config + region_toml(a) + survivor_toml)
    asked: dict[str, Any] = {
        "model": MODEL,
        "input": "Tell me a story",
        "store": False,
        "temperature": 0,
    }
    whole = _openai(b, clients).responses.create(**asked)
    raw = _openai(router, clients).responses.with_raw_response.create(**asked, stream=True)
    events = list(raw.parse())
    assert raw.headers["x-router-region"] == "a"  # the headers went out before the cut
    kinds = [e.type for e in events]
    assert kinds.count("response.created") == 1
    assert kinds[-1] == "response.completed"
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert "".join(e.delta for e in deltas) == whole.output_text
    assert {e.item_id for e in deltas} == {events[2].item.id}  # one message item throughout
    final = events[-1].response
    assert final.id == events[0].response.id
    assert final.output_text == whole.output_text
    assert final.usage is not None
    assert final.usage.output_tokens == whole.usage.output_tokens  # type: ignore[union-attr]
    assert sim_stats(b)["by_path"]["/v1/responses"] == 2  # the direct ask and the continuation

    anthropic_asked: dict[str, Any] = {
        "model": MODEL,
        "max_tokens": 4096,
        "messages": [{"role": "user", "content": "Tell me a story"}],
        "extra_body": {"temperature": 0},
    }
    direct = _anthropic(b, clients).messages.create(**anthropic_asked)
    with _anthropic(router, clients).messages.stream(**anthropic_asked) as stream:
        text = "".join(stream.text_stream)
        final_message = stream.get_final_message()
    assert text == direct.content[0].text  # type: ignore[union-attr]
    assert final_message.stop_reason == "end_turn"
    assert final_message.usage.output_tokens == direct.usage.output_tokens


@pytest.mark.parametrize("first", ["vllm", "llama-server"])
@pytest.mark.parametrize("survivor", ["vllm", "llama-server"])
def test_a_clients_own_prefill_is_carried_on_not_repeated(
    first: str,
    survivor: str,
    sim_region: SimFactory,
    router_proc: RouterFactory,
    clients: list[Any],
) -> None:
    """A stream after the client's own prefill (a trailing assistant message), cut mid-way, is
    carried on the way the first region treated that prefill: extended when it continued it
    (llama-server everywhere, answering it back first; any server on the Messages API), a turn
    of its own when it answered it with a new turn (vLLM's chat without
    continue_final_message). The client gets exactly what the first region would have said, or
    a failure, never a wrong answer. Each region's `kind` is its sim's."""
    a = sim_region("a", kind=first, fail_mode="die-mid-stream", after_tokens=3)
    b = sim_region("b", kind=survivor)
    config = '[routing]\nmidstream = "resume"\n[auth]\nenabled = false\n'
    regions = region_toml(a, kind=first) + region_toml(b, kind=survivor, bias_ms=500)
    router = router_proc(config + regions)
    fresh = sim_region("c", kind=first)  # the first region's answer when nothing cuts it
    user = {"role": "user", "content": "Tell me a story"}
    told = _openai(fresh, clients).chat.completions.create(
        model=MODEL, messages=[user], temperature=0
    )
    prefill = (told.choices[0].message.content or "")[:9]

    asked: dict[str, Any] = {
        "model": MODEL,
        "messages": [user, {"role": "assistant", "content": prefill}],
        "temperature": 0,
    }
    whole = _openai(fresh, clients).chat.completions.create(**asked)
    chat = _openai(router, clients).chat.completions.create(**asked, stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in chat if c.choices)
    assert text == whole.choices[0].message.content

    anthropic_asked: dict[str, Any] = {
        "model": MODEL,
        "max_tokens": 4096,
        "messages": [user, {"role": "assistant", "content": [{"type": "text", "text": prefill}]}],
        "extra_body": {"temperature": 0},
    }
    direct = _anthropic(fresh, clients).messages.create(**anthropic_asked)
    with _anthropic(router, clients).messages.stream(**anthropic_asked) as stream:
        pieces: list[str] = []
        try:
            pieces.extend(stream.text_stream)
        except anthropic.APIStatusError:
            # vLLM regenerates the Messages API (temperature 0), without llama-server's echo:
            # its text cannot match what the client has, so the stream fails.
            assert (first, survivor) == ("llama-server", "vllm")
            return
    assert "".join(pieces) == direct.content[0].text  # type: ignore[union-attr]
    assert (first, survivor) != ("llama-server", "vllm")
    assert sim_stats(b)["by_path"]["/v1/messages"] == 1  # cut on a, carried on by b


def _read_chunks(stream: Any) -> tuple[str, int, Any]:
    """(text, chunks carrying text, the last usage) of an SDK chat or completions stream."""
    text, chunks, usage = "", 0, None
    for chunk in stream:
        for choice in chunk.choices:
            piece = choice.delta.content if hasattr(choice, "delta") else choice.text
            if piece:
                text += piece
                chunks += 1
        if chunk.usage is not None:
            usage = chunk.usage
    return text, chunks, usage


def test_a_continued_stream_stops_where_llama_servers_n_predict_says(
    sim_region: SimFactory, router_proc: RouterFactory, clients: list[Any]
) -> None:
    """llama-server reads `n_predict` before max_tokens: a stream cut after 3 tokens and
    continued elsewhere ends, in all, where one region alone would have (the continuation is
    allowed what the request allowed less what the client had, in every length field)."""
    a = sim_region("a", kind="llama-server", fail_mode="die-mid-stream", after_tokens=3)
    b = sim_region("b", kind="llama-server")
    fresh = sim_region("c", kind="llama-server")
    config = '[routing]\nmidstream = "resume"\n[auth]\nenabled = false\n'
    regions = region_toml(a, kind="llama-server")
    router = router_proc(config + regions + region_toml(b, kind="llama-server", bias_ms=500))
    user = {"role": "user", "content": "Tell me a story"}
    for api, asked in (
        ("chat", {"messages": [user], "extra_body": {"n_predict": 9}}),
        ("completions", {"prompt": "The sea is", "max_tokens": 20, "extra_body": {"n_predict": 9}}),
    ):
        asked = {"model": MODEL, "temperature": 0, "stream": True, **asked}
        make = (
            (lambda c: c.chat.completions.create)
            if api == "chat"
            else (lambda c: c.completions.create)
        )
        direct, direct_chunks, _ = _read_chunks(make(_openai(fresh, clients))(**asked))
        assert direct_chunks == 9
        text, chunks, _ = _read_chunks(make(_openai(router, clients))(**asked))
        assert (text, chunks) == (direct, 9), api
        sent = json.loads(sim_stats(b)["last_body"])
        assert sent["n_predict"] == 6, api  # 9 allowed, 3 sent
        if api == "completions":
            assert sent["max_tokens"] == 6


def test_a_regenerated_stream_without_usage_still_ends_with_the_usage_asked_for(
    sim_region: SimFactory, router_proc: RouterFactory, clients: list[Any]
) -> None:
    """llama-cpp-python sends no usage event, include_usage or not: a stream cut on
    llama-server and regenerated there still gives the client that asked for it a last usage
    chunk covering the whole answer (the router's prompt count; a token per text chunk)."""
    a = sim_region("a", kind="llama-server", fail_mode="die-mid-stream", after_tokens=3)
    b = sim_region("b", kind="llama-cpp-python")
    fresh = sim_region("c", kind="llama-server")
    config = '[routing]\nmidstream = "resume"\n[auth]\nenabled = false\n'
    regions = region_toml(a, kind="llama-server")
    survivor = region_toml(b, kind="llama-cpp-python", bias_ms=500)
    router = router_proc(config + regions + survivor)
    asked: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Tell me a story"}],
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    direct, _, direct_usage = _read_chunks(_openai(fresh, clients).chat.completions.create(**asked))
    text, chunks, usage = _read_chunks(_openai(router, clients).chat.completions.create(**asked))
    assert text == direct
    assert sim_stats(b)["by_path"]["/v1/chat/completions"] == 1  # regenerated there
    assert usage is not None
    assert usage.completion_tokens == chunks == direct_usage.completion_tokens
    assert usage.prompt_tokens > 0
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


def test_stored_responses_are_not_continued_elsewhere(
    sim_region: SimFactory, router_proc: RouterFactory, clients: list[Any]
) -> None:
    """A stored response lives where it was made: cut there, it ends in response.failed."""
    a = sim_region("a", fail_mode="die-mid-stream", after_tokens=3)
    b = sim_region("b")
    config = '[routing]\nmidstream = "resume"\n[auth]\nenabled = false\n'
    router = router_proc(config + region_toml(a) + region_toml(b, bias_ms=500))
    events = list(_openai(router, clients).responses.create(model=MODEL, input="x", stream=True))
    assert events[-1].type == "response.failed"
    assert "/v1/responses" not in sim_stats(b)["by_path"]


def test_stored_responses_are_read_and_deleted_at_their_region_by_their_tenant(
    sim_region: SimFactory, router_proc: RouterFactory, clients: list[Any]
) -> None:
    a, b = sim_region("a"), sim_region("b")
    keys = "".join(
        f'[[auth.keys]]\nsha256 = "{hash_key(key)}"\ntenant = "{name}"\n'
        for name, key in (("one", "sk-one"), ("two", "sk-two"))
    )
    router = router_proc("[auth]\n" + keys + region_toml(a) + region_toml(b, bias_ms=500))
    one = _openai(router, clients, api_key="sk-one")
    two = _openai(router, clients, api_key="sk-two")
    made = one.responses.create(
        model=MODEL,
        input="keep me",
        extra_headers={"x-sim-fail": "503", "x-sim-only": "a"},
    )
    read = one.responses.with_raw_response.retrieve(made.id)
    assert read.headers["x-router-region"] == "b"
    assert read.parse().output_text == made.output_text
    items = one.responses.input_items.list(made.id)
    assert [i.content for i in items.data] == ["keep me"]  # type: ignore[union-attr]
    # Another tenant, or an id this router never saw made, is not found.
    with pytest.raises(openai.NotFoundError) as other:
        two.responses.retrieve(made.id)
    assert other.value.code == "response_not_found"
    with pytest.raises(openai.NotFoundError):
        one.responses.retrieve("resp_unknown")
    with pytest.raises(openai.NotFoundError) as chained:
        two.responses.create(model=MODEL, input="x", previous_response_id=made.id)
    assert chained.value.code == "response_not_found"
    # Nor is another tenant's item, never sent to a region.
    item = made.output[0].id
    assert item is not None
    asked = [sim_stats(p)["by_path"]["/v1/responses"] for p in (a, b)]
    with pytest.raises(openai.NotFoundError) as referred:
        two.responses.create(
            model=MODEL, input=[{"type": "item_reference", "id": item}], store=False
        )
    assert referred.value.code == "item_not_found"
    # Not behind 32 references to items of its own either (every reference is checked).
    own = [
        two.responses.create(model=MODEL, input=f"mine {n}", extra_headers={"x-sim-only": "a"})
        for n in range(33)
    ]
    refs = [{"type": "item_reference", "id": r.output[0].id} for r in own]
    asked = [sim_stats(p)["by_path"]["/v1/responses"] for p in (a, b)]
    with pytest.raises(openai.NotFoundError) as padded:
        two.responses.create(
            model=MODEL, input=[*refs, {"type": "item_reference", "id": item}], store=False
        )
    assert padded.value.code == "item_not_found"
    assert [sim_stats(p)["by_path"]["/v1/responses"] for p in (a, b)] == asked
    one.responses.delete(made.id)
    with pytest.raises(openai.NotFoundError):
        one.responses.retrieve(made.id)  # the region's own 404 now
    assert "/v1/responses/" + made.id not in sim_stats(a)["by_path"]


def _get(url: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def test_stored_responses_read_again_are_checked_like_new_ones(
    sim_region: SimFactory, router_proc: RouterFactory, clients: list[Any]
) -> None:
    """GET /v1/responses/{id}, whole or as its stream (?stream=true): relayed whole and equal to
    the region's; a region that breaks off the whole one is a clean 502, never a truncated body
    that looks complete; a stream it cuts ends with `response.failed`, never looking complete."""
    a = sim_region("a")
    router = router_proc(regions_toml(a))
    made = _openai(router, clients).responses.create(model=MODEL, input="keep me")
    url = f"{router.url}/v1/responses/{made.id}"

    status, _, body = _get(url)
    assert status == 200
    assert json.loads(body)["output"][0]["content"][0]["text"] == made.output_text
    status, headers, raw = _get(url + "?stream=true")
    assert status == 200
    assert headers["Content-Type"].startswith("text/event-stream")
    events = _events(raw)
    assert events[-1][0] == "response.completed"
    text = "".join(e["delta"] for name, e in events if name == "response.output_text.delta")
    assert text == made.output_text

    cut = {"x-sim-fail": "die-mid-stream", "x-sim-after-tokens": "2"}
    status, _, body = _get(url, cut)
    assert status == 502
    assert json.loads(body)["error"]["code"] == "upstream_error"
    status, _, raw = _get(url + "?stream=true", cut)
    assert status == 200
    events = _events(raw)
    name, failed = events[-1]
    assert name == "response.failed"
    assert failed["response"]["id"] == made.id
    assert failed["response"]["status"] == "failed"
    assert failed["sequence_number"] == events[-2][1]["sequence_number"] + 1
    assert [n for n, _ in events].count("response.output_text.delta") == 2
    status, _, body = _post(url + "/cancel", {"pad": "x" * (70 << 10)})
    assert status == 413
    assert json.loads(body)["error"]["type"] == "invalid_request_error"


def test_routers_sharing_redis_pin_each_others_responses(
    sim_region: SimFactory, tmp_path: Path, clients: list[Any]
) -> None:
    """[state] redis_url: a response relayed by one router is followed up, and read, through
    another; with Redis stopped, what each router relayed itself still is."""
    redis = start_redis(tmp_path)
    a, b = sim_region("a"), sim_region("b")
    config = (
        f'[state]\nredis_url = "redis://127.0.0.1:{redis.port}/0"\n[auth]\nenabled = false\n'
        + region_toml(a)
        + region_toml(b, bias_ms=500)
    )
    routers = [start_router(tmp_path, config) for _ in range(2)]
    try:
        first, second = (_openai(r, clients) for r in routers)
        made = first.responses.create(
            model=MODEL, input="keep me", extra_headers={"x-sim-fail": "503", "x-sim-only": "a"}
        )
        follow = second.responses.with_raw_response.create(
            model=MODEL, input="more", previous_response_id=made.id
        )
        assert follow.headers["x-router-region"] == "b"
        assert second.responses.retrieve(made.id).id == made.id
        redis.kill()
        again = first.responses.with_raw_response.create(
            model=MODEL, input="again", previous_response_id=made.id
        )
        assert again.headers["x-router-region"] == "b"
    finally:
        for proc in routers:
            proc.kill()
        redis.kill()


def test_concurrent_identical_message_streams_share_one_exchange(
    sim_region: SimFactory, router_proc: RouterFactory, clients: list[Any]
) -> None:
    """Coalesced followers of a Messages stream get its events whole, event names included
    (the Anthropic SDK reads nothing without them)."""
    from concurrent.futures import ThreadPoolExecutor

    a = sim_region("a", tokens_per_s=50)
    router = router_proc(regions_toml(a, header="[cache]\nenabled = true\n"))
    asked: dict[str, Any] = {
        "model": MODEL,
        "max_tokens": 4096,
        "extra_body": {"temperature": 0},
        "messages": [{"role": "user", "content": "share me"}],
    }

    def read(_: int) -> tuple[str, str]:
        raw = _anthropic(router, clients).messages.with_raw_response.create(**asked, stream=True)
        events = list(raw.parse())
        assert events[-1].type == "message_stop"
        text = "".join(e.delta.text for e in events if e.type == "content_block_delta")  # type: ignore[union-attr]
        return raw.headers["x-cache"], text

    with ThreadPoolExecutor(3) as pool:
        results = list(pool.map(read, range(3)))
    texts = {text for _, text in results}
    assert len(texts) == 1
    assert texts.pop()
    assert sorted(outcome for outcome, _ in results).count("MISS") == 1
    assert sim_stats(a)["by_path"]["/v1/messages"] == 1


def test_token_limits_count_the_new_apis_and_refuse_in_their_shape(
    sim_region: SimFactory, router_proc: RouterFactory, clients: list[Any]
) -> None:
    """A key's tokens_per_minute: a Messages request whose prompt + max_tokens exceed it is a
    429 in Anthropic's shape; a Responses one in OpenAI's; the small ones pass."""
    a = sim_region("a")
    key = f'[[auth.keys]]\nsha256 = "{hash_key("sk-t")}"\ntenant = "t"\n'
    limits = "tokens_per_minute = 600\ntoken_burst = 1000\n"
    router = router_proc("[auth]\n" + key + limits + region_toml(a))
    messages = _anthropic(router, clients, api_key="sk-t")
    responses = _openai(router, clients, api_key="sk-t")
    small = [{"role": "user", "content": "hi"}]
    assert messages.messages.create(model=MODEL, max_tokens=10, messages=small)  # type: ignore[arg-type]
    big = [{"role": "user", "content": "word " * 400}]
    with pytest.raises(anthropic.RateLimitError) as refused:
        messages.messages.create(model=MODEL, max_tokens=700, messages=big)  # type: ignore[arg-type]
    assert refused.value.body["error"]["type"] == "rate_limit_error"  # type: ignore[index]
    with pytest.raises(openai.RateLimitError):
        responses.responses.create(model=MODEL, input="hi", max_output_tokens=2000, store=False)
    assert responses.responses.create(
        model=MODEL, input="hi", max_output_tokens=10, store=False
    ).output_text


def test_prompt_counts_are_answered_by_a_region_that_counts(
    sim_region: SimFactory, router_proc: RouterFactory, clients: list[Any]
) -> None:
    """`client.messages.count_tokens` and `client.responses.input_tokens.count` through the
    router: the region's own count, equal to the usage of the same prompt."""
    a = sim_region("a")
    router = router_proc(regions_toml(a))
    messages = [{"role": "user", "content": "count these words please"}]
    counted = _anthropic(router, clients).messages.count_tokens(model=MODEL, messages=messages)  # type: ignore[arg-type]
    used = _anthropic(router, clients).messages.create(
        model=MODEL,
        max_tokens=4096,
        messages=messages,  # type: ignore[arg-type]
    )
    assert counted.input_tokens == used.usage.input_tokens > 0
    responses = _openai(router, clients)
    count = responses.responses.input_tokens.count(model=MODEL, input="count these words please")
    made = responses.responses.create(model=MODEL, input="count these words please", store=False)
    assert made.usage is not None
    assert count.input_tokens == made.usage.input_tokens
    with pytest.raises(anthropic.BadRequestError):
        _anthropic(router, clients).messages.count_tokens(model=MODEL, messages=[])
