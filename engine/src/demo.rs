//! The demo method set shared by every example, test and bench: the specification's
//! section 7 methods plus a few for measuring.
//!
//! | method | params | result |
//! | --- | --- | --- |
//! | `subtract` | `[minuend, subtrahend]` or `{"minuend", "subtrahend"}` | the difference |
//! | `sum` | an array of integers | their sum |
//! | `get_data` | none | `["hello", 5]` |
//! | `ping` | none | `"pong"` |
//! | `echo` | anything | the params, as sent |
//! | `add` | `[a, b]` | `a + b` |
//! | `sleep` | `{"ms": N}` (N ≤ 60000) | `null`, after N ms (blocking: the server runs it on the worker pool) |
//! | `update`, `notify_hello`, `notify_sum` | anything | notifications: no answer |
//!
//! Integers are `i64`; overflow is answered with `-32602`. `foobar` does not exist.

use std::time::Duration;

use serde::Deserialize;

use crate::{Config, Engine, Params, Registry, RegistryBuilder, RpcError};

/// The longest `sleep` accepted, in milliseconds.
pub const MAX_SLEEP_MS: u64 = 60_000;

#[derive(Deserialize)]
struct Subtract {
    minuend: i64,
    subtrahend: i64,
}

#[derive(Deserialize)]
struct Sleep {
    ms: u64,
}

fn overflow() -> RpcError {
    RpcError::invalid_params("the result overflows a 64-bit signed integer")
}

/// A builder holding the demo methods, for adding more before freezing.
pub fn builder() -> RegistryBuilder {
    let mut b = Registry::builder();
    let r = (|| -> Result<(), crate::RegisterError> {
        b.method("subtract", |p: Params<'_>| {
            let s: Subtract = p.parse()?;
            s.minuend.checked_sub(s.subtrahend).ok_or_else(overflow)
        })?
        .method("sum", |p: Params<'_>| {
            let v: Vec<i64> = p.parse()?;
            v.iter()
                .try_fold(0i64, |acc, x| acc.checked_add(*x))
                .ok_or_else(overflow)
        })?
        .method("add", |p: Params<'_>| {
            let [a, b]: [i64; 2] = p.parse()?;
            a.checked_add(b).ok_or_else(overflow)
        })?
        .method("get_data", |_p: Params<'_>| Ok(("hello", 5)))?
        .raw_method("ping", |_p, out| out.write_str("pong"))?
        .raw_method("echo", |p, out| out.write_params(&p))?
        .blocking_method("sleep", |p: Params<'_>| {
            let s: Sleep = p.parse()?;
            if s.ms > MAX_SLEEP_MS {
                return Err(RpcError::invalid_params(format_args!(
                    "`ms` must be at most {MAX_SLEEP_MS}"
                )));
            }
            std::thread::sleep(Duration::from_millis(s.ms));
            Ok(())
        })?
        .notification("update", |_p| Ok(()))?
        .notification("notify_hello", |_p| Ok(()))?
        .notification("notify_sum", |_p| Ok(()))?;
        Ok(())
    })();
    // The names above are fixed, distinct and unreserved.
    debug_assert!(r.is_ok());
    b
}

/// The frozen demo registry.
pub fn registry() -> Registry {
    builder().freeze()
}

/// An engine serving the demo methods under `config`.
pub fn engine(config: Config) -> Engine {
    Engine::new(registry(), config)
}
