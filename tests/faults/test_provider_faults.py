"""Issue 23 through real sockets: the fault is injected by the provider (tests/faults/provider.py,
a real process), the client is the openai SDK, the router is `router serve`.

Each test checks a row of README's "Failure behaviour (defaults)" table or an item of issue 23:
what the client gets, and what the provider saw (its attempts per request key, with their
times). Timeouts are scaled down in the router's config so the file runs in about a minute.
Each test names the issue item it covers.
"""

from __future__ import annotations

import hashlib
import json
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest
from openai import OpenAI
from openai.types.chat import (
    ChatCompletion,
    ChatCompletionMessageParam,
    ChatCompletionStreamOptionsParam,
)

from router.sim.text import count_prompt_tokens, full_chat_text
from tests.integration.conftest import MODEL, RouterFactory, SimFactory, region_toml, sim_stats
from tests.support import Proc, free_port, spawn

ProviderFactory = Callable[..., Proc]
CHAT = "/v1/chat/completions"
TIMEOUTS = "[timeouts]\nconnect = 1.0\nfirst_byte = 1.5\nidle = 1.0\ntotal = 20.0\n"
SLOW_TIMEOUTS = "[timeouts]\nconnect = 1.0\nfirst_byte = 30.0\nidle = 30.0\ntotal = 60.0\n"
HEALTH = "[health]\ninterval_s = 0.5\ntimeout_s = 0.4\n"


@pytest.fixture
def provider(tmp_path: Path) -> Iterator[ProviderFactory]:
    """Factory: provider(name) starts `python -m tests.faults.provider` on a free port."""
    procs: list[Proc] = []

    def start(name: str = "provider") -> Proc:
        port = free_port()
        args = ["python", "-m", "tests.faults.provider", "--port", str(port), "--lifetime", "120"]
        proc = spawn(args, port, tmp_path / f"provider-{port}.log")
        proc.name = name  # type: ignore[attr-defined]
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        proc.kill()


def _provider_toml(proc: Proc, models: tuple[str, ...] = (MODEL,), bias_ms: float = 0.0) -> str:
    # kind vllm: it continues an assistant prefill (the provider's text does, like the sim's).
    return region_toml(proc, models=models, kind="vllm", bias_ms=bias_ms)


def _sim_toml(proc: Proc, models: tuple[str, ...] = (MODEL,)) -> str:
    # Far behind the provider in the ranking: it answers only when the provider did not.
    return region_toml(proc, models=models, bias_ms=200.0)


def _router(
    router_proc: RouterFactory,
    *regions: str,
    routing: str = "",
    sections: str = "",
    auth: str = "[auth]\nenabled = false\n",
    timeouts: str = TIMEOUTS,
) -> Proc:
    text = timeouts + HEALTH + f"[routing]\ntolerance_ms = 5.0\n{routing}\n" + sections + auth
    return router_proc(text + "".join(regions))


Alone = Callable[..., tuple[Proc, Proc]]
Backed = Callable[..., tuple[Proc, Proc, Proc]]
Fallback = Callable[..., tuple[Proc, Proc, Proc]]
Pair = Callable[..., tuple[Proc, Proc, Proc]]


@pytest.fixture
def alone(provider: ProviderFactory, router_proc: RouterFactory) -> Alone:
    """Factory: alone(**_router's options) -> (router, provider), the provider its only region."""

    def start(**options: str) -> tuple[Proc, Proc]:
        bad = provider()
        return _router(router_proc, _provider_toml(bad), **options), bad

    return start


@pytest.fixture
def backed(provider: ProviderFactory, sim_region: SimFactory, router_proc: RouterFactory) -> Backed:
    """Factory: backed(**_router's options) -> (router, provider, b), sim region b behind the
    provider."""

    def start(**options: str) -> tuple[Proc, Proc, Proc]:
        bad, good = provider(), sim_region("b")
        return _router(router_proc, _provider_toml(bad), _sim_toml(good), **options), bad, good

    return start


