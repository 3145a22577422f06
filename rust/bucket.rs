//! Token buckets: per key a requests bucket and a tokens bucket, in a sharded hash table. Pure:
//! every operation takes `now` (seconds on a monotonic clock) so tests are deterministic.
//!
//! Levels are refilled from the elapsed time on each touch (no ticking, so no drift). A request
//! for more tokens than the bucket can ever hold is refused with `retry_after = inf`. Token levels
//! may go negative through [`Table::reconcile`] (debt), which later refills pay back.

use hashbrown::{DefaultHashBuilder, HashTable};
use parking_lot::Mutex;
use std::hash::BuildHasher;

/// Capacity, refill rate and current level of one bucket.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Bucket {
    pub capacity: f64,
    pub per_second: f64,
    pub level: f64,
}

impl Bucket {
    /// A full bucket.
    pub fn full(capacity: f64, per_second: f64) -> Self {
        Self {
            capacity,
            per_second,
            level: capacity,
        }
    }

    fn refill(&mut self, elapsed: f64) {
        self.level = (self.level + self.per_second * elapsed).min(self.capacity);
    }

    /// Seconds until the level reaches `need` (0 if it already has, inf if it never will).
    pub fn wait_for(&self, need: f64) -> f64 {
        if self.level >= need {
            0.0
        } else if need > self.capacity || self.per_second <= 0.0 {
            f64::INFINITY
        } else {
            (need - self.level) / self.per_second
        }
    }

    /// Whole units available now (0 while in debt).
    pub fn remaining(&self) -> u64 {
        self.level.max(0.0).floor() as u64
    }

    fn add(&mut self, amount: f64) {
        self.level = (self.level + amount).min(self.capacity);
    }
}

/// Limits for one key, as configured.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Limits {
    pub requests_per_minute: f64,
    pub tokens_per_minute: f64,
    pub request_burst: f64,
    pub token_burst: f64,
}

impl Limits {
    /// Limits with bursts defaulting to the per-minute figures; `Err` names a bad value.
    pub fn new(
        requests_per_minute: f64,
        tokens_per_minute: f64,
        request_burst: Option<f64>,
        token_burst: Option<f64>,
    ) -> Result<Self, String> {
        let limits = Self {
            requests_per_minute,
            tokens_per_minute,
            request_burst: request_burst.unwrap_or(requests_per_minute),
            token_burst: token_burst.unwrap_or(tokens_per_minute),
        };
        for (name, value) in [
            ("requests_per_minute", limits.requests_per_minute),
            ("tokens_per_minute", limits.tokens_per_minute),
            ("request_burst", limits.request_burst),
            ("token_burst", limits.token_burst),
        ] {
            if !(value.is_finite() && value >= 0.0) {
                return Err(format!("{name} must be a finite number >= 0, got {value}"));
            }
        }
        Ok(limits)
    }
}

/// Both buckets of a key and when it was last touched.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Pair {
    pub requests: Bucket,
    pub tokens: Bucket,
    pub last: f64,
}

/// The answer to one `try_acquire`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Decision {
    pub allowed: bool,
    pub retry_after: f64,
    pub remaining_requests: u64,
    pub remaining_tokens: u64,
    pub reset_requests: f64,
    pub reset_tokens: f64,
}

impl Pair {
    /// Full buckets for `limits`, touched at `now`.
    pub fn new(limits: &Limits, now: f64) -> Self {
        Self {
            requests: Bucket::full(limits.request_burst, limits.requests_per_minute / 60.0),
            tokens: Bucket::full(limits.token_burst, limits.tokens_per_minute / 60.0),
            last: now,
        }
    }

    /// Bring both levels up to `now`; a clock that seems to go backwards adds nothing.
    pub fn refill(&mut self, now: f64) {
        let elapsed = (now - self.last).max(0.0);
        self.requests.refill(elapsed);
        self.tokens.refill(elapsed);
        self.last = self.last.max(now);
    }

    /// Change the limits, keeping current levels (clamped to the new capacities).
    pub fn update(&mut self, limits: &Limits, now: f64) {
        self.refill(now);
        self.requests.capacity = limits.request_burst;
        self.requests.per_second = limits.requests_per_minute / 60.0;
        self.requests.level = self.requests.level.min(self.requests.capacity);
        self.tokens.capacity = limits.token_burst;
        self.tokens.per_second = limits.tokens_per_minute / 60.0;
        self.tokens.level = self.tokens.level.min(self.tokens.capacity);
    }

    /// Take one request and `tokens` tokens from both buckets, or from neither.
    pub fn try_acquire(&mut self, tokens: u64, now: f64) -> Decision {
        self.refill(now);
        let need = tokens as f64;
        let allowed = self.requests.level >= 1.0 && self.tokens.level >= need;
        let retry_after = if allowed {
            self.requests.level -= 1.0;
            self.tokens.level -= need;
            0.0
        } else {
            self.requests.wait_for(1.0).max(self.tokens.wait_for(need))
        };
        Decision {
            allowed,
            retry_after,
            remaining_requests: self.requests.remaining(),
            remaining_tokens: self.tokens.remaining(),
            reset_requests: self.requests.wait_for(self.requests.capacity),
            reset_tokens: self.tokens.wait_for(self.tokens.capacity),
        }
    }

