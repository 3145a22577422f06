//! `str` arguments: one rule for every function of the module. A lone surrogate (a `str` that
//! has no UTF-8) raises `InvalidArgumentError` naming the argument; pyo3's own `&str` and
//! `String` would raise `UnicodeEncodeError` before the function could name it.

use std::path::PathBuf;

use pyo3::exceptions::PyUnicodeEncodeError;
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedStr;
use pyo3::types::PyString;

use crate::py::errors::InvalidArgumentError;

pub fn lone_surrogate(what: &str) -> PyErr {
    InvalidArgumentError::new_err(format!("{what} is not valid Unicode (lone surrogate)"))
}

/// The UTF-8 of a Python string, or a typed error for lone surrogates.
pub fn utf8<'a>(text: &'a Bound<'_, PyString>, what: &str) -> PyResult<&'a str> {
    text.to_str().map_err(|_| lone_surrogate(what))
}

/// The UTF-8 of a Python string as an owned Rust value (it keeps a reference to the immutable
/// str), or a typed error for lone surrogates.
pub fn owned_text(text: Bound<'_, PyString>, what: &str) -> PyResult<PyBackedStr> {
    PyBackedStr::try_from(text).map_err(|_| lone_surrogate(what))
}

/// A `str` or `os.PathLike` argument as a path; a str the file system cannot encode (a lone
/// surrogate) is the same typed error, other failures (a wrong type) are pyo3's.
pub fn path(value: &Bound<'_, PyAny>, what: &str) -> PyResult<PathBuf> {
    value.extract::<PathBuf>().map_err(|e| {
        if e.is_instance_of::<PyUnicodeEncodeError>(value.py()) {
            lone_surrogate(what)
        } else {
            e
        }
    })
}

/// A `str` argument whose UTF-8 is read in the function body with [`Text::get`], so the error
/// names it. `Default` is for signature defaults (`level = Text::Default("exact")`; give the
/// function a `text_signature`, as pyo3 shows such a default as `...`). pyo3 passes it by
/// value: functions taking one allow `clippy::needless_pass_by_value`.
pub enum Text<'py> {
    Py(Bound<'py, PyString>),
    Default(&'static str),
}

impl<'a, 'py> FromPyObject<'a, 'py> for Text<'py> {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        Ok(Self::Py(obj.cast::<PyString>()?.to_owned()))
    }
}

impl Text<'_> {
    /// The argument's UTF-8; `what` names it in the error.
    pub fn get(&self, what: &str) -> PyResult<&str> {
        match self {
            Self::Py(text) => utf8(text, what),
            Self::Default(text) => Ok(text),
        }
    }
}
