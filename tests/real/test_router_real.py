"""The router in front of real inference servers (llama.cpp's llama-server and llama-cpp-python's
server), the openai SDK as the client: what broke when it was first tried, each fixed here.

Items refer to the real-server issue: 1 request ids, 2-3 continuation, 4 probes of a busy server
and cut streams, 5 errors the request causes, 6 a streamed context overflow, 7 stream usage.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from openai import OpenAI

from tests.integration.conftest import start_router
from tests.real.conftest import RealFactory
from tests.real.servers import MODEL_ALIAS
from tests.support import Proc

pytestmark = pytest.mark.real

MESSAGES: list[Any] = [{"role": "user", "content": "Tell me about the sea."}]
ADMIN = "admin-token-0123456789"
HEADER = f"""
[auth]
enabled = false
admin_token_sha256 = "{__import__("hashlib").sha256(ADMIN.encode()).hexdigest()}"

[health]
interval_s = 0.3
timeout_s = 2.0

[timeouts]
first_byte = 60.0
idle = 20.0
total = 180.0
"""
KINDS = {"llama_server": "llama-server", "llama_cpp_server": "llama-cpp-python"}
DETERMINISTIC: dict[str, Any] = {"temperature": 0, "seed": 7}


def region(name: str, proc: Proc, kind: str, **extra: Any) -> str:
    """One [[regions]] table for a real server."""
    lines = [
        "[[regions]]",
        f'name = "{name}"',
        f'base_url = "{proc.url}/v1"',
        f'models = ["{MODEL_ALIAS}"]',
        f'kind = "{kind}"',
        *(f"{key} = {json.dumps(value)}" for key, value in extra.items()),
    ]
    return "\n".join(lines) + "\n"


# Every SDK client a test opens, closed after it (an unclosed one's sockets warn, as errors, in
# whatever test the garbage collector happens to run in).
_OPEN: list[OpenAI] = []


def sdk(proc: Proc, key: str = "x", timeout: float = 180) -> OpenAI:
    client = OpenAI(base_url=proc.url + "/v1", api_key=key, max_retries=0, timeout=timeout)
    _OPEN.append(client)
    return client


@pytest.fixture(autouse=True)
def _close_clients() -> Iterator[None]:
    yield
    while _OPEN:
        _OPEN.pop().close()


def admin_health(router: Proc) -> dict[str, Any]:
    req = urllib.request.Request(
        router.url + "/admin/health", headers={"Authorization": f"Bearer {ADMIN}"}
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        health: dict[str, Any] = json.loads(resp.read())
    return {r["name"]: r for r in health["regions"]}


def wait_healthy(router: Proc, *names: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        regions = admin_health(router)
        if all(regions[n]["healthy"] and regions[n]["available"] for n in names):
            return
        time.sleep(0.1)
    raise AssertionError(f"regions {names} never healthy: {admin_health(router)}")


@pytest.fixture
def routers(tmp_path: Path) -> Iterator[list[Proc]]:
    started: list[Proc] = []
    yield started
    for proc in started:
        proc.kill()


def router_for(tmp: Path, routers: list[Proc], *regions: str, extra: str = "") -> Proc:
    proc = start_router(tmp, HEADER + extra + "".join(regions))
    routers.append(proc)
    return proc


@pytest.fixture(params=sorted(KINDS))
def one(request: pytest.FixtureRequest, tmp_path: Path, routers: list[Proc]) -> tuple[Proc, Proc]:
    """(a router, its only region) for each real server."""
    server: Proc = request.getfixturevalue(request.param)
    router = router_for(tmp_path, routers, region("a", server, KINDS[request.param]))
    wait_healthy(router, "a")
    return router, server


def test_models_through_the_router(one: tuple[Proc, Proc]) -> None:
    router, _ = one
    assert MODEL_ALIAS in [m.id for m in sdk(router).models.list()]


def test_chat_through_the_router_equals_direct(one: tuple[Proc, Proc]) -> None:
    # Item 1: llama-cpp-python refused every proxied POST with an empty 400 (a non-UUID id).
    router, server = one
    args: dict[str, Any] = {"model": MODEL_ALIAS, "messages": MESSAGES, "max_tokens": 12}
    via = sdk(router).chat.completions.with_raw_response.create(
        **args, **DETERMINISTIC, extra_headers={"X-Request-Id": "req-123"}
    )
    assert via.headers["x-request-id"] == "req-123"
    direct = sdk(server).chat.completions.create(**args, **DETERMINISTIC)
    assert via.parse().choices[0].message.content == direct.choices[0].message.content
    text, finishes = "", []
    for chunk in sdk(router).chat.completions.create(**args, **DETERMINISTIC, stream=True):
        for choice in chunk.choices:
            # A chat chunk's delta, or a completions chunk's text.
            text += (choice.delta.content if hasattr(choice, "delta") else choice.text) or ""
            if choice.finish_reason:
                finishes.append(choice.finish_reason)
    assert text == direct.choices[0].message.content
    assert finishes == ["length"]


def test_completions_through_the_router_equal_direct(one: tuple[Proc, Proc]) -> None:
    router, server = one
    args: dict[str, Any] = {"model": MODEL_ALIAS, "prompt": "The sea is", "max_tokens": 8}
    via = sdk(router).completions.create(**args, **DETERMINISTIC)
    direct = sdk(server).completions.create(**args, **DETERMINISTIC)
    assert via.choices[0].text == direct.choices[0].text


@pytest.mark.parametrize("fixture", ["llama_server_embed", "llama_cpp_server_embed"])
def test_embeddings_through_the_router_equal_direct(
    fixture: str, request: pytest.FixtureRequest, tmp_path: Path, routers: list[Proc]
) -> None:
    server: Proc = request.getfixturevalue(fixture)
    kind = "llama-server" if fixture == "llama_server_embed" else "llama-cpp-python"
    router = router_for(tmp_path, routers, region("a", server, kind))
    wait_healthy(router, "a")
    via = sdk(router).embeddings.create(model=MODEL_ALIAS, input=["the sea", "the sky"])
    direct = sdk(server).embeddings.create(model=MODEL_ALIAS, input=["the sea", "the sky"])
    assert [d.embedding for d in via.data] == [d.embedding for d in direct.data]


def test_errors_the_request_causes_are_returned_and_eject_nobody(
    llama_server: Proc, llama_cpp_server: Proc, tmp_path: Path, routers: list[Proc]
) -> None:
    """Item 5: embeddings asked of chat servers (501 from one, 500 from the other) six times."""
    router = router_for(
        tmp_path,
        routers,
        region("ls", llama_server, "llama-server"),
        region("lcp", llama_cpp_server, "llama-cpp-python"),
    )
    wait_healthy(router, "ls", "lcp")
    for _ in range(6):
        with pytest.raises(openai.APIStatusError) as caught:
            sdk(router).embeddings.create(model=MODEL_ALIAS, input="the sea")
        assert caught.value.status_code in (500, 501)
    regions = admin_health(router)
    assert [regions[n]["ejections"] for n in ("ls", "lcp")] == [0, 0]
    assert all(regions[n]["available"] for n in ("ls", "lcp"))
    # A bad parameter: llama-server's 400 comes back as it is, from one attempt.
    bad = sdk(router).chat.completions.with_raw_response
    with pytest.raises(openai.BadRequestError):
        bad.create(model=MODEL_ALIAS, messages=MESSAGES, temperature="hot")  # type: ignore[arg-type]


def test_a_streamed_context_overflow_is_one_clean_error(
    llama_cpp_server: Proc, tmp_path: Path, routers: list[Proc]
) -> None:
    """Item 6: llama-cpp-python answers it with 200 and an empty body; the router tried both
    regions and answered a bare 502."""
    router = router_for(tmp_path, routers, region("lcp", llama_cpp_server, "llama-cpp-python"))
    wait_healthy(router, "lcp")
    long = [{"role": "user", "content": "the sea and the sky " * 400}]
    with pytest.raises(openai.APIStatusError) as caught:
        for _ in sdk(router).chat.completions.create(
            model=MODEL_ALIAS, messages=long, max_tokens=8, stream=True
        ):
            pass
    assert caught.value.status_code == 502
    body = caught.value.body
    assert isinstance(body, dict)
    assert body.get("code") == "empty_stream" or body.get("error", {}).get("code") == "empty_stream"


@pytest.mark.timeout(240)
def test_a_busy_llama_cpp_python_stays_healthy_and_its_stream_is_never_cut_by_probes(
    llama_cpp_server: Proc, tmp_path: Path, routers: list[Proc]
) -> None:
    """Item 4: probing /v1/models waited for the model lock (unhealthy while busy) and, with
    interrupt-on-new-request, cut the running stream, which then ended like a clean one."""
    router = router_for(
        tmp_path, routers, region("lcp", llama_cpp_server, "llama-cpp-python"), extra=""
    )
    wait_healthy(router, "lcp")
    seen: list[bool] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            seen.append(admin_health(router)["lcp"]["healthy"])
            time.sleep(0.2)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        finishes, pieces = [], 0
        for chunk in sdk(router).chat.completions.create(
            model=MODEL_ALIAS, messages=MESSAGES, max_tokens=200, temperature=0, stream=True
        ):
            for choice in chunk.choices:
                pieces += bool(choice.delta.content)
                if choice.finish_reason:
                    finishes.append(choice.finish_reason)
    finally:
        stop.set()
        watcher.join()
    assert finishes == ["length"]
    assert pieces == 200
    assert seen
    assert all(seen), "marked unhealthy while busy"


def read_stream(stream: Any) -> tuple[str, set[str], list[str], Any]:
    """(text, chunk ids, finish reasons, last usage) of an SDK stream."""
    text, ids, finishes, usage = "", set(), [], None
    for chunk in stream:
        ids.add(chunk.id)
        for choice in chunk.choices:
            # A chat chunk's delta, or a completions chunk's text.
            text += (choice.delta.content if hasattr(choice, "delta") else choice.text) or ""
            if choice.finish_reason:
                finishes.append(choice.finish_reason)
        if chunk.usage is not None:
            usage = chunk.usage
    return text, ids, finishes, usage


def _first_and_survivor(
    survivor: str, start_real: RealFactory, tmp_path: Path, routers: list[Proc]
) -> tuple[Proc, Proc]:
    """(a resuming router, its first region): llama-server first, `survivor` behind it."""
    first = start_real("llama-server")
    rest = start_real(survivor)
    router = router_for(
        tmp_path,
        routers,
        region("first", first, "llama-server"),
        region("rest", rest, survivor, bias_ms=1000.0),
        extra='[routing]\nmidstream = "resume"\n',
    )
    wait_healthy(router, "first", "rest")
    return router, first


@pytest.mark.timeout(300)
@pytest.mark.parametrize("survivor", ["llama-server", "llama-cpp-python"])
def test_sigkill_mid_stream_is_continued_by_what_the_survivor_can_do(
    survivor: str, start_real: RealFactory, tmp_path: Path, routers: list[Proc]
) -> None:
    """Items 2-3: a llama-server region SIGKILLed mid-stream; the survivor continues from a
    prefill (llama-server) or regenerates the deterministic request (llama-cpp-python, which
    cannot continue). Guaranteed: nothing duplicated or lost at the seam, one id, one end, the
    usage of the whole answer."""
    router, first = _first_and_survivor(survivor, start_real, tmp_path, routers)
    stream = sdk(router).chat.completions.create(
        model=MODEL_ALIAS,
        messages=MESSAGES,
        max_tokens=300,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    before, ids = "", set()
    chunks = iter(stream)
    for chunk in chunks:
        ids.add(chunk.id)
        for choice in chunk.choices:
            before += choice.delta.content or ""
        if len(before) >= 40:
            break
    first.kill()  # SIGKILL, mid-answer
    try:
        text, more_ids, finishes, usage = read_stream(chunks)
    except openai.APIError as exc:
        # Why the router could not carry it on is in its log (seen once, under heavy load).
        log = router.log.read_text(errors="replace")[-3000:]
        raise AssertionError(f"the stream was not carried on: {exc}\n{log}") from exc
    whole = before + text
    assert len(ids | more_ids) == 1
    assert finishes == ["length"]
    # The region that answered from scratch must have repeated exactly what the client had;
    # llama-server continued from it. Either way the answer starts with what was sent.
    assert whole.startswith(before)
    assert len(whole) > len(before)
    assert usage is not None
    if survivor == "llama-server":
        # The continuation's usage, rewritten to cover the whole answer.
        assert usage.completion_tokens >= 300 - 2
    else:
        # llama-cpp-python reports no stream usage at all: the router makes the one asked for.
        assert usage.prompt_tokens > 0
        assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


@pytest.mark.timeout(300)
def test_a_continued_stream_gives_logprobs_for_the_new_text_only(
    start_real: RealFactory, tmp_path: Path, routers: list[Proc]
) -> None:
    """llama-server answers a prefill back in the text of its first event, never in its
    logprobs (those are of the new token alone): the router, dropping the echoed text, keeps
    that event's logprobs, and every chunk's logprobs spell exactly its text, at the seam too."""
    router, first = _first_and_survivor("llama-server", start_real, tmp_path, routers)
    stream = sdk(router).chat.completions.create(
        model=MODEL_ALIAS,
        messages=MESSAGES,
        max_tokens=120,
        temperature=0,
        logprobs=True,
        stream=True,
    )
    spelled: list[tuple[str, str]] = []
    for chunk in stream:
        for choice in chunk.choices:
            piece = choice.delta.content or ""
            tokens = choice.logprobs.content if choice.logprobs is not None else None
            if piece or tokens:
                spelled.append((piece, "".join(t.token for t in tokens or ())))
        if len(spelled) == 10:
            first.kill()  # SIGKILL, mid-answer: the rest comes from the survivor
    assert len(spelled) > 11, router.log.read_text(errors="replace")[-3000:]
    assert all(piece == tokens for piece, tokens in spelled), spelled


@pytest.mark.parametrize("survivor", ["llama-server", "llama-cpp-python"])
def test_sigkill_mid_completions_stream_is_continued_too(
    survivor: str, start_real: RealFactory, tmp_path: Path, routers: list[Proc]
) -> None:
    """A completions stream cut the same way goes on from its prompt and the text so far
    (llama-server), or is regenerated and caught up (llama-cpp-python): one stream to the end."""
    router, first = _first_and_survivor(survivor, start_real, tmp_path, routers)
    # llama-server reads n_predict before max_tokens: the whole answer stops at 120 tokens.
    stream = sdk(router).completions.create(
        model=MODEL_ALIAS,
        prompt="The sea is",
        max_tokens=300,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"n_predict": 120},
    )
    before, ids = "", set()
    chunks = iter(stream)
    for chunk in chunks:
        ids.add(chunk.id)
        before += "".join(choice.text or "" for choice in chunk.choices)
        if len(before) >= 40:
            break
    first.kill()  # SIGKILL, mid-answer
    if survivor == "llama-cpp-python":
        # It regenerates, and its text at temperature 0 differs from llama-server's for a raw
        # prompt (in the pinned versions): a regenerated answer that does not repeat what the
        # client has is never spliced on; the stream ends with one error event instead.
        with pytest.raises(openai.APIError, match="stopped mid-stream"):
            read_stream(chunks)
        return
    text, more_ids, finishes, usage = read_stream(chunks)
    assert len(ids | more_ids) == 1
    assert finishes == ["length"]
    assert text
    # What it generated, and what the client had before the cut (as the continuation's
    # usage counts it): n_predict in all, not n_predict more.
    assert usage is not None
    assert usage.completion_tokens == 120


def test_sigkill_before_the_first_byte_fails_over(
    start_real: RealFactory, llama_server: Proc, tmp_path: Path, routers: list[Proc]
) -> None:
    doomed = start_real("llama-server")
    router = router_for(
        tmp_path,
        routers,
        region("doomed", doomed, "llama-server"),
        region("other", llama_server, "llama-server", bias_ms=1000.0),
    )
    wait_healthy(router, "doomed", "other")
    doomed.kill()
    done = sdk(router).chat.completions.with_raw_response.create(
        model=MODEL_ALIAS, messages=MESSAGES, max_tokens=8, **DETERMINISTIC
    )
    assert done.headers["x-router-region"] == "other"
    assert done.parse().choices[0].finish_reason == "length"


def test_a_stream_settles_with_the_regions_own_usage(
    llama_server: Proc, tmp_path: Path, routers: list[Proc]
) -> None:
    """Item 7: a token-limited stream asks llama-server for its usage chunk; the client, who
    did not ask, never sees it."""
    key = "sk-real-0123456789"
    digest = __import__("hashlib").sha256(key.encode()).hexdigest()
    auth = (
        f'[auth]\nadmin_token_sha256 = "{__import__("hashlib").sha256(ADMIN.encode()).hexdigest()}"'
        f'\n[[auth.keys]]\nsha256 = "{digest}"\ntenant = "t"\ntokens_per_minute = 100000\n'
    )
    config = HEADER.replace("[auth]\nenabled = false\n", "").replace(
        f'admin_token_sha256 = "{__import__("hashlib").sha256(ADMIN.encode()).hexdigest()}"\n',
        "",
    )
    router = start_router(tmp_path, auth + config + region("ls", llama_server, "llama-server"))
    routers.append(router)
    wait_healthy(router, "ls")
    client = sdk(router, key=key, timeout=60)
    text, _, finishes, usage = read_stream(
        client.chat.completions.create(
            model=MODEL_ALIAS, messages=MESSAGES, max_tokens=16, stream=True, **DETERMINISTIC
        )
    )
    assert finishes == ["length"]
    assert text
    assert usage is None  # asked for by the router, stripped for the client


@pytest.mark.parametrize("fixture", sorted(KINDS))
def test_exact_prompt_counts_equal_the_servers_own(
    fixture: str, request: pytest.FixtureRequest, real_model: Any, tmp_path: Path
) -> None:
    """[tokenizers]: the tier model's tokenizer.json and its ChatML template count a chat
    prompt as the server does (its usage.prompt_tokens)."""
    from router.access.tokenizers import ModelTokenizer
    from router.config import TokenizerConfig
    from tests.real.model import CHAT_TEMPLATE

    server: Proc = request.getfixturevalue(fixture)
    template = tmp_path / "template.jinja"
    template.write_text(CHAT_TEMPLATE)
    counter = ModelTokenizer(
        MODEL_ALIAS,
        TokenizerConfig(file=str(real_model.tokenizer_json), chat_template=str(template)),
    )
    for messages in (
        MESSAGES,
        [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "héllo wörld, naïve café 🙂 — 12345"},
        ],
    ):
        body = {"model": MODEL_ALIAS, "messages": messages, "max_tokens": 1}
        done = sdk(server).chat.completions.create(**body, temperature=0)
        assert done.usage is not None
        assert counter.count("/v1/chat/completions", json.dumps(body).encode()) == (
            done.usage.prompt_tokens
        )