    /// Settle a reservation: give back `reserved - actual` tokens (negative takes extra, may
    /// leave the bucket in debt).
    pub fn reconcile(&mut self, reserved: i64, actual: i64, now: f64) {
        self.refill(now);
        self.tokens.add(reserved as f64 - actual as f64);
    }

    /// Give back requests and tokens that were acquired but not used.
    pub fn refund(&mut self, requests: u64, tokens: u64, now: f64) {
        self.refill(now);
        self.requests.add(requests as f64);
        self.tokens.add(tokens as f64);
    }

    /// Full at `now` and untouched for at least `idle` seconds.
    pub fn is_idle(&self, now: f64, idle: f64) -> bool {
        let mut projected = *self;
        projected.refill(now);
        now - self.last >= idle
            && projected.requests.level >= projected.requests.capacity
            && projected.tokens.level >= projected.tokens.capacity
    }
}

/// Longest key stored inline in its slot (no separate allocation, no pointer to chase).
pub const INLINE_KEY: usize = 22;

/// A key, inline when short (the common tenant/API-key case), else on the heap.
#[derive(Clone, Debug)]
enum Key {
    Inline { len: u8, bytes: [u8; INLINE_KEY] },
    Heap(Box<[u8]>),
}

impl Key {
    fn new(key: &str) -> Self {
        let raw = key.as_bytes();
        if raw.len() <= INLINE_KEY {
            let mut bytes = [0; INLINE_KEY];
            bytes[..raw.len()].copy_from_slice(raw);
            Self::Inline {
                len: raw.len() as u8,
                bytes,
            }
        } else {
            Self::Heap(raw.into())
        }
    }

    fn as_bytes(&self) -> &[u8] {
        match self {
            Self::Inline { len, bytes } => &bytes[..usize::from(*len)],
            Self::Heap(bytes) => bytes,
        }
    }
}

type Shard = Mutex<HashTable<(Key, Pair)>>;

/// Many keys' bucket pairs behind sharded locks, chosen by a seeded fast hash.
pub struct Table {
    hasher: DefaultHashBuilder,
    shards: Box<[Shard]>,
    shift: u32,
}

impl Table {
    /// A table with `shards` locks (rounded up to a power of two, at least 1).
    pub fn new(shards: usize) -> Self {
        let count = shards.clamp(1, 1 << 16).next_power_of_two();
        Self {
            hasher: DefaultHashBuilder::default(),
            shards: (0..count).map(|_| Mutex::new(HashTable::new())).collect(),
            // The shard comes from the top bits; hashbrown indexes slots with the low bits.
            shift: 64 - count.trailing_zeros(),
        }
    }

    fn locate(&self, key: &str) -> (u64, &Shard) {
        let hash = self.hasher.hash_one(key.as_bytes());
        let index = if self.shift == 64 {
            0
        } else {
            (hash >> self.shift) as usize
        };
        (hash, &self.shards[index])
    }

    /// Run `f` on the key's pair; `None` if the key is unknown.
    pub fn with<R>(&self, key: &str, f: impl FnOnce(&mut Pair) -> R) -> Option<R> {
        let (hash, shard) = self.locate(key);
        let mut table = shard.lock();
        table
            .find_mut(hash, |(k, _)| k.as_bytes() == key.as_bytes())
            .map(|(_, pair)| f(pair))
    }

    /// Insert the key with full buckets, or update its limits keeping its levels.
    pub fn set_limits(&self, key: &str, limits: &Limits, now: f64) {
        let (hash, shard) = self.locate(key);
        let mut table = shard.lock();
        if let Some((_, pair)) = table.find_mut(hash, |(k, _)| k.as_bytes() == key.as_bytes()) {
            pair.update(limits, now);
        } else {
            let hasher = &self.hasher;
            table.insert_unique(hash, (Key::new(key), Pair::new(limits, now)), |(k, _)| {
                hasher.hash_one(k.as_bytes())
            });
        }
    }

    /// Drop keys that are full and untouched for `idle` seconds; returns how many went.
    pub fn expire_idle(&self, idle: f64, now: f64) -> usize {
        let mut removed = 0;
        for shard in &*self.shards {
            let mut table = shard.lock();
            let before = table.len();
            table.retain(|(_, pair)| !pair.is_idle(now, idle));
            removed += before - table.len();
        }
        removed
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().len()).sum()
    }

    /// True if no key is present.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
// The levels compared are sums of small integers: exact in f64.
#[allow(clippy::float_cmp)]
mod tests {
    use super::*;

    fn limits(rpm: f64, tpm: f64) -> Limits {
        Limits::new(rpm, tpm, None, None).unwrap()
    }

