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

use simd_json::Node;

use crate::codec::tape::{elements, members};
use crate::dispatch::responder::Responder;
use crate::error::RpcError;
use crate::serializer::json::{write_str, write_value};

/// Appends the canonical key of a call of `method` with params `params`.
pub(crate) fn write_key(out: &mut Vec<u8>, method: &str, params: Option<&[Node<'_>]>) {
    out.extend_from_slice(method.as_bytes());
    // A byte no JSON text and no UTF-8 method name holds: the method ends here.
    out.push(0xff);
    if let Some(nodes) = params {
        canonical(out, nodes);
    }
}

/// Re-encodes the value spanning `nodes` with object members in name order. Recursion
/// is bounded by the parser's depth limit.
fn canonical(out: &mut Vec<u8>, nodes: &[Node<'_>]) {
    match nodes.first() {
        Some(Node::Array { .. }) => {
            out.push(b'[');
            for (i, e) in elements(nodes).enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                canonical(out, e);
            }
            out.push(b']');
        }
        Some(Node::Object { .. }) => {
            let mut sorted: Vec<(&str, &[Node<'_>])> =
                members(nodes).filter_map(Result::ok).collect();
            sorted.sort_by(|a, b| a.0.cmp(b.0));
            out.push(b'{');
            for (i, (k, v)) in sorted.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_str(out, k);
                out.push(b':');
                canonical(out, v);
            }
            out.push(b'}');
        }
        _ => write_value(out, nodes),
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
                    c.bytes -= k.len() + r.len();
                }
                None
            }
            None => None,
        }
    }

    /// Keeps `result` under `key` for `ttl`. When full, expired entries go first, then
    /// the whole cache is cleared (simple, and bounded: a cache is a hint).
    pub(crate) fn put(&self, key: Arc<[u8]>, result: &[u8], ttl: Duration) {
        let size = key.len() + result.len();
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
                    freed += k.len() + r.len();
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
            c.bytes -= k.len() + r.len();
        }
        c.entries.insert(key, (now + ttl, result.into()));
        c.bytes += size;
    }
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
        write_key(&mut out, "m", Some(&tape.0));
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
        write_key(&mut a, "ab", None);
        let mut b = Vec::new();
        write_key(&mut b, "a", None);
        assert_ne!(a, b);
    }

    #[test]
    fn the_cache_expires_and_stays_within_its_bytes() {
        let c = Cache::new(1000);
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
            assert!(c.lock().bytes <= 1000);
        }
        c.put(
            Arc::from(&b"big"[..]),
            &[b'x'; 600],
            Duration::from_secs(60),
        );
        assert_eq!(
            c.get(b"big", now),
            None,
            "over a quarter of the cache: not kept"
        );
    }
}
