//! Per-region health state: the probe verdict machine, EWMA/window latency stats, passive
//! outcomes and outlier ejection. Pure: every call takes `now`, so it is tested without sockets.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::probe::ProbeAnswer;
use super::settings::{check_path, Settings, MAX_DURATION};
use super::target::Target;
use super::ProberError;

/// What a proxied attempt (or a probe) ended with, as far as region health is concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Ok,
    /// 5xx from the region.
    ServerError,
    ConnectError,
    /// No first byte / no answer in time.
    Timeout,
    /// Says nothing about the region (4xx, 429, client went away): counted but resets nothing.
    Neutral,
}

impl Outcome {
    pub fn parse(s: &str) -> Result<Self, ProberError> {
        match s {
            "ok" => Ok(Self::Ok),
            "server_error" => Ok(Self::ServerError),
            "connect_error" => Ok(Self::ConnectError),
            "timeout" => Ok(Self::Timeout),
            "neutral" => Ok(Self::Neutral),
            other => Err(ProberError::Outcome(other.to_owned())),
        }
    }

    fn is_failure(self) -> bool {
        matches!(self, Self::ServerError | Self::ConnectError | Self::Timeout)
    }
}

/// `now + wait`, capped at [`MAX_DURATION`] so no setting can overflow the clock (a panic here
/// would reach Python, or end a probe task, on every report).
fn later(now: Instant, wait: Duration) -> Instant {
    now.checked_add(wait.min(MAX_DURATION)).unwrap_or(now)
}

/// EWMA plus a window of recent samples for p50/p95.
#[derive(Clone, Debug, Default)]
pub struct Stats {
    ewma: Option<f64>,
    window: VecDeque<f64>,
}

impl Stats {
    pub fn record(&mut self, x: f64, alpha: f64, cap: usize) {
        self.ewma = Some(self.ewma.map_or(x, |e| alpha * x + (1.0 - alpha) * e));
        while self.window.len() >= cap {
            self.window.pop_front();
        }
        self.window.push_back(x);
    }

    pub fn ewma(&self) -> Option<f64> {
        self.ewma
    }

    /// Nearest-rank quantile of the window; None before the first sample.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        if self.window.is_empty() {
            return None;
        }
        let mut v: Vec<f64> = self.window.iter().copied().collect();
        v.sort_by(f64::total_cmp);
        let rank = (q * v.len() as f64).ceil() as usize;
        Some(v[rank.clamp(1, v.len()) - 1])
    }
}

/// Active-probe view of a region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Health {
    /// Not probed yet: selectable, so a fresh router serves before its first probe round.
    Unknown,
    Healthy,
    Unhealthy,
}

/// Everything known about one region.
#[derive(Clone, Debug)]
pub struct RegionState {
    pub url: String,
    pub target: Target,
    /// The region's own probe path: probed instead of the global one, with no 404 fallback.
    pub path: Option<String>,
    /// Bumped on every change of URL or path, so a round planned before it is not recorded.
    generation: u64,
    health: Health,
    successes: u32,
    failures: u32,
    passive_failures: u32,
    ejected_until: Option<Instant>,
    ejection_level: u32,
    last_ejection: Option<Instant>,
    ejections: u64,
    rtt: Stats,
    ttft: Stats,
    total: Stats,
    connect: Stats,
    last_error: Option<String>,
    probes: u64,
    probe_failures: u64,
    passive_reports: u64,
    last_probe: Option<Instant>,
    last_ttft: Option<Instant>,
    /// The global path answered 404: the fallback path is probed from now on.
    use_fallback_path: bool,
}

impl RegionState {
    fn new(url: String, target: Target, path: Option<String>, generation: u64) -> Self {
        Self {
            url,
            target,
            path,
            generation,
            health: Health::Unknown,
            successes: 0,
            failures: 0,
            passive_failures: 0,
            ejected_until: None,
            ejection_level: 0,
            last_ejection: None,
            ejections: 0,
            rtt: Stats::default(),
            ttft: Stats::default(),
            total: Stats::default(),
            connect: Stats::default(),
            last_error: None,
            probes: 0,
            probe_failures: 0,
            passive_reports: 0,
            last_probe: None,
            last_ttft: None,
            use_fallback_path: false,
        }
    }

