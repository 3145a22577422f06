"""Type stubs for the native extension `router._native` (Rust, pyo3)."""

import os
from os import PathLike
from typing import final

__all__ = [
    "BucketTable",
    "ChatTemplate",
    "ChatTemplateError",
    "HfTokenizer",
    "InvalidArgumentError",
    "NativeError",
    "Prober",
    "RegionHealth",
    "RequestDecodeError",
    "RequestShapeError",
    "TokenizeError",
    "TokenizerLoadError",
    "__version__",
    "canonical",
    "count_request_tokens",
    "count_tokens",
    "encoding_for_model",
    "fingerprint",
    "fingerprint_hex",
    "normalize",
    "preload_tokenizers",
]

__version__: str

class NativeError(Exception):
    """Root of every error raised by router._native."""

class RequestDecodeError(NativeError):
    """The body is not UTF-8 JSON, is nested too deep, or has a number beyond f64's range."""

class RequestShapeError(NativeError):
    """The request body is JSON of the wrong shape, e.g. `messages` is not an array."""

class InvalidArgumentError(NativeError):
    """An argument has an unsupported value, e.g. an unknown encoding or a negative limit."""

class TokenizerLoadError(NativeError):
    """A tokenizer.json file is missing, unreadable, or not a tokenizer; `path` names the file."""

    path: str

class TokenizeError(NativeError):
    """The tokenizer could not encode a text (e.g. no unknown token for a character)."""

class ChatTemplateError(NativeError):
    """A chat template has a syntax error, or rendering failed (e.g. its raise_exception)."""

def normalize(text: str) -> str:
    """Normalize a prompt for the "normalized" cache level (blank space only); idempotent."""

def fingerprint(body: bytes, *, namespace: str = "", level: str = "exact") -> bytes:
    """The 16-byte cache key of a raw request body (xxh3-128 over its canonical form)."""

def fingerprint_hex(body: bytes, *, namespace: str = "", level: str = "exact") -> str:
    """The fingerprint as 32 lowercase hex digits."""

def canonical(body: bytes, *, level: str = "exact") -> bytes:
    """The canonical JSON the fingerprint hashes."""

def count_tokens(text: str, encoding: str) -> int:
    """Tokens in `text` for "cl100k_base", "o200k_base" (exact) or "estimate"."""

def encoding_for_model(model: str) -> str:
    """The encoding name for a model ("o200k_base", "cl100k_base" or "estimate")."""

def count_request_tokens(body: bytes, encoding: str) -> int:
    """Prompt tokens of a raw chat/completions/embeddings request body."""

def preload_tokenizers() -> None:
    """Build the cl100k/o200k tokenizers now instead of on first use."""

@final
class HfTokenizer:
    """A Hugging Face tokenizer.json (the Rust tokenizers crate), loaded once from a path."""

    def __new__(cls, path: str | os.PathLike[str]) -> HfTokenizer: ...
    @property
    def path(self) -> str:
        """The file the tokenizer was loaded from."""
    @property
    def vocab_size(self) -> int:
        """Size of the vocabulary, added tokens included."""
    def count(self, text: str, *, add_special_tokens: bool = False) -> int:
        """Number of tokens in `text`, as len(tokenizers.Tokenizer.encode(text).ids)."""
    def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        """Token ids of `text`, as tokenizers.Tokenizer.encode(text).ids."""
    def count_many(self, texts: list[str], *, add_special_tokens: bool = False) -> list[int]:
        """Number of tokens of each text, in order, with the GIL released once."""
    def count_chat(
        self,
        template: ChatTemplate,
        body: bytes,
        *,
        add_generation_prompt: bool = True,
        add_special_tokens: bool = False,
    ) -> int:
        """Prompt tokens of a chat/messages/responses request body rendered with `template`."""
    def token_to_id(self, token: str) -> int | None:
        """The id of `token` in the vocabulary or the added tokens, or None."""

@final
class ChatTemplate:
    """A model's Jinja chat template compiled once, rendered as transformers renders it."""

    def __new__(cls, template: str, bos_token: str = "", eos_token: str = "") -> ChatTemplate: ...
    def render(self, body: bytes, add_generation_prompt: bool = True) -> str:
        """The prompt text of a chat/messages/responses request body or a messages array."""
    @property
    def bos_token(self) -> str:
        """The BOS token string given at construction."""

@final
class BucketTable:
    """Per-key requests and tokens buckets on a monotonic clock, behind sharded locks."""

    def __new__(cls, *, shards: int = 64) -> BucketTable: ...
    def set_limits(
        self,
        key: str,
        *,
        requests_per_minute: float,
        tokens_per_minute: float,
        request_burst: float | None = None,
        token_burst: float | None = None,
    ) -> None:
        """Add a key with full buckets, or change its limits keeping its levels."""
    def try_acquire(self, key: str, tokens: int = 0) -> tuple[bool, float, int, int, float, float]:
        """Take 1 request + `tokens` from both buckets or neither; KeyError if unknown."""
    def reconcile(self, key: str, reserved: int, actual: int) -> None:
        """Give back `reserved - actual` tokens, or take the excess (may go into debt)."""
    def refund(self, key: str, requests: int = 1, tokens: int = 0) -> None:
        """Give back requests and tokens acquired but not used."""
    def expire_idle(self, idle_seconds: float) -> int:
        """Drop keys full and untouched for `idle_seconds`; returns how many."""
    def __len__(self) -> int: ...

