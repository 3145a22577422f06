//! Python wrapper of prompt normalization.

// Doc comments here become Python docstrings (help()), written for Python readers.
#![allow(clippy::doc_markdown)]

use pyo3::prelude::*;
use pyo3::types::PyString;

use crate::normalize::normalize as normalize_text;
use crate::py::text::utf8;

/// Inputs at least this long are processed with the GIL released; shorter ones finish before
/// releasing it would pay off.
pub const DETACH_MIN_BYTES: usize = 1024;

/// Normalize a prompt for the "normalized" cache level: only blank space is folded (trailing
/// blank space, leading blank lines, up to 3 leading spaces of a one-line text, runs of Unicode
/// spaces between two visible characters of a prose line to one space). Case, digits,
/// punctuation, every other character, line breaks, indentation and code are kept, and so is
/// blank space at a line's end or beside a tab, from the line of the first quote mark on, and in
/// space-aligned paragraphs. Idempotent.
#[pyfunction]
fn normalize(py: Python<'_>, text: &Bound<'_, PyString>) -> PyResult<String> {
    let text = utf8(text, "text")?;
    if text.len() >= DETACH_MIN_BYTES {
        Ok(py.detach(|| normalize_text(text)))
    } else {
        Ok(normalize_text(text))
    }
}

/// Register the functions on the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(normalize, m)?)
}