@pytest.fixture
def fallback(
    provider: ProviderFactory, sim_region: SimFactory, router_proc: RouterFactory
) -> Fallback:
    """Factory: fallback(b's models, **_router's options) -> (router, provider, b): the provider
    serves "small", b the models given; "small" falls back to "large"."""

    def start(
        good_models: tuple[str, ...] = ("small", "large"), **options: str
    ) -> tuple[Proc, Proc, Proc]:
        bad, good = provider(), sim_region("b", models=",".join(good_models))
        router = _router(
            router_proc,
            _provider_toml(bad, ("small",)),
            _sim_toml(good, good_models),
            sections='[models]\nfallbacks = { small = ["large"] }\n',
            **options,
        )
        return router, bad, good

    return start


@pytest.fixture
def pair(provider: ProviderFactory, router_proc: RouterFactory) -> Pair:
    """Factory: pair(**_router's options) -> (router, p1, p2), two providers, p2 ranked behind."""

    def start(**options: str) -> tuple[Proc, Proc, Proc]:
        first, second = provider("p1"), provider("p2")
        router = _router(
            router_proc, _provider_toml(first), _provider_toml(second, bias_ms=200.0), **options
        )
        return router, first, second

    return start


def _client(router: Proc, key: str = "x", timeout: float = 30.0) -> OpenAI:
    return OpenAI(base_url=router.url + "/v1", api_key=key, max_retries=0, timeout=timeout)


def _messages(tag: str) -> list[ChatCompletionMessageParam]:
    return [{"role": "user", "content": f"Tell me about {tag}."}]


def _fault(fault: str, key: str, **params: object) -> dict[str, str]:
    """The headers that choose the provider's fault (x-fault-times=1 -> times=1)."""
    headers = {"x-fault": fault, "x-fault-key": key}
    headers.update({f"x-fault-{k.replace('_', '-')}": str(v) for k, v in params.items()})
    return headers


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.loads(resp.read())


def _attempts(proc: Proc, key: str | None = None) -> list[dict[str, Any]]:
    """The chat requests the provider saw (for one key, or all), in order."""
    query = "" if key is None else f"?key={key}"
    attempts: list[dict[str, Any]] = _get(proc.url + "/stats" + query)["attempts"]
    return attempts


def _body(error: openai.APIError) -> dict[str, Any]:
    """The OpenAI-shaped error the SDK raised with (its `error` object)."""
    assert isinstance(error.body, dict), error.body
    return error.body


def _chats(sim: Proc) -> int:
    count: int = sim_stats(sim)["by_path"].get(CHAT, 0)
    return count


@dataclass
class Reply:
    """A non-stream answer: the router's response headers and the parsed completion."""

    headers: dict[str, str]  # lower-cased names
    answer: ChatCompletion


def _ask(
    router: Proc, tag: str, headers: dict[str, str], model: str = MODEL, key: str = "x"
) -> Reply:
    """A non-stream chat through the SDK (a client closed afterwards)."""
    with _client(router, key) as client:
        raw = client.chat.completions.with_raw_response.create(
            model=model, messages=_messages(tag), max_tokens=64, extra_headers=headers
        )
        return Reply(dict(raw.headers), raw.parse())


@dataclass
class Streamed:
    """A stream read to its end: its text, last finish_reason, last usage, response headers."""

    text: str
    finish: str | None
    usage: dict[str, int] | None
    headers: dict[str, str]


def _stream(
    router: Proc, tag: str, headers: dict[str, str], model: str = MODEL, usage: bool = False
) -> Streamed:
    """A stream through the SDK, read to its end; it must end without an error."""
    options: ChatCompletionStreamOptionsParam = {"include_usage": usage}
    with _client(router) as client:
        raw = client.chat.completions.with_raw_response.create(
            model=model,
            messages=_messages(tag),
            max_tokens=64,
            stream=True,
            stream_options=options,
            extra_headers=headers,
        )
        last: dict[str, int] | None = None
        pieces: list[str] = []
        finishes: list[str] = []
        for chunk in raw.parse():
            if chunk.usage is not None:
                last = chunk.usage.model_dump(include={"prompt_tokens", "completion_tokens"})
            for choice in chunk.choices:
                pieces.append(choice.delta.content or "")
                if choice.finish_reason is not None:
                    finishes.append(choice.finish_reason)
    finish = finishes[-1] if finishes else None
    return Streamed("".join(pieces), finish, last, dict(raw.headers))


