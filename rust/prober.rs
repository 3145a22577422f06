//! Region health: active HTTP probes on a tokio thread, passive outcomes, thresholds, EWMA, ejection.
//!
//! The table (`Table`) is pure state with an explicit clock so thresholds and ejection are unit
//! tested without sockets; `Prober` owns a tokio runtime on its own OS thread that probes every
//! region and writes into the same table the proxy reports passive outcomes to.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::oneshot;

/// How the prober probes and when health flips.
#[derive(Clone, Debug, PartialEq)]
pub struct ProbeConfig {
    pub interval: Duration,
    /// Fraction of `interval` added or removed at random so regions are not probed in lockstep.
    pub jitter: f64,
    pub timeout: Duration,
    pub path: String,
    /// Used for a region whose `path` answers 404 (`llama.cpp` and `OpenAI` have no `/health`).
    pub fallback_path: String,
    /// Statuses that count as a successful probe; empty means any 2xx.
    pub expected_statuses: Vec<u16>,
    pub healthy_after: u32,
    pub unhealthy_after: u32,
    pub ewma_alpha: f64,
    pub window: usize,
    /// Consecutive passive failures (5xx, connect failures, timeouts) that eject a region.
    pub eject_after: u32,
    pub base_ejection: Duration,
    pub max_ejection: Duration,
}

impl Default for ProbeConfig {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(1),
            jitter: 0.1,
            timeout: Duration::from_millis(800),
            path: "/health".to_owned(),
            fallback_path: "/v1/models".to_owned(),
            expected_statuses: Vec::new(),
            healthy_after: 2,
            unhealthy_after: 2,
            ewma_alpha: 0.3,
            window: 64,
            eject_after: 5,
            base_ejection: Duration::from_secs(5),
            max_ejection: Duration::from_secs(60),
        }
    }
}

impl ProbeConfig {
    /// Reject settings the prober cannot honour.
    pub fn validate(&self) -> Result<(), ProberError> {
        let bad = |what: &str| Err(ProberError::Config(what.to_owned()));
        if self.interval.is_zero() {
            return bad("interval must be > 0");
        }
        if self.timeout.is_zero() {
            return bad("timeout must be > 0");
        }
        if !(0.0..1.0).contains(&self.jitter) {
            return bad("jitter must be in [0, 1)");
        }
        if !(self.ewma_alpha > 0.0 && self.ewma_alpha <= 1.0) {
            return bad("ewma_alpha must be in (0, 1]");
        }
        if self.window == 0 || self.healthy_after == 0 || self.unhealthy_after == 0 {
            return bad("window, healthy_after and unhealthy_after must be >= 1");
        }
        if self.eject_after == 0 {
            return bad("eject_after must be >= 1");
        }
        if self.base_ejection > self.max_ejection {
            return bad("base_ejection must be <= max_ejection");
        }
        if !self.path.starts_with('/') || !self.fallback_path.starts_with('/') {
            return bad("probe paths must start with '/'");
        }
        Ok(())
    }

    /// The ejection length for the k-th ejection in a row: base * 2^(k-1), capped.
    pub fn ejection_for(&self, level: u32) -> Duration {
        let factor = 1u32 << level.saturating_sub(1).min(20);
        self.base_ejection
            .saturating_mul(factor)
            .min(self.max_ejection)
    }

    fn status_ok(&self, status: u16) -> bool {
        if self.expected_statuses.is_empty() {
            (200..300).contains(&status)
        } else {
            self.expected_statuses.contains(&status)
        }
    }
}

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

/// Where a region is probed, parsed from its base URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    pub host: String,
    pub port: u16,
    /// Path prefix of the base URL without a trailing slash or `/v1` (e.g. "" or "/proxy").
    pub prefix: String,
    /// https: only a TCP connect is probed (no TLS client here), so the status is not checked.
    pub tls: bool,
}

