//! W3C Trace Context: the trace a call belongs to, from the caller's `traceparent`
//! (an HTTP header, or `params._meta.traceparent` as MCP carries it) or made here for a
//! sampled call, and the server's own span in it.
//!
//! A traced call's context exposes its [`Trace`] ([`Context::trace`]); an HTTP answer
//! carries `traceparent` with the caller's trace id and the server's span id; a sampled
//! call runs inside a `tracing` span (method, id, transport, peer, identity, trace id)
//! for whatever subscriber the host installed.
//!
//! ```
//! use ringrpc::trace::Trace;
//!
//! let t = Trace::from_traceparent(b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
//!     .expect("valid");
//! assert_eq!(t.trace_id().to_string(), "4bf92f3577b34da6a3ce929d0e0e4736");
//! assert_eq!(t.parent_id().map(|p| p.to_string()).as_deref(), Some("00f067aa0ba902b7"));
//! assert!(t.is_sampled());
//! // The answer's traceparent: the same trace, the server's span.
//! let answer = t.traceparent();
//! assert!(answer.starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-"));
//! assert!(!answer.contains("00f067aa0ba902b7"));
//! ```
//!
//! [`Context::trace`]: crate::Context::trace

use std::cell::Cell;
use std::fmt;
use std::hash::{BuildHasher, Hasher};

/// A trace id: 16 bytes, never all zero.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct TraceId([u8; 16]);

/// A span id: 8 bytes, never all zero.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct SpanId([u8; 8]);

impl TraceId {
    /// The id's bytes.
    pub fn to_bytes(self) -> [u8; 16] {
        self.0
    }
}

impl SpanId {
    /// The id's bytes.
    pub fn to_bytes(self) -> [u8; 8] {
        self.0
    }
}

impl fmt::Display for TraceId {
    /// Lowercase hex, as in `traceparent`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

impl fmt::Debug for TraceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TraceId({self})")
    }
}

impl fmt::Display for SpanId {
    /// Lowercase hex, as in `traceparent`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

impl fmt::Debug for SpanId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SpanId({self})")
    }
}

/// The trace a call belongs to, and the server's span in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Trace {
    trace_id: TraceId,
    span_id: SpanId,
    parent_id: Option<SpanId>,
    sampled: bool,
}

/// The length of a version-00 `traceparent` value.
const TRACEPARENT_LEN: usize = 55;

impl Trace {
    /// Continues the caller's trace from a `traceparent` value (W3C Trace Context,
    /// level 1): same trace id, the caller's span as parent, a new span for the server,
    /// the caller's sampling decision. `None` if the value is not valid (then the call
    /// is not part of the caller's trace: a new one starts if it is sampled here).
    pub fn from_traceparent(value: &[u8]) -> Option<Self> {
        let value = value.trim_ascii();
        // Version 00 is exactly 55 bytes; a later version has at least those fields,
        // and anything after them starts with `-` (the specification's forward rule).
        let version = parse_hex::<1>(value.get(0..2)?)?[0];
        if version == 0xff
            || value.len() < TRACEPARENT_LEN
            || (version == 0 && value.len() != TRACEPARENT_LEN)
            || (value.len() > TRACEPARENT_LEN && value[TRACEPARENT_LEN] != b'-')
        {
            return None;
        }
        if value[2] != b'-' || value[35] != b'-' || value[52] != b'-' {
            return None;
        }
        let trace_id = parse_hex::<16>(&value[3..35])?;
        let parent_id = parse_hex::<8>(&value[36..52])?;
        let flags = parse_hex::<1>(&value[53..55])?[0];
        if trace_id == [0; 16] || parent_id == [0; 8] {
            return None;
        }
        Some(Self {
            trace_id: TraceId(trace_id),
            span_id: new_span_id(),
            parent_id: Some(SpanId(parent_id)),
            sampled: flags & 1 == 1,
        })
    }

    /// A new trace started here (no caller's trace), sampled or not.
    pub fn root(sampled: bool) -> Self {
        let (a, b) = (random(), random());
        let mut trace_id = [0; 16];
        trace_id[..8].copy_from_slice(&a.to_be_bytes());
        trace_id[8..].copy_from_slice(&b.to_be_bytes());
        if trace_id == [0; 16] {
            trace_id[15] = 1;
        }
        Self {
            trace_id: TraceId(trace_id),
            span_id: new_span_id(),
            parent_id: None,
            sampled,
        }
    }

    /// The trace's id.
    pub fn trace_id(&self) -> TraceId {
        self.trace_id
    }

    /// The server's span in the trace.
    pub fn span_id(&self) -> SpanId {
        self.span_id
    }

    /// The caller's span, when the trace came with the call.
    pub fn parent_id(&self) -> Option<SpanId> {
        self.parent_id
    }

    /// Whether the call is sampled (recorded): the caller's flag, or the server's own
    /// sampling of calls that came without a trace.
    pub fn is_sampled(&self) -> bool {
        self.sampled
    }

    /// The `traceparent` value naming the server's span: what an answer carries, and
    /// what a call made on the server's behalf sends on.
    pub fn traceparent(&self) -> String {
        String::from_utf8_lossy(&self.traceparent_bytes()).into_owned()
    }

