//! Region health: active HTTP(S) probes on a tokio thread, passive outcomes, thresholds, EWMA,
//! ejection.
//!
//! `settings` (what to probe and when health flips), `target` (a base URL), `probe` (one request,
//! plain or TLS), `tls` (trust roots), `state` (the pure health table with an explicit clock),
//! `runtime` (the probe thread). [`Prober`] ties them together for the Python wrapper.

mod probe;
mod runtime;
mod settings;
mod state;
mod target;
mod tls;

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

pub use probe::{probe_once, ProbeAnswer};
pub use settings::{Settings, MAX_SECONDS};
pub use state::{Event, Outcome, RegionSnapshot, RoutingView, Transition, Upsert};
pub use target::Target;
pub use tls::Tls;

use runtime::{Runner, Shared};
use state::Table;

/// Errors from the prober's API (bad input, never a probe failure: those go in the table).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProberError {
    Config(String),
    Url(String),
    Outcome(String),
    Runtime(String),
}

impl fmt::Display for ProberError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Config(m) => write!(f, "invalid prober config: {m}"),
            Self::Url(m) => write!(f, "invalid region url: {m}"),
            Self::Outcome(m) => write!(f, "unknown outcome {m:?}"),
            Self::Runtime(m) => write!(f, "prober runtime: {m}"),
        }
    }
}

impl std::error::Error for ProberError {}

/// The health table plus the thread that probes it.
pub struct Prober {
    shared: Arc<Shared>,
    runner: Mutex<Option<Runner>>,
}

impl Prober {
    /// Validate the settings and load the TLS roots (the CA file is read now).
    pub fn new(settings: Settings) -> Result<Self, ProberError> {
        settings.validate()?;
        let tls = Tls::load(settings.ca_file.as_deref())?;
        Ok(Self {
            shared: Arc::new(Shared::new(Table::new(settings), tls)),
            runner: Mutex::new(None),
        })
    }

    fn runner(&self) -> MutexGuard<'_, Option<Runner>> {
        self.runner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Started and still probing (false once a panic has ended the thread or a region's task).
    pub fn is_running(&self) -> bool {
        self.runner().as_ref().is_some_and(Runner::alive)
    }

    /// Start the probe thread (idempotent; a thread or task ended by a panic is started anew).
    pub fn start(&self) -> Result<(), ProberError> {
        let mut runner = self.runner();
        if !runner.as_ref().is_some_and(Runner::alive) {
            if let Some(dead) = runner.take() {
                dead.stop();
            }
            *runner = Some(Runner::start(&self.shared)?);
        }
        Ok(())
    }

    /// Stop probing and join the thread (idempotent); the table keeps its last state.
    pub fn stop(&self) {
        let taken = self.runner().take();
        if let Some(runner) = taken {
            runner.stop();
        }
    }

    /// Add a region, change its URL (history reset, probing restarts) or its own probe path
    /// (`None`: the global path with its 404 fallback; history kept either way).
    pub fn upsert_region(
        &self,
        name: &str,
        url: &str,
        path: Option<&str>,
    ) -> Result<Upsert, ProberError> {
        let change = self.shared.table().upsert(name, url, path)?;
        if change == Upsert::Reset {
            if let Some(runner) = self.runner().as_mut() {
                runner.spawn(&self.shared, name.to_owned());
            }
        }
        Ok(change)
    }

    pub fn remove_region(&self, name: &str) -> bool {
        if let Some(runner) = self.runner().as_mut() {
            runner.abort(name);
        }
        self.shared.table().remove(name)
    }

    /// Names of the regions, sorted.
    pub fn regions(&self) -> Vec<String> {
        self.shared.table().names()
    }

    /// Replace the settings (hot reload; the CA file is read again); takes effect at each
    /// region's next round.
    pub fn set_settings(&self, settings: Settings) -> Result<(), ProberError> {
        settings.validate()?;
        let tls = Tls::load(settings.ca_file.as_deref())?;
        self.shared.table().settings = settings;
        self.shared.set_tls(tls);
        Ok(())
    }

    pub fn report(
        &self,
        name: &str,
        outcome: Outcome,
        connect_s: Option<f64>,
        ttft_s: Option<f64>,
        total_s: Option<f64>,
    ) -> Option<Transition> {
        self.shared.table().record_passive(
            name,
            Instant::now(),
            outcome,
            connect_s,
            ttft_s,
            total_s,
        )
    }

    pub fn snapshot(&self) -> Vec<RegionSnapshot> {
        self.shared.table().snapshot(Instant::now())
    }

    /// Every region's routing inputs now (see [`state::Table::routing_view`]).
    pub fn routing_view(&self) -> Vec<RoutingView> {
        self.shared.table().routing_view(Instant::now())
    }

    pub fn take_events(&self) -> Vec<Event> {
        self.shared.table().take_events()
    }
}

impl Drop for Prober {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::probe::tests::{server, Pki};
    use super::*;

