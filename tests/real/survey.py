"""Print how the real servers behave at the edges the router cares about, as raw bytes.

    python -m tests.real.survey [section ...]     # needs `make real-servers`

Sections: request_id, continue, locks, interrupt, errors, usage, routes, speed. Each starts its
own servers on free 127.0.0.1 ports and kills them after. Exploration, not assertions: the tests
pin what the next step relies on.
"""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from openai import OpenAI
from tokenizers import Tokenizer

from tests.real.artifacts import llama_server_bin, venv_python
from tests.real.model import ensure_model
from tests.real.servers import MODEL_ALIAS, start_llama_cpp_python, start_llama_server
from tests.support import Proc

LONG_PROMPT = "The router sends each request to the nearest healthy region. " * 150
CHAT: list[Any] = [{"role": "user", "content": "Tell me about the sea."}]


def request(
    proc: Proc,
    method: str,
    path: str,
    body: Any = None,
    headers: dict[str, str] | None = None,
    timeout: float = 120,
) -> tuple[int, dict[str, str], bytes, float]:
    """One request on a fresh connection: status, headers, the whole body, seconds taken."""
    conn = http.client.HTTPConnection("127.0.0.1", proc.port, timeout=timeout)
    data = None if body is None else json.dumps(body).encode()
    hdrs = {"Content-Type": "application/json", **(headers or {})}
    start = time.monotonic()
    conn.request(method, path, body=data, headers=hdrs)
    resp = conn.getresponse()
    payload = resp.read()
    took = time.monotonic() - start
    conn.close()
    return resp.status, {k.lower(): v for k, v in resp.getheaders()}, payload, took


def show(label: str, result: tuple[int, dict[str, str], bytes, float], limit: int = 400) -> None:
    status, headers, payload, took = result
    ctype = headers.get("content-type", "")
    extra = f" x-request-id={headers['x-request-id']!r}" if "x-request-id" in headers else ""
    print(f"  {label}: {status} [{ctype}] {took * 1000:.0f} ms{extra} {payload[:limit]!r}")


@contextmanager
def servers(*kinds: str, **options: Any) -> Iterator[list[Proc]]:
    model = ensure_model().gguf
    procs: list[Proc] = []
    with tempfile.TemporaryDirectory() as tmp:
        try:
            for kind in kinds:
                if kind == "llama-server":
                    procs.append(start_llama_server(Path(tmp), model, **options))
                else:
                    procs.append(start_llama_cpp_python(Path(tmp), model, **options))
            yield procs
        finally:
            for proc in procs:
                proc.kill()


def chat(max_tokens: int = 4, **extra: Any) -> dict[str, Any]:
    return {
        "model": MODEL_ALIAS,
        "messages": CHAT,
        "max_tokens": max_tokens,
        "temperature": 0,
        **extra,
    }


def section_request_id() -> None:
    print("== X-Request-Id")
    values = [
        None,
        "0123456789abcdef01234567",  # 24 hex
        "0123456789abcdef0123456789abcdef",  # 32 hex
        "01234567-89ab-cdef-0123-456789abcdef",  # uuid with dashes
        "{01234567-89ab-cdef-0123-456789abcdef}",
        "urn:uuid:01234567-89ab-cdef-0123-456789abcdef",
        "req-123",
        "",
    ]
    with servers("llama-cpp-python", "llama-server") as (lcp, ls):
        for name, proc in (("llama-cpp-python", lcp), ("llama-server", ls)):
            print(f" {name}")
            for value in values:
                headers = {} if value is None else {"X-Request-Id": value}
                show(
                    f"chat X-Request-Id={value!r}",
                    request(proc, "POST", "/v1/chat/completions", chat(1), headers),
                    160,
                )
            show(
                "GET /v1/models X-Request-Id=24hex",
                request(proc, "GET", "/v1/models", None, {"X-Request-Id": values[1] or ""}),
                120,
            )


