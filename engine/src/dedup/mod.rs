//! De-duplication of retried calls: a client that resends a call (same id, after a
//! timeout or a dropped connection) gets the first attempt's answer instead of running
//! a non-idempotent method twice.
//!
//! Opt-in per method ([`RegistryBuilder::dedup`]); methods that only read never need
//! it. A call is de-duplicated when it has a **key**:
//!
//! - the HTTP `Idempotency-Key` header's value, when present (with the identity, if
//!   any; the elements of a batch stay apart by their position);
//! - otherwise (identity, request id) for a caller the [`Guard`](crate::guard::Guard)
//!   authenticated. Anonymous calls without the header are not de-duplicated: ids repeat
//!   across clients (two processes both send id 1).
//!
//! With the key a **fingerprint** of the method and the params is stored: in memory, of
//! the params as parsed (their values, types, keys and order: whitespace, escapes and the
//! spelling of a number do not count), in Redis of their raw bytes. A retry of a finished
//! call replays the stored answer (result or error) with the new request's id; one that arrives while the first still runs answers `-32042` (with
//! `retryAfterMs`); the same key with another fingerprint answers `-32043` and runs
//! nothing. Only calls that started are stored: refusals (`-32700`, `-32600`,
//! `-32601`, `-32602`, `-32005`, `-32000`) free the key again. A call answered
//! `-32001` (its deadline passed) stays in progress until its handler really finishes,
//! and the retry then gets the real outcome.
//!
//! Stores: in memory ([`Dedup::memory`]: bounded in bytes, entries live for a TTL, no
//! allocation per call in steady state), or Redis (`Dedup::redis`, cargo feature
//! `redis`) for several instances serving the same clients.
//!
//! ```
//! use std::time::Duration;
//! use ringrpc::dedup::Dedup;
//! use ringrpc::guard::{Guard, Session};
//! use ringrpc::{demo, Config, Connection, Engine, Peer, Source, Transport};
//!
//! let guard = Guard::new().with_keys_toml("[[key]]\nname = \"app\"\ntoken = \"t\"\nallow = [\"*\"]\n")?;
//! let engine = demo::engine(Config::default())
//!     .with_guard(guard)
//!     .with_dedup(Dedup::memory(1 << 20, Duration::from_secs(600)));
//! let conn = Connection::new(Transport::Tcp, Peer::Unknown, 1);
//! let session = Session::new();
//! let source = Source::new(&conn).with_session(&session);
//! let (mut scratch, mut out) = (engine.scratch(), Vec::new());
//! let mut call = |frame: &str| {
//!     out.clear();
//!     let _ = engine.handle_from(frame.as_bytes(), &source, &mut scratch, &mut out);
//!     String::from_utf8(out.clone()).unwrap()
//! };
//! call(r#"{"jsonrpc":"2.0","method":"rpc.auth","params":{"token":"t"},"id":0}"#);
//! // `incr` is marked for de-duplication: the retry of id 7 does not add again.
//! assert_eq!(call(r#"{"jsonrpc":"2.0","method":"incr","params":[5],"id":7}"#), r#"{"jsonrpc":"2.0","id":7,"result":5}"#);
//! assert_eq!(call(r#"{"jsonrpc":"2.0","method":"incr","params":[5],"id":7}"#), r#"{"jsonrpc":"2.0","id":7,"result":5}"#);
//! assert_eq!(call(r#"{"jsonrpc":"2.0","method":"get_counter","id":8}"#), r#"{"jsonrpc":"2.0","id":8,"result":5}"#);
//! // The same id with other params is a mistake, not a retry.
//! assert!(call(r#"{"jsonrpc":"2.0","method":"incr","params":[6],"id":7}"#).contains("-32043"));
//! # Ok::<(), ringrpc::guard::GuardError>(())
//! ```
//!
//! [`RegistryBuilder::dedup`]: crate::RegistryBuilder::dedup

pub(crate) mod memory;
mod table;
pub(crate) use memory::{method_state, same_group};
#[cfg(feature = "redis")]
pub(crate) mod redis;
#[cfg(feature = "redis")]
mod redis_retry;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::codec::Id;
use crate::error::{
    Reason, INVALID_PARAMS, INVALID_REQUEST, LIMIT_EXCEEDED, METHOD_NOT_FOUND, PARSE_ERROR,
    SERVER_BUSY,
};
use crate::serializer::response::{write_prefix, write_reason_tail};
use crate::Params;