impl Target {
    /// Parse `http://host[:port][/prefix]` or `https://...`.
    pub fn parse(url: &str) -> Result<Self, ProberError> {
        let err = || ProberError::Url(url.to_owned());
        let (tls, rest) = if let Some(r) = url.strip_prefix("http://") {
            (false, r)
        } else if let Some(r) = url.strip_prefix("https://") {
            (true, r)
        } else {
            return Err(err());
        };
        let (authority, path) = rest.find('/').map_or((rest, ""), |i| rest.split_at(i));
        if authority.is_empty() || authority.contains('@') {
            return Err(err());
        }
        let default_port = if tls { 443 } else { 80 };
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            let (h, after) = v6.split_once(']').ok_or_else(err)?;
            let port = match after.strip_prefix(':') {
                Some(p) => p.parse().map_err(|_| err())?,
                None if after.is_empty() => default_port,
                None => return Err(err()),
            };
            (h.to_owned(), port)
        } else {
            match authority.rsplit_once(':') {
                Some((h, p)) => (h.to_owned(), p.parse().map_err(|_| err())?),
                None => (authority.to_owned(), default_port),
            }
        };
        if host.is_empty() || port == 0 {
            return Err(err());
        }
        // Probe paths are from the server root: a base URL ending in /v1 (OpenAI style, as
        // regions are configured) has /health and /v1/models one level up.
        let prefix = path.trim_end_matches('/');
        let prefix = prefix.strip_suffix("/v1").unwrap_or(prefix);
        Ok(Self {
            host,
            port,
            prefix: prefix.to_owned(),
            tls,
        })
    }

    fn authority(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

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
    use_fallback_path: bool,
}

