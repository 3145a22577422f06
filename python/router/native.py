"""Facade over the compiled extension: the only module that imports `router._native`."""

from router._native import NativeError, Prober, RegionHealth, __version__

__all__ = ["NativeError", "Prober", "RegionHealth", "__version__"]