def _drain(stream: Any) -> tuple[list[str], list[str], openai.APIError | None]:
    """Read an SDK stream to its end: (content pieces, finish reasons, the error it raised)."""
    pieces: list[str] = []
    finishes: list[str] = []
    try:
        for chunk in stream:
            for choice in chunk.choices:
                pieces.append(choice.delta.content or "")
                if choice.finish_reason is not None:
                    finishes.append(choice.finish_reason)
    except openai.APIError as error:
        return pieces, finishes, error
    return pieces, finishes, None


# 1. 429 with Retry-After


def test_429_with_retry_after_fails_over_at_once_when_another_region_serves(backed: Backed) -> None:
    router, bad, _ = backed()
    raw = _ask(router, "limits", _fault("429", "k1", retry_after=2))
    assert raw.headers["x-router-region"] == "b"
    assert raw.answer.choices[0].message.content == full_chat_text(MODEL, _messages("limits"))
    assert len(_attempts(bad, "k1")) == 1


def test_429_with_retry_after_is_waited_for_on_the_only_region(alone: Alone) -> None:
    router, bad = alone()
    raw = _ask(router, "waiting", _fault("429", "k1", retry_after=1, times=1))
    assert raw.headers["x-router-region"] == "provider"
    assert raw.answer.choices[0].message.content == full_chat_text(MODEL, _messages("waiting"))
    first, second = _attempts(bad, "k1")
    assert (first["hit"], second["hit"]) == (True, False)
    # The second attempt only once the Retry-After the provider asked for (1 s) has passed.
    assert second["t"] - first["t"] >= 1.0


def test_429_with_retry_after_over_the_cap_returns_the_providers_429(alone: Alone) -> None:
    router, bad = alone()  # max_retry_after_s = 5 (default)
    with pytest.raises(openai.RateLimitError) as caught:
        _ask(router, "patience", _fault("429", "k1", retry_after=30))
    assert caught.value.status_code == 429
    assert _body(caught.value)["message"] == "Rate limit reached for requests"  # the provider's own
    assert len(_attempts(bad, "k1")) == 1


def test_429_with_retry_after_past_the_clients_deadline_is_not_waited_for(alone: Alone) -> None:
    router, bad = alone()
    began = time.monotonic()
    with pytest.raises(openai.RateLimitError):
        _ask(
            router,
            "deadline",
            {**_fault("429", "k1", retry_after=3), "x-router-timeout-ms": "2000"},
        )
    assert time.monotonic() - began < 2.0  # the 429 at once: waiting 3 s could not fit in 2 s
    assert len(_attempts(bad, "k1")) == 1


def test_429_with_retry_after_past_the_openai_sdk_timeout_is_not_waited_for(alone: Alone) -> None:
    router, bad = alone()
    with _client(router, timeout=2.0) as client, pytest.raises(openai.RateLimitError):
        client.chat.completions.create(
            model=MODEL,
            messages=_messages("sdk deadline"),
            max_tokens=64,
            extra_headers=_fault("429", "k1", retry_after=3),
        )
    assert len(_attempts(bad, "k1")) == 1


# 2. 429 without Retry-After, persistent


def test_persistent_429_without_retry_after_backs_off_and_gives_up(alone: Alone) -> None:
    router, bad = alone(routing="max_attempts = 10")
    with pytest.raises(openai.RateLimitError) as caught:
        _ask(router, "hammer", _fault("429", "k1"))
    assert _body(caught.value)["message"] == "Rate limit reached for requests"
    first, second = _attempts(bad, "k1")  # 2 at most, even with max_attempts = 10
    # Backed off with jitter (0.125-0.375 s); the upper bound is left to a loaded machine.
    assert second["t"] - first["t"] >= 0.12


