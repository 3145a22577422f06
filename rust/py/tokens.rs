//! Python wrapper of token counting.

// Doc comments here become Python docstrings (help()), written for Python readers.
#![allow(clippy::doc_markdown)]

use pyo3::prelude::*;
use pyo3::types::PyString;

use crate::py::errors::{request_error, InvalidArgumentError};
use crate::py::normalize::DETACH_MIN_BYTES;
use crate::py::text::utf8;
use crate::tokens::{self, Encoding};

fn encoding(name: &Bound<'_, PyString>) -> PyResult<Encoding> {
    let name = utf8(name, "encoding")?;
    Encoding::parse(name).ok_or_else(|| {
        InvalidArgumentError::new_err(format!(
            "encoding must be \"cl100k_base\", \"o200k_base\" or \"estimate\", got {name:?}"
        ))
    })
}

/// Number of tokens in `text` for "cl100k_base" or "o200k_base" (exact, equal to tiktoken) or
/// "estimate" (one per 4 UTF-8 bytes, rounded up).
#[pyfunction]
fn count_tokens(
    py: Python<'_>,
    text: &Bound<'_, PyString>,
    encoding: &Bound<'_, PyString>,
) -> PyResult<usize> {
    let encoding = self::encoding(encoding)?;
    let text = utf8(text, "text")?;
    if text.len() >= DETACH_MIN_BYTES {
        Ok(py.detach(|| encoding.count(text)))
    } else {
        Ok(encoding.count(text))
    }
}

/// The encoding name for a model: gpt-4o/4.1/4.5/5 and o1/o3/o4 use "o200k_base", other gpt-4,
/// gpt-3.5 and text-embedding models "cl100k_base", anything else "estimate".
#[pyfunction]
fn encoding_for_model(model: &Bound<'_, PyString>) -> PyResult<&'static str> {
    Ok(tokens::encoding_for_model(utf8(model, "model")?).name())
}

/// Prompt tokens of a raw request body: chat messages with the OpenAI cookbook overheads (3 per
/// message, 1 per name, 3 for the reply), else completions `prompt`, else embeddings `input`.
#[pyfunction]
fn count_request_tokens(
    py: Python<'_>,
    body: &[u8],
    encoding: &Bound<'_, PyString>,
) -> PyResult<usize> {
    let encoding = self::encoding(encoding)?;
    let count = || tokens::count_request_tokens(body, encoding);
    let result = if body.len() >= DETACH_MIN_BYTES {
        py.detach(count)
    } else {
        count()
    };
    result.map_err(request_error)
}

/// Build the cl100k/o200k tokenizers now (they are otherwise built on first use, which takes a
/// few hundred milliseconds); call once at startup. The GIL is released meanwhile.
#[pyfunction]
fn preload_tokenizers(py: Python<'_>) {
    py.detach(tokens::preload);
}

/// Register the functions on the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(count_tokens, m)?)?;
    m.add_function(wrap_pyfunction!(encoding_for_model, m)?)?;
    m.add_function(wrap_pyfunction!(count_request_tokens, m)?)?;
    m.add_function(wrap_pyfunction!(preload_tokenizers, m)?)
}
