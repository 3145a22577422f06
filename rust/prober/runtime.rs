//! The running side: a current-thread tokio runtime on its own OS thread, one probe task per
//! region, each round planned and recorded under the table lock and probed without it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::sync::oneshot;

use super::probe::{probe_once, ProbeAnswer};
use super::settings::MAX_DURATION;
use super::state::{Table, Transition};
use super::tls::Tls;
use super::ProberError;

/// What the caller's threads and the probe thread share.
#[derive(Debug)]
pub struct Shared {
    table: Mutex<Table>,
    tls: Mutex<Arc<Tls>>,
}

/// Lock a mutex, surviving a panicked holder (the table stays consistent field by field).
fn locked<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Shared {
    pub fn new(table: Table, tls: Tls) -> Self {
        Self {
            table: Mutex::new(table),
            tls: Mutex::new(Arc::new(tls)),
        }
    }

    pub fn table(&self) -> MutexGuard<'_, Table> {
        locked(&self.table)
    }

    pub fn tls(&self) -> Arc<Tls> {
        Arc::clone(&locked(&self.tls))
    }

    pub fn set_tls(&self, tls: Tls) {
        *locked(&self.tls) = Arc::new(tls);
    }
}

/// One region's probe round: its path, then the fallback path if that is a 404. None once the
/// region is gone.
pub async fn probe_round(shared: &Shared, name: &str) -> Option<Transition> {
    let plan = shared.table().plan(name)?;
    let tls = shared.tls();
    let mut answer = probe_once(&plan.target, &plan.path, plan.timeout, &tls).await;
    let mut fell_back = false;
    if let (Some(fallback), Ok(ProbeAnswer { status: 404, .. })) = (&plan.fallback, &answer) {
        answer = probe_once(&plan.target, fallback, plan.timeout, &tls).await;
        fell_back = true;
    }
    let recorded =
        shared
            .table()
            .record_round(name, plan.generation, Instant::now(), answer, fell_back);
    // A round made stale by a path change is dropped; the region is still there.
    Some(recorded.unwrap_or(Transition::None))
}

async fn probe_loop(shared: Arc<Shared>, name: String) {
    let mut jitter = Jitter::new(&name);
    while probe_round(&shared, &name).await.is_some() {
        let (interval, spread) = {
            let t = shared.table();
            (t.settings.interval.as_secs_f64(), t.settings.jitter)
        };
        let wait = interval * (1.0 + spread * jitter.next());
        tokio::time::sleep(sleep_for(wait)).await;
    }
}

/// A wait in seconds as a `Duration`: at least 1 ms, at most [`MAX_DURATION`], never a panic
/// (NaN or a huge value from the settings would panic in `Duration::from_secs_f64`).
fn sleep_for(seconds: f64) -> Duration {
    Duration::try_from_secs_f64(seconds.max(0.001))
        .unwrap_or(MAX_DURATION)
        .min(MAX_DURATION)
}

/// A small xorshift for probe jitter; no need for a crypto RNG or a crate.
struct Jitter(u64);

impl Jitter {
    fn new(name: &str) -> Self {
        let mut seed = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64);
        for b in name.bytes() {
            seed = seed.rotate_left(5) ^ u64::from(b);
        }
        Self(seed | 1)
    }

    /// Uniform in [-1, 1).
    fn next(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 11) as f64 / (1u64 << 52) as f64 - 1.0
    }
}

/// The probe thread and its tasks; dropping the runtime at `stop` cancels them all.
pub struct Runner {
    handle: tokio::runtime::Handle,
    shutdown: oneshot::Sender<()>,
    thread: JoinHandle<()>,
    tasks: HashMap<String, tokio::task::JoinHandle<()>>,
}

impl Runner {
    /// Start the thread and a probe task for every region in the table.
    pub fn start(shared: &Arc<Shared>) -> Result<Self, ProberError> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| ProberError::Runtime(e.to_string()))?;
        let handle = runtime.handle().clone();
        let (tx, rx) = oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("router-prober".to_owned())
            .spawn(move || {
                runtime.block_on(async {
                    let _ = rx.await;
                });
            })
            .map_err(|e| ProberError::Runtime(e.to_string()))?;
        let mut runner = Self {
            handle,
            shutdown: tx,
            thread,
            tasks: HashMap::new(),
        };
        let names = shared.table().names();
        for name in names {
            runner.spawn(shared, name);
        }
        Ok(runner)
    }

    /// (Re)start probing one region from a fresh round.
    pub fn spawn(&mut self, shared: &Arc<Shared>, name: String) {
        self.abort(&name);
        let task = self
            .handle
            .spawn(probe_loop(Arc::clone(shared), name.clone()));
        self.tasks.insert(name, task);
    }

    /// Whether the thread and every region's task are still going: a panic ends a task (or the
    /// thread), and a dead prober must not pass for a running one.
    pub fn alive(&self) -> bool {
        !self.thread.is_finished() && self.tasks.values().all(|t| !t.is_finished())
    }

    pub fn abort(&mut self, name: &str) {
        if let Some(task) = self.tasks.remove(name) {
            task.abort();
        }
    }

    /// Cancel every task and join the thread.
    pub fn stop(self) {
        for task in self.tasks.values() {
            task.abort();
        }
        let _ = self.shutdown.send(());
        let _ = self.thread.join();
    }
}

