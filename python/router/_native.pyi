"""Type stubs for the native extension `router._native` (Rust, pyo3)."""

__all__ = ["NativeError", "__version__"]

__version__: str

class NativeError(Exception):
    """Root of every error raised by router._native."""
