//! Calls that share an answer: identical in-flight calls to idempotent methods sent
//! upstream once (coalescing), and answers kept for a while (the response cache).
//!
//! Both are keyed by the call's *canonical* text, written from the tape: the method,
//! then the params re-encoded compactly with object members sorted by name, so
//! whitespace, escapes and member order do not matter (`{"a":1,"b":2}` and
//! `{ "b": 2, "a": 1 }` are one key). Keys are compared whole, never by hash alone.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use simd_json::{Node, StaticNode};

use crate::codec::raw::RawCtx;

use crate::codec::tape::{elements, members};
use crate::dispatch::responder::Responder;
use crate::error::RpcError;
use crate::serializer::json::{write_str, write_value};

/// Appends the canonical key of a call of `method` with params `params` (found in
/// `raw`'s frame).
pub(crate) fn write_key(
    out: &mut Vec<u8>,
    method: &str,
    params: Option<&[Node<'_>]>,
    raw: Option<RawCtx<'_>>,
) {
    out.extend_from_slice(method.as_bytes());
    // A byte no JSON text and no UTF-8 method name holds: the method ends here.
    out.push(0xff);
    if let Some(nodes) = params {
        // A float is keyed by its text: two numbers one f64 cannot tell apart (integers
        // past 2^64, long fractions) may differ to the upstream. Finding the text costs
        // a walk of the frame, done only when there is a float.
        let floats = nodes
            .iter()
            .any(|n| matches!(n, Node::Static(StaticNode::F64(_))));
        let at = match raw {
            Some(raw) if floats => raw.structural_of(nodes).map(|s| (raw, s)),
            _ => None,
        };
        canonical(out, nodes, at);
    }
}

/// Where a value's text is: the frame, and the index of its first structural.
type At<'a> = Option<(RawCtx<'a>, usize)>;

/// Re-encodes the value spanning `nodes` with object members in name order; `at` is
/// where its text is (the frame, and the index of its first structural), to write
/// floats as they were sent. Recursion is bounded by the parser's depth limit.
fn canonical(out: &mut Vec<u8>, nodes: &[Node<'_>], at: At<'_>) {
    match nodes.first() {
        Some(Node::Array { .. }) => {
            out.push(b'[');
            // Past the `[`; each element's structurals, then its `,`.
            let mut next = at.map(|(raw, s)| (raw, s + 1));
            for (i, e) in elements(nodes).enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                canonical(out, e, next);
                next = next.map(|(raw, s)| (raw, s + structurals(e) + 1));
            }
            out.push(b']');
        }
        Some(Node::Object { .. }) => {
            // Each member with where its value starts: past the `{`, then per member its
            // key and `:`, its value's structurals and a `,`.
            let mut next = at.map(|(raw, s)| (raw, s + 1));
            let mut sorted: Vec<(&str, &[Node<'_>], At<'_>)> = Vec::new();
            for (k, v) in members(nodes).filter_map(Result::ok) {
                let value_at = next.map(|(raw, s)| (raw, s + 2));
                sorted.push((k, v, value_at));
                next = value_at.map(|(raw, s)| (raw, s + structurals(v) + 1));
            }
            sorted.sort_by(|a, b| a.0.cmp(b.0));
            out.push(b'{');
            for (i, (k, v, value_at)) in sorted.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_str(out, k);
                out.push(b':');
                canonical(out, v, value_at);
            }
            out.push(b'}');
        }
        Some(Node::Static(StaticNode::F64(_))) => {
            let text = at.and_then(|(raw, s)| raw.scalar_text_at(s));
            match text {
                Some(t) if t.first().is_some_and(|&c| c == b'-' || c.is_ascii_digit()) => {
                    out.extend_from_slice(t);
                }
                _ => write_value(out, nodes),
            }
        }
        _ => write_value(out, nodes),
    }
}

