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

create_exception!(
    _native,
    RequestDecodeError,
    NativeError,
    "The request body is not valid UTF-8 JSON, is nested too deep, or has an out-of-range number."
);

create_exception!(
    _native,
    RequestShapeError,
    NativeError,
    "The request body is JSON of the wrong shape, e.g. `messages` is not an array."
);

create_exception!(
    _native,
    InvalidArgumentError,
    NativeError,
    "An argument has an unsupported value, e.g. an unknown encoding or a negative limit."
);

create_exception!(
    _native,
    TokenizerLoadError,
    NativeError,
    "A tokenizer.json file is missing, unreadable, or not a tokenizer; `path` names the file."
);

create_exception!(
    _native,
    TokenizeError,
    NativeError,
    "The tokenizer could not encode a text (e.g. no unknown token for a character)."
);

create_exception!(
    _native,
    ChatTemplateError,
    NativeError,
    "A chat template has a syntax error, or rendering failed (e.g. its raise_exception)."
);

/// Register the exception classes on the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("NativeError", py.get_type::<NativeError>())?;
    m.add("RequestDecodeError", py.get_type::<RequestDecodeError>())?;
    m.add("RequestShapeError", py.get_type::<RequestShapeError>())?;
    m.add(
        "InvalidArgumentError",
        py.get_type::<InvalidArgumentError>(),
    )?;
    m.add("TokenizerLoadError", py.get_type::<TokenizerLoadError>())?;
    m.add("TokenizeError", py.get_type::<TokenizeError>())?;
    m.add("ChatTemplateError", py.get_type::<ChatTemplateError>())?;
    Ok(())
}

/// The Python exception for a rejected request body.
pub fn request_error(err: crate::json::RequestError) -> PyErr {
    match err {
        crate::json::RequestError::Decode(m) => RequestDecodeError::new_err(m),
        crate::json::RequestError::Shape(m) => RequestShapeError::new_err(m),
    }
}