def test_persistent_429_asking_for_no_wait_is_never_hammered(alone: Alone) -> None:
    router, bad = alone(routing="max_attempts = 10")
    with pytest.raises(openai.RateLimitError):
        _ask(router, "zero", _fault("429", "k1", retry_after=0))
    # Never more than two attempts on a limited region within a second and a half.
    times = [a["t"] for a in _attempts(bad, "k1")]
    assert 1 <= len(times) <= 2, times


def test_persistent_429_without_retry_after_fails_over(backed: Backed) -> None:
    router, bad, _ = backed()
    raw = _ask(router, "elsewhere", _fault("429", "k1"))
    assert raw.headers["x-router-region"] == "b"
    assert 1 <= len(_attempts(bad, "k1")) <= 2


# 3. 500 once, then healthy


def test_500_once_is_retried_on_the_only_region(alone: Alone) -> None:
    router, bad = alone()
    raw = _ask(router, "once", _fault("500", "k1", times=1))
    assert (raw.headers["x-router-region"], raw.headers["x-router-attempts"]) == ("provider", "2")
    assert [a["hit"] for a in _attempts(bad, "k1")] == [True, False]


def test_500_once_fails_over_when_another_region_serves(backed: Backed) -> None:
    router, bad, _ = backed()
    raw = _ask(router, "once", _fault("500", "k1", times=1))
    assert raw.headers["x-router-region"] == "b"
    assert len(_attempts(bad, "k1")) == 1


# 4. 503 persistent


def test_persistent_503_fails_over(backed: Backed) -> None:
    router, bad, _ = backed()
    raw = _ask(router, "busy", _fault("503", "k1"))
    assert raw.headers["x-router-region"] == "b"
    assert 1 <= len(_attempts(bad, "k1")) <= 2


def test_persistent_503_on_the_only_region_returns_the_providers_own_error(alone: Alone) -> None:
    router, bad = alone()
    with pytest.raises(openai.InternalServerError) as caught:
        _ask(router, "busy", _fault("503", "k1"))
    assert caught.value.status_code == 503
    assert _body(caught.value)["message"] == "The provider is overloaded (provider 503)."
    assert len(_attempts(bad, "k1")) == 2


def test_the_same_503_from_two_regions_is_returned_after_one_attempt_each(pair: Pair) -> None:
    router, first, second = pair(routing="max_attempts = 5")
    with pytest.raises(openai.InternalServerError) as caught:
        _ask(router, "both", _fault("503", "k1"))
    assert caught.value.status_code == 503
    assert _body(caught.value)["message"] == "The provider is overloaded (provider 503)."
    assert (len(_attempts(first, "k1")), len(_attempts(second, "k1"))) == (1, 1)


# 5. connection reset before any byte


@pytest.mark.parametrize("stream", [False, True])
def test_a_reset_before_any_byte_is_retried_on_the_only_region(stream: bool, alone: Alone) -> None:
    router, bad = alone()
    headers = _fault("reset", "k1", times=1)
    if stream:
        got = _stream(router, "reset", headers)
        assert (got.text, got.finish) == (full_chat_text(MODEL, _messages("reset")), "stop")
        region = got.headers["x-router-region"]
    else:
        region = _ask(router, "reset", headers).headers["x-router-region"]
    assert region == "provider"
    assert [a["hit"] for a in _attempts(bad, "k1")] == [True, False]


def test_a_persistent_reset_fails_over_after_two_attempts_at_most(backed: Backed) -> None:
    router, bad, _ = backed()
    raw = _ask(router, "reset", _fault("reset", "k1"))
    assert raw.headers["x-router-region"] == "b"
    assert 1 <= len(_attempts(bad, "k1")) <= 2


# 6. accepts the request, never answers