/// The default time a stored answer is kept: 10 minutes.
pub const DEFAULT_TTL: Duration = Duration::from_secs(600);

/// The default memory bound of [`Dedup::memory`]'s store: 64 MiB.
pub const DEFAULT_MAX_BYTES: usize = 64 << 20;

/// A call's key (who, which request) or fingerprint (which method and params), hashed
/// by the store: a randomly seeded word hash in memory (folded multiplies, as foldhash;
/// 64 of the 128 bits), SHA-256 cut
/// to 128 bits (the same in every instance) for Redis.
///
/// A `u128`, not 16 bytes: returned in two registers, where a byte array comes back
/// through memory that the caller then reads whole, a load the CPU cannot forward from
/// the callee's two 8-byte stores (~8 ns a de-duplicated call, stop 36).
pub(crate) type Digest = u128;

/// An authenticated identity, as de-duplication keys use it: its name, and the memory
/// store's hash of it ([`memory::identity_state`]), made once when it authenticated
/// instead of per call.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Identity<'a> {
    /// The name handlers and logs see.
    pub(crate) name: &'a str,
    /// `memory::identity_state(name)`.
    pub(crate) state: u64,
}

impl<'a> Identity<'a> {
    /// `name`, hashed now (where it is not kept: tests, and identities made per call).
    pub(crate) fn new(name: &'a str) -> Self {
        Self {
            name,
            state: memory::identity_state(name),
        }
    }
}

/// What a store says about a claimed key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) enum Claim {
    /// New: run the call, then [`Store::finish`] (or [`Store::release`]) it, with this
    /// slot number (the memory store's place for it; 0 in Redis).
    Run(u64),
    /// Answered before: the stored answer was written with the new id; its code.
    Replayed(Option<i32>),
    /// The first attempt still runs.
    InProgress,
    /// The key was used with another method or params.
    Mismatch,
    /// The store cannot be reached (Redis down) and failures are closed.
    Unavailable,
    /// The store cannot be reached and failures are open: run without de-duplication.
    Bypass,
}

/// Where answers are kept, keyed by [`Digest`]s.
pub(crate) trait Store: Send + Sync {
    /// Hashes the parts of a key or fingerprint (each part length-prefixed).
    fn digest(&self, parts: &[&[u8]]) -> Digest;
    /// The key of request `id` from identity `who` (see [`Dedup::key`]).
    fn id_digest(&self, who: &Identity<'_>, id: Id<'_>) -> Digest {
        let who = who.name;
        // The id, typed: 1, "1" and 1.0 are different ids.
        let mut num = itoa::Buffer::new();
        let mut float = ryu::Buffer::new();
        let (kind, id_bytes): (&[u8], &[u8]) = match id {
            Id::Null => (b"n", b""),
            Id::Str(s) => (b"s", s.as_bytes()),
            Id::Int(i) => (b"i", num.format(i).as_bytes()),
            Id::UInt(u) => (b"i", num.format(u).as_bytes()),
            Id::Float(f) => (b"f", float.format(f).as_bytes()),
        };
        self.digest(&[b"id", who.as_bytes(), kind, id_bytes])
    }
    /// The fingerprint of a call: its method and params. By default (Redis: the same in
    /// every instance and version) the params' raw bytes, as sent.
    /// `named`: the memory store's hash of the method's name made when it was
    /// registered ([`memory::method_state`]; `None` for a fallback's call).
    fn fingerprint(&self, method: &str, named: Option<u64>, params: &Params<'_>) -> Digest {
        let _ = named;
        match params.raw_json() {
            Some(p) => self.digest(&[method.as_bytes(), b"p", p]),
            None => self.digest(&[method.as_bytes(), b"-"]),
        }
    }
    /// Claims `key` for a call with fingerprint `fp`. A replay is written to `out` as a
    /// whole response with `id`.
    fn claim(&self, key: &Digest, fp: &Digest, id: Id<'_>, out: &mut Vec<u8>) -> Claim;
    /// Stores the answer of a call claimed as `slot` ([`Claim::Run`]): `tail` is the
    /// response after its id (`"result":…}` or `"error":{…}}`), `code` its error code.
    fn finish(&self, key: &Digest, fp: &Digest, slot: u64, tail: &[u8], code: Option<i32>);
    /// Frees a key claimed as `slot` whose call did not start.
    fn release(&self, key: &Digest, fp: &Digest, slot: u64);
    /// Whether claiming may block on I/O (then never on a reactor thread).
    fn remote(&self) -> bool;
}

/// The stores, as one concrete type: the engine calls them directly, not through a
/// `dyn Store` (two dynamic calls per call, and nothing inlined across them).
pub(crate) enum Backend {
    /// [`Dedup::memory`].
    Memory(memory::MemoryStore),
    /// [`Dedup::redis`].
    #[cfg(feature = "redis")]
    Redis(redis::RedisStore),
}

/// Calls `$call` on whichever store `$b` is.
macro_rules! each {
    ($b:expr, $s:ident => $call:expr) => {
        match $b {
            Backend::Memory($s) => $call,
            #[cfg(feature = "redis")]
            Backend::Redis($s) => $call,
        }
    };
}

impl Backend {
    /// [`Store::digest`].
    #[inline]
    pub(crate) fn digest(&self, parts: &[&[u8]]) -> Digest {
        each!(self, s => s.digest(parts))
    }