    /// Not marked unhealthy by active probes (an unprobed region counts as healthy).
    fn healthy(&self) -> bool {
        self.health != Health::Unhealthy
    }

    /// Seconds since the last first-token observation, if any.
    fn ttft_age_s(&self, now: Instant) -> Option<f64> {
        self.last_ttft.map(|t| now.duration_since(t).as_secs_f64())
    }

    /// The path the next probe requests, and the one to try if it answers 404.
    fn probe_paths<'a>(&'a self, settings: &'a Settings) -> (&'a str, Option<&'a str>) {
        match (&self.path, self.use_fallback_path) {
            (Some(own), _) => (own, None),
            (None, true) => (&settings.fallback_path, None),
            (None, false) => (&settings.path, Some(&settings.fallback_path)),
        }
    }
}

/// What [`Table::upsert`] changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Upsert {
    Unchanged,
    /// A new region or a new URL: history reset, probing must (re)start.
    Reset,
    /// Same URL, another probe path: history kept, the next round uses the new path.
    PathChanged,
}

/// One region's next probe round, planned under the lock and run without it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    pub generation: u64,
    pub target: Target,
    pub path: String,
    /// Probed when `path` answers 404 (only for regions on the global path).
    pub fallback: Option<String>,
    pub timeout: Duration,
}

/// The per-request routing inputs of one region (see [`Table::routing_view`]).
#[derive(Clone, Debug, PartialEq)]
pub struct RoutingView {
    pub name: String,
    /// Healthy by probes and not ejected.
    pub available: bool,
    pub healthy: bool,
    pub ewma_rtt_s: Option<f64>,
    pub ewma_ttft_s: Option<f64>,
    pub ttft_age_s: Option<f64>,
}

/// A point-in-time copy of one region's health, as handed to Python.
#[derive(Clone, Debug, PartialEq)]
pub struct RegionSnapshot {
    pub name: String,
    pub url: String,
    /// The request path of the next probe (base URL prefix included).
    pub probe_path: String,
    /// Active-probe verdict (true before the first probe).
    pub healthy: bool,
    pub probed: bool,
    pub ejected: bool,
    /// Seconds of ejection left (0 when not ejected or waiting only for a good probe).
    pub ejected_for_s: f64,
    /// Wall-clock (unix seconds) end of the current ejection, if ejected.
    pub ejected_until: Option<f64>,
    pub ewma_rtt_s: Option<f64>,
    pub rtt_p50_s: Option<f64>,
    pub rtt_p95_s: Option<f64>,
    pub ewma_ttft_s: Option<f64>,
    pub ttft_p50_s: Option<f64>,
    pub ttft_p95_s: Option<f64>,
    pub ewma_total_s: Option<f64>,
    pub ewma_connect_s: Option<f64>,
    pub consecutive_failures: u32,
    pub passive_failures: u32,
    pub ejections: u64,
    pub last_error: Option<String>,
    pub probes: u64,
    pub probe_failures: u64,
    pub passive_reports: u64,
    pub last_probe_age_s: Option<f64>,
    /// Seconds since the last TTFT sample: a region without traffic keeps an old estimate.
    pub ttft_age_s: Option<f64>,
}

impl RegionSnapshot {
    /// Healthy and not ejected: selection may send traffic here.
    pub fn available(&self) -> bool {
        self.healthy && !self.ejected
    }
}

/// A health transition worth logging (the prober itself logs nothing).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Transition {
    None,
    BecameHealthy,
    BecameUnhealthy,
    Ejected,
    Reinstated,
}

impl Transition {
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::None => "none",
            Self::BecameHealthy => "healthy",
            Self::BecameUnhealthy => "unhealthy",
            Self::Ejected => "ejected",
            Self::Reinstated => "reinstated",
        }
    }
}

/// A health transition of one region, stamped with wall-clock unix seconds.
#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    pub region: String,
    pub transition: Transition,
    pub at: f64,
    pub detail: Option<String>,
}

const MAX_EVENTS: usize = 1024;

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// The health table: settings plus per-region state, updated by probes and passive reports.
#[derive(Debug)]
pub struct Table {
    pub settings: Settings,
    regions: BTreeMap<String, RegionState>,
    /// Transitions not yet taken by `take_events`, oldest first, bounded.
    events: VecDeque<Event>,
    generations: u64,
}

