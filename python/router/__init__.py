"""router: a multi-region failover router for OpenAI-compatible LLM inference."""

from router.native import (
    BucketTable,
    InvalidArgumentError,
    NativeError,
    Prober,
    RegionHealth,
    RequestDecodeError,
    RequestShapeError,
    __version__,
    canonical,
    count_request_tokens,
    count_tokens,
    encoding_for_model,
    fingerprint,
    fingerprint_hex,
    normalize,
    preload_tokenizers,
)

__all__ = [
    "BucketTable",
    "InvalidArgumentError",
    "NativeError",
    "Prober",
    "RegionHealth",
    "RequestDecodeError",
    "RequestShapeError",
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
