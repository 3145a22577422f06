"""Pure-Python references for the native hot path (normalize, canonical form, token counting)."""

from __future__ import annotations

import functools
import glob
import hashlib
import json
import os
import re
import unicodedata
from typing import Any

import tiktoken
import tiktoken.load

PUNCTUATION = ".!?,;:\u3002\u3001"
TRAILING_FILLER = (
    "thank you very much",
    "thanks a lot",
    "thank you",
    "thanks",
    "please",
    "thx",
    "pls",
    "plz",
)
LEADING_FILLER = ("please", "kindly", "pls", "plz")
TRANSPORT_FIELDS = frozenset(
    {
        "metadata",
        "prompt_cache_key",
        "safety_identifier",
        "service_tier",
        "store",
        "stream",
        "stream_options",
        "user",
    }
)
_SPACES = re.compile(r"\s+")
_TWO_POW_63 = 2**63


def _fold(text: str) -> str:
    """NFKC, then casefold + NFKC until stable (at most 4 rounds), as the Rust side does."""
    current = unicodedata.normalize("NFKC", text)
    for _ in range(4):
        folded = current.casefold()
        if folded == current:
            break
        following = unicodedata.normalize("NFKC", folded)
        if following == current:
            break
        current = following
    return current


def _strip_once(s: str, strip_punctuation: bool, strip_filler: bool) -> str:
    if strip_punctuation:
        s = s.rstrip(PUNCTUATION + " ")
    if strip_filler:
        for filler in TRAILING_FILLER:
            if len(s) > len(filler) and s.endswith(filler) and s[-len(filler) - 1] == " ":
                s = s[: -len(filler)].rstrip(" ")
                break
        word, space, rest = s.partition(" ")
        if space and word.rstrip(",!.") in LEADING_FILLER:
            s = rest
    return s


def normalize(text: str, *, strip_punctuation: bool = True, strip_filler: bool = False) -> str:
    """Reference for `router.normalize`: unicodedata NFKC + str.casefold + regex whitespace."""
    s = _SPACES.sub(" ", _fold(text)).strip(" ")
    while True:
        stripped = _strip_once(s, strip_punctuation, strip_filler)
        if stripped == s:
            return s
        s = stripped


def _reject_constant(name: str) -> Any:
    raise ValueError(f"non-finite number {name}")


def _parse_int(digits: str) -> int | float:
    # serde_json keeps integers within i64/u64 and reads larger ones as floats.
    value = int(digits)
    return value if -_TWO_POW_63 <= value < 2**64 else float(digits)


def _parse_float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError(f"number out of range: {text}")
    return value


def loads(body: bytes) -> Any:
    """Decode a request body the way the Rust side accepts it (no NaN/Infinity)."""
    return json.loads(
        body.decode("utf-8"),
        parse_constant=_reject_constant,
        parse_int=_parse_int,
        parse_float=_parse_float,
    )


def _numbers(value: Any) -> Any:
    """Integral floats within i64 become ints, so 1 and 1.0 compare equal."""
    if isinstance(value, float) and value.is_integer() and abs(value) < _TWO_POW_63:
        return int(value)
    if isinstance(value, list):
        return [_numbers(v) for v in value]
    if isinstance(value, dict):
        return {k: _numbers(v) for k, v in value.items()}
    return value


def _texts(value: Any) -> Any:
    """Mirror of the Rust `write_texts`: strings normalized, text parts' `text` normalized."""
    if isinstance(value, str):
        return normalize(value)
    if isinstance(value, list):
        return [
            {k: _texts(v) if k == "text" else v for k, v in item.items()}
            if isinstance(item, dict)
            else _texts(item)
            for item in value
        ]
    return value


def canonical_value(request: dict[str, Any], level: str = "exact") -> dict[str, Any]:
    """The request with transport fields dropped and, at level "normalized", text normalized."""
    out = {k: v for k, v in request.items() if k not in TRANSPORT_FIELDS}
    if level == "normalized":
        if isinstance(out.get("messages"), list):
            out["messages"] = [
                {k: _texts(v) if k == "content" else v for k, v in m.items()}
                if isinstance(m, dict)
                else m
                for m in out["messages"]
            ]
        for field in ("prompt", "input"):
            if field in out:
                out[field] = _texts(out[field])
    return out


def canonical(body: bytes, *, level: str = "exact") -> bytes:
    """Reference for `router.canonical`: json.loads, sorted compact json.dumps."""
    request = loads(body)
    if not isinstance(request, dict):
        raise ValueError("request body must be a JSON object")
    value = _numbers(canonical_value(request, level))
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def fingerprint(body: bytes, *, namespace: str = "", level: str = "exact") -> bytes:
    """A reference key of the same cost shape (hashlib blake2b-128; Rust uses xxh3-128)."""
    header = f"router-fp/1\n{level}\n{len(namespace.encode())}:{namespace}\n".encode()
    return hashlib.blake2b(header + canonical(body, level=level), digest_size=16).digest()