@final
class RegionHealth:
    """One region's health at the moment of `Prober.snapshot()`."""

    @property
    def name(self) -> str: ...
    @property
    def url(self) -> str: ...
    @property
    def probe_path(self) -> str:
        """The request path of the next probe (base URL prefix included)."""
    @property
    def healthy(self) -> bool: ...
    @property
    def probed(self) -> bool: ...
    @property
    def ejected(self) -> bool: ...
    @property
    def ejected_for_s(self) -> float: ...
    @property
    def ejected_until(self) -> float | None: ...
    @property
    def ewma_rtt_s(self) -> float | None: ...
    @property
    def rtt_p50_s(self) -> float | None: ...
    @property
    def rtt_p95_s(self) -> float | None: ...
    @property
    def ewma_ttft_s(self) -> float | None: ...
    @property
    def ttft_p50_s(self) -> float | None: ...
    @property
    def ttft_p95_s(self) -> float | None: ...
    @property
    def ewma_total_s(self) -> float | None: ...
    @property
    def ewma_connect_s(self) -> float | None: ...
    @property
    def consecutive_failures(self) -> int: ...
    @property
    def passive_failures(self) -> int: ...
    @property
    def ejections(self) -> int: ...
    @property
    def last_error(self) -> str | None: ...
    @property
    def probes(self) -> int: ...
    @property
    def probe_failures(self) -> int: ...
    @property
    def passive_reports(self) -> int: ...
    @property
    def last_probe_age_s(self) -> float | None: ...
    @property
    def ttft_age_s(self) -> float | None: ...
    @property
    def available(self) -> bool:
        """Healthy by active probes and not ejected by passive outcomes."""

@final
class Prober:
    """Health prober: probes every region on its own thread; takes passive reports."""

    def __new__(
        cls,
        *,
        interval_s: float = 1.0,
        jitter: float = 0.1,
        timeout_s: float = 0.8,
        path: str = "/health",
        fallback_path: str = "/v1/models",
        expected_statuses: list[int] = ...,
        healthy_after: int = 2,
        unhealthy_after: int = 2,
        ewma_alpha: float = 0.3,
        window: int = 64,
        eject_after: int = 5,
        base_ejection_s: float = 5.0,
        max_ejection_s: float = 60.0,
        ca_file: str | PathLike[str] | None = None,
    ) -> Prober:
        """Settings as keywords (times in seconds, at most 86400); https regions trust the
        system store plus `ca_file` (PEM). A bad value: ValueError naming it."""
    def configure(
        self,
        *,
        interval_s: float = 1.0,
        jitter: float = 0.1,
        timeout_s: float = 0.8,
        path: str = "/health",
        fallback_path: str = "/v1/models",
        expected_statuses: list[int] = ...,
        healthy_after: int = 2,
        unhealthy_after: int = 2,
        ewma_alpha: float = 0.3,
        window: int = 64,
        eject_after: int = 5,
        base_ejection_s: float = 5.0,
        max_ejection_s: float = 60.0,
        ca_file: str | PathLike[str] | None = None,
    ) -> None:
        """Replace the probe settings (hot reload); regions and their history are kept."""
    def start(self) -> None:
        """Start the probe thread (idempotent)."""
    def stop(self) -> None:
        """Stop probing and join the thread (idempotent; also done on garbage collection)."""
    @property
    def running(self) -> bool: ...
    def upsert_region(self, name: str, url: str, path: str | None = None) -> None:
        """Add a region or change its URL (history reset) or own probe path (no 404 fallback)."""
    def remove_region(self, name: str) -> bool:
        """Stop probing a region and forget it; False if it was unknown."""
    def regions(self) -> list[str]:
        """Names of the regions in the table, sorted."""
    def report(
        self,
        region: str,
        outcome: str,
        connect_s: float | None = None,
        ttft_s: float | None = None,
        total_s: float | None = None,
    ) -> bool:
        """Record one proxied attempt's outcome; True if this report ejected the region."""
    def snapshot(self) -> list[RegionHealth]:
        """Every region's health now, sorted by name."""
    def routing_view(
        self,
    ) -> list[tuple[str, bool, bool, float | None, float | None, float | None]]:
        """Per-request routing inputs, sorted by name: (name, available, healthy, ewma_rtt_s,
        ewma_ttft_s, ttft_age_s). Cheaper than snapshot(): no latency quantiles.
        """
    def take_events(self) -> list[tuple[str, str, float, str | None]]:
        """Health transitions since the last call: (region, transition, unix time, detail)."""
