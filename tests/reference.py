"""Pure-Python references for the native hot path (normalize, canonical form, token counting)."""

from __future__ import annotations

import functools
import glob
import hashlib
import itertools
import json
import os
import re
from typing import Any

import tiktoken
import tiktoken.load

# Unicode's space separators (Zs) and Python's str.splitlines line breaks.
SPACES = " \u00a0\u1680" + "".join(map(chr, range(0x2000, 0x200B))) + "\u202f\u205f\u3000"
LINE_BREAKS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
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
_TWO_POW_63 = 2**63
# Quote marks: double ones always; single ones unless between two word characters (apostrophes).
DOUBLE_QUOTES = '"«»“”„‟‹›「」『』〝〞〟＂'
SINGLE_QUOTES = "'‘’‚‛＇"
# Fold 4: a run of spaces between two visible characters (neither blank nor a tab).
_SPACE_RUN = re.compile(f"(?<=[^{SPACES}\t])[{SPACES}]+(?=[^{SPACES}\t])")
_COLUMN_RUN = re.compile(f"(?<=[^{SPACES}\t])[{SPACES}]{{2,}}(?=[^{SPACES}\t])")
_LINES = re.compile(f"(\r\n|[{LINE_BREAKS}])")
_FENCE = re.compile(f"[{SPACES}\t]*(`{{3,}}(?!.*`)|~{{3,}})", re.DOTALL)


def _is_blank(line: str) -> bool:
    return not line.strip(SPACES + "\t")


def _closes(line: str, fence: str) -> bool:
    body = line.lstrip(SPACES + "\t")
    run = len(body) - len(body.lstrip(fence[0]))
    return run >= len(fence) and _is_blank(body[run:])


def _is_word(c: str) -> bool:
    if c.isascii():
        return c.isalnum()
    return c not in SPACES + LINE_BREAKS + DOUBLE_QUOTES + SINGLE_QUOTES


def _first_quote(text: str) -> int:
    """Index of the first quote mark that may open or close a quotation, or len(text)."""
    for i, c in enumerate(text):
        if c in DOUBLE_QUOTES:
            return i
        if c in SINGLE_QUOTES:
            before, after = text[i - 1 : i], text[i + 1 : i + 2]
            if not (before and after and _is_word(before) and _is_word(after)):
                return i
    return len(text)


def normalize(text: str) -> str:
    """Reference for `router.normalize`: the four blank-space folds of rust/normalize.rs."""
    blank = SPACES + LINE_BREAKS
    text = text.rstrip(blank)
    first = len(text) - len(text.lstrip(blank))
    text = text[max(text.rfind(c, 0, first) for c in LINE_BREAKS) + 1 :]
    indent = len(text) - len(text.lstrip(SPACES))
    if 0 < indent <= 3 and not any(c in text for c in LINE_BREAKS):
        text = text[indent:]
    quote = _first_quote(text)
    parts = _LINES.split(text)
    lines, breaks = parts[::2], [*parts[1::2], ""]
    # Which lines are kept verbatim: fences and their content, indented lines, per paragraph the
    # lines from the first to the last one holding a backtick, paragraphs of 2+ lines with runs
    # on at least half of them, and every line from the one holding the first quote mark on.
    verbatim = [False] * len(lines)
    paragraph: list[int] = []

    def close_paragraph() -> None:
        ticked = [i for i in paragraph if "`" in lines[i]]
        if ticked:
            for i in range(ticked[0], ticked[-1] + 1):
                verbatim[i] = True
        runs = sum(bool(_COLUMN_RUN.search(lines[i])) for i in paragraph)
        if len(paragraph) >= 2 and 2 * runs >= len(paragraph):
            for i in paragraph:
                verbatim[i] = True
        paragraph.clear()

    fence = ""
    for i, line in enumerate(lines):
        if fence:
            verbatim[i] = True
            if _closes(line, fence):
                fence = ""
            continue
        opened = _FENCE.match(line)
        if opened or _is_blank(line):
            close_paragraph()
            verbatim[i] = True
            fence = opened.group(1) if opened else ""
            continue
        paragraph.append(i)
        verbatim[i] = line[0] in SPACES + "\t"
    close_paragraph()
    start = 0
    for i, (line, brk) in enumerate(zip(lines, breaks, strict=True)):
        verbatim[i] = verbatim[i] or start + len(line) > quote
        start += len(line) + len(brk)
    return "".join(
        (line if keep else _SPACE_RUN.sub(" ", line)) + brk
        for line, keep, brk in zip(lines, verbatim, breaks, strict=True)
    )


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


