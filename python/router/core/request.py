"""Reading and validating a client request body: size cap, content type, decode, model lookup."""

from __future__ import annotations

import asyncio
import json
import re
from itertools import accumulate
from typing import Any

import msgspec
from aiohttp import web

from router.errors import ApiError, InvalidRequest, PayloadTooLarge

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
EMBEDDINGS = "/v1/embeddings"
RESPONSES = "/v1/responses"
MESSAGES = "/v1/messages"
# Prompt token counts, answered by a region (nothing generated).
INPUT_TOKENS = "/v1/responses/input_tokens"
COUNT_TOKENS = "/v1/messages/count_tokens"


class UnsupportedMediaType(ApiError):
    """415: the body is not JSON."""

    status = 415
    type = "invalid_request_error"
    code = "unsupported_media_type"


class RequestTimeout(ApiError):
    """408: the client did not send its body in time."""

    status = 408
    type = "invalid_request_error"
    code = "request_timeout"


class _StreamOptions(msgspec.Struct):
    include_usage: bool | None = None


class _Message(msgspec.Struct):
    role: str
    # Text or a list of content parts; None is legal for assistant tool-call messages.
    content: str | list[dict[str, Any]] | None = None


class _Chat(msgspec.Struct):
    model: str
    messages: list[_Message]
    stream: bool | None = None
    stream_options: _StreamOptions | None = None
    # Read laxly (see whole_number), as a region's parser would.
    max_tokens: Any = None
    max_completion_tokens: Any = None
    n: Any = None
    best_of: Any = None
    # llama.cpp's server's own `n`, read before it.
    n_cmpl: Any = None
    # Decoded here so a number no float holds (1e999) is a 400 now, not a 500 later.
    temperature: Any = None


class _Completion(msgspec.Struct):
    model: str
    # str | list[str] | list[int] | list[list[int]]; msgspec allows one array type in a union,
    # so the elements are checked by hand.
    prompt: str | list[Any]
    stream: bool | None = None
    stream_options: _StreamOptions | None = None
    max_tokens: Any = None
    n: Any = None
    best_of: Any = None
    n_cmpl: Any = None
    echo: Any = None
    temperature: Any = None


class _Embedding(msgspec.Struct):
    model: str
    input: str | list[Any]


class _Responses(msgspec.Struct):
    """OpenAI's Responses API request (the fields the router acts on)."""

    model: str
    # A string, or a list of input items (messages, function calls and their outputs, ...).
    input: str | list[Any] | None = None
    instructions: Any = None
    stream: bool | None = None
    max_output_tokens: Any = None
    temperature: Any = None
    # State kept by the region: stored responses (the default), chains, conversations, jobs.
    store: bool | None = None
    background: bool | None = None
    previous_response_id: str | None = None
    conversation: Any = None
    # A prompt template kept by the provider (its id, version, variables).
    prompt: Any = None


class _AnthropicMessage(msgspec.Struct):
    role: str
    # Text or a list of content blocks (text, image, tool_use, tool_result, ...).
    content: str | list[dict[str, Any]]


class _Messages(msgspec.Struct):
    """Anthropic's Messages API request (the fields the router acts on)."""

    model: str
    messages: list[_AnthropicMessage]
    # Required by the Messages API: the completion budget is always known.
    max_tokens: Any
    system: str | list[dict[str, Any]] | None = None
    stream: bool | None = None
    temperature: Any = None


class _MessagesCount(msgspec.Struct):
    """Anthropic's count_tokens request: a Messages request without its budget."""

    model: str
    messages: list[_AnthropicMessage]
    system: str | list[dict[str, Any]] | None = None
    max_tokens: Any = None
    stream: bool | None = None