    /// [`Store::id_digest`].
    #[inline]
    pub(crate) fn id_digest(&self, who: &Identity<'_>, id: Id<'_>) -> Digest {
        each!(self, s => s.id_digest(who, id))
    }

    /// [`Store::fingerprint`].
    #[inline]
    pub(crate) fn fingerprint(
        &self,
        method: &str,
        named: Option<u64>,
        params: &Params<'_>,
    ) -> Digest {
        each!(self, s => s.fingerprint(method, named, params))
    }

    /// [`Store::claim`].
    #[inline]
    pub(crate) fn claim(&self, key: &Digest, fp: &Digest, id: Id<'_>, out: &mut Vec<u8>) -> Claim {
        each!(self, s => s.claim(key, fp, id, out))
    }

    /// [`Store::finish`].
    #[inline]
    pub(crate) fn finish(
        &self,
        key: &Digest,
        fp: &Digest,
        slot: u64,
        tail: &[u8],
        code: Option<i32>,
    ) {
        each!(self, s => s.finish(key, fp, slot, tail, code))
    }

    /// [`Store::release`].
    #[inline]
    pub(crate) fn release(&self, key: &Digest, fp: &Digest, slot: u64) {
        each!(self, s => s.release(key, fp, slot))
    }

    /// [`Store::remote`].
    #[inline]
    pub(crate) fn remote(&self) -> bool {
        each!(self, s => s.remote())
    }
}

/// A de-duplication store for an [`Engine`](crate::Engine) ([`Engine::with_dedup`]).
///
/// [`Engine::with_dedup`]: crate::Engine::with_dedup
#[derive(Clone)]
pub struct Dedup {
    pub(crate) store: Arc<Backend>,
    /// Whether a server fetches the next call's store line ahead
    /// (`Engine::prefetch_frame`): for a memory store that outgrows a core's own caches
    /// ([`FETCH_AHEAD_FROM`]). A smaller one stays cached, and the hint would cost more
    /// than it saves (measured: 0.88x calls/s at 64 KiB, 1.2x at 64 MiB).
    pub(crate) fetch_ahead: bool,
}

/// The least memory store bound for which the next call's line is fetched ahead: a
/// few times a core's L2 cache, where the store's lines no longer stay cached between
/// calls.
const FETCH_AHEAD_FROM: usize = 4 << 20;

impl fmt::Debug for Dedup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Dedup")
            .field("remote", &self.store.remote())
            .finish()
    }
}

impl Dedup {
    /// At a graceful shutdown: a Redis store makes the answers still waiting to be
    /// stored, for up to two seconds (see `redis_retry`); a memory store has none.
    pub(crate) fn flush(&self) {
        match &*self.store {
            Backend::Memory(_) => {}
            #[cfg(feature = "redis")]
            Backend::Redis(r) => r.flush(),
        }
    }

