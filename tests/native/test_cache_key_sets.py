"""The published cache-key sets (tests/cache_key_sets.py) against the fingerprint (texts, a
message's text parts, member order and repeated keys), and numbers that differ only past float
precision."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

import router
from tests import reference
from tests.cache_key_sets import (
    CONSERVATIVE_MISSES,
    FALSE_HITS,
    ORDER_FALSE_HITS,
    ORDER_TRUE_HITS,
    PART_FALSE_HITS,
    PART_TRUE_HITS,
    TRUE_HITS,
    BodyPair,
    Pair,
    PartsPair,
)

# Every place the normalized level reads text from.
SHAPES: dict[str, Callable[[str], bytes]] = {
    "content": lambda t: json.dumps(
        {"model": "m", "temperature": 0, "messages": [{"role": "user", "content": t}]}
    ).encode(),
    "parts": lambda t: json.dumps(
        {"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": t}]}]}
    ).encode(),
    "input": lambda t: json.dumps({"model": "m", "input": [t]}).encode(),
    # Escaped on the wire (\\n, \\u00a0 ...) instead of raw: the parser's other string path.
    "ascii": lambda t: json.dumps({"model": "m", "input": t}, ensure_ascii=True).encode(),
}


def key(text: str, shape: str, level: str = "normalized") -> bytes:
    return router.fingerprint(SHAPES[shape](text), namespace="tenant", level=level)


def ids(pairs: tuple[Pair, ...]) -> list[str]:
    return [p.why for p in pairs]


@pytest.mark.parametrize("pair", FALSE_HITS, ids=ids(FALSE_HITS))
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_false_hit_set_never_shares_a_key(pair: Pair, shape: str) -> None:
    assert router.normalize(pair.a) != router.normalize(pair.b)
    for level in ("exact", "normalized"):
        assert key(pair.a, shape, level) != key(pair.b, shape, level), pair.why


@pytest.mark.parametrize("pair", TRUE_HITS, ids=ids(TRUE_HITS))
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_true_hit_set_shares_a_key(pair: Pair, shape: str) -> None:
    assert key(pair.a, shape) == key(pair.b, shape), pair.why
    assert key(pair.a, shape, "exact") != key(pair.b, shape, "exact")
    body = SHAPES[shape](pair.b)
    assert router.canonical(body, level="normalized") == reference.canonical(
        body, level="normalized"
    )


# Text a model continues as written, where the last blank space picks the next token: a
# completions prompt, a prefill (a trailing assistant message). Never normalized.
CONTINUED: dict[str, Callable[[str], bytes]] = {
    "prompt": lambda t: json.dumps({"model": "m", "prompt": [t]}).encode(),
    "prefill": lambda t: json.dumps(
        {
            "model": "m",
            "messages": [
                {"role": "user", "content": "Go on."},
                {"role": "assistant", "content": t},
            ],
        }
    ).encode(),
}


@pytest.mark.parametrize("pair", TRUE_HITS, ids=ids(TRUE_HITS))
@pytest.mark.parametrize("shape", sorted(CONTINUED))
def test_text_the_model_continues_keys_exactly_at_both_levels(pair: Pair, shape: str) -> None:
    a, b = CONTINUED[shape](pair.a), CONTINUED[shape](pair.b)
    for level in ("exact", "normalized"):
        assert router.fingerprint(a, level=level) != router.fingerprint(b, level=level), pair.why
    assert router.canonical(b, level="normalized") == reference.canonical(b, level="normalized")


@pytest.mark.parametrize("pair", CONSERVATIVE_MISSES, ids=ids(CONSERVATIVE_MISSES))
def test_conservative_misses_stay_apart(pair: Pair) -> None:
    assert key(pair.a, "content") != key(pair.b, "content"), pair.why


def test_sets_are_well_formed() -> None:
    for pairs in (FALSE_HITS, TRUE_HITS, CONSERVATIVE_MISSES):
        assert all(p.a != p.b for p in pairs)
    assert len({(p.a, p.b) for p in FALSE_HITS}) == len(FALSE_HITS)
    for part_pairs in (PART_FALSE_HITS, PART_TRUE_HITS):
        assert all(p.a != p.b for p in part_pairs)
    for body_pairs in (ORDER_FALSE_HITS, ORDER_TRUE_HITS):
        for p in body_pairs:
            assert p.a != p.b
            json.loads(p.a)
            json.loads(p.b)


def _blocks(texts: tuple[str, ...], kind: str = "text") -> list[dict[str, str]]:
    return [{"type": kind, "text": t} for t in texts]


# Every place a message's text parts are read from: chat content parts (also escaped on the
# wire), Anthropic content blocks, and text items of a Responses `input`.
PART_SHAPES: dict[str, Callable[[tuple[str, ...]], bytes]] = {
    "chat": lambda t: json.dumps(
        {"model": "m", "temperature": 0, "messages": [{"role": "user", "content": _blocks(t)}]}
    ).encode(),
    "ascii": lambda t: json.dumps(
        {"model": "m", "messages": [{"role": "user", "content": _blocks(t)}]}, ensure_ascii=True
    ).encode(),
    "anthropic": lambda t: json.dumps(
        {
            "model": "m",
            "max_tokens": 8,
            "system": [{"type": "text", "text": "Be brief."}],
            "messages": [{"role": "user", "content": _blocks(t)}],
        }
    ).encode(),
    "input": lambda t: json.dumps({"model": "m", "input": _blocks(t, "input_text")}).encode(),
}


def part_ids(pairs: tuple[PartsPair, ...]) -> list[str]:
    return [p.why for p in pairs]


@pytest.mark.parametrize("pair", PART_FALSE_HITS, ids=part_ids(PART_FALSE_HITS))
@pytest.mark.parametrize("shape", sorted(PART_SHAPES))
def test_text_parts_false_hit_set_never_shares_a_key(pair: PartsPair, shape: str) -> None:
    a, b = PART_SHAPES[shape](pair.a), PART_SHAPES[shape](pair.b)
    for level in ("exact", "normalized"):
        assert router.fingerprint(a, level=level) != router.fingerprint(b, level=level), pair.why
    for raw in (a, b):
        assert router.canonical(raw, level="normalized") == reference.canonical(
            raw, level="normalized"
        )


@pytest.mark.parametrize("pair", PART_TRUE_HITS, ids=part_ids(PART_TRUE_HITS))
@pytest.mark.parametrize("shape", sorted(PART_SHAPES))
def test_text_parts_true_hit_set_shares_a_key(pair: PartsPair, shape: str) -> None:
    a, b = PART_SHAPES[shape](pair.a), PART_SHAPES[shape](pair.b)
    assert router.fingerprint(a, level="normalized") == router.fingerprint(b, level="normalized")
    assert router.fingerprint(a) != router.fingerprint(b)
    assert router.canonical(a, level="normalized") == reference.canonical(a, level="normalized")


def body_ids(pairs: tuple[BodyPair, ...]) -> list[str]:
    return [p.why for p in pairs]


@pytest.mark.parametrize("pair", ORDER_FALSE_HITS, ids=body_ids(ORDER_FALSE_HITS))
@pytest.mark.parametrize("level", ["exact", "normalized"])
def test_member_order_false_hit_set_never_shares_a_key(pair: BodyPair, level: str) -> None:
    a, b = pair.a.encode(), pair.b.encode()
    assert router.fingerprint(a, level=level) != router.fingerprint(b, level=level), pair.why
    for raw in (a, b):
        assert router.canonical(raw, level=level) == reference.canonical(raw, level=level)


@pytest.mark.parametrize("pair", ORDER_TRUE_HITS, ids=body_ids(ORDER_TRUE_HITS))
@pytest.mark.parametrize("level", ["exact", "normalized"])
def test_member_order_true_hit_set_shares_a_key(pair: BodyPair, level: str) -> None:
    a, b = pair.a.encode(), pair.b.encode()
    assert router.fingerprint(a, level=level) == router.fingerprint(b, level=level), pair.why


# Numbers: every digit of the literal counts, at both levels (rust/json.rs says why 1 and 1.0
# are not unified either).
NUMBER_PAIRS = [
    ("seed", "12345678901234567890", "12345678901234567891"),
    ("seed", "123456789012345678901", "123456789012345678902"),
    ("seed", "-9223372036854775809", "-9223372036854775810"),
    ("seed", "9007199254740993", "9007199254740992"),
    ("seed", "9007199254740993.0", "9007199254740992.0"),
    ("seed", "1" * 300, "1" * 299 + "2"),
    ("temperature", "0.1000000000000000055511151231257827", "0.1"),
    ("temperature", "0.30000000000000000001", "0.3"),
    ("temperature", "1e-400", "0"),
    ("temperature", "1.7976931348623157e308", "1.7976931348623158e308"),
    ("n", "1", "1.0"),
    ("max_tokens", "100", "1e2"),
    ("max_tokens", "1e2", "1E2"),
    ("max_tokens", "1e2", "1e+2"),
    ("temperature", "0", "-0"),
    ("temperature", "0.0", "-0.0"),
    ("temperature", "0.5", "5e-1"),
]


@pytest.mark.parametrize(("field", "x", "y"), NUMBER_PAIRS)
@pytest.mark.parametrize("level", ["exact", "normalized"])
def test_numbers_keep_every_digit(field: str, x: str, y: str, level: str) -> None:
    def body(n: str) -> bytes:
        return f'{{"model":"m","prompt":"x","{field}":{n}}}'.encode()

    assert router.fingerprint(body(x), level=level) != router.fingerprint(body(y), level=level)
    for n in (x, y):
        assert router.canonical(body(n), level=level) == reference.canonical(body(n), level=level)
        assert f'"{field}":{n}'.encode() in router.canonical(body(n), level=level)


def test_same_literal_same_key() -> None:
    a = b'{"model":"m","prompt":"x","seed":12345678901234567890,"temperature":0.70}'
    b = b'{ "temperature": 0.70, "seed": 12345678901234567890, "prompt": "x", "model": "m" }'
    for level in ("exact", "normalized"):
        assert router.fingerprint(a, level=level) == router.fingerprint(b, level=level)