impl Table {
    pub fn new(settings: Settings) -> Self {
        Self {
            settings,
            regions: BTreeMap::new(),
            events: VecDeque::new(),
            generations: 0,
        }
    }

    fn push_event(&mut self, region: &str, transition: Transition) {
        if transition == Transition::None {
            return;
        }
        while self.events.len() >= MAX_EVENTS {
            self.events.pop_front();
        }
        let detail = self.regions.get(region).and_then(|r| r.last_error.clone());
        self.events.push_back(Event {
            region: region.to_owned(),
            transition,
            at: unix_now(),
            detail,
        });
    }

    /// Every transition since the last call, oldest first.
    pub fn take_events(&mut self) -> Vec<Event> {
        self.events.drain(..).collect()
    }

    /// Add a region, change its URL (resetting its state) or its own probe path (keeping it).
    pub fn upsert(
        &mut self,
        name: &str,
        url: &str,
        path: Option<&str>,
    ) -> Result<Upsert, ProberError> {
        let target = Target::parse(url)?;
        if let Some(p) = path {
            check_path(p)?;
        }
        self.generations += 1;
        let generation = self.generations;
        if let Some(r) = self.regions.get_mut(name) {
            if r.url == url {
                if r.path.as_deref() == path {
                    return Ok(Upsert::Unchanged);
                }
                r.path = path.map(str::to_owned);
                r.use_fallback_path = false;
                r.generation = generation;
                return Ok(Upsert::PathChanged);
            }
        }
        let state = RegionState::new(url.to_owned(), target, path.map(str::to_owned), generation);
        self.regions.insert(name.to_owned(), state);
        Ok(Upsert::Reset)
    }

    pub fn remove(&mut self, name: &str) -> bool {
        self.regions.remove(name).is_some()
    }

    pub fn names(&self) -> Vec<String> {
        self.regions.keys().cloned().collect()
    }

    /// The next probe round of a region; None once it is gone.
    pub fn plan(&self, name: &str) -> Option<Plan> {
        let r = self.regions.get(name)?;
        let (path, fallback) = r.probe_paths(&self.settings);
        Some(Plan {
            generation: r.generation,
            target: r.target.clone(),
            path: path.to_owned(),
            fallback: fallback.map(str::to_owned),
            timeout: self.settings.timeout,
        })
    }

    /// Judge a finished round against the settings and record it. `fell_back`: the planned path
    /// answered 404 and `answer` is the fallback's. A round planned before the region changed
    /// (or was removed) is dropped: None.
    pub fn record_round(
        &mut self,
        name: &str,
        generation: u64,
        now: Instant,
        answer: Result<ProbeAnswer, String>,
        fell_back: bool,
    ) -> Option<Transition> {
        let r = self.regions.get_mut(name)?;
        if r.generation != generation {
            return None;
        }
        if fell_back {
            r.use_fallback_path = true;
        }
        let (rtt, error) = match answer {
            Ok(a) if !self.settings.status_ok(a.status) => {
                (Some(a.rtt), Some(format!("status {}", a.status)))
            }
            Ok(a) => (Some(a.rtt), None),
            Err(e) => (None, Some(e)),
        };
        Some(self.record_probe(name, now, rtt, error))
    }

    /// Record an active probe result; `rtt` is set for any answer, `error` for a failure.
    pub fn record_probe(
        &mut self,
        name: &str,
        now: Instant,
        rtt: Option<Duration>,
        error: Option<String>,
    ) -> Transition {
        let t = self.apply_probe(name, now, rtt, error);
        self.push_event(name, t.clone());
        t
    }