    /// Answers kept in this process's memory, in at most `max_bytes` (oldest evicted
    /// first), each for `ttl`. An entry counts 96 bytes (its slot, holding an answer of
    /// up to 30 bytes after the id, and its index entry), plus the buffer of a longer
    /// answer (its length rounded up to a power of two): what the store holds stays
    /// within the bound, save calls still running when a shard is full of them.
    pub fn memory(max_bytes: usize, ttl: Duration) -> Self {
        Self {
            store: Arc::new(Backend::Memory(memory::MemoryStore::new(max_bytes, ttl))),
            fetch_ahead: max_bytes >= FETCH_AHEAD_FROM,
        }
    }

    /// Answers kept in Redis at `url` (`redis://HOST:PORT[/DB]`), shared by every
    /// instance using it, each for `ttl`. Claims are `SET … NX PX`; Redis is only ever
    /// talked to from worker threads (calls of methods marked for de-duplication go to
    /// the worker pool). `fail_open`: when Redis cannot be reached, run calls without
    /// de-duplication instead of answering `-32000`.
    ///
    /// # Errors
    ///
    /// If `url` is not a Redis URL. (Redis being down is not an error here: it is
    /// retried per call.)
    #[cfg(feature = "redis")]
    pub fn redis(url: &str, ttl: Duration, fail_open: bool) -> Result<Self, DedupError> {
        Ok(Self {
            store: Arc::new(Backend::Redis(redis::RedisStore::new(url, ttl, fail_open)?)),
            fetch_ahead: false,
        })
    }

    /// Whether claims may block (Redis): such calls run on the worker pool.
    pub(crate) fn remote(&self) -> bool {
        self.store.remote()
    }

    /// The key of a call with `id` (batch element `element`), by `identity` or an
    /// `Idempotency-Key` value; `None`: the call is not de-duplicated.
    ///
    /// Under an `Idempotency-Key` the id is not part of the key (a client library may
    /// number each attempt anew): the key names the request, and a batch's elements by
    /// their position in it.
    pub(crate) fn key(
        &self,
        identity: Option<Identity<'_>>,
        idempotency_key: Option<&[u8]>,
        id: Id<'_>,
        element: Option<u32>,
    ) -> Option<Digest> {
        match (idempotency_key, identity) {
            (Some(k), who) => {
                let at = element.map_or([0xff; 4], u32::to_le_bytes);
                Some(
                    self.store
                        .digest(&[b"idem", who.map_or("", |w| w.name).as_bytes(), k, &at]),
                )
            }
            (None, Some(who)) => Some(self.store.id_digest(&who, id)),
            (None, None) => None,
        }
    }

    /// The fingerprint of a call: its method and params ([`Store::fingerprint`]).
    pub(crate) fn fingerprint(
        &self,
        method: &str,
        named: Option<u64>,
        params: &Params<'_>,
    ) -> Digest {
        self.store.fingerprint(method, named, params)
    }
}

/// A claimed call's way to its store's [`Store::finish`], wherever it is answered.
#[derive(Clone)]
pub(crate) struct Ticket {
    pub(crate) store: Arc<Backend>,
    pub(crate) key: Digest,
    pub(crate) fp: Digest,
    /// Where the claim put it ([`Claim::Run`]).
    pub(crate) slot: u64,
}

impl fmt::Debug for Ticket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ticket").finish_non_exhaustive()
    }
}

impl Ticket {
    /// Stores `answer` (a whole response object), or frees the key if the call did not
    /// start (its code says it was refused).
    pub(crate) fn finish(&self, answer: &[u8], code: Option<i32>) {
        settle(
            &self.store,
            &self.key,
            &self.fp,
            self.slot,
            tail(answer),
            code,
        );
    }
}

/// Stores the answer of the call claimed as `key` in `slot` (`answer`: its part after
/// the id, see [`tail`]; `None`: not an answer to store), or frees the key if the call
/// did not start (its code says it was refused).
pub(crate) fn settle(
    store: &Backend,
    key: &Digest,
    fp: &Digest,
    slot: u64,
    answer: Option<&[u8]>,
    code: Option<i32>,
) {
    match (not_started(code), answer) {
        (false, Some(tail)) => store.finish(key, fp, slot, tail, code),
        _ => store.release(key, fp, slot),
    }
}