def test_a_silent_provider_is_never_waited_on_twice(
    provider: ProviderFactory, sim_region: SimFactory, router_proc: RouterFactory
) -> None:
    bad = provider()
    # [routing] ttft_timeout_s: the first-byte timeout, short here ([timeouts] first_byte 1.5).
    routing = "max_attempts = 5\nttft_timeout_s = 0.5"
    alone = _router(router_proc, _provider_toml(bad), routing=routing)
    with pytest.raises(openai.APIStatusError) as caught:
        _ask(alone, "silence", _fault("blackhole", "k1"))
    assert caught.value.status_code == 504
    assert _body(caught.value)["code"] == "upstream_timeout"
    assert len(_attempts(bad, "k1")) == 1
    good = sim_region("b")
    router = _router(router_proc, _provider_toml(bad), _sim_toml(good), routing=routing)
    raw = _ask(router, "silence", _fault("blackhole", "k2"))
    assert raw.headers["x-router-region"] == "b"
    assert len(_attempts(bad, "k2")) == 1


# 7. stream headers at once, first token late


def test_a_stream_whose_first_token_is_late_fails_over(backed: Backed) -> None:
    # [timeouts] idle and first_byte far off: only the stream TTFT deadline can move it.
    router, bad, _ = backed(routing="stream_ttft_timeout_s = 1.0", timeouts=SLOW_TIMEOUTS)
    began = time.monotonic()
    got = _stream(router, "late", _fault("slow-first-token", "k1", delay=20))
    assert time.monotonic() - began < 15  # the bound; the provider's token is 20 s away
    assert (got.text, got.finish) == (full_chat_text(MODEL, _messages("late")), "stop")
    assert got.headers["x-router-region"] == "b"
    assert len(_attempts(bad, "k1")) == 1


def test_a_stream_whose_first_token_is_late_moves_to_a_fallback_model(fallback: Fallback) -> None:
    # No other region serves "small"; a fallback model ("large", on b) can serve the request.
    router, bad, _ = fallback(
        ("large",), routing="stream_ttft_timeout_s = 1.0", timeouts=SLOW_TIMEOUTS
    )
    got = _stream(router, "late", _fault("slow-first-token", "k1", delay=3), model="small")
    assert got.headers.get("x-router-fallback-model") == "large"
    assert got.text == full_chat_text("large", _messages("late"))
    assert len(_attempts(bad, "k1")) == 1


# 8. stream cut after K of N tokens, 9. stream stalled past the idle timeout


# [DONE] before any finish_reason (llama-cpp-python's interrupted stream) is a cut stream too.
RESUMABLE = [
    "cut",
    "drop",
    "stall",
    "done-early",
]
BREAKS = [
    "cut",
    "drop",
    "stall",
    "done-early",
]


@pytest.mark.parametrize("fault", RESUMABLE)
def test_a_broken_stream_is_resumed_elsewhere_into_the_whole_answer(
    fault: str, backed: Backed
) -> None:
    router, bad, good = backed(routing='midstream = "resume"')
    headers = _fault(fault, "k1", after=5, delay=30)
    got = _stream(router, "resume", headers, usage=True)
    assert got.text == full_chat_text(MODEL, _messages("resume"))
    assert (got.finish, got.headers["x-router-region"]) == ("stop", "provider")
    # Item 16: the last usage block covers the whole answer, not the continuation's request.
    whole = {
        "prompt_tokens": count_prompt_tokens(_messages("resume")),
        "completion_tokens": len(full_chat_text(MODEL, _messages("resume")).split(" ")),
    }
    assert got.usage == whole
    assert len(_attempts(bad, "k1")) == 1
    assert _chats(good) == 1
    assert json.loads(sim_stats(good)["last_body"])["messages"][-1]["role"] == "assistant"
    # The router is healthy afterwards.
    again = _ask(router, "after", _fault("none", "k2"))
    assert again.headers["x-router-region"] == "provider"


