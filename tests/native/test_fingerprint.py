"""router.fingerprint / fingerprint_hex / canonical: keys, levels, errors."""

from __future__ import annotations

import json

import pytest

import router

CHAT = {
    "model": "gpt-4o",
    "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Hello  World!"}], "name": "bob"},
    ],
    "temperature": 0.5,
}


def body(value: object) -> bytes:
    return json.dumps(value).encode()


def test_key_is_16_bytes_and_hex_matches() -> None:
    key = router.fingerprint(body(CHAT))
    assert isinstance(key, bytes)
    assert len(key) == 16
    assert router.fingerprint_hex(body(CHAT)) == key.hex()


def test_order_and_whitespace_do_not_matter_number_spelling_does() -> None:
    shuffled = {k: CHAT[k] for k in reversed(list(CHAT))}
    spaced = json.dumps(shuffled, indent=3)
    assert router.fingerprint(spaced.encode()) == router.fingerprint(body(CHAT))
    other = spaced.replace('"temperature": 0.5', '"temperature": 5e-1')
    assert router.fingerprint(other.encode()) != router.fingerprint(body(CHAT))
    one = body({"model": "m", "prompt": "x", "n": 1})
    assert router.fingerprint(one) != router.fingerprint(b'{"model":"m","prompt":"x","n":1.0}')


def test_transport_fields_ignored() -> None:
    noisy = {
        **CHAT,
        "stream": True,
        "stream_options": {"include_usage": True},
        "user": "u-1",
        "metadata": {"a": "b"},
        "store": False,
        "service_tier": "auto",
        "safety_identifier": "s",
        "prompt_cache_key": "k",
    }
    assert router.fingerprint(body(noisy)) == router.fingerprint(body(CHAT))


def test_namespace_separates_tenants() -> None:
    a = router.fingerprint(body(CHAT), namespace="tenant-a")
    assert a != router.fingerprint(body(CHAT), namespace="tenant-b")
    assert a != router.fingerprint(body(CHAT))


def test_normalized_level() -> None:
    loud = {**CHAT, "messages": [{"role": "user", "content": "  Hello   world!\n"}]}
    calm = {**CHAT, "messages": [{"role": "user", "content": "Hello world!"}]}
    exact = [router.fingerprint(body(b)) for b in (loud, calm)]
    norm = [router.fingerprint(body(b), level="normalized") for b in (loud, calm)]
    assert exact[0] != exact[1]
    assert norm[0] == norm[1]
    assert norm[1] != exact[1]


# Keys under router-fp/5: one text per rule of rust/normalize.rs (a fold, a line end, a
# quotation, aligned columns); text parts normalized as one text, and a schema whose member
# order counts. A change here is a change of key rules: bump VERSION in rust/fingerprint.rs with
# it, so a shared tier never answers from keys made under other rules.
PINNED = {"model": "m", "input": ["How  are   you? ", "foo  \nbar", 'say "a  b"', "a  b\nc  d"]}
PINNED_CHAT = {
    "model": "m",
    "messages": [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "def f():"},
                {"type": "text", "text": "  return  1"},
                {"type": "text", "text": "x  y"},
            ],
        }
    ],
    "response_format": {
        "type": "json_schema",
        "json_schema": {
            "name": "r",
            "schema": {"type": "object", "properties": {"b": {}, "a": {}}},
        },
    },
}


@pytest.mark.parametrize(
    ("pinned", "level", "hex_key"),
    [
        (PINNED, "exact", "935547790e9ec6e7cf97f8de82edc75e"),
        (PINNED, "normalized", "73ceb592abfb7c051f226622347da5d4"),
        (PINNED_CHAT, "exact", "0e530669d60970905cc7f3adbf4c6113"),
        (PINNED_CHAT, "normalized", "feae3335c5df2769903878ac844f815c"),
    ],
)
def test_keys_are_pinned(pinned: dict[str, object], level: str, hex_key: str) -> None:
    assert router.fingerprint_hex(body(pinned), namespace="t", level=level) == hex_key


def test_canonical_form() -> None:
    raw = b'{"b": 1.0, "a": [1e0, -0.0, 2.50], "stream": true, "model": "M"}'
    assert router.canonical(raw) == b'{"a":[1e0,-0.0,2.50],"b":1.0,"model":"M"}'
    texts = b'{"input": ["  A  B. ", [1, 2.0]], "model": "M"}'
    assert router.canonical(texts, level="normalized") == b'{"input":["A B.",[1,2.0]],"model":"M"}'
    # A completions prompt is continued as written: kept exactly.
    prompt = b'{"prompt": ["  A  B. "], "model": "M"}'
    assert router.canonical(prompt, level="normalized") == b'{"model":"M","prompt":["  A  B. "]}'


@pytest.mark.parametrize(
    "literal",
    [
        "12345678901234567890",
        "-12345678901234567891",
        "1" * 300,
        "3.141592653589793238462643383279502884197",
        "6.02214076e23",
        "6.02214076E+23",
        "1e-320",
        "-0",
        "-0.0",
        "0.000",
    ],
)
def test_number_literals_are_kept_digit_for_digit(literal: str) -> None:
    raw = f'{{"model":"m","seed": {literal} }}'.encode()
    assert router.canonical(raw) == f'{{"model":"m","seed":{literal}}}'.encode()


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        (b"\xff\xfe", "UTF-8"),
        (b"{", "not valid JSON"),
        (b"", "not valid JSON"),
        (b'{"temperature": NaN}', "not valid JSON"),
        (b'{"temperature": Infinity}', "not valid JSON"),
        (b'{"temperature": 1e400}', "not valid JSON"),
        (b'{"seed": ' + b"9" * 400 + b"}", "out of range"),
        (b'{"a":' + b"[" * 200 + b"]" * 200 + b"}", "nested deeper than 128"),
    ],
)
def test_decode_errors(raw: bytes, needle: str) -> None:
    for call in (router.fingerprint, router.canonical):
        with pytest.raises(router.RequestDecodeError, match=needle):
            call(raw)


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ([1, 2], "must be a JSON object"),
        ({"messages": {"role": "user"}}, "`messages` must be an array"),
        ({"messages": ["hi"]}, r"`messages\[0\]` must be an object"),
        ({"messages": [{"content": "x"}]}, "has no `role`"),
        ({"messages": [{"role": "user", "content": 3}]}, "content"),
        ({"messages": [{"role": "user", "content": [1]}]}, r"content\[0\]"),
        ({"model": 4}, "`model` must be a string"),
        ({"prompt": {"a": 1}}, "`prompt`"),
    ],
)
def test_shape_errors(value: object, needle: str) -> None:
    with pytest.raises(router.RequestShapeError, match=needle):
        router.fingerprint(body(value))


def test_errors_share_the_root() -> None:
    assert issubclass(router.RequestDecodeError, router.NativeError)
    assert issubclass(router.RequestShapeError, router.NativeError)
    with pytest.raises(router.InvalidArgumentError, match="level"):
        router.fingerprint(body(CHAT), level="fuzzy")


def test_huge_string_is_fine() -> None:
    big = body({"model": "m", "prompt": "x" * 5_000_000})
    assert len(router.fingerprint(big)) == 16