    fn apply_probe(
        &mut self,
        name: &str,
        now: Instant,
        rtt: Option<Duration>,
        error: Option<String>,
    ) -> Transition {
        let cfg = &self.settings;
        let Some(r) = self.regions.get_mut(name) else {
            return Transition::None;
        };
        r.probes += 1;
        r.last_probe = Some(now);
        if let Some(rtt) = rtt {
            r.rtt.record(rtt.as_secs_f64(), cfg.ewma_alpha, cfg.window);
        }
        if let Some(e) = error {
            r.probe_failures += 1;
            r.successes = 0;
            r.failures = r.failures.saturating_add(1);
            r.last_error = Some(e);
            // The first probe decides at once: no history to be patient with.
            let flip = r.health == Health::Unknown
                || (r.health == Health::Healthy && r.failures >= cfg.unhealthy_after);
            if flip {
                r.health = Health::Unhealthy;
                return Transition::BecameUnhealthy;
            }
            return Transition::None;
        }
        r.failures = 0;
        r.successes = r.successes.saturating_add(1);
        let mut t = Transition::None;
        if r.health == Health::Unknown
            || (r.health == Health::Unhealthy && r.successes >= cfg.healthy_after)
        {
            r.health = Health::Healthy;
            t = Transition::BecameHealthy;
        }
        if let Some(until) = r.ejected_until {
            if now >= until {
                r.ejected_until = None;
                r.passive_failures = 0;
                if t == Transition::None {
                    t = Transition::Reinstated;
                }
            }
        }
        // A region that stayed clean for a full max ejection earns back one backoff level.
        if r.ejected_until.is_none() && r.ejection_level > 0 {
            if let Some(last) = r.last_ejection {
                if now.duration_since(last) >= cfg.max_ejection {
                    r.ejection_level -= 1;
                    r.last_ejection = Some(now);
                }
            }
        }
        t
    }

    /// Record the outcome of one proxied attempt; latencies in seconds where known.
    pub fn record_passive(
        &mut self,
        name: &str,
        now: Instant,
        outcome: Outcome,
        connect_s: Option<f64>,
        ttft_s: Option<f64>,
        total_s: Option<f64>,
    ) -> Option<Transition> {
        let t = self.apply_passive(name, now, outcome, connect_s, ttft_s, total_s);
        if let Some(t) = &t {
            self.push_event(name, t.clone());
        }
        t
    }

    fn apply_passive(
        &mut self,
        name: &str,
        now: Instant,
        outcome: Outcome,
        connect_s: Option<f64>,
        ttft_s: Option<f64>,
        total_s: Option<f64>,
    ) -> Option<Transition> {
        let cfg = &self.settings;
        let r = self.regions.get_mut(name)?;
        r.passive_reports += 1;
        let sane = |x: Option<f64>| x.filter(|v| v.is_finite() && *v >= 0.0);
        if let Some(c) = sane(connect_s) {
            r.connect.record(c, cfg.ewma_alpha, cfg.window);
        }
        if outcome == Outcome::Ok {
            if let Some(t) = sane(ttft_s) {
                r.ttft.record(t, cfg.ewma_alpha, cfg.window);
                r.last_ttft = Some(now);
            }
            if let Some(t) = sane(total_s) {
                r.total.record(t, cfg.ewma_alpha, cfg.window);
            }
            r.passive_failures = 0;
            return Some(Transition::None);
        }
        if !outcome.is_failure() {
            return Some(Transition::None);
        }
        if r.ejected_until.is_some() {
            // Attempts already in flight when the region was ejected say nothing new.
            return Some(Transition::None);
        }
        r.passive_failures = r.passive_failures.saturating_add(1);
        r.last_error = Some(format!("passive: {outcome:?}"));
        if r.passive_failures < cfg.eject_after {
            return Some(Transition::None);
        }
        r.ejection_level = r.ejection_level.saturating_add(1);
        r.ejections += 1;
        r.ejected_until = Some(later(now, cfg.ejection_for(r.ejection_level)));
        r.last_ejection = Some(now);
        r.passive_failures = 0;
        Some(Transition::Ejected)
    }

    /// What region selection reads on every request (sorted by name): no quantiles, no clones
    /// beyond the name.
    pub fn routing_view(&self, now: Instant) -> Vec<RoutingView> {
        self.regions
            .iter()
            .map(|(name, r)| RoutingView {
                name: name.clone(),
                available: r.healthy() && r.ejected_until.is_none(),
                healthy: r.healthy(),
                ewma_rtt_s: r.rtt.ewma(),
                ewma_ttft_s: r.ttft.ewma(),
                ttft_age_s: r.ttft_age_s(now),
            })
            .collect()
    }