impl RegionState {
    fn new(url: String, target: Target) -> Self {
        Self {
            url,
            target,
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

/// The health table: config plus per-region state, updated by probes and passive reports.
#[derive(Debug)]
pub struct Table {
    pub config: ProbeConfig,
    regions: BTreeMap<String, RegionState>,
    /// Transitions not yet taken by `take_events`, oldest first, bounded.
    events: VecDeque<Event>,
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

impl Table {
    pub fn new(config: ProbeConfig) -> Self {
        Self {
            config,
            regions: BTreeMap::new(),
            events: VecDeque::new(),
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

    /// Add a region, or change its URL (resetting its state when the URL changes).
    pub fn upsert(&mut self, name: &str, url: &str) -> Result<bool, ProberError> {
        let target = Target::parse(url)?;
        if let Some(r) = self.regions.get(name) {
            if r.url == url {
                return Ok(false);
            }
        }
        self.regions
            .insert(name.to_owned(), RegionState::new(url.to_owned(), target));
        Ok(true)
    }

    pub fn remove(&mut self, name: &str) -> bool {
        self.regions.remove(name).is_some()
    }

    pub fn names(&self) -> Vec<String> {
        self.regions.keys().cloned().collect()
    }

    pub fn get(&self, name: &str) -> Option<&RegionState> {
        self.regions.get(name)
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
        let cfg = &self.config;
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
        let cfg = &self.config;
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
        r.ejected_until = Some(now + cfg.ejection_for(r.ejection_level));
        r.last_ejection = Some(now);
        r.passive_failures = 0;
        Some(Transition::Ejected)
    }

    /// What region selection reads on every request (sorted by name): no quantiles, no clones
    /// beyond the name. `(name, available, healthy, ewma_rtt_s, ewma_ttft_s, ttft_age_s)`.
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

/// One probe's answer: the status (None for a TCP-only probe) and the round-trip time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProbeAnswer {
    pub status: Option<u16>,
    pub rtt: Duration,
}

/// GET `path` on the target over plain HTTP/1.1; RTT runs from connect start to the status line.
pub async fn probe_once(
    target: &Target,
    path: &str,
    timeout: Duration,
) -> Result<ProbeAnswer, String> {
    let started = Instant::now();
    let work = async {
        let mut stream = TcpStream::connect((target.host.as_str(), target.port))
            .await
            .map_err(|e| format!("connect: {e}"))?;
        if target.tls {
            return Ok(ProbeAnswer {
                status: None,
                rtt: started.elapsed(),
            });
        }
        let _ = stream.set_nodelay(true);
        let request = format!(
            "GET {}{} HTTP/1.1\r\nHost: {}\r\nUser-Agent: router-prober\r\nAccept: */*\r\n\
             Connection: close\r\n\r\n",
            target.prefix,
            path,
            target.authority()
        );
        stream
            .write_all(request.as_bytes())
            .await
            .map_err(|e| format!("write: {e}"))?;
        let mut buf = Vec::with_capacity(1024);
        let mut chunk = [0u8; 4096];
        let (status, rtt) = loop {
            let n = stream
                .read(&mut chunk)
                .await
                .map_err(|e| format!("read: {e}"))?;
            if n == 0 {
                return Err("connection closed before the status line".to_owned());
            }
            buf.extend_from_slice(&chunk[..n]);
            if let Some(end) = buf.windows(2).position(|w| w == b"\r\n") {
                break (parse_status_line(&buf[..end])?, started.elapsed());
            }
            if buf.len() > 8192 {
                return Err("status line too long".to_owned());
            }
        };
        // Drain the (small) rest so the server sees an orderly close, not a reset.
        let mut drained = buf.len();
        while drained < 256 * 1024 {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => drained += n,
            }
        }
        Ok(ProbeAnswer {
            status: Some(status),
            rtt,
        })
    };
    match tokio::time::timeout(timeout, work).await {
        Ok(r) => r,
        Err(_) => Err(format!("timeout after {:.3}s", timeout.as_secs_f64())),
    }
}

fn parse_status_line(line: &[u8]) -> Result<u16, String> {
    let text = std::str::from_utf8(line).map_err(|_| "status line is not text".to_owned())?;
    let mut parts = text.split(' ');
    let version = parts.next().unwrap_or("");
    let code = parts.next().unwrap_or("");
    if !version.starts_with("HTTP/1.") || code.len() != 3 {
        return Err(format!("bad status line {text:?}"));
    }
    code.parse()
        .map_err(|_| format!("bad status line {text:?}"))
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

pub type Shared = Arc<Mutex<Table>>;

/// Lock the table, surviving a panicked holder (the table stays consistent field by field).
pub fn lock(table: &Shared) -> MutexGuard<'_, Table> {
    table
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// One region's probe round: the configured path, then the fallback path if that is a 404.
async fn probe_round(table: &Shared, name: &str) -> Option<Transition> {
    let (target, cfg, fallback) = {
        let t = lock(table);
        let r = t.get(name)?;
        (r.target.clone(), t.config.clone(), r.use_fallback_path)
    };
    let path = if fallback {
        &cfg.fallback_path
    } else {
        &cfg.path
    };
    let mut result = probe_once(&target, path, cfg.timeout).await;
    let mut switched = false;
    if !fallback
        && matches!(
            result,
            Ok(ProbeAnswer {
                status: Some(404),
                ..
            })
        )
    {
        result = probe_once(&target, &cfg.fallback_path, cfg.timeout).await;
        switched = true;
    }
    let now = Instant::now();
    let mut t = lock(table);
    if switched {
        if let Some(r) = t.regions.get_mut(name) {
            r.use_fallback_path = true;
        }
    }
    let transition = match result {
        Ok(ProbeAnswer {
            status: Some(s),
            rtt,
        }) if !cfg.status_ok(s) => {
            t.record_probe(name, now, Some(rtt), Some(format!("status {s}")))
        }
        Ok(answer) => t.record_probe(name, now, Some(answer.rtt), None),
        Err(e) => t.record_probe(name, now, None, Some(e)),
    };
    Some(transition)
}

async fn probe_loop(table: Shared, name: String) {
    let mut jitter = Jitter::new(&name);
    loop {
        if probe_round(&table, &name).await.is_none() {
            return; // region removed
        }
        let (interval, spread) = {
            let t = lock(&table);
            (t.config.interval.as_secs_f64(), t.config.jitter)
        };
        let wait = interval * (1.0 + spread * jitter.next());
        tokio::time::sleep(Duration::from_secs_f64(wait.max(0.001))).await;
    }
}

/// The running side: a tokio runtime on its own thread and one probe task per region.
struct Running {
    handle: tokio::runtime::Handle,
    shutdown: oneshot::Sender<()>,
    thread: JoinHandle<()>,
    tasks: HashMap<String, tokio::task::JoinHandle<()>>,
}

/// The health table plus the thread that probes it.
pub struct Prober {
    table: Shared,
    running: Mutex<Option<Running>>,
}

impl Prober {
    pub fn new(config: ProbeConfig) -> Result<Self, ProberError> {
        config.validate()?;
        Ok(Self {
            table: Arc::new(Mutex::new(Table::new(config))),
            running: Mutex::new(None),
        })
    }

    pub fn table(&self) -> &Shared {
        &self.table
    }

    fn running(&self) -> MutexGuard<'_, Option<Running>> {
        self.running
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub fn is_running(&self) -> bool {
        self.running().is_some()
    }

    /// Start the probe thread (idempotent).
    pub fn start(&self) -> Result<(), ProberError> {
        let mut running = self.running();
        if running.is_some() {
            return Ok(());
        }
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
                // Dropping the runtime cancels every probe task.
            })
            .map_err(|e| ProberError::Runtime(e.to_string()))?;
        let mut state = Running {
            handle,
            shutdown: tx,
            thread,
            tasks: HashMap::new(),
        };
        for name in lock(&self.table).names() {
            spawn_probe(&mut state, &self.table, name);
        }
        *running = Some(state);
        Ok(())
    }

    /// Stop probing and join the thread (idempotent); the table keeps its last state.
    pub fn stop(&self) {
        let taken = self.running().take();
        if let Some(state) = taken {
            for task in state.tasks.values() {
                task.abort();
            }
            let _ = state.shutdown.send(());
            let _ = state.thread.join();
        }
    }

    /// Add a region or change its URL; a running prober starts (or restarts) probing it.
    pub fn upsert_region(&self, name: &str, url: &str) -> Result<(), ProberError> {
        let changed = lock(&self.table).upsert(name, url)?;
        if changed {
            if let Some(state) = self.running().as_mut() {
                spawn_probe(state, &self.table, name.to_owned());
            }
        }
        Ok(())
    }

    pub fn remove_region(&self, name: &str) -> bool {
        if let Some(state) = self.running().as_mut() {
            if let Some(task) = state.tasks.remove(name) {
                task.abort();
            }
        }
        lock(&self.table).remove(name)
    }

    /// Replace the probe config (hot reload); takes effect at each region's next round.
    pub fn set_config(&self, config: ProbeConfig) -> Result<(), ProberError> {
        config.validate()?;
        lock(&self.table).config = config;
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
        lock(&self.table).record_passive(name, Instant::now(), outcome, connect_s, ttft_s, total_s)
    }

    pub fn snapshot(&self) -> Vec<RegionSnapshot> {
        lock(&self.table).snapshot(Instant::now())
    }

    /// Every region's routing inputs now (see [`Table::routing_view`]).
    pub fn routing_view(&self) -> Vec<RoutingView> {
        lock(&self.table).routing_view(Instant::now())
    }

    pub fn take_events(&self) -> Vec<Event> {
        lock(&self.table).take_events()
    }
}

fn spawn_probe(state: &mut Running, table: &Shared, name: String) {
    if let Some(old) = state.tasks.remove(&name) {
        old.abort();
    }
    let task = state
        .handle
        .spawn(probe_loop(Arc::clone(table), name.clone()));
    state.tasks.insert(name, task);
}

impl Drop for Prober {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    fn cfg() -> ProbeConfig {
        ProbeConfig {
            interval: Duration::from_millis(50),
            timeout: Duration::from_millis(300),
            eject_after: 3,
            base_ejection: Duration::from_secs(2),
            max_ejection: Duration::from_secs(10),
            ..ProbeConfig::default()
        }
    }

    fn table_with(name: &str) -> Table {
        let mut t = Table::new(cfg());
        t.upsert(name, "http://127.0.0.1:9").unwrap();
        t
    }

    #[test]
    fn target_parses_hosts_ports_prefixes() {
        let t = Target::parse("http://127.0.0.1:8080/base/").unwrap();
        assert_eq!(
            (t.host.as_str(), t.port, t.prefix.as_str(), t.tls),
            ("127.0.0.1", 8080, "/base", false)
        );
        let t = Target::parse("https://api.openai.com/v1").unwrap();
        assert_eq!((t.port, t.tls, t.prefix.as_str()), (443, true, ""));
        let t = Target::parse("http://h:1/proxy/v1/").unwrap();
        assert_eq!(t.prefix, "/proxy");
        let t = Target::parse("http://[::1]:81").unwrap();
        assert_eq!(
            (t.host.as_str(), t.port, t.authority()),
            ("::1", 81, "[::1]:81".to_owned())
        );
        for bad in [
            "ftp://x",
            "http://",
            "http://h:notaport",
            "http://h:0",
            "http://u@h",
            "h:80",
        ] {
            assert!(Target::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn config_validation_rejects_nonsense() {
        assert!(ProbeConfig::default().validate().is_ok());
        let bad = [
            ProbeConfig {
                interval: Duration::ZERO,
                ..cfg()
            },
            ProbeConfig {
                jitter: 1.0,
                ..cfg()
            },
            ProbeConfig {
                ewma_alpha: 0.0,
                ..cfg()
            },
            ProbeConfig {
                unhealthy_after: 0,
                ..cfg()
            },
            ProbeConfig {
                path: "health".into(),
                ..cfg()
            },
            ProbeConfig {
                base_ejection: Duration::from_secs(99),
                ..cfg()
            },
        ];
        for c in bad {
            assert!(c.validate().is_err(), "{c:?}");
        }
    }

    #[test]
    fn ejection_backoff_doubles_and_caps() {
        let c = cfg();
        let secs: Vec<u64> = (1..=5).map(|k| c.ejection_for(k).as_secs()).collect();
        assert_eq!(secs, vec![2, 4, 8, 10, 10]);
        assert_eq!(c.ejection_for(u32::MAX), c.max_ejection);
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
        assert!(!t.upsert("a", "http://127.0.0.1:9").unwrap());
        assert!(!t.snapshot(now)[0].healthy);
        assert!(t.upsert("a", "http://127.0.0.1:10").unwrap());
        assert!(t.snapshot(now)[0].healthy);
        assert!(t.upsert("b", "nope").is_err());
        assert!(t.remove("a") && !t.remove("a"));
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

    /// A tiny HTTP server answering `status` on `/health` (404 elsewhere) after `delay`.
    async fn server(health_status: u16, delay: Duration) -> (u16, tokio::task::JoinHandle<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut sock, _)) = listener.accept().await else {
                    return;
                };
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 2048];
                    let mut got = 0;
                    while !buf[..got].windows(4).any(|w| w == b"\r\n\r\n") {
                        match sock.read(&mut buf[got..]).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => got += n,
                        }
                    }
                    let head = String::from_utf8_lossy(&buf[..got]).to_string();
                    let status = if head.starts_with("GET /health ") {
                        health_status
                    } else if head.starts_with("GET /v1/models ") {
                        200
                    } else {
                        404
                    };
                    tokio::time::sleep(delay).await;
                    let body = "{}";
                    let resp = format!("HTTP/1.1 {status} X\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len());
                    let _ = sock.write_all(resp.as_bytes()).await;
                });
            }
        });
        (port, task)
    }

