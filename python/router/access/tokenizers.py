"""Exact prompt counts for models with a Hugging Face tokenizer ([tokenizers] in config)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import msgspec

from router.config import TokenizerConfig
from router.errors import ConfigError
from router.native import ChatTemplate, HfTokenizer, NativeError


class _Part(msgspec.Struct):
    text: str | None = None


class _Message(msgspec.Struct):
    content: str | list[_Part] | None = None


class _Chat(msgspec.Struct):
    messages: list[_Message] = []


class _Prompt(msgspec.Struct):
    prompt: str | list[str] | None = None
    input: str | list[str] | None = None


_CHAT = msgspec.json.Decoder(_Chat)
_PROMPT = msgspec.json.Decoder(_Prompt)


class ModelTokenizer:
    """One model's tokenizer and chat template: prompt tokens as its server counts them."""

    __slots__ = ("add_special", "per_message", "template", "tokenizer")

    def __init__(self, name: str, config: TokenizerConfig) -> None:
        try:
            self.tokenizer = HfTokenizer(config.file)
            self.template = None
            if config.chat_template is not None:
                text = Path(config.chat_template).read_text(encoding="utf-8")
                self.template = ChatTemplate(text, config.bos_token, config.eos_token)
        except (NativeError, OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"field `tokenizers.models.{name}`: {exc}") from None
        self.per_message = config.per_message
        self.add_special = config.add_special_tokens

    def count(self, endpoint: str, body: bytes) -> int:
        """Prompt tokens of a request body for this model (NativeError if it cannot read it)."""
        if endpoint.endswith("/chat/completions"):
            if self.template is not None:
                return self.tokenizer.count_chat(
                    self.template, body, add_special_tokens=self.add_special
                )
            try:
                chat = _CHAT.decode(body)
            except msgspec.MsgspecError as exc:
                raise NativeError(str(exc)) from None
            texts = []
            for message in chat.messages:
                if isinstance(message.content, str):
                    texts.append(message.content)
                elif message.content:
                    texts.extend(part.text for part in message.content if part.text)
            counted = sum(self.tokenizer.count_many(texts)) if texts else 0
            return counted + self.per_message * len(chat.messages)
        try:
            prompt = _PROMPT.decode(body)
        except msgspec.MsgspecError as exc:
            raise NativeError(str(exc)) from None
        value = prompt.prompt if prompt.prompt is not None else prompt.input
        items = [value] if isinstance(value, str) else list(value or ())
        return sum(self.tokenizer.count_many(items, add_special_tokens=True)) if items else 0


def load(models: Mapping[str, TokenizerConfig]) -> dict[str, ModelTokenizer]:
    """Every configured tokenizer, loaded once at start-up; errors name the field."""
    return {name: ModelTokenizer(name, config) for name, config in models.items()}