def section_continue() -> None:
    print("== assistant prefill / continue_final_message / add_generation_prompt")
    tok = Tokenizer.from_file(str(ensure_model().tokenizer_json))
    messages = [
        {"role": "user", "content": "Write a story."},
        {"role": "assistant", "content": "Once upon a time"},
    ]
    head = "<|im_start|>user\nWrite a story.<|im_end|>\n<|im_start|>assistant\nOnce upon a time"
    rendered = {
        "new turn": head + "<|im_end|>\n<|im_start|>assistant\n",
        "closed, no gen prompt": head + "<|im_end|>\n",
        "continued": head,
    }
    counts = {name: len(tok.encode(text).ids) for name, text in rendered.items()}
    print(f"  prompt token counts of candidate renderings: {counts}")
    variants: list[tuple[str, dict[str, Any]]] = [
        ("plain", {}),
        (
            "continue_final_message",
            {"continue_final_message": True, "add_generation_prompt": False},
        ),
        ("add_generation_prompt=false", {"add_generation_prompt": False}),
        (
            "chat_template_kwargs",
            {
                "chat_template_kwargs": {
                    "add_generation_prompt": False,
                    "continue_final_message": True,
                }
            },
        ),
    ]
    with servers("llama-server", "llama-cpp-python") as (ls, lcp):
        for name, proc in (("llama-server", ls), ("llama-cpp-python", lcp)):
            print(f" {name}")
            for label, extra in variants:
                body = {
                    "model": MODEL_ALIAS,
                    "messages": messages,
                    "max_tokens": 6,
                    "temperature": 0,
                    **extra,
                }
                status, _, payload, _ = request(proc, "POST", "/v1/chat/completions", body)
                if status == 200:
                    done = json.loads(payload)
                    text = done["choices"][0]["message"]["content"]
                    prompt = done["usage"]["prompt_tokens"]
                    print(f"  {label}: 200 prompt_tokens={prompt} content={text!r}")
                else:
                    print(f"  {label}: {status} {payload[:300]!r}")
                if name == "llama-server":
                    show(
                        f"  /apply-template {label}",
                        request(proc, "POST", "/apply-template", {"messages": messages, **extra}),
                        400,
                    )


