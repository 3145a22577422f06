"""How the attempt path and the relay meet a misbehaving provider, in process (LocalTransport).

Each fault is the provider's; the client is aiohttp's test client on 127.0.0.1. What the
provider sees is counted from the requests its transport got.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from multidict import CIMultiDict

from router.config import RoutingConfig
from router.core.attempt import retry_after
from router.core.request import CHAT
from router.core.transport import LocalReply
from tests.unit.core.test_pipeline import JSON, SSE, app_for, body, delta, event

Handler = Callable[[str, bytes, CIMultiDict[str]], Awaitable[LocalReply]]
OK = LocalReply(200, JSON, [b'{"choices":[]}'])


def error_body(message: str, kind: str = "server_error", code: str | None = None) -> bytes:
    return json.dumps({"error": {"message": message, "type": kind, "code": code}}).encode()


def scripted(*replies: LocalReply | BaseException | float) -> Handler:
    """Answers in turn (the last repeats): a reply, an exception raised, or seconds of silence."""
    left = list(replies)

    async def handle(path: str, raw: bytes, headers: CIMultiDict[str]) -> LocalReply:
        step = left.pop(0) if len(left) > 1 else left[0]
        if isinstance(step, BaseException):
            raise step
        if isinstance(step, float):
            await asyncio.sleep(step)
            return OK
        return step

    return handle


async def post(app: Any, **extra: Any) -> tuple[int, bytes, dict[str, str]]:
    from aiohttp.test_utils import TestClient, TestServer

    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        resp = await client.post(CHAT, json=body(**extra))
        return resp.status, await resp.read(), dict(resp.headers)


def busy(retry_after: str | None = None) -> LocalReply:
    headers = dict(JSON)
    if retry_after is not None:
        headers["Retry-After"] = retry_after
    return LocalReply(429, headers, [error_body("slow down", "rate_limit_error")])


async def test_429_with_retry_after_fails_over_at_once_when_another_region_serves() -> None:
    app, regions = app_for({"a": scripted(busy("1")), "b": scripted(OK)})
    status, _, headers = await post(app)
    assert status == 200
    assert headers["x-router-region"] == "b"
    assert len(regions["a"].requests) == 1


async def test_429_with_retry_after_is_waited_for_when_it_is_the_only_region() -> None:
    app, regions = app_for({"a": scripted(busy("0.05"), OK)})
    status, _, _ = await post(app)
    assert status == 200
    assert len(regions["a"].requests) == 2


async def test_429_retry_after_longer_than_the_cap_is_not_waited_for() -> None:
    app, regions = app_for({"a": scripted(busy("30"), OK)})
    status, raw, _ = await post(app)
    assert status == 429
    assert json.loads(raw)["error"]["message"] == "slow down"  # the provider's own error
    assert len(regions["a"].requests) == 1


async def test_persistent_429_without_retry_after_is_tried_twice_at_most() -> None:
    app, regions = app_for({"a": scripted(busy())}, RoutingConfig(max_attempts=10))
    status, _, _ = await post(app)
    assert status == 429
    assert len(regions["a"].requests) == 2


async def test_500_once_is_retried_on_the_only_region() -> None:
    app, regions = app_for({"a": scripted(LocalReply(500, JSON, [error_body("oops")]), OK)})
    status, _, headers = await post(app)
    assert status == 200
    assert (len(regions["a"].requests), headers["x-router-attempts"]) == (2, "2")


async def test_500_once_fails_over_when_another_region_serves() -> None:
    app, regions = app_for(
        {"a": scripted(LocalReply(500, JSON, [error_body("oops")]), OK), "b": scripted(OK)}
    )
    status, _, headers = await post(app)
    assert (status, headers["x-router-region"]) == (200, "b")
    assert len(regions["a"].requests) == 1


async def test_persistent_503_returns_the_providers_own_error() -> None:
    app, regions = app_for({"a": scripted(LocalReply(503, JSON, [error_body("down for now")]))})
    status, raw, _ = await post(app)
    assert status == 503
    assert json.loads(raw)["error"]["message"] == "down for now"
    assert len(regions["a"].requests) == 2


async def test_a_reset_before_any_byte_is_retried() -> None:
    app, regions = app_for({"a": scripted(ConnectionResetError("reset"), OK)})
    status, _, _ = await post(app)
    assert status == 200
    assert len(regions["a"].requests) == 2


async def test_a_silent_region_is_never_waited_on_twice() -> None:
    routing = RoutingConfig(ttft_timeout_s=0.2, max_attempts=5)
    app, regions = app_for({"a": scripted(30.0)}, routing)
    status, raw, _ = await post(app)
    assert status == 504
    assert json.loads(raw)["error"]["code"] == "upstream_timeout"
    assert len(regions["a"].requests) == 1
    app, regions = app_for({"a": scripted(30.0), "b": scripted(OK)}, routing)
    status, _, headers = await post(app)
    assert (status, headers["x-router-region"]) == (200, "b")


async def test_a_request_error_is_returned_as_it_is_and_retried_nowhere() -> None:
    refused = LocalReply(500, JSON, [error_body("bad value", "invalid_request_error")])
    app, regions = app_for({"a": scripted(refused), "b": scripted(OK)})
    status, raw, _ = await post(app)
    assert status == 500
    assert json.loads(raw)["error"]["message"] == "bad value"
    assert (len(regions["a"].requests), len(regions["b"].requests)) == (1, 0)


async def test_the_same_answer_from_two_regions_stops_the_attempts() -> None:
    same = LocalReply(502, JSON, [error_body("model crashed on this prompt")])
    app, regions = app_for(
        {"a": scripted(same), "b": scripted(same), "c": scripted(OK)},
        RoutingConfig(max_attempts=5),
    )
    status, _, _ = await post(app)
    assert status == 502
    assert len(regions["c"].requests) == 0


async def test_the_same_busy_page_from_two_regions_leaves_the_next_one_to_try() -> None:
    # Regions behind one ingress send the same 503 page while shedding: not the request's doing.
    busy = LocalReply(503, {"Content-Type": "text/html"}, [b"<html>503 Service Unavailable</html>"])
    app, regions = app_for(
        {"a": scripted(busy), "b": scripted(busy), "c": scripted(OK)},
        RoutingConfig(max_attempts=5),
    )
    status, _, headers = await post(app)
    assert (status, headers["x-router-region"]) == (200, "c")
    assert len(regions["c"].requests) == 1


@pytest.mark.parametrize(
    "reply",
    [
        LocalReply(204, {}, []),
        LocalReply(200, JSON, [b"null"]),
        LocalReply(200, JSON, [b"[]"]),
        LocalReply(200, JSON, [b'{"error": {"message": "engine crashed"}}']),
    ],
)
async def test_a_2xx_that_is_no_answer_is_a_failed_attempt_never_relayed(reply: LocalReply) -> None:
    # Relayed as they came, these were a 204, a `null`, an error under a 200: "successes".
    app, regions = app_for({"a": scripted(reply), "b": scripted(OK)})
    status, _, headers = await post(app)
    assert (status, headers["x-router-region"]) == (200, "b")
    assert len(regions["a"].requests) == 1


async def test_a_failed_responses_object_is_the_regions_answer() -> None:
    # A Responses object carries `error` when its status is failed: the region's answer, as a
    # 4xx would be, not a broken 2xx to retry everywhere (the request may be what failed).
    failed = b'{"object": "response", "status": "failed", "error": {"code": "invalid_prompt"}}'
    app, regions = app_for({"a": scripted(LocalReply(200, JSON, [failed])), "b": scripted(OK)})
    status, raw, headers = await post(app)
    assert (status, headers["x-router-region"]) == (200, "a")
    assert json.loads(raw)["error"]["code"] == "invalid_prompt"
    assert len(regions["b"].requests) == 0


async def test_a_redirect_is_a_failed_attempt_never_relayed() -> None:
    moved = LocalReply(307, {"Location": "http://elsewhere.example/v1/chat/completions"}, [])
    app, regions = app_for({"a": scripted(moved), "b": scripted(OK)})
    status, _, headers = await post(app)
    assert (status, headers["x-router-region"]) == (200, "b")
    assert "Location" not in headers
    assert len(regions["a"].requests) == 1


async def test_a_whole_answer_nested_too_deep_to_check_is_a_failed_attempt() -> None:
    app, regions = app_for({"a": scripted(LocalReply(200, JSON, [DEEP])), "b": scripted(OK)})
    status, _, headers = await post(app)
    assert (status, headers["x-router-region"]) == (200, "b")
    assert len(regions["a"].requests) == 1


@pytest.mark.parametrize("code", [600, 999])
async def test_a_status_outside_http_is_a_failed_attempt_never_relayed(code: int) -> None:
    app, regions = app_for({"a": scripted(LocalReply(code, JSON, [b"{}"])), "b": scripted(OK)})
    status, _, headers = await post(app)
    assert (status, headers["x-router-region"]) == (200, "b")
    assert len(regions["a"].requests) == 1


# How servers answer a model they do not have (the router's config says the region serves "m").
VLLM_NO_MODEL = (
    b'{"error": {"message": "The model `m` does not exist.", "type": "NotFoundError", '
    b'"param": null, "code": 404}}'
)
VLLM_NO_MODEL_FLAT = (
    b'{"object":"error","message":"The model `m` does not exist.","type":"NotFoundError",'
    b'"param":null,"code":404}'
)
OPENAI_NO_MODEL = error_body(
    "The model `m` does not exist or you do not have access to it.",
    "invalid_request_error",
    "model_not_found",
)
LLAMA_NO_MODEL = (
    b'{"error": {"code": 404, "message": "model name=m is not found", "type": "not_found_error"}}'
)
ANTHROPIC_NO_MODEL = (
    b'{"type": "error", "error": {"type": "not_found_error", "message": "model: m"}}'
)


@pytest.mark.parametrize(
    "said", [VLLM_NO_MODEL, VLLM_NO_MODEL_FLAT, OPENAI_NO_MODEL, LLAMA_NO_MODEL, ANTHROPIC_NO_MODEL]
)
async def test_a_region_without_the_model_fails_over_like_a_5xx(said: bytes) -> None:
    """Issue: a region whose config drifted (it no longer serves a model the router's config
    says it does) answered 404, which was relayed to the client as the answer."""
    no_model = LocalReply(404, JSON, [said])
    app, regions = app_for({"a": scripted(no_model), "b": scripted(OK)})
    status, _, headers = await post(app)
    assert (status, headers["x-router-region"], headers["x-router-failovers"]) == (200, "b", "1")
    assert len(regions["a"].requests) == 1
    streamed = stream(delta("hi"), finish(), b"data: [DONE]\n\n")
    app, regions = app_for({"a": scripted(no_model), "b": scripted(streamed)})
    status, raw, headers = await post(app, stream=True)
    assert (status, headers["x-router-region"], headers["x-router-failovers"]) == (200, "b", "1")
    assert raw.endswith(b"data: [DONE]\n\n")


@pytest.mark.parametrize(
    ("said", "shaped"),
    [
        (VLLM_NO_MODEL, json.loads(VLLM_NO_MODEL)),
        # vLLM's flat error object in OpenAI's shape, its fields kept.
        (VLLM_NO_MODEL_FLAT, json.loads(VLLM_NO_MODEL)),
    ],
)
async def test_no_region_with_the_model_is_a_404_in_openais_shape(
    said: bytes, shaped: dict[str, Any]
) -> None:
    no_model = scripted(LocalReply(404, JSON, [said]))
    app, regions = app_for({"a": no_model, "b": no_model}, RoutingConfig(max_attempts=5))
    status, raw, headers = await post(app)
    assert status == 404
    assert json.loads(raw) == shaped
    assert headers["x-router-attempts"] == "2"
    # Each region once: a region saying it has no such model is not asked twice.
    assert (len(regions["a"].requests), len(regions["b"].requests)) == (1, 1)


@pytest.mark.parametrize(
    "said",
    [
        # A stored response the region does not hold; a route it does not have (llama.cpp's
        # answer to an unknown path); another model's name; no API error at all.
        error_body("Previous response with id 'resp_m' not found.", "invalid_request_error"),
        b'{"error": {"code": 404, "message": "File Not Found", "type": "not_found_error"}}',
        error_body("The model `m-large` does not exist.", "NotFoundError"),
        b'{"detail": "model m does not exist"}',
        # The request's own words quoted back (an id it chose naming the model): never the
        # region's "no such model", or a client could open every region's circuit for it.
        error_body("Previous response with id 'resp_1 model m' not found.", "NotFoundError"),
        error_body("Item with id 'the model m' not found.", "invalid_request_error"),
    ],
)
async def test_a_404_about_anything_but_the_model_is_the_regions_answer(said: bytes) -> None:
    app, regions = app_for({"a": scripted(LocalReply(404, JSON, [said])), "b": scripted(OK)})
    status, raw, headers = await post(app)
    assert (status, headers["x-router-attempts"]) == (404, "1")
    assert len(regions["b"].requests) == 0
    if b'"error"' in said:
        assert raw == said  # an API error, relayed as it came


PAGE = (
    b"<html><head><title>404 Not Found</title></head><body><h1>404 Not Found</h1>"
    b"<p>ingress-7.internal.corp (10.3.4.5)</p><hr><center>nginx</center></body></html>"
)


@pytest.mark.parametrize("code", [400, 404, 405, 409, 422])
@pytest.mark.parametrize(("page", "media"), [(PAGE, "text/html"), (b"", "text/plain")])
async def test_a_regions_own_4xx_that_is_no_api_error_becomes_the_routers_own(
    code: int, page: bytes, media: str
) -> None:
    """Issue: a 4xx is no failure, so it was relayed as it came, an ingress's HTML page naming
    internal hosts included (the pages of a failure already were not)."""
    headers = {"Content-Type": media, "X-Upstream-Host": "10.3.4.5:8000", "Retry-After": "2"}
    app, regions = app_for({"a": scripted(LocalReply(code, headers, [page])), "b": scripted(OK)})
    status, raw, got = await post(app)
    assert status == code
    assert got["Content-Type"] == "application/json"
    error = json.loads(raw)["error"]
    assert (error["type"], error["code"]) == ("invalid_request_error", "upstream_refused")
    assert error["message"] == f"The region refused the request (HTTP {code})."
    assert b"10.3.4.5" not in raw
    assert b"nginx" not in raw
    assert "X-Upstream-Host" not in got
    assert got["Retry-After"] == "2"
    assert len(regions["b"].requests) == 0


async def test_a_regions_own_4xx_page_is_the_routers_own_in_anthropics_shape() -> None:
    from aiohttp.test_utils import TestClient, TestServer

    from router.core.request import MESSAGES

    app, _ = app_for({"a": scripted(LocalReply(404, {"Content-Type": "text/html"}, [PAGE]))})
    ask = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        resp = await client.post(MESSAGES, json=ask)
        answer = await resp.json()
    assert resp.status == 404
    assert answer["type"] == "error"
    assert answer["error"] == {
        "type": "not_found_error",
        "message": "The region refused the request (HTTP 404).",
    }


def stream(*events: bytes | float) -> LocalReply:
    async def chunks() -> AsyncIterator[bytes]:
        for item in events:
            if isinstance(item, float):
                await asyncio.sleep(item)
            else:
                yield item

    return LocalReply(200, SSE, chunks())


def finish(reason: str = "stop") -> bytes:
    return event(
        {"id": "chatcmpl-a", "choices": [{"index": 0, "delta": {}, "finish_reason": reason}]}
    )


def role() -> bytes:
    choice = {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
    return event({"id": "chatcmpl-a", "choices": [choice]})


def payloads(raw: bytes) -> list[bytes]:
    return [line[6:] for line in raw.split(b"\n") if line.startswith(b"data: ")]


async def test_a_stream_without_a_first_token_in_time_fails_over() -> None:
    routing = RoutingConfig(stream_ttft_timeout_s=0.2)
    slow = stream(role(), 30.0, delta("late"), finish(), b"data: [DONE]\n\n")
    fast = stream(role(), delta("on time"), finish(), b"data: [DONE]\n\n")
    app, _ = app_for({"a": scripted(slow), "b": scripted(fast)}, routing)
    status, raw, headers = await post(app, stream=True)
    assert (status, headers["x-router-region"]) == (200, "b")
    assert b"on time" in raw


# JSON nested past what Python's decoders reach (the router's and the client's): about 1,000
# levels on 3.11, 10,000 from 3.12 on.
DEEP = b'{"x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"


@pytest.mark.parametrize(
    "garbage", [b"data: {not json\n\n", b"data: \x00\xff\n\n", b"data: " + DEEP + b"\n\n"]
)
async def test_an_invalid_event_mid_stream_is_dropped(garbage: bytes) -> None:
    broken = stream(delta("a"), garbage, delta("b"), finish(), b"data: [DONE]\n\n")
    app, _ = app_for({"a": scripted(broken)})
    _, raw, _ = await post(app, stream=True)
    assert garbage not in raw
    assert payloads(raw)[-1] == b"[DONE]"
    assert len(payloads(raw)) == 4


async def test_a_finished_stream_without_done_gets_done() -> None:
    app, _ = app_for({"a": scripted(stream(delta("a"), finish()))})
    _, raw, _ = await post(app, stream=True)
    assert raw.endswith(b"data: [DONE]\n\n")
    assert b"upstream_stream_error" not in raw


async def test_done_before_every_choice_finished_is_a_cut_stream() -> None:
    # llama-cpp-python ends an interrupted stream with [DONE] and no finish_reason.
    app, _ = app_for({"a": scripted(stream(delta("a"), b"data: [DONE]\n\n"))})
    _, raw, _ = await post(app, stream=True)
    last = json.loads(payloads(raw)[-1])
    assert last["error"]["code"] == "upstream_stream_error"
    assert "finished" in last["error"]["message"]
    assert b"[DONE]" not in raw  # never relayed: an SDK stops at it and sees a whole answer


async def test_a_stream_cut_without_finish_ends_with_one_error_event() -> None:
    app, _ = app_for({"a": scripted(stream(delta("a"), delta("b")))})
    _, raw, _ = await post(app, stream=True)
    kinds = [json.loads(p).get("error", {}).get("code") for p in payloads(raw)]
    assert kinds == [None, None, "upstream_stream_error"]


def fallback_app(big: Handler, small: Handler) -> tuple[Any, dict[str, Any]]:
    """Region a serves model "big", region b "small"; "big" falls back to "small"."""
    from aiohttp import web

    from router.config import Config, ModelsConfig, RegionConfig
    from router.core.pipeline import Features, Pipeline
    from router.core.transport import LocalTransport
    from router.core.upstream import Upstream, Upstreams
    from router.routing.fallback import Fallbacks
    from router.routing.runtime import LiveRouting, RetryState, routing_headers
    from router.server.pools import RegionPools
    from router.server.reload import LiveConfig

    models = ModelsConfig(fallbacks={"big": ("small",)})
    regions = {
        "a": (RegionConfig(name="a", base_url="http://a:1/v1", models=("big",)), big),
        "b": (RegionConfig(name="b", base_url="http://b:1/v1", models=("small",)), small),
    }
    transports = {name: LocalTransport(handler) for name, (_, handler) in regions.items()}
    config = Config(regions=tuple(c for c, _ in regions.values()), models=models)
    pools = RegionPools(
        Upstreams(Upstream(c, transports[n], None) for n, (c, _) in regions.items())
    )
    features = Features(
        retry=RetryState(LiveRouting(config.routing)),
        fallbacks=Fallbacks(models),
        decorators=(routing_headers,),
    )
    pipeline = Pipeline(features, LiveConfig(config), pools)
    app = web.Application()
    app.on_response_prepare.append(pipeline.on_prepare)
    app.router.add_post(CHAT, pipeline.handler(CHAT))
    return app, transports


async def post_model(app: Any, model: str) -> tuple[int, bytes, dict[str, str]]:
    from aiohttp.test_utils import TestClient, TestServer

    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        resp = await client.post(CHAT, json={**body(), "model": model})
        return resp.status, await resp.read(), dict(resp.headers)


async def test_a_model_nobody_can_answer_falls_back_to_the_next() -> None:
    app, regions = fallback_app(
        scripted(LocalReply(503, JSON, [error_body("overloaded")])), scripted(OK)
    )
    status, _, headers = await post_model(app, "big")
    assert (status, headers["x-router-fallback-model"]) == (200, "small")
    assert json.loads(regions["b"].requests[0][1])["model"] == "small"


async def test_too_long_a_prompt_moves_to_the_larger_model_never_resent_unchanged() -> None:
    too_long = LocalReply(
        400, JSON, [error_body("too long", "invalid_request_error", "context_length_exceeded")]
    )
    app, regions = fallback_app(scripted(too_long), scripted(OK))
    status, _, headers = await post_model(app, "big")
    assert (status, headers["x-router-fallback-model"]) == (200, "small")
    assert len(regions["a"].requests) == 1


async def test_a_content_policy_refusal_never_falls_back() -> None:
    refusal = LocalReply(
        400, JSON, [error_body("refused: policy", "invalid_request_error", "content_policy")]
    )
    app, regions = fallback_app(scripted(refusal), scripted(OK))
    status, raw, headers = await post_model(app, "big")
    assert status == 400
    assert json.loads(raw)["error"]["message"] == "refused: policy"
    assert "x-router-fallback-model" not in headers
    assert len(regions["b"].requests) == 0


async def test_a_stream_that_ends_before_any_byte_is_one_clean_error_tried_nowhere_else() -> None:
    # llama-cpp-python answers a streamed prompt over its context with 200 and an empty body.
    empty = LocalReply(200, SSE, [])
    app, regions = app_for({"a": scripted(empty), "b": scripted(empty)})
    status, raw, _ = await post(app, stream=True)
    assert status == 502
    assert json.loads(raw)["error"]["code"] == "empty_stream"
    assert (len(regions["a"].requests), len(regions["b"].requests)) == (1, 0)


def broken(*events: bytes) -> LocalReply:
    """A stream whose region connection breaks after `events`."""

    async def chunks() -> AsyncIterator[bytes]:
        for item in events:
            yield item
        raise ConnectionResetError("region died")

    return LocalReply(200, SSE, chunks())


@pytest.mark.parametrize(
    "odd",
    [
        b'data: {"id":"c","choices":[{"index":0,"delta":"str"}]}\n\n',
        b'data: {"id":"c","choices":5}\n\n',
        b'data: {"id":"c","choices":[{"index":0,"delta":[1]}]}\n\n',
    ],
)
async def test_a_region_event_of_another_shape_is_relayed_and_the_stream_resumed(
    odd: bytes,
) -> None:
    routing = RoutingConfig(midstream="resume")
    first = broken(delta("Hel"), odd)
    rest = stream(delta("lo"), finish(), b"data: [DONE]\n\n")
    app, _ = app_for({"a": scripted(first), "b": scripted(rest)}, routing)
    status, raw, _ = await post(app, stream=True)
    assert status == 200
    assert b"Internal router error" not in raw
    assert b"HTTP/1.1" not in raw
    assert payloads(raw)[-1] == b"[DONE]"


async def test_a_region_that_breaks_after_a_complete_stream_adds_no_error() -> None:
    app, _ = app_for({"a": scripted(broken(delta("a"), finish(), b"data: [DONE]\n\n"))})
    _, raw, _ = await post(app, stream=True)
    assert b'"error"' not in raw
    assert payloads(raw)[-1] == b"[DONE]"
    # Finished without [DONE], then the break: [DONE] is added, as for a clean end.
    app, _ = app_for({"a": scripted(broken(delta("a"), finish()))})
    _, raw, _ = await post(app, stream=True)
    assert b'"error"' not in raw
    assert payloads(raw)[-1] == b"[DONE]"


async def test_a_bug_past_a_streams_head_ends_it_with_one_error_event(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from router.core import relay

    def fail(*args: object) -> bytes:
        raise RuntimeError("a bug")

    monkeypatch.setattr(relay, "passable", fail)
    app, _ = app_for({"a": scripted(stream(delta("a"), finish(), b"data: [DONE]\n\n"))})
    status, raw, _ = await post(app, stream=True)
    # The head went out: no second response, one error event, a clean end of the body.
    assert status == 200
    assert b"HTTP/1.1" not in raw
    assert b"The router failed mid-stream." in raw


@pytest.mark.parametrize(
    ("headers", "seconds"),
    [
        ({"Retry-After": "7"}, 7.0),
        ({"Retry-After": " 2.5 "}, 2.5),
        ({"retry-after-ms": "1500", "Retry-After": "9"}, 1.5),
        # Python's float() syntax is no delay: 1_0 read as 10 s, 1e3 as 1000 s.
        ({"Retry-After": "1_0"}, None),
        ({"Retry-After": "1e3"}, None),
        ({"Retry-After": "nan"}, None),
        ({"Retry-After": "-1"}, None),
        ({"retry-after-ms": "infinity", "Retry-After": "3"}, 3.0),
        ({"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"}, None),
    ],
)
def test_a_regions_retry_after_is_read_as_digits_only(
    headers: dict[str, str], seconds: float | None
) -> None:
    assert retry_after(CIMultiDict(headers)) == seconds
