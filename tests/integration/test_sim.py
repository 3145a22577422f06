"""The simulated region on its own: OpenAI-compatible answers and every injected fault."""

from __future__ import annotations

import base64
import json
import struct
from collections.abc import Iterator

import httpx2 as httpx
import openai
import pytest

from router.sim import text
from tests.integration.conftest import MODEL, sim_config, sim_reset, sim_stats, start_sim
from tests.support import Proc

MESSAGES = [{"role": "user", "content": "Simulate."}]


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    proc = start_sim(tmp_path_factory.mktemp("sim"), "solo", models="sim-1,sim-2")
    yield proc
    proc.kill()


@pytest.fixture(autouse=True)
def _reset(sim: Proc) -> None:
    sim_reset(sim)
    sim_config(sim, fail_mode="none")


def chat(sim: Proc, headers: dict[str, str] | None = None, **body: object) -> httpx.Response:
    return httpx.post(
        sim.url + "/v1/chat/completions",
        json={"model": MODEL, "messages": MESSAGES, **body},
        headers=headers or {},
        timeout=10,
    )


def events(resp: httpx.Response) -> list[str]:
    return [e.removeprefix("data: ") for e in resp.text.split("\n\n") if e]


def test_models_and_health(sim: Proc) -> None:
    ids = [m["id"] for m in httpx.get(sim.url + "/v1/models").json()["data"]]
    assert ids == ["sim-1", "sim-2"]
    assert httpx.get(sim.url + "/health").json() == {"status": "ok", "name": "solo"}


def test_sdk_chat_completions_embeddings(sim: Proc) -> None:
    with openai.OpenAI(base_url=sim.url + "/v1", api_key="x", max_retries=0) as client:
        out = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=4)  # type: ignore[arg-type]
        assert out.choices[0].finish_reason == "length"
        assert out.usage is not None
        assert out.usage.completion_tokens == 4
        assert text.full_chat_text(MODEL, MESSAGES).startswith(out.choices[0].message.content or "")
        done = client.completions.create(model=MODEL, prompt="p")
        assert done.choices[0].text == "".join(text.completion_tokens(MODEL, "p"))
        emb = client.embeddings.create(model=MODEL, input="x", dimensions=4)
        assert emb.data[0].embedding == pytest.approx(text.embedding(MODEL, "x", 4), rel=1e-6)


def test_embeddings_encodings_agree(sim: Proc) -> None:
    url = sim.url + "/v1/embeddings"
    floats = httpx.post(url, json={"model": MODEL, "input": ["a"]}).json()["data"][0]["embedding"]
    b64 = httpx.post(url, json={"model": MODEL, "input": ["a"], "encoding_format": "base64"})
    raw = base64.b64decode(b64.json()["data"][0]["embedding"])
    assert list(struct.unpack(f"<{len(raw) // 4}f", raw)) == pytest.approx(floats, rel=1e-6)


def test_stream_usage_only_when_asked(sim: Proc) -> None:
    plain = events(chat(sim, stream=True))
    assert plain[-1] == "[DONE]"
    assert all("usage" not in json.loads(e) for e in plain[:-1])
    with_usage = events(chat(sim, stream=True, stream_options={"include_usage": True}))
    last = json.loads(with_usage[-2])
    assert last["choices"] == []
    assert last["usage"]["completion_tokens"] == len(with_usage) - 4  # role, finish, usage, DONE


@pytest.mark.parametrize("status", [500, 503, 429])
def test_status_faults(sim: Proc, status: int) -> None:
    resp = chat(sim, {"x-sim-fail": str(status)})
    assert resp.status_code == status
    assert "error" in resp.json()
    if status in (429, 503):
        assert resp.headers["retry-after"] == "1"
    assert sim_stats(sim)["injected_failures"] == 1


def test_refuse_drops_the_connection(sim: Proc) -> None:
    with pytest.raises(httpx.TransportError):
        chat(sim, {"x-sim-fail": "refuse"})
    stats = sim_stats(sim)
    assert stats["injected_failures"] == 1
    assert stats["cancelled"] == 0


def test_die_mid_stream_after_n_tokens(sim: Proc) -> None:
    with (
        httpx.Client(timeout=10) as client,
        client.stream(
            "POST",
            sim.url + "/v1/chat/completions",
            json={"model": MODEL, "messages": MESSAGES, "stream": True},
            headers={"x-sim-fail": "die-mid-stream", "x-sim-after-tokens": "3"},
        ) as resp,
    ):
        pieces: list[bytes] = []
        with pytest.raises(httpx.RemoteProtocolError):
            pieces.extend(resp.iter_raw())
    got = b"".join(pieces)
    chunks = [e for e in got.decode().split("\n\n") if e]
    assert len(chunks) == 4  # the role chunk and three tokens
    assert b"[DONE]" not in got