@pytest.mark.parametrize("fault", BREAKS)
def test_a_broken_stream_without_resume_ends_with_one_error_never_complete(
    fault: str, alone: Alone
) -> None:
    router, bad = alone()  # midstream = "error" (default)
    began = time.monotonic()
    with _client(router) as client:
        stream = client.chat.completions.create(
            model=MODEL,
            messages=_messages("cut"),
            max_tokens=64,
            stream=True,
            extra_headers=_fault(fault, "k1", after=5, delay=30),
        )
        pieces, finishes, error = _drain(stream)
    assert time.monotonic() - began < 15  # a stall is detected by [timeouts] idle = 1 s
    assert finishes == [], "a cut stream must never look complete"
    assert error is not None
    assert _body(error)["code"] == "upstream_stream_error"
    assert "".join(pieces) == full_chat_text(MODEL, _messages("cut"))[: len("".join(pieces))]
    assert len(_attempts(bad, "k1")) == 1
    assert _ask(router, "after", _fault("none", "k2")).headers["x-router-region"] == "provider"


def _refused_continuation(pair: Pair) -> tuple[Proc, list[Proc], list[str], openai.APIError | None]:
    """p1 cuts the stream after 5 tokens; every continuation (a prefill) is refused with a 400.

    The router, the providers, the finish reasons the client saw and the error it got."""
    router, first, second = pair(routing='midstream = "resume"')
    headers = {**_fault("cut", "k1", after=5), "x-fault-on-prefill": "reject"}
    with _client(router) as client:
        stream = client.chat.completions.create(
            model=MODEL,
            messages=_messages("refused"),
            max_tokens=64,
            stream=True,
            extra_headers=headers,
        )
        _, finishes, error = _drain(stream)
    return router, [first, second], finishes, error


def test_a_continuation_the_next_region_refuses_ends_with_one_clean_error(pair: Pair) -> None:
    _, providers, finishes, error = _refused_continuation(pair)
    assert finishes == [], "a cut stream must never look complete"
    assert error is not None
    # Item 14: the prefill rejection is not what the client is left with.
    assert _body(error)["code"] == "upstream_stream_error"
    assert "prefill" not in str(_body(error)["message"]).lower(), _body(error)
    refused = [a for p in providers for a in _attempts(p, "k1") if a["prefill"]]
    assert refused, "the continuation was never tried"


def test_a_refused_continuation_is_logged_with_its_status_and_body(pair: Pair) -> None:
    router, _, _, _ = _refused_continuation(pair)
    out = router.wait_output("resume on p2 refused", timeout=5)
    line = next(ln for ln in out.splitlines() if "resume on p2 refused" in ln)
    assert "400" in line
    assert "Assistant prefill is not supported" in line


# 10. an invalid JSON event mid-stream


@pytest.mark.parametrize("fault", ["bad-event", "deep-event"])
def test_an_invalid_event_mid_stream_never_reaches_the_client(fault: str, alone: Alone) -> None:
    # deep-event: valid JSON nested 5,000 deep, which no decoder of the router (nor the
    # client's) reaches: dropped like an invalid one, never a crash of the relay.
    router, bad = alone()
    with (
        _client(router) as client,
        client.chat.completions.with_streaming_response.create(
            model=MODEL,
            messages=_messages("garbage"),
            max_tokens=64,
            stream=True,
            extra_headers=_fault(fault, "k1", after=3),
        ) as resp,
    ):
        lines = [line for line in resp.iter_lines() if line.startswith("data: ")]
    payloads = [line[len("data: ") :] for line in lines]
    assert payloads[-1] == "[DONE]"
    events = [json.loads(p) for p in payloads[:-1]]  # every event is JSON: nothing garbled
    text = "".join(c["delta"].get("content") or "" for e in events for c in e["choices"])
    assert text == full_chat_text(MODEL, _messages("garbage"))
    assert events[-1]["choices"][0]["finish_reason"] == "stop"
    assert len(_attempts(bad, "k1")) == 1


# 11. finish_reason, a clean end, no [DONE]


