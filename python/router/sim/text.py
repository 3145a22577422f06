"""Deterministic completions: the token sequence is a pure function of model + prompt."""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from typing import Any

import msgspec

_VOCABULARY = (
    "the a of to and in is it that for on with as was at by an be this from or are have not "
    "region router stream token cache model prompt latency edge request answer failover "
    "quiet river stone light paper window garden cloud signal bridge harbor lantern meadow "
    "north south east west early late small large bright dark swift slow calm brave "
    "runs holds keeps turns reads writes finds moves waits sends builds opens closes "
    "today again always never often soon here there inside outside between across"
)
_WORDS = _VOCABULARY.split()
_ENCODE = msgspec.json.Encoder()
MIN_TOKENS = 12
MAX_TOKENS = 60


def _seed(parts: Any) -> bytes:
    return hashlib.sha256(_ENCODE.encode(parts)).digest()


def _tokens(seed: bytes) -> list[str]:
    """The full sequence for a seed: MIN..MAX word tokens, a leading space on all but the first."""
    stream = hashlib.shake_256(seed).digest(2 * (MAX_TOKENS + 1))
    count = MIN_TOKENS + stream[0] % (MAX_TOKENS - MIN_TOKENS + 1)
    words = [_WORDS[stream[1 + i] % len(_WORDS)] for i in range(count)]
    words[0] = words[0].capitalize()
    words[-1] += "."
    return [words[0], *(" " + w for w in words[1:])]


def _message_key(message: Any) -> list[Any]:
    """Only role and content count, so a re-encoded copy of a message seeds the same text."""
    if isinstance(message, dict):
        return [message.get("role"), message.get("content")]
    return [None, message]


def chat_tokens(
    model: str, messages: Sequence[Any], *, continues: bool = True
) -> tuple[list[str], int]:
    """(tokens to emit, prefill length): a trailing assistant prefill that is a prefix of the
    sequence for the earlier messages continues that sequence instead of starting a new one
    (unless not `continues`: then every message is a turn, and a new one follows)."""
    if messages and continues:
        last = messages[-1]
        if isinstance(last, dict) and last.get("role") == "assistant":
            prefill = last.get("content")
            if isinstance(prefill, str):
                full = _tokens(_seed([model, [_message_key(m) for m in messages[:-1]]]))
                if "".join(full).startswith(prefill):
                    return continuation(full, len(prefill)), len(prefill)
    return _tokens(_seed([model, [_message_key(m) for m in messages]])), 0


def full_chat_text(model: str, messages: Sequence[Any]) -> str:
    """The whole text a chat request without prefill produces (for tests of resume)."""
    return "".join(_tokens(_seed([model, [_message_key(m) for m in messages]])))


def continuation(tokens: Sequence[str], prefix_len: int) -> list[str]:
    """The tokens after the first `prefix_len` characters; a token cut by the prefix keeps its
    remaining part."""
    out: list[str] = []
    pos = 0
    for tok in tokens:
        end = pos + len(tok)
        if end > prefix_len:
            out.append(tok[max(0, prefix_len - pos) :])
        pos = end
    return out


def stopped(tokens: Sequence[str], stops: Sequence[str]) -> tuple[list[str], str | None]:
    """The tokens a server streams before the first of `stops` completes in their text, and
    which one did (None: none): the token completing it is cut where that stop string began
    (dropped if it began in an earlier token, which went out as it came: nothing held back)."""
    text = ""
    for i, tok in enumerate(tokens):
        before = len(text)
        text += tok
        found = sorted((text.find(stop), stop) for stop in stops if stop and stop in text)
        if found:
            start, stop = found[0]
            cut = tok[: max(0, start - before)]
            return [*tokens[:i], *([cut] if cut else [])], stop
    return list(tokens), None


def completion_tokens(model: str, prompt: Any) -> list[str]:
    """The sequence for a legacy completions prompt; a text prompt that is an earlier one
    followed by the start of that one's own sequence (a cut stream carried on elsewhere) gets
    the rest of it, as a model reading its own words back would go on."""
    if isinstance(prompt, str):
        rest = _carried_on(model, prompt)
        if rest is not None:
            return rest
    return _tokens(_seed([model, prompt]))


# The most characters a sequence has (MAX_TOKENS words of the vocabulary, with spaces).
_MAX_TEXT = MAX_TOKENS * (1 + max(len(w) for w in _WORDS)) + 1


def _carried_on(model: str, prompt: str) -> list[str] | None:
    """The rest of the sequence of the prompt that `prompt` carries on, if it does: a sequence
    starts with its one capitalized word, so only those places are tried."""
    for cut in range(len(prompt) - 2, max(-1, len(prompt) - _MAX_TEXT - 1), -1):
        if not prompt[cut].isupper():
            continue
        tokens = _tokens(_seed([model, prompt[:cut]]))
        said = prompt[cut:]
        whole = "".join(tokens)
        if whole.startswith(said) and len(said) < len(whole):
            return continuation(tokens, len(said))
    return None


def count_prompt_tokens(parts: Any) -> int:
    """A stable stand-in for a tokenizer: whitespace words in every string, 1 per int."""
    if isinstance(parts, str):
        return len(parts.split())
    if isinstance(parts, int):
        return 1
    if isinstance(parts, dict):
        return sum(count_prompt_tokens(v) for k, v in parts.items() if k in ("content", "text"))
    if isinstance(parts, list | tuple):
        return sum(count_prompt_tokens(p) for p in parts)
    return 0


def embedding(model: str, text: Any, dims: int) -> list[float]:
    """A unit vector determined by model + input."""
    raw = hashlib.shake_256(_ENCODE.encode([model, text])).digest(4 * dims)
    values = [v / 2**31 - 1.0 for v in struct.unpack(f"<{dims}I", raw)]
    norm = sum(v * v for v in values) ** 0.5 or 1.0
    return [v / norm for v in values]
