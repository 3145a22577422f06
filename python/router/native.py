"""Facade over the compiled extension: the only module that imports `router._native`."""

from router._native import NativeError, __version__

__all__ = ["NativeError", "__version__"]