@pytest.mark.parametrize("midstream", ["error", "resume"])
def test_a_finished_stream_without_done_gets_done_and_keeps_its_usage(
    midstream: str, backed: Backed
) -> None:
    router, bad, good = backed(routing=f'midstream = "{midstream}"')
    with (
        _client(router) as client,
        client.chat.completions.with_streaming_response.create(
            model=MODEL,
            messages=_messages("done"),
            max_tokens=64,
            stream=True,
            stream_options={"include_usage": True},
            extra_headers=_fault("no-done", "k1"),
        ) as resp,
    ):
        payloads = [line[6:] for line in resp.iter_lines() if line.startswith("data: ")]
    assert payloads[-1] == "[DONE]"
    events = [json.loads(p) for p in payloads[:-1]]
    assert not any("error" in e for e in events)
    usage = events[-1]["usage"]
    tokens = len(full_chat_text(MODEL, _messages("done")).split(" "))
    assert usage["completion_tokens"] == tokens
    assert len(_attempts(bad, "k1")) == 1
    assert _chats(good) == 0  # complete as it was: never continued, never sent elsewhere


# 12. 400 context_length_exceeded, 13. 400 content policy


@pytest.mark.parametrize("words", ["context-length", "context-length-llama", "context-length-vllm"])
def test_too_long_a_prompt_moves_to_the_larger_fallback_model(
    fallback: Fallback, words: str
) -> None:
    """In OpenAI's words, llama-server's (exceed_context_size_error) or vLLM's (its message):
    issue, only OpenAI's moved on."""
    router, bad, good = fallback()
    raw = _ask(router, "long", _fault(words, "k1"), model="small")
    answer = raw.answer
    assert (raw.headers["x-router-fallback-model"], answer.model) == ("large", "large")
    assert answer.choices[0].message.content == full_chat_text("large", _messages("long"))
    assert len(_attempts(bad, "k1")) == 1
    # Never resent unchanged: b got the request once, for the larger model.
    assert _chats(good) == 1
    assert json.loads(sim_stats(good)["last_body"])["model"] == "large"


def test_too_long_a_prompt_in_a_stream_moves_to_the_larger_fallback_model(
    fallback: Fallback,
) -> None:
    router, bad, good = fallback()
    got = _stream(router, "long", _fault("context-length", "k1"), model="small", usage=True)
    assert got.headers["x-router-fallback-model"] == "large"
    assert (got.text, got.finish) == (full_chat_text("large", _messages("long")), "stop")
    assert len(_attempts(bad, "k1")) == 1
    assert json.loads(sim_stats(good)["last_body"])["model"] == "large"


def test_a_fallback_model_the_key_may_not_use_is_never_tried(fallback: Fallback) -> None:
    """Issue: a key limited to "small" got "large" through the fallback chain, though asking
    for "large" itself was a 403."""
    key = "sk-small-only-0123456789"
    digest = hashlib.sha256(key.encode()).hexdigest()
    auth = f'[auth]\n[[auth.keys]]\ntenant = "t"\nsha256 = "{digest}"\nmodels = ["small"]\n'
    router, bad, good = fallback(auth=auth)
    with pytest.raises(openai.PermissionDeniedError):
        _ask(router, "direct", {}, model="large", key=key)
    with pytest.raises(openai.BadRequestError) as caught:
        _ask(router, "long", _fault("context-length", "k1"), model="small", key=key)
    assert caught.value.code == "context_length_exceeded"  # small's own answer
    assert (len(_attempts(bad, "k1")), _chats(good)) == (1, 0)


def test_too_long_a_prompt_without_a_fallback_is_returned_as_it_is(backed: Backed) -> None:
    router, bad, good = backed()
    with pytest.raises(openai.BadRequestError) as caught:
        _ask(router, "long", _fault("context-length", "k1"))
    assert caught.value.code == "context_length_exceeded"
    assert (
        _body(caught.value)["message"]
        == "This model's maximum context length is 8 tokens (provider)."
    )
    assert (len(_attempts(bad, "k1")), _chats(good)) == (1, 0)


