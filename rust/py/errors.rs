//! The exception hierarchy raised by the native module.

use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;

create_exception!(
    _native,
    NativeError,
    PyException,
    "Root of every error raised by router._native."
);

/// Register the exception classes on the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("NativeError", py.get_type::<NativeError>())?;
    Ok(())
}