    fn fast() -> Settings {
        Settings {
            interval: Duration::from_millis(50),
            timeout: Duration::from_millis(300),
            ..Settings::default()
        }
    }

    #[test]
    fn bad_settings_and_ca_files_are_config_errors() {
        let e = Prober::new(Settings {
            jitter: 2.0,
            ..fast()
        });
        assert!(matches!(e, Err(ProberError::Config(_))));
        let e = Prober::new(Settings {
            ca_file: Some("/nonexistent/ca.pem".into()),
            ..fast()
        });
        assert!(
            matches!(&e, Err(ProberError::Config(m)) if m.contains("/nonexistent/ca.pem")),
            "{:?}",
            e.err()
        );
        let p = Prober::new(fast()).unwrap();
        assert!(p
            .set_settings(Settings {
                ca_file: Some("/nonexistent/ca.pem".into()),
                ..fast()
            })
            .is_err());
        assert!(p.upsert_region("a", "http://h", Some("nope")).is_err());
        assert!(p.regions().is_empty());
    }

    #[test]
    fn prober_thread_probes_flips_and_stops() {
        let pki = Pki::new();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let (port, srv) = rt.block_on(server(200, Duration::ZERO, None));
        let (tls_port, tls_srv) = rt.block_on(server(200, Duration::ZERO, Some(&pki)));
        let server_thread = std::thread::spawn(move || {
            rt.block_on(async {
                let _ = tokio::join!(srv, tls_srv);
            });
        });
        let dir = std::env::temp_dir().join(format!("router-prober-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ca_file = dir.join("ca.pem");
        std::fs::write(&ca_file, &pki.ca_pem).unwrap();
        let prober = Prober::new(Settings {
            ca_file: Some(ca_file),
            ..fast()
        })
        .unwrap();
        prober
            .upsert_region("up", &format!("http://127.0.0.1:{port}"), None)
            .unwrap();
        prober
            .upsert_region("secure", &format!("https://localhost:{tls_port}"), None)
            .unwrap();
        prober
            .upsert_region("down", "http://127.0.0.1:1", None)
            .unwrap();
        prober.start().unwrap();
        prober.start().unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let s = prober.snapshot();
            if s.iter().all(|r| r.probes >= 3) {
                let by = |n: &str| s.iter().find(|r| r.name == n).unwrap().clone();
                assert!(by("up").available());
                assert!(by("secure").available(), "{:?}", by("secure"));
                assert!(!by("down").healthy);
                break;
            }
            assert!(Instant::now() < deadline, "probes did not run: {s:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(prober.remove_region("down"));
        prober.stop();
        assert!(!prober.is_running());
        let frozen = prober.snapshot()[0].probes;
        std::thread::sleep(Duration::from_millis(150));
        assert_eq!(prober.snapshot()[0].probes, frozen);
        drop(prober);
        drop(server_thread);
    }
}
