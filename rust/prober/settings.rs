//! The prober's settings, defined once: defaults, validation, and the rules they imply.

use std::path::PathBuf;
use std::time::Duration;

use super::ProberError;

/// The longest any of the prober's times may be (interval, timeout, ejections): a day. Far
/// beyond any useful value, and far enough from `Instant`'s range that adding it never overflows.
pub const MAX_SECONDS: u64 = 86_400;

/// [`MAX_SECONDS`] as a `Duration`.
pub const MAX_DURATION: Duration = Duration::from_secs(MAX_SECONDS);

/// How the prober probes, which TLS roots it trusts, and when health flips.
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    pub interval: Duration,
    /// Fraction of `interval` added or removed at random so regions are not probed in lockstep.
    pub jitter: f64,
    /// Whole probe: connect, TLS handshake, request and status line.
    pub timeout: Duration,
    /// Probed on every region without a path of its own.
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
    /// PEM bundle of CA certificates trusted for https regions on top of the system store.
    pub ca_file: Option<PathBuf>,
}

impl Default for Settings {
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
            ca_file: None,
        }
    }
}

/// Reject a probe path that is not an absolute path of printable ASCII (it goes on the
/// request line verbatim, so a space or CR/LF would break or forge the request).
pub fn check_path(path: &str) -> Result<(), ProberError> {
    if !path.starts_with('/') {
        return Err(ProberError::Config(
            "probe paths must start with '/'".to_owned(),
        ));
    }
    if !path.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(ProberError::Config(format!(
            "probe path {path:?} must be printable ASCII without spaces"
        )));
    }
    Ok(())
}

impl Settings {
    /// Reject settings the prober cannot honour (no I/O: the CA file is read by `tls`).
    pub fn validate(&self) -> Result<(), ProberError> {
        let bad = |what: &str| Err(ProberError::Config(what.to_owned()));
        if self.interval.is_zero() {
            return bad("interval must be > 0");
        }
        if self.timeout.is_zero() {
            return bad("timeout must be > 0");
        }
        for (name, value) in [
            ("interval", self.interval),
            ("timeout", self.timeout),
            ("base_ejection", self.base_ejection),
            ("max_ejection", self.max_ejection),
        ] {
            if value > MAX_DURATION {
                return Err(ProberError::Config(format!(
                    "{name} must be at most {MAX_SECONDS} s, got {} s",
                    value.as_secs_f64()
                )));
            }
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
        if self
            .expected_statuses
            .iter()
            .any(|s| !(100..600).contains(s))
        {
            return bad("expected_statuses must be HTTP statuses (100-599)");
        }
        if self
            .ca_file
            .as_ref()
            .is_some_and(|p| p.as_os_str().is_empty())
        {
            return bad("ca_file must be a path or None");
        }
        check_path(&self.path)?;
        check_path(&self.fallback_path)
    }

    /// The ejection length for the k-th ejection in a row: base * 2^(k-1), capped.
    pub fn ejection_for(&self, level: u32) -> Duration {
        let factor = 1u32 << level.saturating_sub(1).min(20);
        self.base_ejection
            .saturating_mul(factor)
            .min(self.max_ejection)
    }

    /// Whether a probe's status counts as healthy.
    pub fn status_ok(&self, status: u16) -> bool {
        if self.expected_statuses.is_empty() {
            (200..300).contains(&status)
        } else {
            self.expected_statuses.contains(&status)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> Settings {
        Settings {
            base_ejection: Duration::from_secs(2),
            max_ejection: Duration::from_secs(10),
            ..Settings::default()
        }
    }

    #[test]
    fn validation_rejects_nonsense() {
        assert!(Settings::default().validate().is_ok());
        let bad = [
            Settings {
                interval: Duration::ZERO,
                ..cfg()
            },
            Settings {
                timeout: Duration::ZERO,
                ..cfg()
            },
            Settings {
                jitter: 1.0,
                ..cfg()
            },
            Settings {
                ewma_alpha: 0.0,
                ..cfg()
            },
            Settings {
                unhealthy_after: 0,
                ..cfg()
            },
            Settings {
                eject_after: 0,
                ..cfg()
            },
            Settings {
                path: "health".into(),
                ..cfg()
            },
            Settings {
                fallback_path: "/v1/models HTTP/1.0\r\nX: y".into(),
                ..cfg()
            },
            Settings {
                base_ejection: Duration::from_secs(99),
                ..cfg()
            },
            Settings {
                expected_statuses: vec![200, 99],
                ..cfg()
            },
            Settings {
                ca_file: Some(PathBuf::new()),
                ..cfg()
            },
            Settings {
                interval: MAX_DURATION + Duration::from_nanos(1),
                ..cfg()
            },
            Settings {
                timeout: Duration::MAX,
                ..cfg()
            },
            Settings {
                base_ejection: Duration::MAX,
                max_ejection: Duration::MAX,
                ..cfg()
            },
        ];
        for c in bad {
            assert!(c.validate().is_err(), "{c:?}");
        }
    }

    #[test]
    fn paths_must_be_absolute_printable_ascii() {
        assert!(check_path("/health?probe=1").is_ok());
        for bad in ["", "health", "/a b", "/a\r\nHost: x", "/é"] {
            assert!(check_path(bad).is_err(), "{bad:?}");
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
    fn status_ok_is_2xx_unless_listed() {
        let c = cfg();
        assert!(c.status_ok(200) && c.status_ok(204) && !c.status_ok(503) && !c.status_ok(301));
        let c = Settings {
            expected_statuses: vec![200, 503],
            ..cfg()
        };
        assert!(c.status_ok(503) && !c.status_ok(204));
    }
}