/// Codes that mean the call never ran: not stored, so a retry runs it.
fn not_started(code: Option<i32>) -> bool {
    matches!(
        code,
        Some(
            PARSE_ERROR
                | INVALID_REQUEST
                | METHOD_NOT_FOUND
                | INVALID_PARAMS
                | LIMIT_EXCEEDED
                | SERVER_BUSY
        )
    )
}

/// A response's start up to its id.
const PREFIX: &[u8; 22] = br#"{"jsonrpc":"2.0","id":"#;

/// The part of a response after its id: `"result":…}` or `"error":{…}}`. The engine
/// wrote the response (`{"jsonrpc":"2.0","id":ID,` first), so the id is a JSON number,
/// `null` or a string whose end is found by skipping escapes.
pub(crate) fn tail(answer: &[u8]) -> Option<&[u8]> {
    // Compared as one 22-byte array (two vector compares), not through `memcmp`.
    let (prefix, rest) = answer.split_first_chunk::<22>()?;
    if prefix != PREFIX {
        return None;
    }
    let end = if rest.first() == Some(&b'"') {
        let mut i = 1;
        loop {
            match rest.get(i)? {
                b'\\' => i += 2,
                b'"' => break i + 1,
                _ => i += 1,
            }
        }
    } else {
        // A number or `null`: a few bytes, where a plain scan beats memchr's setup.
        rest.iter().position(|&b| b == b',')?
    };
    rest.get(end..)?.strip_prefix(b",")
}

/// Writes a replayed answer: the new id, then the stored tail.
pub(crate) fn write_replay(out: &mut Vec<u8>, id: Id<'_>, tail: &[u8]) {
    write_prefix(out, id);
    out.extend_from_slice(tail);
}

/// Writes the answer of a claim that does not run the call (in progress — with a
/// retry hint of 100 ms —, mismatch, store down). Returns its code.
#[cold]
pub(crate) fn write_refusal(out: &mut Vec<u8>, id: Id<'_>, claim: Claim) -> i32 {
    write_prefix(out, id);
    let (reason, message, retry_after_ms) = match claim {
        Claim::InProgress => (
            Reason::InProgress,
            "In progress: a call with this id is still running; retry later",
            Some(IN_PROGRESS_RETRY_MS),
        ),
        Claim::Mismatch => (
            Reason::FingerprintMismatch,
            "Fingerprint mismatch: this id was used before with another method or params",
            None,
        ),
        _ => (
            Reason::DedupUnavailable,
            "Server busy: the de-duplication store cannot be reached",
            None,
        ),
    };
    write_reason_tail(out, reason, format_args!("{message}"), retry_after_ms);
    reason.code().code()
}

/// The retry hint sent with `-32042 In progress`: short, as a first attempt that is
/// still running is usually about to finish.
const IN_PROGRESS_RETRY_MS: u64 = 100;