def test_a_content_policy_refusal_reaches_the_client_untried_elsewhere(fallback: Fallback) -> None:
    router, bad, good = fallback()
    with pytest.raises(openai.BadRequestError) as caught:
        _ask(router, "policy", _fault("content-policy", "k1"), model="small")
    assert caught.value.code == "content_policy_violation"
    assert caught.value.type == "invalid_request_error"
    assert (
        _body(caught.value)["message"]
        == "Your request was rejected by the provider's content policy."
    )
    assert "x-router-fallback-model" not in caught.value.response.headers
    assert (len(_attempts(bad, "k1")), _chats(good)) == (1, 0)


# 15. a primary that answers 503 for a while, then recovers


@pytest.mark.timeout(60)
def test_a_primary_down_for_a_while_gets_few_attempts_then_its_traffic_back(backed: Backed) -> None:
    # Scaled from 60 s down / a request every 4 s / back within 30 s: 3 s down, one every 0.25 s,
    # circuits of 0.5, 1, 1 s (circuit_max_s), so back within a second or so of recovery.
    router, bad, _ = backed(routing="circuit_base_s = 0.5\ncircuit_max_s = 1.0")
    down_s, every_s, count = 3.0, 0.25, 24
    armed = _post_arm(bad)
    regions: list[tuple[float, str]] = []
    for i in range(count):
        raw = _ask(router, f"recovery {i}", _fault("down", f"r{i}", **{"for": down_s}))
        regions.append((time.monotonic() - armed, raw.headers["x-router-region"]))
        time.sleep(max(0.0, armed + (i + 1) * every_s - time.monotonic()))
    hits = [a for a in _attempts(bad) if a["hit"]]
    sent_while_down = sum(1 for t, _ in regions if t < down_s)
    # While it was down every request was served elsewhere (an answer before down_s cannot be
    # the provider's: it answered 503 until then).
    assert {region for t, region in regions if t < down_s} == {"b"}, regions
    # A circuit, not a retry per request: circuit_after failures open it, then one trial per
    # opening, and openings are at least circuit_base_s apart.
    assert len(hits) <= 3 + down_s / 0.5, (len(hits), sent_while_down)
    assert len(hits) < sent_while_down
    # Traffic is back on the provider after it recovered (within circuit_max_s and a probe).
    tail = [region for t, region in regions if t > down_s + 2.0]
    assert tail
    assert set(tail) == {"provider"}, regions


def _post_arm(proc: Proc) -> float:
    req = urllib.request.Request(proc.url + "/arm", data=b"{}", method="POST")
    with urllib.request.urlopen(req, timeout=5) as resp:
        armed: float = json.loads(resp.read())["armed"]
    return armed


# 16. accounting after a fallback


def _hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def test_after_a_fallback_the_answering_model_is_named_and_only_its_answer_is_billed(
    fallback: Fallback,
) -> None:
    keys = "".join(
        f'[[auth.keys]]\nsha256 = "{_hash(name)}"\ntenant = "{name}"\n'
        "tokens_per_minute = 1\ntoken_burst = 100000\n"
        for name in ("failing", "direct")
    )
    router, bad, _ = fallback(("large",), auth=f"[auth]\n{keys}")
    # "failing" meets two 503s on small, then the fallback's answer; "direct" asks large.
    failed = _ask(router, "bill", _fault("503", "k1"), model="small", key="failing")
    direct = _ask(router, "bill", {}, model="large", key="direct")
    assert failed.headers["x-router-fallback-model"] == "large"
    assert failed.answer.model == "large"
    assert failed.answer.usage == direct.answer.usage
    assert len(_attempts(bad, "k1")) == 2  # the 503 twice on the only region serving "small"
    # The same next request from each tenant: the same tokens left (refill is 1 a minute).
    left = [
        int(
            _ask(router, "next", {}, model="large", key=name).headers[
                "x-ratelimit-remaining-tokens"
            ]
        )
        for name in ("failing", "direct")
    ]
    assert abs(left[0] - left[1]) <= 1, left