class Number(str):
    """A JSON number's literal exactly as written (the canonical form keeps it)."""


def _literal(text: str) -> Number:
    if float(text) in (float("inf"), float("-inf")):
        raise ValueError(f"number out of range: {text}")
    return Number(text)


def loads(body: bytes) -> Any:
    """Decode a request body the way the Rust side accepts it (no NaN/Infinity)."""
    return json.loads(
        body.decode("utf-8"),
        parse_constant=_reject_constant,
        parse_int=_parse_int,
        parse_float=_parse_float,
    )


class Members(list[tuple[str, Any]]):
    """A JSON object's members in the order written, repeated keys included."""

    def get(self, key: str) -> Any:
        """The value of the last member named `key` (as most JSON parsers read it), or None."""
        return next((v for k, v in reversed(self) if k == key), None)


def loads_literal(body: bytes) -> Any:
    """Decode a request body keeping each number's literal as a `Number` and each object's
    members as written (`Members`)."""
    return json.loads(
        body.decode("utf-8"),
        object_pairs_hook=Members,
        parse_constant=_reject_constant,
        parse_int=_literal,
        parse_float=_literal,
    )


def dumps(value: Any) -> str:
    """Compact JSON, numbers as written (`json.dumps` would quote them); `Members` in their
    order, dicts with sorted keys."""
    if isinstance(value, Number):
        return str(value)
    if isinstance(value, Members):
        return "{" + ",".join(f"{dumps(k)}:{dumps(v)}" for k, v in value) + "}"
    if isinstance(value, dict):
        items = (f"{dumps(k)}:{dumps(v)}" for k, v in sorted(value.items()))
        return "{" + ",".join(items) + "}"
    if isinstance(value, list):
        return "[" + ",".join(dumps(v) for v in value) + "]"
    return json.dumps(value, ensure_ascii=False)


def _is_text(value: Any) -> bool:
    return isinstance(value, str) and not isinstance(value, Number)


def _trim_span(text: str) -> tuple[int, int]:
    """Where the text folds 1-3 keep starts and ends (rust/normalize.rs `trim_span`)."""
    blank = SPACES + LINE_BREAKS
    text = text.rstrip(blank)
    first = len(text) - len(text.lstrip(blank))
    start = max(text.rfind(c, 0, first) for c in LINE_BREAKS) + 1
    rest = text[start:]
    indent = len(rest) - len(rest.lstrip(SPACES))
    if 0 < indent <= 3 and not any(c in rest for c in LINE_BREAKS):
        start += indent
    return start, len(text)


def normalize_parts(texts: list[str]) -> tuple[list[str], str, str]:
    """Reference for rust/normalize.rs `normalize_parts`: the parts joined by a line break and
    normalized, cut where each part ends; joined without a separator; joined by a blank line."""
    lines = "\n".join(texts)
    out = normalize(lines)
    start, end = _trim_span(lines)
    # Folds never remove, change or add a line break inside the kept span.
    breaks = [m.span() for m in _LINES.finditer(lines, start, end)]
    out_breaks = [m.span() for m in _LINES.finditer(out)]
    assert len(breaks) == len(out_breaks)
    parts, begin, at = [], 0, 0
    for text in texts[:-1]:
        at += len(text)
        if at < start:
            cut, kept = 0, False
        elif at >= end:
            cut, kept = len(out), False
        else:
            j = next(j for j, (a, b) in enumerate(breaks) if a <= at < b)
            cut, kept = out_breaks[j][0] + at - breaks[j][0], True
        parts.append(out[begin:cut])
        begin = cut + kept
        at += 1
    parts.append(out[begin:])
    return parts, normalize("".join(texts)), normalize("\n\n".join(texts))