/// A de-duplication store that cannot be set up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DedupError {
    /// A Redis URL that cannot be used.
    #[error("bad Redis URL {url:?}: {reason}")]
    Url {
        /// The URL given.
        url: String,
        /// Why it cannot be used.
        reason: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The next call's line is fetched ahead only where the store can miss the caches.
    #[test]
    fn only_a_large_memory_store_fetches_ahead() {
        assert!(!Dedup::memory(64 << 10, DEFAULT_TTL).fetch_ahead);
        assert!(!Dedup::memory(FETCH_AHEAD_FROM - 1, DEFAULT_TTL).fetch_ahead);
        assert!(Dedup::memory(FETCH_AHEAD_FROM, DEFAULT_TTL).fetch_ahead);
        assert!(Dedup::memory(DEFAULT_MAX_BYTES, DEFAULT_TTL).fetch_ahead);
    }

    #[test]
    fn tails_skip_any_id() {
        for (answer, want) in [
            (
                &br#"{"jsonrpc":"2.0","id":7,"result":5}"#[..],
                &br#""result":5}"#[..],
            ),
            (
                br#"{"jsonrpc":"2.0","id":null,"result":[1,2]}"#,
                br#""result":[1,2]}"#,
            ),
            (
                br#"{"jsonrpc":"2.0","id":"a,\"b\\","error":{"code":1,"message":"x"}}"#,
                br#""error":{"code":1,"message":"x"}}"#,
            ),
            (
                br#"{"jsonrpc":"2.0","id":-1.5e3,"result":"x,y"}"#,
                br#""result":"x,y"}"#,
            ),
        ] {
            assert_eq!(
                tail(answer),
                Some(want),
                "{}",
                String::from_utf8_lossy(answer)
            );
        }
        assert_eq!(tail(b"{}"), None);
        assert_eq!(tail(br#"{"jsonrpc":"2.0","id":"unterminated"#), None);
    }

    /// The tail is found after any id the engine writes.
    #[test]
    fn tails_follow_every_kind_of_id() {
        let ids = [
            Id::Null,
            Id::Int(0),
            Id::Int(-1),
            Id::Int(i64::MIN),
            Id::UInt(u64::MAX),
            Id::Str("a,\"b"),
            Id::Str(""),
            Id::Float(-1.5e3),
        ];
        for id in ids {
            for tail_in in [
                &br#""result":5}"#[..],
                br#""error":{"code":1,"message":"x"}}"#,
            ] {
                let mut answer = Vec::new();
                write_replay(&mut answer, id, tail_in);
                assert_eq!(tail(&answer), Some(tail_in), "{id:?}");
            }
        }
        assert_eq!(tail(br#"{"jsonrpc":"2.1","id":1,"result":5}"#), None);
    }

    #[test]
    fn replays_carry_the_new_id() {
        let mut out = Vec::new();
        write_replay(&mut out, Id::Str("n\"ew"), br#""result":5}"#);
        assert_eq!(out, br#"{"jsonrpc":"2.0","id":"n\"ew","result":5}"#);
    }

    /// The memory store's fingerprint is of the params as parsed: another spelling of
    /// the same values is a retry; any other value, type, key or order is a mismatch.
    #[test]
    fn fingerprints_see_values_not_spelling() {
        use crate::guard::{Guard, Session};
        use crate::{Config, Connection, Engine, Peer, Registry, Source, Transport};
        let mut b = Registry::builder();
        b.dedup_method("take", |p: Params<'_>| Ok(p.len())).unwrap();
        let keys = "[[key]]\nname = \"r\"\ntoken = \"t\"\nallow = [\"take\"]\n";
        let engine = Engine::new(b.freeze(), Config::default())
            .with_guard(Guard::new().with_keys_toml(keys).unwrap())
            .with_dedup(Dedup::memory(1 << 20, Duration::from_secs(600)));
        let conn = Connection::new(Transport::Tcp, Peer::Unknown, 1);
        let session = Session::new();
        let source = Source::new(&conn).with_session(&session);
        let mut scratch = engine.scratch();
        let mut call = |frame: &str| {
            let mut out = Vec::new();
            let _ = engine.handle_from(frame.as_bytes(), &source, &mut scratch, &mut out);
            String::from_utf8(out).unwrap()
        };
        call(r#"{"jsonrpc":"2.0","method":"rpc.auth","params":{"token":"t"},"id":0}"#);
        let groups: [(&str, &[&str], &[&str]); 3] = [
            (
                r#"[2,"a\"b",{"k":[true,null]}]"#,
                // The same values, spelled otherwise.
                &[
                    r#"[ 2 , "a\"b" , { "k" : [ true , null ] } ]"#,
                    r#"[2,"a\u0022\u0062",{"\u006b":[true,null]}]"#,
                ],
                // Another value, type, length or nesting.
                &[
                    r#"[3,"a\"b",{"k":[true,null]}]"#,
                    r#"[2.0,"a\"b",{"k":[true,null]}]"#,
                    r#"["2","a\"b",{"k":[true,null]}]"#,
                    r#"[2,"a\"c",{"k":[true,null]}]"#,
                    r#"[2,"a\"b",{"j":[true,null]}]"#,
                    r#"[2,"a\"b",{"k":[false,null]}]"#,
                    r#"[2,"a\"b",{"k":[true]}]"#,
                    r#"[2,"a\"b",{"k":[[true],null]}]"#,
                    r#"[2,"a\"b",{"k":[true,null]},1]"#,
                    r#"[-2,"a\"b",{"k":[true,null]}]"#,
                    r#"{"k":2}"#,
                    r#"[]"#,
                ],
            ),
            (
                r#"{"a":1,"b":"x"}"#,
                &[r#"{ "a" : 1 , "b" : "\u0078" }"#],
                &[
                    r#"{"b":"x","a":1}"#,
                    r#"{"a":1}"#,
                    r#"{"a":1,"b":"x","c":null}"#,
                    r#"{"a":1e0,"b":"x"}"#,
                ],
            ),
            (
                r#"[100.0]"#,
                &[r#"[1e2]"#, r#"[1.00E+2]"#],
                &[r#"[100]"#, r#"[100.5]"#],
            ),
        ];
        for (n, (first, same, other)) in groups.into_iter().enumerate() {
            let frame =
                |p: &str| format!(r#"{{"jsonrpc":"2.0","method":"take","params":{p},"id":{n}}}"#);
            let answer = call(&frame(first));
            assert!(answer.contains("result"), "{answer}");
            for p in same {
                assert_eq!(call(&frame(p)), answer, "{p}");
            }
            for p in other {
                assert!(call(&frame(p)).contains("-32043"), "{p}");
            }
            let absent = format!(r#"{{"jsonrpc":"2.0","method":"take","id":{n}}}"#);
            assert!(call(&absent).contains("-32043"));
        }
    }

    /// A driver for instruction counts, not a check: `DEDUP_CALLS` calls of `incr`
    /// (a new id each, cycled over `1 << 18` prebuilt frames, as `benches/guard.rs`
    /// does) through `Engine::handle_from`, with a memory store of `DEDUP_BYTES`
    /// (0: none). Run a release build under `valgrind --tool=callgrind` twice with
    /// different `DEDUP_CALLS`; the difference over the difference in calls is the cost
    /// per call, setup cancelled.
    #[test]
    #[ignore = "a profiling driver: run under callgrind (see its doc)"]
    fn cost_driver() {
        use crate::guard::{Guard, Session};
        use crate::{demo, Config, Connection, Peer, Source, Transport};
        let env = |name: &str, default: usize| {
            std::env::var(name)
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(default)
        };
        let (calls, bytes) = (env("DEDUP_CALLS", 100_000), env("DEDUP_BYTES", 64 << 10));
        let keys = "[[key]]\nname = \"r\"\ntoken = \"t\"\nallow = [\"incr\", \"get_counter\"]\n";
        let engine =
            demo::engine(Config::default()).with_guard(Guard::new().with_keys_toml(keys).unwrap());
        let engine = if bytes == 0 {
            engine
        } else {
            engine.with_dedup(Dedup::memory(bytes, Duration::from_secs(600)))
        };
        let conn = Connection::new(Transport::Tcp, Peer::Unknown, 1);
        let session = Session::new();
        let source = Source::new(&conn).with_session(&session);
        let (mut scratch, mut out) = (engine.scratch(), Vec::with_capacity(1024));
        let auth = br#"{"jsonrpc":"2.0","method":"rpc.auth","params":{"token":"t"},"id":0}"#;
        let _ = engine.handle_from(auth, &source, &mut scratch, &mut out);
        let frames: Vec<Vec<u8>> = (0..1u32 << 18)
            .map(|i| {
                format!(r#"{{"jsonrpc":"2.0","method":"incr","params":[1],"id":{i}}}"#).into_bytes()
            })
            .collect();
        for i in 0..calls {
            out.clear();
            let frame = &frames[i & ((1 << 18) - 1)];
            let _ =
                engine.handle_from(std::hint::black_box(frame), &source, &mut scratch, &mut out);
        }
        // The counter says how many calls ran (the rest were replays).
        out.clear();
        let get = br#"{"jsonrpc":"2.0","method":"get_counter","id":0}"#;
        let _ = engine.handle_from(get, &source, &mut scratch, &mut out);
        eprintln!(
            "{calls} calls, store {bytes} bytes, ran: {}",
            String::from_utf8_lossy(&out)
        );
    }

    #[test]
    fn refusals_are_well_formed() {
        for claim in [Claim::InProgress, Claim::Mismatch, Claim::Unavailable] {
            let mut out = Vec::new();
            let code = write_refusal(&mut out, Id::Int(3), claim);
            let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
            assert_eq!(v["error"]["code"], code);
            assert!(v["error"]["data"]["reason"].is_string());
        }
    }
}
