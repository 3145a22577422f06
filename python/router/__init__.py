"""router: a multi-region failover router for OpenAI-compatible LLM inference."""

from router.native import NativeError, Prober, RegionHealth, __version__

__all__ = ["NativeError", "Prober", "RegionHealth", "__version__"]
