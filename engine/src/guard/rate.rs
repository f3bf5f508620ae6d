//! TEMPORARY STUB (replaced by the rate branch).
#![allow(dead_code, missing_docs, clippy::all)]
use std::sync::atomic::{AtomicU64, Ordering};
pub(crate) fn now_ns() -> u64 {
    static E: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    E.get_or_init(std::time::Instant::now).elapsed().as_nanos() as u64
}
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Rate {
    emission_ns: u64,
    tolerance_ns: u64,
}
#[derive(Debug, thiserror::Error)]
#[error("bad rate")]
pub(crate) struct RateError;
impl Rate {
    pub(crate) fn new(per_second: f64, burst: u32) -> Result<Self, RateError> {
        if !(per_second > 0.0) || burst == 0 {
            return Err(RateError);
        }
        let e = (1e9 / per_second) as u64;
        Ok(Self {
            emission_ns: e,
            tolerance_ns: e * (burst as u64 - 1),
        })
    }
    pub(crate) fn parse(spec: &str) -> Result<Self, RateError> {
        let (r, b) = spec.split_once(':').unwrap_or((spec, ""));
        let r: f64 = r.parse().map_err(|_| RateError)?;
        let b = if b.is_empty() {
            (r.ceil() as u32).max(1)
        } else {
            b.parse().map_err(|_| RateError)?
        };
        Self::new(r, b)
    }
}
#[derive(Debug, Default)]
pub(crate) struct Bucket {
    tat: AtomicU64,
}
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Limited {
    pub(crate) retry_after_ns: u64,
}
impl Limited {
    pub(crate) fn retry_after_ms(&self) -> u64 {
        self.retry_after_ns.div_ceil(1_000_000).max(1)
    }
    pub(crate) fn retry_after_secs(&self) -> u64 {
        self.retry_after_ns.div_ceil(1_000_000_000).max(1)
    }
}
impl Bucket {
    pub(crate) fn new() -> Self {
        Self::default()
    }
    pub(crate) fn charge(&self, rate: &Rate, now: u64, cost: u32) -> Result<(), Limited> {
        let cost = cost.max(1) as u64;
        let inc = rate.emission_ns * cost;
        loop {
            let tat = self.tat.load(Ordering::Relaxed).max(now);
            let new = tat + inc;
            if new - now > rate.tolerance_ns + rate.emission_ns {
                return Err(Limited {
                    retry_after_ns: new - now - rate.tolerance_ns - rate.emission_ns,
                });
            }
            if self
                .tat
                .compare_exchange(
                    self.tat.load(Ordering::Relaxed),
                    new,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok()
            {
                return Ok(());
            }
        }
    }
}
pub(crate) struct PeerLimiter {
    rate: Rate,
    m: std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, u64>>,
}
impl PeerLimiter {
    pub(crate) fn new(rate: Rate, _capacity: usize) -> Self {
        Self {
            rate,
            m: Default::default(),
        }
    }
    pub(crate) fn charge(&self, ip: std::net::IpAddr, now: u64, cost: u32) -> Result<(), Limited> {
        let b = Bucket::new();
        let mut m = self.m.lock().unwrap();
        b.tat.store(*m.get(&ip).unwrap_or(&0), Ordering::Relaxed);
        let r = b.charge(&self.rate, now, cost);
        m.insert(ip, b.tat.load(Ordering::Relaxed));
        r
    }
    pub(crate) fn len(&self) -> usize {
        self.m.lock().unwrap().len()
    }
}