def stream_raw(
    proc: Proc,
    path: str,
    body: dict[str, Any],
    out: list[bytes],
    started: threading.Event,
    first: list[float],
) -> None:
    """Read a streamed answer line by line into `out` (de-chunked, line ends kept); the time of
    the first data line goes to `first`."""
    conn = http.client.HTTPConnection("127.0.0.1", proc.port, timeout=300)
    conn.request(
        "POST", path, body=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    resp = conn.getresponse()
    out.append(f"HTTP {resp.status} {resp.getheader('content-type')}\n".encode())
    while line := resp.readline():
        out.append(line)
        if line.startswith(b"data: {") and not started.is_set():
            started.set()
            first.append(time.monotonic())
    started.set()
    conn.close()


def background_stream(proc: Proc, body: dict[str, Any]) -> tuple[threading.Thread, list[bytes]]:
    out: list[bytes] = []
    started = threading.Event()
    thread = threading.Thread(
        target=stream_raw, args=(proc, "/v1/chat/completions", body, out, started, [])
    )
    thread.start()
    started.wait(60)
    time.sleep(0.3)
    return thread, out


def section_locks() -> None:
    print("== which llama-cpp-python routes wait for the model lock (interrupt_requests=False)")
    with servers("llama-cpp-python", extra=["--interrupt_requests", "false"]) as (lcp,):
        thread, _ = background_stream(lcp, chat(400, stream=True))
        for method, path in (
            ("GET", "/docs"),
            ("GET", "/openapi.json"),
            ("GET", "/health"),
            ("GET", "/v1/models"),  # last: it waits for the stream to end
        ):
            try:
                result = request(lcp, method, path)
            except TimeoutError:
                print(f"  {method} {path}: no answer within 120 s while the stream ran")
                continue
            running = thread.is_alive()
            show(f"{method} {path} (stream still running when answered: {running})", result, 80)
        thread.join()
    print("== llama-server while a stream runs (--parallel 1)")
    with servers("llama-server") as (ls,):
        thread, _ = background_stream(ls, chat(400, stream=True))
        for method, path in (
            ("GET", "/health"),
            ("GET", "/v1/models"),
            ("GET", "/props"),
            ("GET", "/slots"),
        ):
            result = request(ls, method, path)
            show(f"{method} {path} (stream running: {thread.is_alive()})", result, 160)
        result = request(ls, "POST", "/v1/chat/completions", chat(2))
        show(
            f"second chat (queued; first stream still running after: {thread.is_alive()})",
            result,
            200,
        )
        thread.join()


def section_interrupt() -> None:
    print("== llama-cpp-python default interrupt_requests=True: a new request during a stream")
    for label, second in (
        ("second = chat", ("POST", "/v1/chat/completions", chat(2))),
        ("second = GET /v1/models", ("GET", "/v1/models", None)),
    ):
        with servers("llama-cpp-python") as (lcp,):
            thread, out = background_stream(lcp, chat(400, stream=True))
            method, path, body = second
            show(f"{label}", request(lcp, method, path, body), 200)
            thread.join(120)
            data_lines = [ln for ln in out if ln.startswith(b"data:")]
            print(f"  first stream: {out[0]!r}, {len(data_lines)} data lines; its last 6 lines:")
            for line in out[-6:]:
                print(f"    {line!r}")
            finishes = [
                json.loads(ln[5:])["choices"][0].get("finish_reason")
                for ln in data_lines
                if ln.startswith(b"data: {")
            ]
            print(f"  finish_reasons seen: {sorted(set(map(str, finishes)))}")


def section_errors() -> None:
    print("== errors caused by the request")
    cases: list[tuple[str, str, dict[str, Any]]] = [
        ("bad parameter temperature='hot'", "/v1/chat/completions", chat(temperature="hot")),
        ("no messages", "/v1/chat/completions", {"model": MODEL_ALIAS, "max_tokens": 2}),
        ("unknown model", "/v1/chat/completions", {**chat(2), "model": "no-such-model"}),
        ("embeddings on a chat server", "/v1/embeddings", {"model": MODEL_ALIAS, "input": "hi"}),
        (
            "context overflow, non-stream",
            "/v1/chat/completions",
            {**chat(16), "messages": [{"role": "user", "content": LONG_PROMPT}]},
        ),
        (
            "context overflow, stream",
            "/v1/chat/completions",
            {**chat(16), "stream": True, "messages": [{"role": "user", "content": LONG_PROMPT}]},
        ),
        (
            "completions overflow, stream",
            "/v1/completions",
            {"model": MODEL_ALIAS, "prompt": LONG_PROMPT, "max_tokens": 16, "stream": True},
        ),
        # last: llama-cpp-python takes max_tokens <= 0 as "until the context is full"
        ("bad parameter max_tokens=-5", "/v1/chat/completions", chat(-5)),
    ]
    with servers("llama-server", "llama-cpp-python") as (ls, lcp):
        for name, proc in (("llama-server", ls), ("llama-cpp-python", lcp)):
            print(f" {name}")
            for label, path, body in cases:
                try:
                    show(label, request(proc, "POST", path, body, timeout=20), 500)
                except TimeoutError:
                    print(f"  {label}: no response head within 20 s (still generating)")


def section_usage() -> None:
    print("== stream_options.include_usage")
    with servers("llama-server", "llama-cpp-python") as (ls, lcp):
        for name, proc in (("llama-server", ls), ("llama-cpp-python", lcp)):
            for extra in ({"stream_options": {"include_usage": True}}, {}):
                status, _, payload, _ = request(
                    proc, "POST", "/v1/chat/completions", chat(3, stream=True, **extra)
                )
                lines = [ln for ln in payload.split(b"\n") if ln.strip()]
                print(f" {name} {extra or 'no stream_options'}: {status}, last 3 lines:")
                for line in lines[-3:]:
                    print(f"    {line!r}")


def section_routes() -> None:
    print("== routes")
    probes: list[tuple[str, str, Any]] = [
        ("POST", "/v1/responses", {"model": MODEL_ALIAS, "input": "hi", "max_output_tokens": 2}),
        (
            "POST",
            "/v1/messages",
            {
                "model": MODEL_ALIAS,
                "max_tokens": 2,
                "messages": [{"role": "user", "content": "hi"}],
            },
        ),
        ("POST", "/v1/embeddings", {"model": MODEL_ALIAS, "input": "hi"}),
        ("POST", "/tokenize", {"content": "hi"}),
        ("POST", "/extras/tokenize", {"model": MODEL_ALIAS, "input": "hi"}),
        ("POST", "/apply-template", {"messages": CHAT}),
        ("GET", "/health", None),
        ("GET", "/v1/health", None),
        ("GET", "/props", None),
        ("GET", "/metrics", None),
    ]
    with servers("llama-server", "llama-cpp-python") as (ls, lcp):
        for name, proc in (("llama-server", ls), ("llama-cpp-python", lcp)):
            print(f" {name}")
            for method, path, body in probes:
                show(f"{method} {path}", request(proc, method, path, body), 160)
    with servers("llama-server", embeddings=True) as (ls,):
        show(
            "llama-server --embeddings POST /v1/embeddings",
            request(ls, "POST", "/v1/embeddings", {"model": MODEL_ALIAS, "input": "hi"}),
            120,
        )
    version = subprocess.run([str(llama_server_bin()), "--version"], capture_output=True, text=True)
    print(f"  llama-server --version: {(version.stdout + version.stderr).strip()!r}")
    lcp_version = subprocess.run(
        [str(venv_python()), "-c", "import llama_cpp; print(llama_cpp.__version__)"],
        capture_output=True,
        text=True,
    )
    print(f"  llama_cpp.__version__: {lcp_version.stdout.strip()}")


def section_speed() -> None:
    """With the OpenAI SDK (httpx): reading the stream line by line with http.client made
    llama-server's stream 5-15 times slower (11-27 s for 400 tokens), an artefact of that client."""
    print("== a 400-token stream at temperature 0 (OpenAI SDK)")
    with servers("llama-server", "llama-cpp-python") as (ls, lcp):
        for name, proc in (("llama-server", ls), ("llama-cpp-python", lcp)):
            api = OpenAI(base_url=proc.url + "/v1", api_key="x", max_retries=0, timeout=300)
            for stream in (False, True, True):
                start = time.monotonic()
                first = 0.0
                if stream:
                    chunks = 0
                    for _ in api.chat.completions.create(
                        model=MODEL_ALIAS, messages=CHAT, max_tokens=400, temperature=0, stream=True
                    ):
                        chunks += 1
                        first = first or time.monotonic() - start
                    what = f"stream, {chunks} chunks, first after {first * 1000:.0f} ms"
                else:
                    api.chat.completions.create(
                        model=MODEL_ALIAS, messages=CHAT, max_tokens=400, temperature=0
                    )
                    what = "non-stream"
                took = time.monotonic() - start
                print(f"  {name} {what}: {took:.2f} s, {400 / took:.0f} tok/s")


SECTIONS: dict[str, Callable[[], None]] = {
    "request_id": section_request_id,
    "continue": section_continue,
    "locks": section_locks,
    "interrupt": section_interrupt,
    "errors": section_errors,
    "usage": section_usage,
    "routes": section_routes,
    "speed": section_speed,
}


def main() -> None:
    for name in sys.argv[1:] or list(SECTIONS):
        SECTIONS[name]()


if __name__ == "__main__":
    main()