/// How many structural characters the value spanning `nodes` has: one for a scalar;
/// a container's brackets, commas, and for an object each key and `:`.
fn structurals(nodes: &[Node<'_>]) -> usize {
    match nodes.first() {
        Some(&Node::Array { len, .. }) => {
            2 + len.saturating_sub(1) + elements(nodes).map(structurals).sum::<usize>()
        }
        Some(&Node::Object { len, .. }) => {
            2 + len.saturating_sub(1)
                + members(nodes)
                    .filter_map(Result::ok)
                    .map(|(_, v)| 2 + structurals(v))
                    .sum::<usize>()
        }
        _ => 1,
    }
}

/// How a call is answered, for every call that shares it.
pub(crate) enum Answer<'a> {
    /// A result's JSON text.
    Result(&'a [u8]),
    /// An error object's JSON text, and its code.
    Relayed(i32, &'a [u8]),
    /// An error the proxy made.
    Error(&'a RpcError),
}

impl Answer<'_> {
    /// Gives this answer to `responder`.
    pub(crate) fn give(&self, responder: Responder) {
        match *self {
            Self::Result(text) => responder.respond_raw(text),
            Self::Relayed(code, text) => responder.relay_error(code, text),
            Self::Error(e) => responder.error(e.clone()),
        }
    }
}

/// Calls waiting on an identical call already sent upstream, by key.
#[derive(Default)]
pub(crate) struct InFlight {
    waiting: Mutex<HashMap<Arc<[u8]>, Vec<Responder>>>,
}

impl InFlight {
    fn lock(&self) -> MutexGuard<'_, HashMap<Arc<[u8]>, Vec<Responder>>> {
        self.waiting
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Joins `responder` to the call in flight under `key`, if there is one (then it is
    /// answered with that call's answer); otherwise makes this call the one in flight
    /// and gives back its responder and the key to settle it with.
    pub(crate) fn join(&self, key: &[u8], responder: Responder) -> Option<(Responder, Arc<[u8]>)> {
        let mut waiting = self.lock();
        if let Some(list) = waiting.get_mut(key) {
            list.push(responder);
            return None;
        }
        let key: Arc<[u8]> = key.into();
        waiting.insert(Arc::clone(&key), Vec::new());
        Some((responder, key))
    }

    /// The calls that waited on the call under `key`, which is answered now.
    pub(crate) fn settle(&self, key: &[u8]) -> Vec<Responder> {
        self.lock().remove(key).unwrap_or_default()
    }
}

/// Results kept for a while, bounded in bytes: a call whose key is here is answered
/// without going upstream.
pub(crate) struct Cache {
    inner: Mutex<CacheInner>,
    max_bytes: usize,
}

/// A cached result and when it expires.
type Cached = (Instant, Arc<[u8]>);

struct CacheInner {
    entries: HashMap<Arc<[u8]>, Cached>,
    bytes: usize,
}

impl Cache {
    /// A cache holding at most `max_bytes` of keys and results.
    pub(crate) fn new(max_bytes: usize) -> Self {
        Self {
            inner: Mutex::new(CacheInner {
                entries: HashMap::new(),
                bytes: 0,
            }),
            max_bytes,
        }
    }

    fn lock(&self) -> MutexGuard<'_, CacheInner> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The result kept under `key`, if it has not expired.
    pub(crate) fn get(&self, key: &[u8], now: Instant) -> Option<Arc<[u8]>> {
        let mut c = self.lock();
        match c.entries.get(key) {
            Some((until, result)) if *until > now => Some(Arc::clone(result)),
            Some(_) => {
                if let Some((k, (_, r))) = c.entries.remove_entry(key) {
                    c.bytes -= charge(&k, &r);
                }
                None
            }
            None => None,
        }
    }

    /// Keeps `result` under `key` for `ttl`. When full, expired entries go first, then
    /// the whole cache is cleared (simple, and bounded: a cache is a hint).
    pub(crate) fn put(&self, key: Arc<[u8]>, result: &[u8], ttl: Duration) {
        let size = key.len() + result.len() + ENTRY_OVERHEAD;
        if size > self.max_bytes / 4 {
            return;
        }
        let now = Instant::now();
        let mut c = self.lock();
        if c.bytes + size > self.max_bytes {
            let mut freed = 0;
            c.entries.retain(|k, (until, r)| {
                let keep = *until > now;
                if !keep {
                    freed += charge(k, r);
                }
                keep
            });
            c.bytes -= freed;
            if c.bytes + size > self.max_bytes {
                c.entries.clear();
                c.bytes = 0;
            }
        }
        if let Some((k, (_, r))) = c.entries.remove_entry(&key) {
            c.bytes -= charge(&k, &r);
        }
        c.entries
            .insert(key, (super::later(now, ttl), result.into()));
        c.bytes += size;
    }
}

/// What a cache entry costs beside its key and result: the table's slot, the two
/// reference counts and allocation headers, the expiry (so many tiny entries stay
/// within the bound too).
const ENTRY_OVERHEAD: usize = 96;

/// The bytes an entry is charged.
fn charge(key: &[u8], result: &[u8]) -> usize {
    key.len() + result.len() + ENTRY_OVERHEAD
}

#[cfg(test)]
mod tests {
    use super::*;
    use simd_json::{Buffers, Tape, INPUT_PADDING};

    fn key(params: &str) -> Vec<u8> {
        let mut copy = params.as_bytes().to_vec();
        let len = copy.len();
        copy.resize(len + INPUT_PADDING, b' ');
        let mut buffers = Buffers::default();
        let mut tape = Tape(Vec::new());
        simd_json::fill_tape_padded(&mut copy, len, &mut buffers, &mut tape).unwrap();
        let mut out = Vec::new();
        let raw = RawCtx {
            frame: params.as_bytes(),
            structurals: buffers.structural_indexes(),
            root: &tape.0,
        };
        write_key(&mut out, "m", Some(&tape.0), Some(raw));
        out
    }

    #[test]
    fn keys_ignore_whitespace_escapes_and_member_order() {
        assert_eq!(
            key(r#"{"a":1,"b":[{"y":2,"x":"\u0041"}]}"#),
            key(r#" { "b" : [ { "x" : "A" , "y" : 2 } ] , "a" : 1 } "#)
        );
        assert_ne!(key(r#"[1,2]"#), key(r#"[2,1]"#));
        assert_ne!(key(r#"{"a":1}"#), key(r#"{"a":"1"}"#));
        let mut a = Vec::new();
        write_key(&mut a, "ab", None, None);
        let mut b = Vec::new();
        write_key(&mut b, "a", None, None);
        assert_ne!(a, b);
    }

    /// Numbers one f64 cannot tell apart are different calls to an upstream that
    /// reads them exactly; equal texts in other member orders are still one key.
    #[test]
    fn keys_keep_numbers_apart() {
        assert_ne!(
            key("[100000000000000000001]"),
            key("[100000000000000000000]")
        );
        assert_ne!(key("[0.1]"), key("[0.10000000000000001]"));
        assert_ne!(
            key(r#"{"b":[1,{"c":0.1}],"a":1e300}"#),
            key(r#"{"b":[1,{"c":0.10000000000000001}],"a":1e300}"#)
        );
        assert_eq!(
            key(r#"{"b":[1.5, {"c":0.10000000000000001, "d":[]}], "a":-2.50}"#),
            key(r#" { "a" : -2.50 , "b" : [ 1.5 , { "d" : [ ] , "c" : 0.10000000000000001 } ] } "#)
        );
        let sorted =
            String::from_utf8_lossy(&key(r#"{"z":[0.25,{"y":3e2}],"a":[[],-0.0]}"#)).into_owned();
        assert!(
            sorted.ends_with(r#"{"a":[[],-0.0],"z":[0.25,{"y":3e2}]}"#),
            "{sorted}"
        );
    }

    #[test]
    fn the_cache_expires_and_stays_within_its_bytes() {
        let c = Cache::new(2000);
        let now = Instant::now();
        c.put(Arc::from(&b"k1"[..]), b"r1", Duration::from_secs(60));
        assert_eq!(c.get(b"k1", now).as_deref(), Some(&b"r1"[..]));
        assert_eq!(c.get(b"k1", now + Duration::from_secs(61)), None);
        for i in 0..1000 {
            c.put(
                Arc::from(format!("key{i}").as_bytes()),
                &[b'x'; 100],
                Duration::from_secs(60),
            );
            assert!(c.lock().bytes <= 2000);
        }
        c.put(
            Arc::from(&b"big"[..]),
            &[b'x'; 500],
            Duration::from_secs(60),
        );
        assert_eq!(
            c.get(b"big", now),
            None,
            "over a quarter of the cache: not kept"
        );
    }
}