#[cfg(test)]
mod tests {
    use super::super::probe::tests::{server, Pki};
    use super::super::settings::Settings;
    use super::*;

    fn shared(tls: Tls) -> Shared {
        Shared::new(Table::new(Settings::default()), tls)
    }

    #[test]
    fn jitter_stays_in_range() {
        let mut j = Jitter::new("a");
        for _ in 0..10_000 {
            let x = j.next();
            assert!((-1.0..1.0).contains(&x), "{x}");
        }
    }

    #[test]
    fn sleeps_are_bounded_never_a_panic() {
        assert_eq!(sleep_for(0.0), Duration::from_millis(1));
        assert_eq!(sleep_for(f64::NAN), Duration::from_millis(1));
        assert_eq!(sleep_for(0.5), Duration::from_millis(500));
        assert_eq!(sleep_for(1.7e19), MAX_DURATION);
        assert_eq!(sleep_for(f64::INFINITY), MAX_DURATION);
    }

    #[test]
    fn a_panicked_task_makes_the_runner_dead() {
        let s = Arc::new(shared(Tls::load(None).unwrap()));
        let mut runner = Runner::start(&s).unwrap();
        assert!(runner.alive());
        let task = runner.handle.spawn(async { panic!("boom") });
        runner.tasks.insert("a".to_owned(), task);
        let deadline = Instant::now() + Duration::from_secs(5);
        while runner.alive() {
            assert!(
                Instant::now() < deadline,
                "the panicked task still counts as alive"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        runner.stop();
    }

    #[tokio::test]
    async fn round_falls_back_to_models_and_checks_status() {
        let (port, _srv) = server(404, Duration::ZERO, None).await;
        let s = shared(Tls::load(None).unwrap());
        s.table()
            .upsert("a", &format!("http://127.0.0.1:{port}"), None)
            .unwrap();
        assert_eq!(probe_round(&s, "a").await, Some(Transition::BecameHealthy));
        assert_eq!(s.table().plan("a").unwrap().path, "/v1/models");
        let (port503, _srv2) = server(503, Duration::ZERO, None).await;
        s.table()
            .upsert("b", &format!("http://127.0.0.1:{port503}"), None)
            .unwrap();
        assert_eq!(
            probe_round(&s, "b").await,
            Some(Transition::BecameUnhealthy)
        );
        let snap = s.table().snapshot(Instant::now());
        assert_eq!(snap[1].last_error.as_deref(), Some("status 503"));
        assert!(snap[1].ewma_rtt_s.is_some());
        assert_eq!(probe_round(&s, "gone").await, None);
    }

    #[tokio::test]
    async fn own_path_has_no_fallback() {
        // /health answers 404 here; a region told to probe it must not go looking elsewhere.
        let (port, _srv) = server(404, Duration::ZERO, None).await;
        let s = shared(Tls::load(None).unwrap());
        let url = format!("http://127.0.0.1:{port}");
        s.table().upsert("a", &url, Some("/health")).unwrap();
        assert_eq!(
            probe_round(&s, "a").await,
            Some(Transition::BecameUnhealthy)
        );
        assert_eq!(s.table().snapshot(Instant::now())[0].probe_path, "/health");
        s.table().upsert("a", &url, Some("/live")).unwrap();
        probe_round(&s, "a").await;
        probe_round(&s, "a").await;
        assert!(s.table().snapshot(Instant::now())[0].healthy);
    }

    #[tokio::test]
    async fn https_round_checks_status_over_tls() {
        let pki = Pki::new();
        let (port, _srv) = server(503, Duration::ZERO, Some(&pki)).await;
        let s = shared(pki.client());
        s.table()
            .upsert("a", &format!("https://localhost:{port}/v1"), None)
            .unwrap();
        assert_eq!(
            probe_round(&s, "a").await,
            Some(Transition::BecameUnhealthy)
        );
        assert_eq!(
            s.table().snapshot(Instant::now())[0].last_error.as_deref(),
            Some("status 503")
        );
        s.set_tls(Pki::new().client());
        probe_round(&s, "a").await;
        let err = s.table().snapshot(Instant::now())[0].last_error.clone();
        assert!(
            err.as_deref().is_some_and(|e| e.starts_with("tls: ")),
            "{err:?}"
        );
    }
}
