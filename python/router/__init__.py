"""router: a multi-region failover router for OpenAI-compatible LLM inference."""

from router.native import NativeError, __version__

__all__ = ["NativeError", "__version__"]