    fn local(port: u16) -> Target {
        Target::parse(&format!("http://127.0.0.1:{port}")).unwrap()
    }

    #[tokio::test]
    async fn probe_reads_status_and_measures_rtt() {
        let (port, _srv) = server(200, Duration::from_millis(30)).await;
        let a = probe_once(&local(port), "/health", Duration::from_secs(2))
            .await
            .unwrap();
        assert_eq!(a.status, Some(200));
        assert!(a.rtt >= Duration::from_millis(30), "{:?}", a.rtt);
        let a = probe_once(&local(port), "/nope", Duration::from_secs(2))
            .await
            .unwrap();
        assert_eq!(a.status, Some(404));
    }

    #[tokio::test]
    async fn probe_times_out_and_reports_refused() {
        let (port, _srv) = server(200, Duration::from_secs(5)).await;
        let e = probe_once(&local(port), "/health", Duration::from_millis(100))
            .await
            .unwrap_err();
        assert!(e.starts_with("timeout"), "{e}");
        let dead = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let dead_port = dead.local_addr().unwrap().port();
        drop(dead);
        let e = probe_once(&local(dead_port), "/health", Duration::from_secs(1))
            .await
            .unwrap_err();
        assert!(e.starts_with("connect"), "{e}");
    }

    #[tokio::test]
    async fn probe_round_falls_back_to_models_and_checks_status() {
        let (port, _srv) = server(404, Duration::ZERO).await;
        let table: Shared = Arc::new(Mutex::new(Table::new(cfg())));
        lock(&table)
            .upsert("a", &format!("http://127.0.0.1:{port}"))
            .unwrap();
        assert_eq!(
            probe_round(&table, "a").await,
            Some(Transition::BecameHealthy)
        );
        assert!(lock(&table).get("a").unwrap().use_fallback_path);
        let (port503, _srv2) = server(503, Duration::ZERO).await;
        lock(&table)
            .upsert("b", &format!("http://127.0.0.1:{port503}"))
            .unwrap();
        assert_eq!(
            probe_round(&table, "b").await,
            Some(Transition::BecameUnhealthy)
        );
        let snap = lock(&table).snapshot(Instant::now());
        assert_eq!(snap[1].last_error.as_deref(), Some("status 503"));
        assert!(snap[1].ewma_rtt_s.is_some());
        assert_eq!(probe_round(&table, "gone").await, None);
    }

    #[test]
    fn prober_thread_probes_flips_and_stops() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let (port, srv) = rt.block_on(server(200, Duration::ZERO));
        let server_thread = std::thread::spawn(move || {
            rt.block_on(async {
                let _ = srv.await;
            });
        });
        let prober = Prober::new(cfg()).unwrap();
        prober
            .upsert_region("up", &format!("http://127.0.0.1:{port}"))
            .unwrap();
        prober.upsert_region("down", "http://127.0.0.1:1").unwrap();
        prober.start().unwrap();
        prober.start().unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let s = prober.snapshot();
            if s.iter().all(|r| r.probes >= 3) {
                assert!(s.iter().find(|r| r.name == "up").unwrap().available());
                assert!(!s.iter().find(|r| r.name == "down").unwrap().healthy);
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