_DECODERS: dict[str, msgspec.json.Decoder[Any]] = {
    CHAT: msgspec.json.Decoder(_Chat),
    COMPLETIONS: msgspec.json.Decoder(_Completion),
    EMBEDDINGS: msgspec.json.Decoder(_Embedding),
    RESPONSES: msgspec.json.Decoder(_Responses),
    MESSAGES: msgspec.json.Decoder(_Messages),
    INPUT_TOKENS: msgspec.json.Decoder(_Responses),
    COUNT_TOKENS: msgspec.json.Decoder(_MessagesCount),
}
_RAW_OBJECT = msgspec.json.Decoder(dict[str, msgspec.Raw])
_ENCODER = msgspec.json.Encoder()
_AT = re.compile(r"^(?P<what>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.S)
_MISSING = re.compile(r"missing required field `(?P<name>[^`]+)`")


class ParsedRequest(msgspec.Struct, frozen=True, kw_only=True):
    """A validated request: the bytes to forward and the few fields the router acts on."""

    endpoint: str
    # The model the client named, and the name regions know it by (differs for an alias).
    model: str
    upstream_model: str = ""
    body: bytes
    stream: bool = False
    include_usage: bool = False
    # The decoded body (a _Chat/_Completion/_Embedding/...), for features that need the prompt.
    decoded: Any = None
    # Responses API: the request reads or writes state only its region holds (a stored
    # response, a chain, a conversation, a background job): never cached.
    stateful: bool = False
    # The stored response it continues from (previous_response_id): it goes to that region.
    state_ref: str | None = None
    # Stored items its input refers to (`item_reference`), each distinct id once (at most
    # MAX_ITEM_REFERENCES): it goes to the region holding them (after state_ref's).
    state_items: tuple[str, ...] = ()

    def with_model(self, upstream_model: str) -> ParsedRequest:
        """A copy whose forwarded body names `upstream_model`; other fields stay byte-identical."""
        if upstream_model == self.model:
            if upstream_model == self.upstream_model:
                return self  # frozen: nothing to copy
            return msgspec.structs.replace(self, upstream_model=upstream_model)
        fields = _RAW_OBJECT.decode(self.body)
        fields["model"] = msgspec.Raw(_ENCODER.encode(upstream_model))
        return msgspec.structs.replace(
            self, upstream_model=upstream_model, body=_ENCODER.encode(fields)
        )

    def as_model(self, model: str) -> ParsedRequest:
        """The same request asked of another model (a fallback): body and fields name it."""
        fields = _RAW_OBJECT.decode(self.body)
        fields["model"] = msgspec.Raw(_ENCODER.encode(model))
        return msgspec.structs.replace(
            self, model=model, upstream_model=model, body=_ENCODER.encode(fields)
        )


def check_content_type(content_type: str | None) -> None:
    """JSON or nothing; anything else is 415."""
    if not content_type:
        return
    media = content_type.partition(";")[0].strip().lower()
    if media == "application/json" or media.endswith("+json"):
        return
    raise UnsupportedMediaType(f"Unsupported content type {media!r}; send application/json.")


async def read_body(request: web.Request, max_bytes: int, within_s: float) -> bytes:
    """The whole body, at most `max_bytes` (else 413), within `within_s` seconds (else 408)."""
    declared = request.content_length
    if declared is not None and declared > max_bytes:
        raise PayloadTooLarge(f"Request body is {declared} bytes; the limit is {max_bytes}.")
    if request.headers.get("Content-Encoding", "identity").strip().lower() != "identity":
        # aiohttp decodes the body: its length is not the declared one, and the limit applies
        # to what it decodes to (a small compressed body may expand a thousandfold).
        declared = None
    if declared == 0:
        return b""
    content = request.content
    try:
        if declared and content.is_eof():
            # Already received whole (the usual small JSON body): no read timeout to arm, and
            # taken from the buffer as it is rather than through readexactly's read loop.
            body = content.read_nowait()
            if len(body) < declared:
                raise asyncio.IncompleteReadError(body, declared)
            return body[:declared] if len(body) > declared else body
        async with asyncio.timeout(within_s):
            if declared is not None:
                return await content.readexactly(declared)
            chunks: list[bytes] = []
            size = 0
            async for chunk in content.iter_any():
                size += len(chunk)
                if size > max_bytes:
                    raise PayloadTooLarge(f"Request body exceeds the limit of {max_bytes} bytes.")
                chunks.append(chunk)
            return b"".join(chunks)
    except TimeoutError:
        raise RequestTimeout(f"Request body not received within {within_s:g} s.") from None
    except asyncio.IncompleteReadError:
        raise InvalidRequest("Request body ended before Content-Length bytes.") from None
    except web.RequestPayloadError:
        raise unreadable_body(request) from None


def unreadable_body(request: web.BaseRequest) -> InvalidRequest:
    """The 400 for a body aiohttp could not read (a Content-Encoding that does not decode, a
    chunk that does not parse). Its parser has stopped, so the connection closes after the
    answer; the body counts as read, so aiohttp does not read on into the same error again."""
    request.content.feed_eof()
    return InvalidRequest(
        "Request body could not be read as sent (its Content-Encoding or chunked framing is "
        "malformed).",
        code="invalid_body",
        close=True,
    )


def _invalid(exc: msgspec.MsgspecError) -> InvalidRequest:
    """A decode/validation error as a 400 naming the offending parameter."""
    text = str(exc)
    match = _AT.match(text)
    assert match is not None  # the pattern matches any string
    path = match["path"]
    missing = _MISSING.search(text)
    param = path.lstrip(".") if path else None
    if missing is not None:
        name = missing["name"]
        param = f"{param}.{name}" if param else name
    if isinstance(exc, msgspec.ValidationError):
        if missing is not None:
            message = f"Invalid request: `{param}` is required."
        else:
            message = f"Invalid request: {match['what']}" + (f" at `{param}`" if param else "")
    elif "UTF-8" in text:
        message = "Request body is not valid UTF-8."
    else:
        message = f"Request body is not valid JSON: {text}"
    return InvalidRequest(message, param=param)


def _shown(value: object, limit: int = 80) -> str:
    """A client's value as an error message quotes it: its repr, cut at `limit` characters (a
    body may hold a megabyte-long one)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# The largest integer a field may hold: servers read these as 64-bit integers (llama.cpp's
# parser refuses more; vLLM's context check does), and the router's arithmetic on them (n
# times max_tokens, plus the prompt) stays printable.
MAX_WHOLE = 2**63 - 1


def whole_number(value: object, param: str, minimum: int = 0) -> int | None:
    """An integer field read the way a lax region parser (pydantic) reads it: 5000, 5000.0,
    5e3 and "5000" are 5000. Anything else (or above MAX_WHOLE) is a 400, never a default: a
    limit must not be dodged by how a number is written."""
    if value is None:
        return None
    number: int | None = None
    if isinstance(value, bool):
        number = None
    elif isinstance(value, int):
        number = value
    elif isinstance(value, float) and value.is_integer():
        number = int(value)
    elif isinstance(value, str):
        digits = value.strip()
        # Past 4,300 digits int() refuses (CPython's guard against quadratic conversion).
        if digits.isascii() and digits.isdigit() and len(digits) <= 4300:
            number = int(digits)
    if number is None or not minimum <= number <= MAX_WHOLE:
        raise InvalidRequest(
            f"`{param}` must be an integer from {minimum} to {MAX_WHOLE}, got {_shown(value)}.",
            param=param,
        )
    return number


# Top-level fields the router acts on: a second copy of one is refused (a region whose parser
# keeps the first value would see another model, limit or stream flag than the router did).
_ACTED = (
    "model",
    "messages",
    "prompt",
    "input",
    "stream",
    "stream_options",
    "max_tokens",
    "max_completion_tokens",
    "n",
    "temperature",
    "user",
    "tools",
    "functions",
    "max_output_tokens",
    "instructions",
    "system",
    "store",
    "background",
    "previous_response_id",
    "conversation",
    # What the cache reads besides (cache.serving: whether an answer may be stored, what
    # else shapes its key): a second copy there would let a region see another request.
    "service_tier",
    "metadata",
    "prompt_cache_key",
    "safety_identifier",
    "mcp_servers",
    "web_search_options",
    "dynatemp_range",
    "samplers",
    "xtc_probability",
    "xtc_threshold",
    "n_cmpl",
)
_ACTED_KEY = re.compile(rb'"(' + b"|".join(k.encode() for k in _ACTED) + rb')"\s*:')
# A key that could spell one of those with an escape (`"str\u0065am":`): only lowercase ASCII,
# `_` and \u00XX escapes of ASCII, at least one escape; split one way only (letters, then the
# first escape), so a long run of escapes costs one linear scan.
_ESCAPE = rb"\\u00[0-7][0-9a-fA-F]"
_ESCAPED_KEY = re.compile(rb'"[a-z_]*' + _ESCAPE + rb"(?:[a-z_]|" + _ESCAPE + rb')*"\s*:')


def _check_duplicates(body: bytes) -> None:
    """400 when a field the router acts on appears twice at the top level."""
    found = _ACTED_KEY.findall(body)
    if len(found) == len(set(found)) and not (b"\\u00" in body and _ESCAPED_KEY.search(body)):
        return  # the usual case: one scan, no second copy anywhere, no key spelled in escapes
    top: list[list[tuple[str, object]]] = []

    def pairs(items: list[tuple[str, object]]) -> dict[str, object]:
        top.append(items)
        return dict(items)

    try:
        # Numbers as text: past 4,300 digits int() refuses what msgspec took (not too deep).
        json.loads(body, object_pairs_hook=pairs, parse_int=str)
    except (RecursionError, ValueError):
        raise InvalidRequest(_TOO_DEEP) from None
    keys = [key for key, _ in top[-1]] if top else []
    for name in _ACTED:
        if keys.count(name) > 1:
            raise InvalidRequest(f"`{name}` is given more than once.", param=name)


def _check_count(count: int, limit: int, param: str) -> None:
    if count > limit:
        raise InvalidRequest(
            f"`{param}` has {count} items; this router accepts at most {limit}.",
            param=param,
            code="too_many_items",
        )


def _check_token_list(value: list[Any], param: str) -> None:
    """Prompt/input lists: all strings, all ints, or all lists of ints."""
    if not value:
        raise InvalidRequest(f"`{param}` must not be empty.", param=param)
    first = value[0]
    if isinstance(first, str):
        ok = all(isinstance(v, str) for v in value)
    elif isinstance(first, int) and not isinstance(first, bool):
        ok = all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    elif isinstance(first, list):
        ok = all(
            isinstance(v, list)
            and v
            and all(isinstance(t, int) and not isinstance(t, bool) for t in v)
            for v in value
        )
    else:
        ok = False
    if not ok:
        raise InvalidRequest(
            f"`{param}` must be a string, a list of strings, a list of token ids or a list of "
            "token-id lists.",
            param=param,
        )


# Deepest nesting of a request body, as the native JSON parser (the cache's fingerprints)
# accepts: a fixed bound, so no later decode of the body (Python's decoders stop at a depth that
# depends on how deep the call stack already is) can fail where parsing it passed.
MAX_DEPTH = 128
_TOO_DEEP = f"Request body is nested deeper than {MAX_DEPTH} levels."
_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_STEP = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}


def nesting(body: bytes) -> int:
    """How deep a valid JSON document nests its arrays and objects (strings stepped over)."""
    skeleton = _JSON_STRING.sub(b"", body).translate(None, _NOT_BRACKETS)
    return max(accumulate(map(_STEP.__getitem__, skeleton)), default=0)


def _check_depth(body: bytes) -> None:
    """400 for a body nested deeper than MAX_DEPTH (counted only when it could be)."""
    if body.count(b"[") + body.count(b"{") > MAX_DEPTH and nesting(body) > MAX_DEPTH:
        raise InvalidRequest(_TOO_DEEP)


# Longest model name a request may give (longer is a 400).
MAX_MODEL_CHARS = 256

# Built once: a `X | Y` written in the isinstance call is a new union object per request.
_TYPED_APIS = _Responses | _Messages
_OPENAI_TEXT = _Chat | _Completion


def parse_body(endpoint: str, body: bytes, *, max_items: int = 2048) -> ParsedRequest:
    """Decode and validate `body` for `endpoint`; 400 with the parameter named on any problem.

    `max_items` caps messages (chat) and prompt/input list items.
    """
    if not body:
        raise InvalidRequest("Request body is empty; expected a JSON object.")
    try:
        decoded = _DECODERS[endpoint].decode(body)
    except msgspec.MsgspecError as exc:
        raise _invalid(exc) from None
    except RecursionError:
        raise InvalidRequest(_TOO_DEEP) from None
    _check_depth(body)
    _check_duplicates(body)
    stream = False
    include_usage = False
    stateful = False
    state_ref: str | None = None
    state_items: tuple[str, ...] = ()
    if endpoint in (INPUT_TOKENS, COUNT_TOKENS):
        # A count: nothing streams, nothing is stored.
        if isinstance(decoded, _MessagesCount):
            _check_messages(decoded, max_items, budget=False)
        elif isinstance(decoded.input, list):
            _check_count(len(decoded.input), max_items, "input")
    elif isinstance(decoded, _TYPED_APIS):
        stream = bool(decoded.stream)
        # Their streams report usage themselves: nothing to ask for, nothing to strip.
        include_usage = stream
        if isinstance(decoded, _Responses):
            _check_responses(decoded, max_items)
            state_ref = decoded.previous_response_id
            refs = item_references(decoded.input)
            if refs is not None:
                state_items = refs
            # A prompt template is the provider's too, and may change under the same id (its
            # variables are text, images and files: no item references).
            stateful = (
                decoded.store is not False
                or bool(decoded.background)
                or state_ref is not None
                or refs is not None
                or decoded.conversation is not None
                or decoded.prompt is not None
            )
        else:
            _check_messages(decoded, max_items)
    elif isinstance(decoded, _Chat):
        if not decoded.messages:
            raise InvalidRequest("`messages` must not be empty.", param="messages")
        _check_count(len(decoded.messages), max_items, "messages")
    elif isinstance(decoded, _Completion):
        if isinstance(decoded.prompt, list):
            _check_count(len(decoded.prompt), max_items, "prompt")
            _check_token_list(decoded.prompt, "prompt")
    elif isinstance(decoded.input, list):
        _check_count(len(decoded.input), max_items, "input")
        _check_token_list(decoded.input, "input")
    if isinstance(decoded, _OPENAI_TEXT):
        # Checked only when given (the usual request gives none of them).
        # A negative length is llama.cpp's server's "no bound" (others refuse it themselves).
        if decoded.max_tokens is not None:
            whole_number(decoded.max_tokens, "max_tokens", minimum=-MAX_WHOLE)
        if decoded.n is not None:
            whole_number(decoded.n, "n", minimum=1)
        if isinstance(decoded, _Chat) and decoded.max_completion_tokens is not None:
            whole_number(decoded.max_completion_tokens, "max_completion_tokens", minimum=-MAX_WHOLE)
        stream = bool(decoded.stream)
        options = decoded.stream_options
        include_usage = stream and options is not None and bool(options.include_usage)
    if not decoded.model:
        raise InvalidRequest("`model` must not be empty.", param="model")
    if len(decoded.model) > MAX_MODEL_CHARS:
        # Echoed in errors, logged, counted: a client's megabyte-long name goes no further.
        raise InvalidRequest(
            f"`model` is {len(decoded.model)} characters long; this router accepts at most "
            f"{MAX_MODEL_CHARS}.",
            param="model",
            code="string_above_max_length",
        )
    return ParsedRequest(
        endpoint=endpoint,
        model=decoded.model,
        upstream_model=decoded.model,
        body=body,
        stream=stream,
        include_usage=include_usage,
        decoded=decoded,
        stateful=stateful,
        state_ref=state_ref,
        state_items=state_items,
    )


# How many distinct stored items one request may refer to. Each is checked for its tenant (a
# local note, else one Redis lookup, MAX_ITEM_LOOKUPS at once): a request past it is a 400,
# never a request with its later references unchecked.
MAX_ITEM_REFERENCES = 256
MAX_ITEM_LOOKUPS = 32


def item_references(items: object) -> tuple[str, ...] | None:
    """The distinct ids of the stored items a Responses input list refers to; None when it
    refers to none. A reference is an item of type `item_reference`, or one with neither a type
    nor a role (the API's ItemReference may leave its type out; every other item without a
    type is a message, which has a role). More than MAX_ITEM_REFERENCES is a 400."""
    if not isinstance(items, list):
        return None
    found: dict[str, None] | None = None
    for item in items:
        if not isinstance(item, dict):
            continue
        kind = item.get("type")
        if kind == "item_reference" or (kind is None and "role" not in item):
            if found is None:
                found = {}
            ref = item.get("id")
            if isinstance(ref, str):
                found[ref] = None
                if len(found) > MAX_ITEM_REFERENCES:
                    raise InvalidRequest(
                        f"`input` refers to more than {MAX_ITEM_REFERENCES} distinct stored "
                        "items; send the items themselves instead.",
                        param="input",
                    )
    return None if found is None else tuple(found)


def _check_responses(decoded: _Responses, max_items: int) -> None:
    if isinstance(decoded.input, list):
        _check_count(len(decoded.input), max_items, "input")
    elif (
        decoded.input is None
        and decoded.previous_response_id is None
        and decoded.conversation is None
        and decoded.prompt is None
    ):
        raise InvalidRequest("`input` is required.", param="input")
    whole_number(decoded.max_output_tokens, "max_output_tokens", minimum=1)


def _check_messages(
    decoded: _Messages | _MessagesCount, max_items: int, *, budget: bool = True
) -> None:
    if not decoded.messages:
        raise InvalidRequest("`messages` must not be empty.", param="messages")
    _check_count(len(decoded.messages), max_items, "messages")
    for i, message in enumerate(decoded.messages):
        if message.role not in ("user", "assistant"):
            raise InvalidRequest(
                f'`messages.{i}.role` must be "user" or "assistant", got {_shown(message.role)}'
                " (a system prompt goes in `system`).",
                param=f"messages.{i}.role",
            )
    if budget:
        whole_number(decoded.max_tokens, "max_tokens", minimum=1)