_PATTERNS = {
    "cl100k_base": r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s""",  # noqa: E501
    "o200k_base": "|".join(
        [
            r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
            r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
            r"""\p{N}{1,3}""",
            r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
            r"""\s*[\r\n]+""",
            r"""\s+(?!\S)""",
            r"""\s+""",
        ]
    ),
}
_HASHES = {
    "cl100k_base": "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
    "o200k_base": "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
}


@functools.cache
def tiktoken_encoding(name: str) -> tiktoken.Encoding | None:
    """tiktoken's encoding, loaded offline from the vocab file shipped in the tiktoken-rs crate."""
    home = os.path.expanduser("~/.cargo/registry/src")
    for path in sorted(glob.glob(f"{home}/*/tiktoken-rs-*/assets/{name}.tiktoken"), reverse=True):
        ranks = tiktoken.load.load_tiktoken_bpe(path, expected_hash=_HASHES[name])
        return tiktoken.Encoding(
            name=name, pat_str=_PATTERNS[name], mergeable_ranks=ranks, special_tokens={}
        )
    return None


def _count_texts(value: Any, enc: tiktoken.Encoding) -> int:
    if isinstance(value, str):
        return len(enc.encode_ordinary(value))
    if isinstance(value, bool):
        return 0
    if isinstance(value, int | float):
        return 1
    if isinstance(value, list):
        return sum(_count_texts(v, enc) for v in value)
    return 0


IMAGE_TOKENS = 85 + 170 * 8
IMAGE_TOKENS_LOW = 85


def _count_json(value: Any, enc: tiktoken.Encoding) -> int:
    """Every string and key encoded, numbers and booleans one token each."""
    if isinstance(value, str):
        return len(enc.encode_ordinary(value))
    if isinstance(value, bool | int | float):
        return 1
    if isinstance(value, list):
        return sum(_count_json(v, enc) for v in value)
    if isinstance(value, dict):
        return sum(len(enc.encode_ordinary(k)) + _count_json(v, enc) for k, v in value.items())
    return 0


def _count_part(part: Any, enc: tiktoken.Encoding) -> int:
    """Every text a content part carries; an image by the image rule."""
    if not isinstance(part, dict):
        return len(enc.encode_ordinary(part)) if isinstance(part, str) else 0
    total = 0
    for key, value in part.items():
        if key == "type":
            continue
        if key in ("image_url", "input_image", "image"):
            low = isinstance(value, dict) and value.get("detail") == "low"
            total += IMAGE_TOKENS_LOW if low else IMAGE_TOKENS
        elif key in ("input_audio", "file"):
            total += min(_count_json(value, enc), IMAGE_TOKENS)
        else:
            total += _count_json(value, enc)
    return total


def count_request_tokens(body: bytes, enc: tiktoken.Encoding) -> int:
    """Cookbook prompt-token accounting with tiktoken (special tokens counted as plain text),
    plus the prompt text outside the messages (tools, functions, response format)."""
    request = loads(body)
    extra = sum(
        _count_json(request[field], enc)
        for field in ("tools", "functions", "response_format", "tool_choice")
        if field in request
    )
    messages = request.get("messages")
    if isinstance(messages, list):
        total = 3 + extra
        for message in messages:
            total += 3
            for key, value in message.items():
                if isinstance(value, str):
                    total += len(enc.encode_ordinary(value))
                elif key == "content" and isinstance(value, list):
                    for part in value:
                        total += _count_part(part, enc)
                elif key == "tool_calls" and isinstance(value, list):
                    for call in value:
                        function = call.get("function") if isinstance(call, dict) else None
                        for field in ("name", "arguments"):
                            text = function.get(field) if isinstance(function, dict) else None
                            if isinstance(text, str):
                                total += len(enc.encode_ordinary(text))
                if key == "name":
                    total += 1
        return total
    for field in ("prompt", "input"):
        if field in request:
            return _count_texts(request[field], enc)
    raise ValueError("request has none of messages, prompt or input")


def chat_request(size: int = 2048) -> bytes:
    """A realistic chat request of about `size` bytes."""
    messages = [{"role": "system", "content": "You are a helpful assistant. Answer concisely."}]
    i = 0
    while len(json.dumps({"model": "gpt-4o", "messages": messages})) < size - 80:
        messages.append(
            {
                "role": "user" if i % 2 == 0 else "assistant",
                "content": f"Question {i}: How does the   Failover router handle Region "
                "outages?  Please explain the retry budget and ejection. ",
            }
        )
        i += 1
    body = {"model": "gpt-4o", "messages": messages, "temperature": 0.7, "max_tokens": 256}
    return json.dumps({**body, "stream": True}).encode()


def prompt_text(size: int = 2048) -> str:
    """About `size` bytes of mixed English prose, code and a little non-ASCII."""
    parts = [
        "The router forwards each request to the healthiest region and fails over on errors. ",
        "def retry(budget: float) -> bool:\n    return budget > 0.1  # keep 10%\n",
        "Latency p95 was 183 ms; naïve caches miss 12.5% — “good enough”? ",
    ]
    out, i = "", 0
    while len(out.encode()) < size:
        out += parts[i % len(parts)]
        i += 1
    return out