def _by_key(members: Members) -> tuple[Members, bool]:
    """Members in key order (a stable sort) and whether a key repeats."""
    ordered = Members(sorted(members, key=lambda kv: kv[0]))
    return ordered, any(a[0] == b[0] for a, b in itertools.pairwise(ordered))


def _repeats(members: Members) -> bool:
    return len({k for k, _ in members}) < len(members)


def _items(items: list[Any], by_key: bool, normalized: bool) -> Any:
    """Mirror of the Rust `write_items`: a content array (parts keep their member order) or an
    `input` array (items in key order); at level "normalized" its strings normalized one by one
    and its objects' text parts as one text."""

    def obj(item: Members, text: Any) -> Members:
        members = _by_key(item)[0] if by_key else item
        return Members((k, text(v) if k == "text" and _is_text(v) else v) for k, v in members)

    def array(strings: Any, text: Any) -> list[Any]:
        return [
            obj(item, text)
            if isinstance(item, Members)
            else strings(item)
            if _is_text(item)
            else item
            for item in items
        ]

    def same(value: Any) -> Any:
        return value

    if not normalized or any(isinstance(i, Members) and _repeats(i) for i in items):
        return array(same, same)
    texts = [t for i in items if isinstance(i, Members) and _is_text(t := i.get("text"))]
    if len(texts) < 2:
        return array(normalize, normalize)
    parts, unseparated, paragraphs = normalize_parts(texts)
    rest = iter(parts)
    joined = array(normalize, lambda _: next(rest))
    return Members([("parts", joined), ("joined", [unseparated, paragraphs])])


def _message(message: Members, normalized: bool) -> Members:
    members, repeated = _by_key(message)
    normalized = normalized and not repeated
    out = Members()
    for k, v in members:
        if normalized and k == "content" and _is_text(v):
            v = normalize(v)
        elif normalized and k == "content" and isinstance(v, list):
            v = _items(v, by_key=False, normalized=True)
        out.append((k, v))
    return out


def _is_assistant(message: Any) -> bool:
    return isinstance(message, Members) and message.get("role") == "assistant"


def canonical_value(request: Members, level: str = "exact") -> Members:
    """The request with transport fields dropped, the members of the request and of each
    message in key order, and at level "normalized" text normalized."""
    members, repeated = _by_key(request)
    normalized = level == "normalized" and not repeated
    out = Members()
    for k, v in members:
        if k in TRANSPORT_FIELDS:
            continue
        if k == "messages" and isinstance(v, list):
            # A trailing assistant message (a prefill) keys as written.
            last = len(v) - 1
            v = [
                _message(m, normalized and not (i == last and _is_assistant(m)))
                if isinstance(m, Members)
                else m
                for i, m in enumerate(v)
            ]
        elif k == "input" and _is_text(v) and normalized:
            # A completions prompt keys as written: it is continued from its last character.
            v = normalize(v)
        elif k == "input" and isinstance(v, list):
            v = _items(v, by_key=True, normalized=normalized)
        out.append((k, v))
    return out


def canonical(body: bytes, *, level: str = "exact") -> bytes:
    """Reference for `router.canonical`: json.loads keeping number literals and member order,
    compact JSON."""
    request = loads_literal(body)
    if not isinstance(request, Members):
        raise ValueError("request body must be a JSON object")
    return dumps(canonical_value(request, level)).encode()


def fingerprint(body: bytes, *, namespace: str = "", level: str = "exact") -> bytes:
    """A reference key of the same cost shape (hashlib blake2b-128; Rust uses xxh3-128)."""
    header = f"router-fp/5\n{level}\n{len(namespace.encode())}:{namespace}\n".encode()
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
    plus the prompt text outside the messages (tools, functions, response format, vLLM's
    documents and template arguments, a prediction; a completions suffix)."""
    request = loads(body)
    extra = sum(
        _count_json(request[field], enc)
        for field in (
            "tools",
            "functions",
            "response_format",
            "tool_choice",
            "documents",
            "chat_template_kwargs",
            "prediction",
        )
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
            suffix = _count_json(request["suffix"], enc) if "suffix" in request else 0
            return _count_texts(request[field], enc) + suffix
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
