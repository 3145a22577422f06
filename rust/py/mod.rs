//! Thin pyo3 wrappers: the only code in the crate that touches Python.

pub mod errors;
pub mod prober;
