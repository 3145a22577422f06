//! Python wrapper of request fingerprints.

// Doc comments here become Python docstrings (help()), written for Python readers.
#![allow(clippy::doc_markdown)]

use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::fingerprint::{canonical as canonical_form, fingerprint as key_of, Level};
use crate::json::RequestError;
use crate::py::errors::{request_error, InvalidArgumentError};
use crate::py::normalize::DETACH_MIN_BYTES;
use crate::py::text::Text;

fn level(name: &Text<'_>) -> PyResult<Level> {
    let name = name.get("level")?;
    Level::parse(name).ok_or_else(|| {
        InvalidArgumentError::new_err(format!(
            "level must be \"exact\" or \"normalized\", got {name:?}"
        ))
    })
}

fn run<T: Send>(
    py: Python<'_>,
    body: &[u8],
    f: impl FnOnce() -> Result<T, RequestError> + Send,
) -> PyResult<T> {
    let result = if body.len() >= DETACH_MIN_BYTES {
        py.detach(f)
    } else {
        f()
    };
    result.map_err(request_error)
}

/// The 16-byte cache key of a raw chat/completions/embeddings request body: xxh3-128 over its
/// canonical form and the namespace. Transport-only fields (stream, stream_options, user,
/// metadata, store, service_tier, safety_identifier, prompt_cache_key) are ignored.
#[pyfunction]
#[allow(clippy::needless_pass_by_value)]
#[pyo3(
    signature = (body, *, namespace = Text::Default(""), level = Text::Default("exact")),
    text_signature = "(body, *, namespace=\"\", level=\"exact\")"
)]
fn fingerprint<'py>(
    py: Python<'py>,
    body: &[u8],
    namespace: Text<'_>,
    level: Text<'_>,
) -> PyResult<Bound<'py, PyBytes>> {
    let level = self::level(&level)?;
    let namespace = namespace.get("namespace")?;
    let key = run(py, body, || key_of(body, namespace, level))?;
    Ok(PyBytes::new(py, &key))
}

/// The fingerprint as 32 lowercase hex digits.
#[pyfunction]
#[allow(clippy::needless_pass_by_value)]
#[pyo3(
    signature = (body, *, namespace = Text::Default(""), level = Text::Default("exact")),
    text_signature = "(body, *, namespace=\"\", level=\"exact\")"
)]
fn fingerprint_hex(
    py: Python<'_>,
    body: &[u8],
    namespace: Text<'_>,
    level: Text<'_>,
) -> PyResult<String> {
    let level = self::level(&level)?;
    let namespace = namespace.get("namespace")?;
    let key = run(py, body, || key_of(body, namespace, level))?;
    Ok(format!("{:032x}", u128::from_be_bytes(key)))
}

/// The canonical JSON the fingerprint hashes: the members of the request and of each message
/// in key order, every other object's as written (repeated keys too), no spaces, numbers
/// exactly as written, transport fields dropped; text normalized at level "normalized" (a
/// message's text parts as one text: {"parts": [...], "joined": [...]}).
#[pyfunction]
#[allow(clippy::needless_pass_by_value)]
#[pyo3(
    signature = (body, *, level = Text::Default("exact")),
    text_signature = "(body, *, level=\"exact\")"
)]
fn canonical<'py>(py: Python<'py>, body: &[u8], level: Text<'_>) -> PyResult<Bound<'py, PyBytes>> {
    let level = self::level(&level)?;
    let text = run(py, body, || canonical_form(body, level))?;
    Ok(PyBytes::new(py, text.as_bytes()))
}

/// Register the functions on the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(fingerprint, m)?)?;
    m.add_function(wrap_pyfunction!(fingerprint_hex, m)?)?;
    m.add_function(wrap_pyfunction!(canonical, m)?)
}