    /// [`Trace::traceparent`] without allocating.
    pub(crate) fn traceparent_bytes(&self) -> [u8; TRACEPARENT_LEN] {
        let mut out = [b'-'; TRACEPARENT_LEN];
        out[0..2].copy_from_slice(b"00");
        hex_into(&mut out[3..35], &self.trace_id.0);
        hex_into(&mut out[36..52], &self.span_id.0);
        out[53..55].copy_from_slice(if self.sampled { b"01" } else { b"00" });
        out
    }
}

/// Lowercase hex of `bytes` into `out` (twice as long).
fn hex_into(out: &mut [u8], bytes: &[u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for (pair, b) in out.chunks_exact_mut(2).zip(bytes) {
        pair[0] = DIGITS[usize::from(b >> 4)];
        pair[1] = DIGITS[usize::from(b & 15)];
    }
}

/// `N` bytes from `2N` lowercase hex digits (the specification allows no uppercase).
fn parse_hex<const N: usize>(text: &[u8]) -> Option<[u8; N]> {
    if text.len() != 2 * N {
        return None;
    }
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let mut out = [0; N];
    for (o, pair) in out.iter_mut().zip(text.chunks_exact(2)) {
        *o = digit(pair[0])? << 4 | digit(pair[1])?;
    }
    Some(out)
}

fn new_span_id() -> SpanId {
    let mut r = random();
    if r == 0 {
        r = 1;
    }
    SpanId(r.to_be_bytes())
}

/// A random `u64`: splitmix64 on a per-thread state seeded from the standard library's
/// random hasher keys (ids need to be unique, not secret).
pub(crate) fn random() -> u64 {
    thread_local! {
        static STATE: Cell<u64> = Cell::new({
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u64(std::process::id().into());
            h.finish()
        });
    }
    STATE.with(|s| {
        let x = s.get().wrapping_add(0x9e37_79b9_7f4a_7c15);
        s.set(x);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    })
}

/// Which calls that came without a trace get one here: a fraction of them.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Sampler {
    /// A call is sampled when a random `u64` falls below this (0: never).
    threshold: u64,
    always: bool,
}

impl Sampler {
    /// Samples `rate` of the calls (0 to 1; outside, clamped).
    pub(crate) fn new(rate: f64) -> Self {
        let rate = if rate.is_nan() {
            0.0
        } else {
            rate.clamp(0.0, 1.0)
        };
        Self {
            threshold: (rate * u64::MAX as f64) as u64,
            always: rate >= 1.0,
        }
    }

    /// Whether any frame may be sampled.
    #[inline]
    pub(crate) fn is_on(&self) -> bool {
        self.threshold != 0
    }

    /// A new sampled trace, for this call's share of the rate.
    #[inline]
    pub(crate) fn sample(&self) -> Option<Trace> {
        if !self.is_on() {
            return None;
        }
        (self.always || random() < self.threshold).then(|| Trace::root(true))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALID: &[u8] = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn parses_the_specification_examples() {
        let t = Trace::from_traceparent(VALID).expect("valid");
        assert_eq!(t.trace_id().to_string(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(
            t.parent_id().expect("parent").to_string(),
            "00f067aa0ba902b7"
        );
        assert!(t.is_sampled());
        assert_ne!(t.span_id(), t.parent_id().expect("parent"));
        let unsampled = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00";
        assert!(!Trace::from_traceparent(unsampled)
            .expect("valid")
            .is_sampled());
        // A later version may add fields after a dash.
        let future =
            b"cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-the-future-holds";
        assert!(Trace::from_traceparent(future).is_some());
        assert!(Trace::from_traceparent(
            b"  00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01 "
        )
        .is_some());
    }

    #[test]
    fn refuses_what_the_specification_refuses() {
        for bad in [
            &b""[..],
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0",
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-",
            b"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            b"00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            b"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            b"00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            b"00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
            b"cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",
        ] {
            assert_eq!(
                Trace::from_traceparent(bad),
                None,
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn answers_name_the_server_span() {
        let t = Trace::from_traceparent(VALID).expect("valid");
        let back = Trace::from_traceparent(t.traceparent().as_bytes()).expect("round trip");
        assert_eq!(back.trace_id(), t.trace_id());
        assert_eq!(back.parent_id(), Some(t.span_id()));
        assert_eq!(back.is_sampled(), t.is_sampled());
        let root = Trace::root(false);
        assert_eq!(root.parent_id(), None);
        assert!(root.traceparent().ends_with("-00"));
        assert_ne!(Trace::root(true).trace_id(), Trace::root(true).trace_id());
    }

    #[test]
    fn samples_its_share() {
        assert!(Sampler::new(0.0).sample().is_none());
        assert!(Sampler::default().sample().is_none());
        assert!(Sampler::new(1.0).sample().is_some_and(|t| t.is_sampled()));
        let s = Sampler::new(0.25);
        let n = (0..20_000).filter(|_| s.sample().is_some()).count();
        assert!((4_000..6_000).contains(&n), "{n} of 20000 at 0.25");
    }
}
