//! Python wrapper of the health prober: `Prober`, its `RegionHealth` snapshots and events.

use std::path::PathBuf;
use std::time::Duration;

use pyo3::conversion::FromPyObjectOwned;
use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyUnicodeEncodeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};

use crate::prober::{self, Outcome, ProberError, RegionSnapshot, Settings, MAX_SECONDS};
use crate::py::text::{self, utf8};

fn value_error(e: &ProberError) -> PyErr {
    match e {
        ProberError::Runtime(_) => PyRuntimeError::new_err(e.to_string()),
        _ => PyValueError::new_err(e.to_string()),
    }
}

/// A time setting: finite, in [0, `MAX_SECONDS`] (a larger one would overflow the clock).
fn seconds(key: &str, value: &Bound<'_, PyAny>) -> PyResult<Duration> {
    let secs: f64 = arg(key, value)?;
    let max = MAX_SECONDS as f64; // exact: a day in seconds
    if !(0.0..=max).contains(&secs) {
        return Err(PyValueError::new_err(format!(
            "{key} must be a finite number of seconds from 0 to {MAX_SECONDS}, got {secs}"
        )));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// One setting's value, a type error naming the key (a str with a lone surrogate, in a path or
/// a text, is the module's `InvalidArgumentError`).
fn arg<'py, T: FromPyObjectOwned<'py>>(key: &str, value: &Bound<'py, PyAny>) -> PyResult<T> {
    value.extract::<T>().map_err(|e| {
        let e: PyErr = e.into();
        let py = value.py();
        if e.is_instance_of::<PyUnicodeEncodeError>(py) {
            text::lone_surrogate(key)
        } else {
            PyTypeError::new_err(format!("{key}: {}", e.value(py)))
        }
    })
}

/// `Prober(**settings)` and `configure(**settings)`: every key optional, defaults from
/// [`Settings::default`] (the one place they are defined).
fn settings(kwargs: Option<&Bound<'_, PyDict>>, method: &str) -> PyResult<Settings> {
    let mut s = Settings::default();
    for (key, value) in kwargs.into_iter().flat_map(PyDictMethods::iter) {
        let key = key.cast_into::<PyString>()?;
        let k = utf8(&key, "a setting's name")?;
        let v = &value;
        match k {
            "interval_s" => s.interval = seconds(k, v)?,
            "jitter" => s.jitter = arg(k, v)?,
            "timeout_s" => s.timeout = seconds(k, v)?,
            "path" => s.path = arg(k, v)?,
            "fallback_path" => s.fallback_path = arg(k, v)?,
            "expected_statuses" => s.expected_statuses = arg(k, v)?,
            "healthy_after" => s.healthy_after = arg(k, v)?,
            "unhealthy_after" => s.unhealthy_after = arg(k, v)?,
            "ewma_alpha" => s.ewma_alpha = arg(k, v)?,
            "window" => s.window = arg(k, v)?,
            "eject_after" => s.eject_after = arg(k, v)?,
            "base_ejection_s" => s.base_ejection = seconds(k, v)?,
            "max_ejection_s" => s.max_ejection = seconds(k, v)?,
            "ca_file" => s.ca_file = arg::<Option<PathBuf>>(k, v)?,
            _ => {
                return Err(PyTypeError::new_err(format!(
                    "{method}() got an unexpected keyword argument '{k}'"
                )))
            }
        }
    }
    s.validate().map_err(|e| value_error(&e))?;
    Ok(s)
}

/// One region's health at the moment of `Prober.snapshot()`.
#[pyclass(frozen, get_all, module = "router._native")]
#[derive(Clone)]
pub struct RegionHealth {
    name: String,
    url: String,
    probe_path: String,
    healthy: bool,
    probed: bool,
    ejected: bool,
    ejected_for_s: f64,
    ejected_until: Option<f64>,
    ewma_rtt_s: Option<f64>,
    rtt_p50_s: Option<f64>,
    rtt_p95_s: Option<f64>,
    ewma_ttft_s: Option<f64>,
    ttft_p50_s: Option<f64>,
    ttft_p95_s: Option<f64>,
    ewma_total_s: Option<f64>,
    ewma_connect_s: Option<f64>,
    consecutive_failures: u32,
    passive_failures: u32,
    ejections: u64,
    last_error: Option<String>,
    probes: u64,
    probe_failures: u64,
    passive_reports: u64,
    last_probe_age_s: Option<f64>,
    ttft_age_s: Option<f64>,
}

impl From<RegionSnapshot> for RegionHealth {
    fn from(s: RegionSnapshot) -> Self {
        Self {
            name: s.name,
            url: s.url,
            probe_path: s.probe_path,
            healthy: s.healthy,
            probed: s.probed,
            ejected: s.ejected,
            ejected_for_s: s.ejected_for_s,
            ejected_until: s.ejected_until,
            ewma_rtt_s: s.ewma_rtt_s,
            rtt_p50_s: s.rtt_p50_s,
            rtt_p95_s: s.rtt_p95_s,
            ewma_ttft_s: s.ewma_ttft_s,
            ttft_p50_s: s.ttft_p50_s,
            ttft_p95_s: s.ttft_p95_s,
            ewma_total_s: s.ewma_total_s,
            ewma_connect_s: s.ewma_connect_s,
            consecutive_failures: s.consecutive_failures,
            passive_failures: s.passive_failures,
            ejections: s.ejections,
            last_error: s.last_error,
            probes: s.probes,
            probe_failures: s.probe_failures,
            passive_reports: s.passive_reports,
            last_probe_age_s: s.last_probe_age_s,
            ttft_age_s: s.ttft_age_s,
        }
    }
}

#[pymethods]
impl RegionHealth {
    /// Healthy by active probes and not ejected by passive outcomes.
    #[getter]
    fn available(&self) -> bool {
        self.healthy && !self.ejected
    }

    fn __repr__(&self) -> String {
        let opt = |v: Option<f64>| v.map_or_else(|| "None".to_owned(), |x| format!("{x:.6}"));
        let py_bool = |b: bool| if b { "True" } else { "False" };
        format!(
            "RegionHealth(name={:?}, healthy={}, ejected={}, ewma_rtt_s={}, ewma_ttft_s={})",
            self.name,
            py_bool(self.healthy),
            py_bool(self.ejected),
            opt(self.ewma_rtt_s),
            opt(self.ewma_ttft_s)
        )
    }
}

/// Health prober: probes every region on its own thread; takes passive reports from the proxy.
#[pyclass(frozen, module = "router._native")]
pub struct Prober {
    inner: prober::Prober,
}

#[pymethods]
impl Prober {
    /// Keyword-only settings, each optional (see `router/_native.pyi` for names and defaults).
    #[new]
    #[pyo3(signature = (**settings))]
    fn new(py: Python<'_>, settings: Option<&Bound<'_, PyDict>>) -> PyResult<Self> {
        let settings = self::settings(settings, "Prober")?;
        // Loading the trust store reads files: no need for the GIL.
        let inner = py
            .detach(|| prober::Prober::new(settings))
            .map_err(|e| value_error(&e))?;
        Ok(Self { inner })
    }

    /// Replace the probe settings (hot reload); regions and their history are kept.
    #[pyo3(signature = (**settings))]
    fn configure(&self, py: Python<'_>, settings: Option<&Bound<'_, PyDict>>) -> PyResult<()> {
        let settings = self::settings(settings, "configure")?;
        py.detach(|| self.inner.set_settings(settings))
            .map_err(|e| value_error(&e))
    }

    /// Start the probe thread (idempotent).
    fn start(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| self.inner.start())
            .map_err(|e| value_error(&e))
    }

    /// Stop probing and join the thread (idempotent; also done on garbage collection).
    fn stop(&self, py: Python<'_>) {
        py.detach(|| self.inner.stop());
    }

    #[getter]
    fn running(&self) -> bool {
        self.inner.is_running()
    }

    /// Add a region or change its URL (history reset) or own probe path (no 404 fallback).
    #[pyo3(signature = (name, url, path = None))]
    fn upsert_region(
        &self,
        name: &Bound<'_, PyString>,
        url: &Bound<'_, PyString>,
        path: Option<&Bound<'_, PyString>>,
    ) -> PyResult<()> {
        let name = utf8(name, "name")?;
        let url = utf8(url, "url")?;
        let path = path.map(|p| utf8(p, "path")).transpose()?;
        self.inner
            .upsert_region(name, url, path)
            .map(|_| ())
            .map_err(|e| value_error(&e))
    }

    /// Stop probing a region and forget it; False if it was unknown.
    fn remove_region(&self, name: &Bound<'_, PyString>) -> PyResult<bool> {
        Ok(self.inner.remove_region(utf8(name, "name")?))
    }

    /// Names of the regions in the table, sorted.
    fn regions(&self) -> Vec<String> {
        self.inner.regions()
    }

    /// Record one proxied attempt's outcome; True if this report ejected the region.
    #[pyo3(signature = (region, outcome, connect_s = None, ttft_s = None, total_s = None))]
    fn report(
        &self,
        region: &Bound<'_, PyString>,
        outcome: &Bound<'_, PyString>,
        connect_s: Option<f64>,
        ttft_s: Option<f64>,
        total_s: Option<f64>,
    ) -> PyResult<bool> {
        let region = utf8(region, "region")?;
        let outcome = utf8(outcome, "outcome")?;
        let outcome = Outcome::parse(outcome).map_err(|e| value_error(&e))?;
        let t = self
            .inner
            .report(region, outcome, connect_s, ttft_s, total_s);
        Ok(t == Some(prober::Transition::Ejected))
    }

    /// Every region's health now, sorted by name.
    fn snapshot(&self) -> Vec<RegionHealth> {
        self.inner
            .snapshot()
            .into_iter()
            .map(RegionHealth::from)
            .collect()
    }

    /// Per-request routing inputs, sorted by name: `(name, available, healthy, ewma_rtt_s,
    /// ewma_ttft_s, ttft_age_s)`. Cheaper than `snapshot()`: no latency quantiles.
    #[allow(clippy::type_complexity)]
    fn routing_view(&self) -> Vec<(String, bool, bool, Option<f64>, Option<f64>, Option<f64>)> {
        self.inner
            .routing_view()
            .into_iter()
            .map(|v| {
                (
                    v.name,
                    v.available,
                    v.healthy,
                    v.ewma_rtt_s,
                    v.ewma_ttft_s,
                    v.ttft_age_s,
                )
            })
            .collect()
    }

    /// Health transitions since the last call: (region, transition, unix time, detail).
    fn take_events(&self) -> Vec<(String, &'static str, f64, Option<String>)> {
        self.inner
            .take_events()
            .into_iter()
            .map(|e| (e.region, e.transition.as_str(), e.at, e.detail))
            .collect()
    }
}

/// Register the prober classes on the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Prober>()?;
    m.add_class::<RegionHealth>()?;
    Ok(())
}
