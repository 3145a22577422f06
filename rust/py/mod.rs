//! Thin pyo3 wrappers: the only code in the crate that touches Python.

pub mod bucket;
pub mod errors;
pub mod fingerprint;
pub mod hf_tokenizer;
pub mod normalize;
pub mod prober;
pub mod text;
pub mod tokens;
