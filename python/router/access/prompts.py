"""Responses and Messages requests as the chat request a server renders them to, for counting.

vLLM and llama.cpp's server turn both APIs into chat messages and apply the model's chat
template to those; the router counts their prompts the same way, with the chat counters:
instructions / system first, then each input item or message, content blocks as text parts
(images by the image rule), tool calls and their results as the chat tool messages.
"""

from __future__ import annotations

from typing import Any

import msgspec

_ENCODE = msgspec.json.Encoder()
# Content part types that carry text, in either API.
_TEXT_PARTS = frozenset({"text", "input_text", "output_text", "refusal", "summary_text"})


def _is_text(kind: object) -> bool:
    """Whether a content part's `type` (anything a client sent) names a text part."""
    return isinstance(kind, str) and kind in _TEXT_PARTS


def _text_of(parts: list[Any]) -> str | None:
    """The parts' text joined, when every part is text (else None: keep the parts)."""
    texts = []
    for part in parts:
        if not isinstance(part, dict) or not _is_text(part.get("type")):
            return None
        value = part.get("text", part.get("refusal"))
        if not isinstance(value, str):
            return None
        texts.append(value)
    return "".join(texts)


def _content(value: Any) -> Any:
    """A message content as chat content: a string, or parts (text parts, images)."""
    if isinstance(value, str) or value is None:
        return value
    if isinstance(value, list):
        text = _text_of(value)
        if text is not None:
            return text
        out: list[Any] = []
        for part in value:
            if not isinstance(part, dict):
                continue
            kind = part.get("type")
            if _is_text(kind):
                out.append({"type": "text", "text": part.get("text") or part.get("refusal") or ""})
            elif kind in ("input_image", "image"):
                detail = part.get("detail")
                out.append({"type": "image_url", "image_url": {"detail": detail or "auto"}})
            elif kind in ("input_file", "document"):
                out.append(_file(part))
            elif kind == "tool_result":
                out.append({"type": "text", "text": _flat(part.get("content"))})
            else:
                out.append(part)  # counted as its JSON
        return out
    return _flat(value)


def _flat(value: Any) -> str:
    """Any content as one string (tool outputs, unknown items)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        text = _text_of(value)
        if text is not None:
            return text
    return _ENCODE.encode(value).decode() if value is not None else ""


def _file(part: dict[str, Any]) -> dict[str, Any]:
    """A file or document part as chat's `file` part (counted at most an image's worth), or
    the text of an Anthropic document whose source is plain text."""
    source = part.get("source")
    if isinstance(source, dict) and source.get("type") == "text":
        return {"type": "text", "text": _flat(source.get("data"))}
    return {"type": "file", "file": {k: v for k, v in part.items() if k != "type"}}


def _variables(values: dict[str, Any]) -> list[Any]:
    """A prompt template's variables as content parts: text as text, an image or file part as
    itself (counted by its rule, not its bytes)."""
    parts: list[Any] = []
    for value in values.values():
        content = _content([value]) if isinstance(value, dict) and value.get("type") else None
        if isinstance(content, list):
            parts.extend(content)
        else:
            parts.append({"type": "text", "text": content or _flat(value)})
    return parts


def _responses_messages(decoded: Any) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    instructions = decoded.instructions
    if instructions:
        messages.append({"role": "system", "content": _flat(instructions)})
    # A prompt template's variables are rendered into its messages: counted as their text.
    template = decoded.prompt
    if isinstance(template, dict) and isinstance(template.get("variables"), dict):
        messages.append({"role": "user", "content": _variables(template["variables"])})
    items = decoded.input
    if isinstance(items, str):
        return [*messages, {"role": "user", "content": items}]
    for item in items or ():
        if not isinstance(item, dict):
            continue
        kind = item.get("type", "message")
        if kind == "message" or ("role" in item and "content" in item):
            role = item.get("role", "user")
            messages.append({"role": role, "content": _content(item.get("content"))})
        elif kind == "function_call":
            call = {"name": item.get("name", ""), "arguments": item.get("arguments", "")}
            messages.append({"role": "assistant", "tool_calls": [{"function": call}]})
        elif kind == "function_call_output":
            messages.append({"role": "tool", "content": _flat(item.get("output"))})
        else:
            messages.append({"role": "user", "content": _flat(item)})
    return messages


def _anthropic_messages(decoded: Any) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    if decoded.system:
        messages.append({"role": "system", "content": _flat(decoded.system)})
    for message in decoded.messages:
        content = message.content
        if isinstance(content, list):
            # One pass, by type (comparing blocks by value made this quadratic in the blocks).
            calls: list[Any] = []
            results: list[Any] = []
            rest: list[Any] = []
            for block in content:
                kind = block.get("type") if isinstance(block, dict) else None
                (
                    calls if kind == "tool_use" else results if kind == "tool_result" else rest
                ).append(block)
            for result in results:
                messages.append({"role": "tool", "content": _flat(result.get("content"))})
            if rest or not (calls or results):
                entry: dict[str, Any] = {"role": message.role, "content": _content(rest)}
                messages.append(entry)
            if calls:
                tool_calls = [
                    {"function": {"name": c.get("name", ""), "arguments": _flat(c.get("input"))}}
                    for c in calls
                ]
                messages.append({"role": "assistant", "tool_calls": tool_calls})
        else:
            messages.append({"role": message.role, "content": content})
    return messages


def chat_view(decoded: Any, anthropic: bool, body: bytes) -> bytes:
    """The chat request body a Responses (or, with `anthropic`, Messages) request renders as:
    its messages, and its tools and output schema (counted as their JSON)."""
    messages = _anthropic_messages(decoded) if anthropic else _responses_messages(decoded)
    view: dict[str, Any] = {"model": decoded.model, "messages": messages}
    extras = msgspec.json.decode(body)
    if isinstance(extras, dict):
        if extras.get("tools"):
            view["tools"] = extras["tools"]
        text = extras.get("text")
        if isinstance(text, dict) and isinstance(text.get("format"), dict):
            view["response_format"] = text["format"]
    return _ENCODE.encode(view)