    /// Copy every region's state out (sorted by name).
    pub fn snapshot(&self, now: Instant) -> Vec<RegionSnapshot> {
        let wall = unix_now();
        self.regions
            .iter()
            .map(|(name, r)| {
                let left = r
                    .ejected_until
                    .map(|u| u.saturating_duration_since(now).as_secs_f64());
                RegionSnapshot {
                    name: name.clone(),
                    url: r.url.clone(),
                    probe_path: r.target.request_path(r.probe_paths(&self.settings).0),
                    healthy: r.healthy(),
                    probed: r.health != Health::Unknown,
                    ejected: r.ejected_until.is_some(),
                    ejected_for_s: left.unwrap_or(0.0),
                    ejected_until: left.map(|l| wall + l),
                    ewma_rtt_s: r.rtt.ewma(),
                    rtt_p50_s: r.rtt.quantile(0.5),
                    rtt_p95_s: r.rtt.quantile(0.95),
                    ewma_ttft_s: r.ttft.ewma(),
                    ttft_p50_s: r.ttft.quantile(0.5),
                    ttft_p95_s: r.ttft.quantile(0.95),
                    ewma_total_s: r.total.ewma(),
                    ewma_connect_s: r.connect.ewma(),
                    consecutive_failures: r.failures,
                    passive_failures: r.passive_failures,
                    ejections: r.ejections,
                    last_error: r.last_error.clone(),
                    probes: r.probes,
                    probe_failures: r.probe_failures,
                    passive_reports: r.passive_reports,
                    last_probe_age_s: r.last_probe.map(|t| now.duration_since(t).as_secs_f64()),
                    ttft_age_s: r.ttft_age_s(now),
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> Settings {
        Settings {
            interval: Duration::from_millis(50),
            timeout: Duration::from_millis(300),
            eject_after: 3,
            base_ejection: Duration::from_secs(2),
            max_ejection: Duration::from_secs(10),
            ..Settings::default()
        }
    }

    fn table_with(name: &str) -> Table {
        let mut t = Table::new(cfg());
        t.upsert(name, "http://127.0.0.1:9", None).unwrap();
        t
    }

    fn answer(status: u16) -> ProbeAnswer {
        ProbeAnswer {
            status,
            rtt: Duration::from_millis(5),
            handshake: None,
        }
    }

    #[test]
    fn stats_ewma_and_quantiles() {
        let mut s = Stats::default();
        assert_eq!(s.quantile(0.5), None);
        for x in 1..=100 {
            s.record(f64::from(x), 0.5, 50);
        }
        // Only the last 50 samples (51..=100) are in the window.
        assert_eq!(s.quantile(0.5), Some(75.0));
        assert_eq!(s.quantile(0.95), Some(98.0));
        assert_eq!(s.quantile(0.0), Some(51.0));
        let e = s.ewma().unwrap();
        assert!(e > 98.0 && e < 100.0, "{e}");
    }

    #[test]
    fn thresholds_flip_health() {
        let mut t = table_with("a");
        let now = Instant::now();
        let ok = Some(Duration::from_millis(5));
        // Unknown counts as healthy; the first probe decides at once.
        assert!(t.snapshot(now)[0].healthy);
        assert_eq!(
            t.record_probe("a", now, ok, None),
            Transition::BecameHealthy
        );
        assert_eq!(
            t.record_probe("a", now, None, Some("x".into())),
            Transition::None
        );
        assert!(t.snapshot(now)[0].healthy);
        assert_eq!(
            t.record_probe("a", now, None, Some("x".into())),
            Transition::BecameUnhealthy
        );
        let s = &t.snapshot(now)[0];
        assert!(!s.healthy && !s.available());
        assert_eq!(s.consecutive_failures, 2);
        assert_eq!(s.last_error.as_deref(), Some("x"));
        assert_eq!(t.record_probe("a", now, ok, None), Transition::None);
        assert_eq!(
            t.record_probe("a", now, ok, None),
            Transition::BecameHealthy
        );
        let mut fresh = table_with("b");
        assert_eq!(
            fresh.record_probe("b", now, None, Some("x".into())),
            Transition::BecameUnhealthy
        );
    }

    #[test]
    fn passive_failures_eject_with_backoff_and_probe_reinstates() {
        let mut t = table_with("a");
        let t0 = Instant::now();
        t.record_probe("a", t0, Some(Duration::from_millis(1)), None);
        let fail =
            |t: &mut Table, at| t.record_passive("a", at, Outcome::ServerError, None, None, None);
        assert_eq!(fail(&mut t, t0), Some(Transition::None));
        // A success in between resets the streak, a neutral outcome does not.
        t.record_passive("a", t0, Outcome::Ok, Some(0.001), Some(0.05), Some(0.2));
        fail(&mut t, t0);
        t.record_passive("a", t0, Outcome::Neutral, None, None, None);
        fail(&mut t, t0);
        assert_eq!(fail(&mut t, t0), Some(Transition::Ejected));
        let s = &t.snapshot(t0)[0];
        assert!(s.ejected && s.healthy && !s.available());
        assert!((s.ejected_for_s - 2.0).abs() < 1e-6);
        assert_eq!(s.ejections, 1);
        assert_eq!(s.ewma_ttft_s, Some(0.05));
        // Failures while ejected are in-flight stragglers.
        assert_eq!(fail(&mut t, t0), Some(Transition::None));
        // A good probe before the ejection ends does not reinstate; one after does.
        let ok = Some(Duration::from_millis(1));
        assert_eq!(
            t.record_probe("a", t0 + Duration::from_secs(1), ok, None),
            Transition::None
        );
        assert!(t.snapshot(t0 + Duration::from_secs(1))[0].ejected);
        let t1 = t0 + Duration::from_secs(2);
        assert_eq!(t.record_probe("a", t1, ok, None), Transition::Reinstated);
        assert!(t.snapshot(t1)[0].available());
        // Ejected again soon after: twice as long.
        for _ in 0..3 {
            t.record_passive("a", t1, Outcome::Timeout, None, None, None);
        }
        assert!((t.snapshot(t1)[0].ejected_for_s - 4.0).abs() < 1e-6);
        assert_eq!(
            t.record_passive("zzz", t1, Outcome::Ok, None, None, None),
            None
        );
    }

    #[test]
    fn huge_ejections_are_capped_not_a_panic() {
        // Settings are validated before they get here; the arithmetic must not rely on it.
        let mut t = Table::new(Settings {
            eject_after: 1,
            base_ejection: Duration::MAX,
            max_ejection: Duration::MAX,
            ..cfg()
        });
        t.upsert("a", "http://127.0.0.1:9", None).unwrap();
        let now = Instant::now();
        assert_eq!(
            t.record_passive("a", now, Outcome::Timeout, None, None, None),
            Some(Transition::Ejected)
        );
        let s = &t.snapshot(now)[0];
        assert!(s.ejected && s.ejected_for_s <= MAX_DURATION.as_secs_f64());
    }

    #[test]
    fn backoff_level_decays_after_a_clean_max_ejection() {
        let mut t = table_with("a");
        let t0 = Instant::now();
        let ok = Some(Duration::from_millis(1));
        t.record_probe("a", t0, ok, None);
        for _ in 0..3 {
            t.record_passive("a", t0, Outcome::ConnectError, None, None, None);
        }
        let t1 = t0 + Duration::from_secs(2);
        assert_eq!(t.record_probe("a", t1, ok, None), Transition::Reinstated);
        t.record_probe("a", t0 + Duration::from_secs(11), ok, None);
        let t2 = t0 + Duration::from_secs(12);
        for _ in 0..3 {
            t.record_passive("a", t2, Outcome::ConnectError, None, None, None);
        }
        assert!((t.snapshot(t2)[0].ejected_for_s - 2.0).abs() < 1e-6);
    }

    #[test]
    fn upsert_resets_only_on_url_change() {
        let mut t = table_with("a");
        let now = Instant::now();
        t.record_probe("a", now, None, Some("down".into()));
        assert_eq!(
            t.upsert("a", "http://127.0.0.1:9", None).unwrap(),
            Upsert::Unchanged
        );
        assert!(!t.snapshot(now)[0].healthy);
        // A new path keeps the history; a new URL does not.
        assert_eq!(
            t.upsert("a", "http://127.0.0.1:9", Some("/live")).unwrap(),
            Upsert::PathChanged
        );
        assert!(!t.snapshot(now)[0].healthy);
        assert_eq!(
            t.upsert("a", "http://127.0.0.1:10", Some("/live")).unwrap(),
            Upsert::Reset
        );
        assert!(t.snapshot(now)[0].healthy);
        assert!(t.upsert("b", "nope", None).is_err());
        assert!(t.upsert("b", "http://h", Some("live")).is_err());
        assert!(t.remove("a") && !t.remove("a"));
    }

    #[test]
    fn plans_use_own_path_or_global_then_fallback() {
        let mut t = Table::new(cfg());
        t.upsert("g", "http://h:1/proxy/v1", None).unwrap();
        t.upsert("own", "http://h:2", Some("/live")).unwrap();
        let g = t.plan("g").unwrap();
        assert_eq!(
            (g.path.as_str(), g.fallback.as_deref()),
            ("/health", Some("/v1/models"))
        );
        assert_eq!(g.timeout, Duration::from_millis(300));
        let own = t.plan("own").unwrap();
        assert_eq!((own.path.as_str(), own.fallback), ("/live", None));
        assert_eq!(t.plan("zzz"), None);
        // A 404 on the global path switches the region to the fallback for good.
        let now = Instant::now();
        assert_eq!(
            t.record_round("g", g.generation, now, Ok(answer(200)), true),
            Some(Transition::BecameHealthy)
        );
        let g2 = t.plan("g").unwrap();
        assert_eq!((g2.path.as_str(), g2.fallback), ("/v1/models", None));
        let paths: Vec<String> = t.snapshot(now).into_iter().map(|s| s.probe_path).collect();
        assert_eq!(paths, ["/proxy/v1/models", "/live"]);
        // Giving it a path of its own ends the fallback; taking it away restarts the search.
        t.upsert("g", "http://h:1/proxy/v1", Some("/ready"))
            .unwrap();
        assert_eq!(t.plan("g").unwrap().path, "/ready");
        t.upsert("g", "http://h:1/proxy/v1", None).unwrap();
        assert_eq!(t.plan("g").unwrap().fallback.as_deref(), Some("/v1/models"));
    }

    #[test]
    fn rounds_are_judged_by_status_and_stale_rounds_dropped() {
        let mut t = table_with("a");
        let now = Instant::now();
        let plan = t.plan("a").unwrap();
        assert_eq!(
            t.record_round("a", plan.generation, now, Ok(answer(503)), false),
            Some(Transition::BecameUnhealthy)
        );
        let s = &t.snapshot(now)[0];
        assert_eq!(s.last_error.as_deref(), Some("status 503"));
        assert!(
            s.ewma_rtt_s.is_some(),
            "an answer has an RTT even when it fails"
        );
        t.record_round(
            "a",
            plan.generation,
            now,
            Err("connect: refused".into()),
            false,
        );
        assert_eq!(t.snapshot(now)[0].probes, 2);
        // Re-pointed while the round ran: its result belongs to the old URL.
        t.upsert("a", "http://127.0.0.1:10", None).unwrap();
        assert_eq!(
            t.record_round("a", plan.generation, now, Ok(answer(200)), false),
            None
        );
        assert_eq!(t.snapshot(now)[0].probes, 0);
        t.settings.expected_statuses = vec![503];
        let plan = t.plan("a").unwrap();
        assert_eq!(
            t.record_round("a", plan.generation, now, Ok(answer(503)), false),
            Some(Transition::BecameHealthy)
        );
        assert_eq!(t.record_round("gone", 0, now, Ok(answer(200)), false), None);
    }

    #[test]
    fn transitions_are_queued_as_events() {
        let mut t = table_with("a");
        let now = Instant::now();
        t.record_probe("a", now, None, Some("refused".into()));
        t.record_probe("a", now, None, Some("refused".into()));
        let ev = t.take_events();
        assert_eq!(ev.len(), 1);
        assert_eq!(
            (ev[0].region.as_str(), ev[0].transition.as_str()),
            ("a", "unhealthy")
        );
        assert_eq!(ev[0].detail.as_deref(), Some("refused"));
        assert!(t.take_events().is_empty());
    }

    #[test]
    fn outcomes_parse() {
        assert_eq!(Outcome::parse("timeout"), Ok(Outcome::Timeout));
        assert!(Outcome::parse("boom").is_err());
    }
}
