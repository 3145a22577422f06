"""Property: fingerprints ignore whitespace and the member order of the request and its
messages, see member order everywhere else and every output-affecting field, match the Python
reference's canonical form, and never crash on arbitrary input."""

from __future__ import annotations

import json
import random
from typing import Any

from hypothesis import assume, given, settings
from hypothesis import strategies as st

import router
from tests import reference

TEXT = st.text(st.characters(exclude_categories=("Cs", "Cn", "Co")), max_size=20)
SCALAR = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    TEXT,
)
JSON = st.recursive(
    SCALAR,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(TEXT, inner, max_size=4)),
    max_leaves=8,
)
CONTENT = st.one_of(
    TEXT,
    st.none(),
    st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": TEXT}), max_size=3),
)
MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "user", "assistant", "tool"]), "content": CONTENT},
    optional={"name": TEXT, "tool_call_id": TEXT, "tool_calls": st.lists(JSON, max_size=2)},
)
# Every field the issue names as output-affecting, plus an unknown one (treated the same way).
OUTPUT_FIELDS = [
    "model",
    "messages",
    "temperature",
    "top_p",
    "max_tokens",
    "max_completion_tokens",
    "stop",
    "seed",
    "tools",
    "tool_choice",
    "response_format",
    "n",
    "logprobs",
    "top_logprobs",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "prompt",
    "input",
    "suffix",
    "echo",
    "best_of",
    "parallel_tool_calls",
    "reasoning_effort",
    "x_vendor_extension",
]
REQUEST = st.fixed_dictionaries(
    {"model": TEXT, "messages": st.lists(MESSAGE, max_size=4)},
    optional={
        **{f: JSON for f in OUTPUT_FIELDS if f not in ("model", "messages", "prompt", "input")},
        "prompt": st.one_of(TEXT, st.lists(TEXT, max_size=3)),
        "input": st.one_of(TEXT, st.lists(st.integers(0, 1000), max_size=3)),
        "stream": st.booleans(),
        "user": TEXT,
    },
)


def shuffled(value: Any, rng: random.Random) -> Any:
    """The same JSON value with every object's keys in a random order."""
    if isinstance(value, dict):
        items = [(k, shuffled(v, rng)) for k, v in value.items()]
        rng.shuffle(items)
        return dict(items)
    if isinstance(value, list):
        return [shuffled(v, rng) for v in value]
    return value


def read_by_key(request: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    """The request with its own members and each message's in a random order (what every
    server reads by key), everything inside them as it was."""

    def mix(obj: dict[str, Any]) -> dict[str, Any]:
        items = list(obj.items())
        rng.shuffle(items)
        return dict(items)

    out = mix(request)
    if isinstance(out.get("messages"), list):
        out["messages"] = [mix(m) if isinstance(m, dict) else m for m in out["messages"]]
    return out


def spelled(value: Any, rng: random.Random) -> bytes:
    """Serialize with random indentation, separators and escaping."""
    indent = rng.choice([None, 0, 2, "\t"])
    separators = rng.choice([(",", ":"), (", ", ": "), (" ,", " : ")])
    ascii_only = rng.random() < 0.5
    return json.dumps(value, indent=indent, separators=separators, ensure_ascii=ascii_only).encode()


@settings(max_examples=40, deadline=None)
@given(REQUEST, st.randoms(use_true_random=False), st.sampled_from(["exact", "normalized"]))
def test_order_and_whitespace_invariant(
    request: dict[str, Any], rng: random.Random, level: str
) -> None:
    base = json.dumps(request).encode()
    other = spelled(read_by_key(request, rng), rng)
    assert router.fingerprint(other, level=level) == router.fingerprint(base, level=level)
    assert router.canonical(base, level=level) == reference.canonical(base, level=level)


@settings(max_examples=40, deadline=None)
@given(REQUEST, st.randoms(use_true_random=False), st.sampled_from(["exact", "normalized"]))
def test_member_order_inside_fields_and_parts_changes_the_key(
    request: dict[str, Any], rng: random.Random, level: str
) -> None:
    base = json.dumps(request).encode()
    other = json.dumps(read_by_key(shuffled(request, rng), rng)).encode()
    assert router.canonical(other, level=level) == reference.canonical(other, level=level)
    # Equal canonical forms after only by-key members moved: the key must see the rest.
    moved = reference.canonical(other, level=level) != reference.canonical(base, level=level)
    assert (router.fingerprint(other, level=level) != router.fingerprint(base, level=level)) == (
        moved
    )


@settings(max_examples=40, deadline=None)
@given(REQUEST, st.sampled_from(OUTPUT_FIELDS), JSON)
def test_every_output_field_changes_the_key(
    request: dict[str, Any], field: str, value: Any
) -> None:
    changed = dict(request)
    if field == "model":
        value = str(value)
    elif field == "messages":
        value = [*request["messages"], {"role": "user", "content": str(value)}]
    elif field in ("prompt", "input"):
        value = [str(value), "changed"]
    changed[field] = value
    before = reference.canonical(json.dumps(request).encode())
    after = reference.canonical(json.dumps(changed).encode())
    # Values that are equal as JSON numbers (e.g. 1 and 1.0) are meant to collide.
    assume(before != after)
    assert router.fingerprint(json.dumps(changed).encode()) != router.fingerprint(
        json.dumps(request).encode()
    )


@settings(max_examples=30, deadline=None)
@given(REQUEST, st.sampled_from(sorted(reference.TRANSPORT_FIELDS)), JSON)
def test_transport_fields_never_change_the_key(
    request: dict[str, Any], field: str, value: Any
) -> None:
    noisy = {**request, field: value}
    assert router.fingerprint(json.dumps(noisy).encode()) == router.fingerprint(
        json.dumps({k: v for k, v in request.items() if k != field}).encode()
    )


@settings(max_examples=100, deadline=None)
@given(st.one_of(st.binary(max_size=64), JSON.map(lambda v: json.dumps(v).encode())))
def test_arbitrary_input_gives_an_answer_or_a_typed_error(raw: bytes) -> None:
    for level in ("exact", "normalized"):
        try:
            key = router.fingerprint(raw, level=level)
        except router.NativeError:
            continue
        assert len(key) == 16
    for encoding in ("estimate", "cl100k_base"):
        try:
            count = router.count_request_tokens(raw, encoding)
        except router.NativeError:
            continue
        assert count >= 0