    #[test]
    fn acquire_is_all_or_nothing() {
        let mut pair = Pair::new(&limits(60.0, 600.0), 0.0);
        let d = pair.try_acquire(500, 0.0);
        assert!(d.allowed);
        assert_eq!((d.remaining_requests, d.remaining_tokens), (59, 100));
        let d = pair.try_acquire(200, 0.0);
        assert!(!d.allowed);
        // 100 tokens missing at 10 tokens/s.
        assert!((d.retry_after - 10.0).abs() < 1e-9);
        assert_eq!((d.remaining_requests, d.remaining_tokens), (59, 100));
        assert!((d.reset_tokens - 50.0).abs() < 1e-9);
        assert!((d.reset_requests - 1.0).abs() < 1e-9);
    }

    #[test]
    fn more_than_capacity_never_fits() {
        let mut pair = Pair::new(&limits(60.0, 100.0), 0.0);
        let d = pair.try_acquire(101, 0.0);
        assert!(!d.allowed);
        assert!(d.retry_after.is_infinite());
        let mut blocked = Pair::new(&limits(0.0, 100.0), 0.0);
        assert!(blocked.try_acquire(0, 5.0).retry_after.is_infinite());
    }

    #[test]
    fn refill_is_exact_and_capped() {
        let mut pair = Pair::new(&limits(60.0, 60.0), 0.0);
        for _ in 0..60 {
            assert!(pair.try_acquire(1, 0.0).allowed);
        }
        assert!(!pair.try_acquire(0, 0.0).allowed);
        assert!(pair.try_acquire(1, 1.0).allowed);
        assert!(!pair.try_acquire(0, 1.0).allowed);
        pair.refill(1000.0);
        assert_eq!(pair.requests.level, 60.0);
        // A clock going backwards adds nothing.
        pair.refill(10.0);
        assert_eq!(pair.requests.level, 60.0);
    }

    #[test]
    fn reconcile_refund_and_debt() {
        let mut pair = Pair::new(&limits(60.0, 100.0), 0.0);
        assert!(pair.try_acquire(50, 0.0).allowed);
        pair.reconcile(50, 10, 0.0);
        assert_eq!(pair.tokens.level, 90.0);
        pair.reconcile(0, 150, 0.0);
        assert_eq!(pair.tokens.level, -60.0);
        assert_eq!(pair.try_acquire(0, 0.0).remaining_tokens, 0);
        pair.refund(1, 1000, 0.0);
        assert_eq!(pair.tokens.level, 100.0);
        assert_eq!(pair.requests.level, 60.0);
    }

    #[test]
    fn update_keeps_levels_clamped() {
        let mut pair = Pair::new(&limits(60.0, 100.0), 0.0);
        assert!(pair.try_acquire(10, 0.0).allowed);
        pair.update(&limits(30.0, 50.0), 0.0);
        assert_eq!((pair.requests.level, pair.tokens.level), (30.0, 50.0));
        pair.update(&limits(120.0, 200.0), 0.0);
        assert_eq!((pair.requests.level, pair.tokens.level), (30.0, 50.0));
        assert_eq!(pair.requests.capacity, 120.0);
    }

    #[test]
    fn rejects_bad_limits() {
        assert!(Limits::new(f64::NAN, 1.0, None, None).is_err());
        assert!(Limits::new(1.0, -1.0, None, None).is_err());
        assert!(Limits::new(1.0, 1.0, Some(f64::INFINITY), None).is_err());
        let l = Limits::new(1.0, 2.0, Some(5.0), None).unwrap();
        assert_eq!((l.request_burst, l.token_burst), (5.0, 2.0));
    }

    #[test]
    fn table_keys_and_expiry() {
        let table = Table::new(4);
        for i in 0..1000 {
            table.set_limits(&format!("k{i}"), &limits(60.0, 100.0), 0.0);
        }
        assert_eq!(table.len(), 1000);
        let d = table.with("k7", |p| p.try_acquire(10, 20.0)).unwrap();
        assert!(d.allowed);
        assert!(table.with("missing", |p| p.try_acquire(0, 0.0)).is_none());
        // k7 was touched at 20 s; the others only at 0 s.
        assert_eq!(table.expire_idle(30.0, 30.0), 999);
        assert_eq!(table.expire_idle(30.0, 49.0), 0);
        assert_eq!(table.expire_idle(30.0, 51.0), 1);
        assert!(table.is_empty());
        let long = "k".repeat(INLINE_KEY + 1);
        let short = "k".repeat(INLINE_KEY);
        table.set_limits(&long, &limits(60.0, 100.0), 0.0);
        table.set_limits(&short, &limits(60.0, 100.0), 0.0);
        assert!(table.with(&long, |_| ()).is_some());
        assert!(table.with(&short, |_| ()).is_some());
        assert!(table.with(&"k".repeat(INLINE_KEY - 1), |_| ()).is_none());
        assert_eq!(table.expire_idle(0.0, 100.0), 2);
        // A slot is the key (24 bytes, inline up to 22) plus 56 bytes of buckets.
        assert_eq!(std::mem::size_of::<(Key, Pair)>(), 80);
        let single = Table::new(1);
        single.set_limits("a", &limits(1.0, 1.0), 0.0);
        assert_eq!(single.len(), 1);
    }
}