def test_die_mid_body_for_non_stream(sim: Proc) -> None:
    with pytest.raises(httpx.RemoteProtocolError):
        chat(sim, {"x-sim-fail": "die-mid-stream"})


def test_hang_after_tokens_stalls_the_stream(sim: Proc) -> None:
    with (
        httpx.Client(timeout=httpx.Timeout(10, read=0.5)) as client,
        client.stream(
            "POST",
            sim.url + "/v1/chat/completions",
            json={"model": MODEL, "messages": MESSAGES, "stream": True},
            headers={"x-sim-fail": "hang", "x-sim-after-tokens": "2"},
        ) as resp,
    ):
        lines = resp.iter_lines()
        assert next(lines).startswith("data: ")
        with pytest.raises(httpx.ReadTimeout):
            list(lines)


def test_drip_delivers_everything_slowly(sim: Proc) -> None:
    resp = chat(sim, {"x-sim-fail": "drip", "x-sim-drip-ms": "5"}, stream=True)
    tokens = [json.loads(e)["choices"][0]["delta"].get("content", "") for e in events(resp)[:-1]]
    assert "".join(tokens) == text.full_chat_text(MODEL, MESSAGES)


def test_x_sim_only_targets_named_regions(sim: Proc) -> None:
    assert chat(sim, {"x-sim-fail": "503", "x-sim-only": "other"}).status_code == 200
    assert chat(sim, {"x-sim-fail": "503", "x-sim-only": "other, solo"}).status_code == 503


def test_live_config_changes_mode_and_health(sim: Proc) -> None:
    sim_config(sim, fail_mode="503")
    assert chat(sim).status_code == 503
    assert httpx.get(sim.url + "/health").status_code == 503
    sim_config(sim, fail_mode="none")
    assert chat(sim).status_code == 200
    bad = httpx.post(sim.url + "/sim/config", json={"fail_mode": "explode"})
    assert bad.status_code == 400


def test_a_model_it_does_not_serve_is_vllms_404(sim: Proc) -> None:
    """A region whose config drifted: the model is answered as vLLM answers one it was not
    started with; the others as before."""
    sim_config(sim, unserved=["sim-2"])
    try:
        missing = {
            "error": {
                "message": "The model `sim-2` does not exist.",
                "type": "NotFoundError",
                "param": None,
                "code": 404,
            }
        }
        for stream in (False, True):
            resp = chat(sim, model="sim-2", stream=stream)
            assert (resp.status_code, resp.json()) == (404, missing)
        embedded = httpx.post(sim.url + "/v1/embeddings", json={"model": "sim-2", "input": "x"})
        assert (embedded.status_code, embedded.json()) == (404, missing)
        assert chat(sim).status_code == 200
        assert [m["id"] for m in httpx.get(sim.url + "/v1/models").json()["data"]] == ["sim-1"]
    finally:
        sim_config(sim, unserved=[])


def test_unknown_fail_mode_is_400(sim: Proc) -> None:
    assert chat(sim, {"x-sim-fail": "explode"}).status_code == 400


def test_its_streams_end_their_lines_as_configured(sim: Proc) -> None:
    """`sse_line_end`: each SSE line of a stream ended by LF (the default), CR LF or a lone CR;
    the events the same, a whole answer untouched."""
    lf = chat(sim, stream=True).content
    assert b"\r" not in lf
    try:
        for name, eol in (("crlf", b"\r\n"), ("cr", b"\r")):
            sim_config(sim, sse_line_end=name)
            assert chat(sim, stream=True).content == lf.replace(b"\n", eol)
            assert b"\r" not in chat(sim).content
        bad = httpx.post(sim.url + "/sim/config", json={"sse_line_end": "nel"})
        assert bad.status_code == 400
    finally:
        sim_config(sim, sse_line_end="lf")


def test_its_streams_carry_the_sse_fields_configured(sim: Proc) -> None:
    """`sse_fields` all: a comment and a `retry:` first, an `id:` on every event and `event:
    message` on each that has no name; the data the same, a whole answer untouched."""
    plain = chat(sim, stream=True).content
    try:
        sim_config(sim, sse_fields="all")
        fielded = chat(sim, stream=True).content
        events = fielded.split(b"\n\n")[:-1]
        assert events[:2] == [b": sim region solo", b"retry: 3000"]
        data = plain.split(b"\n\n")[:-1]
        assert len(events) == len(data) + 2
        for n, (event, payload) in enumerate(zip(events[2:], data, strict=True), 1):
            assert event == b"event: message\nid: %d\n" % n + payload
        assert b"id:" not in chat(sim).content
        bad = httpx.post(sim.url + "/sim/config", json={"sse_fields": "some"})
        assert bad.status_code == 400
    finally:
        sim_config(sim, sse_fields="none")
