"""The cache's rules for Responses and Messages answers: what is worth storing, whole events."""

from __future__ import annotations

import json
from typing import Any

from router.cache.policy import StreamRecorder, complete_body


def _event(name: str, **data: Any) -> bytes:
    return f"event: {name}\ndata: {json.dumps({'type': name, **data})}\n\n".encode()


START = _event("message_start", message={"id": "m"}) + _event("content_block_delta", delta={})


def test_whole_answers_worth_storing() -> None:
    assert complete_body(b'{"object": "response", "status": "completed", "error": null}')
    assert complete_body(b'{"object": "response", "status": "incomplete"}')
    assert not complete_body(b'{"object": "response", "status": "failed"}')
    assert not complete_body(b'{"object": "response", "status": "completed", "error": {"m": 1}}')
    assert complete_body(b'{"type": "message", "stop_reason": "end_turn"}')
    assert complete_body(b'{"type": "message", "stop_reason": "max_tokens"}')
    assert not complete_body(b'{"type": "message", "stop_reason": "tool_use"}')


def test_framed_streams_keep_whole_events_and_store_only_clean_ends() -> None:
    recorder = StreamRecorder(typed=True)
    events = recorder.feed(START)
    assert b"".join(events) == START
    assert not recorder.complete
    recorder.feed(_event("message_stop"))
    assert recorder.complete
    assert b"".join(recorder.chunks) == START + _event("message_stop")
    recorder.feed(_event("ping"))  # anything after the end is not understood
    assert not recorder.complete


def test_framed_streams_that_failed_are_never_stored() -> None:
    for bad in (
        _event("error", error={"type": "overloaded_error"}),
        _event("response.failed", response={}),
        b"data: not json\n\n",
    ):
        recorder = StreamRecorder(typed=True)
        recorder.feed(START + bad + _event("message_stop"))
        assert not recorder.complete
    responses = StreamRecorder(typed=True)
    responses.feed(_event("response.created") + _event("response.completed"))
    assert responses.complete
