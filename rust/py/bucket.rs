//! Python wrapper of the token-bucket table, on a monotonic clock.

// Doc comments here become Python docstrings (help()), written for Python readers.
#![allow(clippy::doc_markdown)]

use std::time::Instant;

use pyo3::exceptions::PyKeyError;
use pyo3::prelude::*;
use pyo3::types::PyString;

use crate::bucket::{Limits, Table};
use crate::py::errors::InvalidArgumentError;
use crate::py::text::utf8;

/// Per-key requests and tokens buckets (capacity = burst, refilled continuously at the
/// per-minute rates), thread-safe behind sharded locks. Times are seconds.
#[pyclass(frozen, module = "router._native")]
pub struct BucketTable {
    table: Table,
    epoch: Instant,
}

impl BucketTable {
    fn now(&self) -> f64 {
        self.epoch.elapsed().as_secs_f64()
    }
}

fn unknown(key: &str) -> PyErr {
    PyKeyError::new_err(key.to_owned())
}

#[pymethods]
impl BucketTable {
    #[new]
    #[pyo3(signature = (*, shards = 64))]
    fn new(shards: usize) -> PyResult<Self> {
        if shards == 0 {
            return Err(InvalidArgumentError::new_err("shards must be at least 1"));
        }
        Ok(Self {
            table: Table::new(shards),
            epoch: Instant::now(),
        })
    }

    /// Add `key` with full buckets, or change its limits keeping its levels (clamped to the new
    /// capacities). Bursts default to the per-minute figures.
    #[pyo3(signature = (key, *, requests_per_minute, tokens_per_minute, request_burst = None, token_burst = None))]
    fn set_limits(
        &self,
        key: &Bound<'_, PyString>,
        requests_per_minute: f64,
        tokens_per_minute: f64,
        request_burst: Option<f64>,
        token_burst: Option<f64>,
    ) -> PyResult<()> {
        let limits = Limits::new(
            requests_per_minute,
            tokens_per_minute,
            request_burst,
            token_burst,
        )
        .map_err(InvalidArgumentError::new_err)?;
        self.table
            .set_limits(utf8(key, "key")?, &limits, self.now());
        Ok(())
    }

    /// Take 1 request and `tokens` tokens from both buckets or neither. Returns (allowed,
    /// retry_after_s, remaining_requests, remaining_tokens, reset_requests_s, reset_tokens_s);
    /// retry_after_s is inf when the request can never fit (more tokens than the burst, or a
    /// zero rate). Unknown key: KeyError.
    #[pyo3(signature = (key, tokens = 0))]
    fn try_acquire(
        &self,
        key: &Bound<'_, PyString>,
        tokens: u64,
    ) -> PyResult<(bool, f64, u64, u64, f64, f64)> {
        let key = utf8(key, "key")?;
        let now = self.now();
        let d = self
            .table
            .with(key, |pair| pair.try_acquire(tokens, now))
            .ok_or_else(|| unknown(key))?;
        Ok((
            d.allowed,
            d.retry_after,
            d.remaining_requests,
            d.remaining_tokens,
            d.reset_requests,
            d.reset_tokens,
        ))
    }

    /// Settle a reservation once real usage is known: give back `reserved - actual` tokens, or
    /// take the excess (the bucket may go into debt). Unknown key: KeyError.
    fn reconcile(&self, key: &Bound<'_, PyString>, reserved: i64, actual: i64) -> PyResult<()> {
        let key = utf8(key, "key")?;
        let now = self.now();
        self.table
            .with(key, |pair| pair.reconcile(reserved, actual, now))
            .ok_or_else(|| unknown(key))
    }

    /// Give back requests and tokens that were acquired but not used (capped at capacity).
    #[pyo3(signature = (key, requests = 1, tokens = 0))]
    fn refund(&self, key: &Bound<'_, PyString>, requests: u64, tokens: u64) -> PyResult<()> {
        let key = utf8(key, "key")?;
        let now = self.now();
        self.table
            .with(key, |pair| pair.refund(requests, tokens, now))
            .ok_or_else(|| unknown(key))
    }

    /// Drop keys whose buckets are full and untouched for `idle_seconds`; returns how many.
    fn expire_idle(&self, py: Python<'_>, idle_seconds: f64) -> PyResult<usize> {
        if !(idle_seconds.is_finite() && idle_seconds >= 0.0) {
            return Err(InvalidArgumentError::new_err(format!(
                "idle_seconds must be a finite number >= 0, got {idle_seconds}"
            )));
        }
        let now = self.now();
        Ok(py.detach(|| self.table.expire_idle(idle_seconds, now)))
    }

    fn __len__(&self) -> usize {
        self.table.len()
    }
}

/// Register the class on the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<BucketTable>()
}
