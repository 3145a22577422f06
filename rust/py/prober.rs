//! Python wrapper of the health prober: `Prober`, its `RegionHealth` snapshots and events.

use std::time::Duration;

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;

use crate::prober::{self, Outcome, ProbeConfig, ProberError, RegionSnapshot};

fn value_error(e: &ProberError) -> PyErr {
    match e {
        ProberError::Runtime(_) => PyRuntimeError::new_err(e.to_string()),
        _ => PyValueError::new_err(e.to_string()),
    }
}

fn seconds(what: &str, s: f64) -> PyResult<Duration> {
    Duration::try_from_secs_f64(s).map_err(|_| {
        PyValueError::new_err(format!("{what} must be a non-negative number of seconds"))
    })
}

#[allow(clippy::too_many_arguments)]
fn build_config(
    interval_s: f64,
    jitter: f64,
    timeout_s: f64,
    path: String,
    fallback_path: String,
    expected_statuses: Vec<u16>,
    healthy_after: u32,
    unhealthy_after: u32,
    ewma_alpha: f64,
    window: usize,
    eject_after: u32,
    base_ejection_s: f64,
    max_ejection_s: f64,
) -> PyResult<ProbeConfig> {
    let config = ProbeConfig {
        interval: seconds("interval_s", interval_s)?,
        jitter,
        timeout: seconds("timeout_s", timeout_s)?,
        path,
        fallback_path,
        expected_statuses,
        healthy_after,
        unhealthy_after,
        ewma_alpha,
        window,
        eject_after,
        base_ejection: seconds("base_ejection_s", base_ejection_s)?,
        max_ejection: seconds("max_ejection_s", max_ejection_s)?,
    };
    config.validate().map_err(|e| value_error(&e))?;
    Ok(config)
}

/// One region's health at the moment of `Prober.snapshot()`.
#[pyclass(frozen, get_all, module = "router._native")]
#[derive(Clone)]
pub struct RegionHealth {
    name: String,
    url: String,
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
    #[new]
    #[pyo3(signature = (
        *, interval_s = 1.0, jitter = 0.1, timeout_s = 0.8, path = "/health".to_owned(),
        fallback_path = "/v1/models".to_owned(), expected_statuses = Vec::new(), healthy_after = 2,
        unhealthy_after = 2, ewma_alpha = 0.3, window = 64, eject_after = 5, base_ejection_s = 5.0,
        max_ejection_s = 60.0
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        interval_s: f64,
        jitter: f64,
        timeout_s: f64,
        path: String,
        fallback_path: String,
        expected_statuses: Vec<u16>,
        healthy_after: u32,
        unhealthy_after: u32,
        ewma_alpha: f64,
        window: usize,
        eject_after: u32,
        base_ejection_s: f64,
        max_ejection_s: f64,
    ) -> PyResult<Self> {
        let config = build_config(
            interval_s,
            jitter,
            timeout_s,
            path,
            fallback_path,
            expected_statuses,
            healthy_after,
            unhealthy_after,
            ewma_alpha,
            window,
            eject_after,
            base_ejection_s,
            max_ejection_s,
        )?;
        let inner = prober::Prober::new(config).map_err(|e| value_error(&e))?;
        Ok(Self { inner })
    }

    /// Replace the probe settings (hot reload); regions and their history are kept.
    #[pyo3(signature = (
        *, interval_s = 1.0, jitter = 0.1, timeout_s = 0.8, path = "/health".to_owned(),
        fallback_path = "/v1/models".to_owned(), expected_statuses = Vec::new(), healthy_after = 2,
        unhealthy_after = 2, ewma_alpha = 0.3, window = 64, eject_after = 5, base_ejection_s = 5.0,
        max_ejection_s = 60.0
    ))]
    #[allow(clippy::too_many_arguments)]
    fn configure(
        &self,
        interval_s: f64,
        jitter: f64,
        timeout_s: f64,
        path: String,
        fallback_path: String,
        expected_statuses: Vec<u16>,
        healthy_after: u32,
        unhealthy_after: u32,
        ewma_alpha: f64,
        window: usize,
        eject_after: u32,
        base_ejection_s: f64,
        max_ejection_s: f64,
    ) -> PyResult<()> {
        let config = build_config(
            interval_s,
            jitter,
            timeout_s,
            path,
            fallback_path,
            expected_statuses,
            healthy_after,
            unhealthy_after,
            ewma_alpha,
            window,
            eject_after,
            base_ejection_s,
            max_ejection_s,
        )?;
        self.inner.set_config(config).map_err(|e| value_error(&e))
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

    /// Add a region or change its URL (its history resets only when the URL changes).
    fn upsert_region(&self, name: &str, url: &str) -> PyResult<()> {
        self.inner
            .upsert_region(name, url)
            .map_err(|e| value_error(&e))
    }

    /// Stop probing a region and forget it; False if it was unknown.
    fn remove_region(&self, name: &str) -> bool {
        self.inner.remove_region(name)
    }

    /// Names of the regions in the table, sorted.
    fn regions(&self) -> Vec<String> {
        prober::lock(self.inner.table()).names()
    }

    /// Record one proxied attempt's outcome; True if this report ejected the region.
    #[pyo3(signature = (region, outcome, connect_s = None, ttft_s = None, total_s = None))]
    fn report(
        &self,
        region: &str,
        outcome: &str,
        connect_s: Option<f64>,
        ttft_s: Option<f64>,
        total_s: Option<f64>,
    ) -> PyResult<bool> {
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
