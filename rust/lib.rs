//! Native hot path of `router`: pure modules plus thin pyo3 wrappers under `py/`.

pub mod bucket;
pub mod chat_messages;
pub mod chat_template;
pub mod fingerprint;
pub mod hf_tokenizer;
pub mod jinja_python;
pub mod json;
pub mod normalize;
pub mod pretokenize;
pub mod prober;
pub mod py;
pub mod tokens;

use pyo3::prelude::*;

/// The `router._native` extension module.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    py::errors::register(m)?;
    py::normalize::register(m)?;
    py::fingerprint::register(m)?;
    py::tokens::register(m)?;
    py::hf_tokenizer::register(m)?;
    py::bucket::register(m)?;
    py::prober::register(m)?;
    Ok(())
}
