//! The Redis de-duplication store (feature `redis`): answers shared by every instance
//! that uses the same Redis.
//!
//! One Redis string per key, `ringrpc:dedup:<hex of the key digest>`, holding either
//!
//! - a claim marker, `R<hex fp><hex nonce>`, while the call runs (the nonce drawn
//!   for this claim alone), or
//! - the answer, `D<hex fp><code>\n<tail>`: the code in decimal (empty for a result),
//!   then the response's bytes after its id.
//!
//! Both expire after the TTL (`PX`). A claim is `SET … NX PX`, so of several instances
//! racing for a key exactly one runs the call; finishing and releasing are Lua
//! compare-and-set scripts that only touch the key while it still holds this claim's
//! marker, so a late or duplicate finish cannot overwrite another call's answer, nor
//! the claim of a retry made after this call's marker expired.
//!
//! Unlike the memory store, a running call's marker also expires after the TTL: a call
//! that runs longer than the TTL can then be run again by a retry.
//!
//! Talked to only from threads that may block (pool workers, deferred responders, an
//! embedding host's own thread), synchronously, every step bounded: connecting takes
//! at most [`CONNECT_TIMEOUT`], each read and write at most [`IO_TIMEOUT`]. A finish
//! or release that fails is made again in the background until Redis answers or the
//! marker has expired ([`super::redis_retry`]).

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use redis::{Client, Connection, ErrorKind, RedisError, RedisResult, Value};
use sha2::{Digest as _, Sha256};

use super::redis_retry::Retries;
use super::{write_replay, Claim, DedupError, Digest, Store};
use crate::codec::Id;

/// How long a new connection may take (TCP connect and the Redis handshake).
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// How long one read or write on a connection may take.
pub(crate) const IO_TIMEOUT: Duration = Duration::from_secs(1);

/// After a connect that timed out, how long further connects fail at once: an
/// unreachable Redis (packets dropped, not refused) would otherwise hold every worker
/// for [`CONNECT_TIMEOUT`] per call.
const BACKOFF: Duration = Duration::from_millis(250);

/// Idle connections kept for reuse; more are closed when returned.
const POOL: usize = 16;

/// The prefix of every key this store writes.
const PREFIX: &str = "ringrpc:dedup:";

/// Sets the finished value only if the key still holds this call's marker.
/// `KEYS[1]` key, `ARGV[1]` marker, `ARGV[2]` finished value, `ARGV[3]` TTL in ms.
const FINISH: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then \
     redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3]) return 1 end return 0";

/// Deletes the key only if it still holds this call's marker.
/// `KEYS[1]` key, `ARGV[1]` marker.
const RELEASE: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then \
     return redis.call('DEL', KEYS[1]) end return 0";

/// Answers in Redis.
pub(crate) struct RedisStore {
    client: Client,
    /// Idle connections; one is taken for each operation and put back after it
    /// succeeded (one that failed is dropped: its state is unknown).
    pool: Mutex<Vec<Connection>>,
    ttl_ms: u64,
    fail_open: bool,
    /// Nanoseconds since `epoch` before which connecting is not tried ([`BACKOFF`]).
    retry_at: AtomicU64,
    epoch: Instant,
    /// Claims made, and a random start: each claim's marker is its own.
    claims: AtomicU64,
    seed: u64,
    /// Finishes and releases that failed, made again later.
    retries: Retries,
}

impl RedisStore {
    /// Makes the writes still waiting to be retried, for a short while (see
    /// [`Retries::flush`]).
    pub(crate) fn flush(&self) {
        self.retries.flush();
    }

    /// A store at `url`, entries kept for `ttl`; `fail_open`: claims answer
    /// [`Claim::Bypass`] instead of [`Claim::Unavailable`] when Redis fails. Does not
    /// connect: Redis may be down at start, and is retried per call.
    pub(crate) fn new(url: &str, ttl: Duration, fail_open: bool) -> Result<Self, DedupError> {
        let client = Client::open(url).map_err(|e| DedupError::Url {
            url: redact(url),
            reason: e.to_string(),
        })?;
        Ok(Self {
            retries: Retries::new(client.clone(), ttl),
            client,
            pool: Mutex::new(Vec::new()),
            // Redis refuses `PX 0` and expiries past its clock's range; 2^53 ms is
            // beyond any TTL meant.
            ttl_ms: u64::try_from(ttl.as_millis())
                .unwrap_or(u64::MAX)
                .clamp(1, 1 << 53),
            fail_open,
            retry_at: AtomicU64::new(0),
            epoch: Instant::now(),
            claims: AtomicU64::new(0),
            seed: std::hash::BuildHasher::hash_one(
                &std::collections::hash_map::RandomState::new(),
                std::process::id(),
            ),
        })
    }

    /// A number for a new claim: unique in this process, and (random) unlikely to be
    /// another instance's.
    fn nonce(&self) -> u64 {
        // splitmix64 of a counter from a random start: distinct for 2^64 claims.
        let mut z = self.seed.wrapping_add(
            self.claims
                .fetch_add(1, Ordering::Relaxed)
                .wrapping_mul(0x9e37_79b9_7f4a_7c15),
        );
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn now(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    fn idle(&self) -> MutexGuard<'_, Vec<Connection>> {
        // The pool is a plain Vec: a panic elsewhere cannot leave it inconsistent.
        self.pool.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A new connection, with the I/O timeouts set.
    fn connect(&self) -> RedisResult<Connection> {
        if self.now() < self.retry_at.load(Ordering::Relaxed) {
            return Err(RedisError::from((
                ErrorKind::Io,
                "Redis did not answer a connect moments ago",
            )));
        }
        let conn = self
            .client
            .get_connection_with_timeout(CONNECT_TIMEOUT)
            .inspect_err(|e| {
                if e.is_timeout() {
                    let at = self
                        .now()
                        .saturating_add(u64::try_from(BACKOFF.as_nanos()).unwrap_or(u64::MAX));
                    self.retry_at.store(at, Ordering::Relaxed);
                }
            })?;
        conn.set_read_timeout(Some(IO_TIMEOUT))?;
        conn.set_write_timeout(Some(IO_TIMEOUT))?;
        Ok(conn)
    }

    fn put_back(&self, conn: Connection) {
        let mut idle = self.idle();
        if idle.len() < POOL {
            idle.push(conn);
        }
    }

    /// Runs `op` on a pooled or new connection. `op` must be safe to run twice: when a
    /// pooled connection turns out dead (Redis restarted, or closed it as idle, since it
    /// was opened), the idle ones are dropped too and `op` runs once more on a new
    /// connection, so a restart costs no call an error. Not after a timeout, whose
    /// command may have run. (A connection that dies just after its command ran is
    /// retried too: for a claim, the retry then finds its own marker and answers
    /// `-32042` until the TTL; rare, and only when Redis dies mid-command.)
    fn with_conn<T>(
        &self,
        mut op: impl FnMut(&mut Connection) -> RedisResult<T>,
    ) -> RedisResult<T> {
        let pooled = self.idle().pop();
        let was_pooled = pooled.is_some();
        let mut conn = match pooled {
            Some(c) => c,
            None => self.connect()?,
        };
        match op(&mut conn) {
            Ok(v) => {
                self.put_back(conn);
                Ok(v)
            }
            Err(e) if was_pooled && e.is_connection_dropped() && !e.is_timeout() => {
                drop(conn);
                self.idle().clear();
                let mut conn = self.connect()?;
                let v = op(&mut conn)?;
                self.put_back(conn);
                Ok(v)
            }
            Err(e) => Err(e),
        }
    }

    /// The claim, or the Redis error that prevented it; `sent` is set once the claim's
    /// `SET` may have reached Redis.
    fn try_claim(
        &self,
        key: &Digest,
        fp: &Digest,
        nonce: u64,
        id: Id<'_>,
        out: &mut Vec<u8>,
        sent: &mut bool,
    ) -> RedisResult<Claim> {
        let k = redis_key(key);
        let marker = marker(fp, nonce);
        let found = self.with_conn(|c| {
            *sent = true;
            // Twice: the key may expire between a refused SET and the GET.
            for _ in 0..2 {
                let set: Value = redis::cmd("SET")
                    .arg(&k)
                    .arg(&marker)
                    .arg("NX")
                    .arg("PX")
                    .arg(self.ttl_ms)
                    .query(c)?;
                match set {
                    Value::Okay => return Ok(Found::Claimed),
                    Value::SimpleString(s) if s == "OK" => return Ok(Found::Claimed),
                    Value::Nil => {}
                    _ => return Err(unexpected()),
                }
                let got: Option<Vec<u8>> = redis::cmd("GET").arg(&k).query(c)?;
                if let Some(v) = got {
                    return Ok(Found::Value(v));
                }
            }
            Ok(Found::Churning)
        })?;
        let value = match found {
            // The nonce comes back to `finish` or `release` as the claim's slot.
            Found::Claimed => return Ok(Claim::Run(nonce)),
            // Taken and gone twice in a row: other calls hold it briefly; retry later.
            Found::Churning => return Ok(Claim::InProgress),
            Found::Value(v) => v,
        };
        let ours = &marker.as_bytes()[1..=FP_HEX];
        match parse(&value) {
            Some(Stored::Running(theirs)) if theirs == ours => Ok(Claim::InProgress),
            Some(Stored::Done(theirs, code, tail)) if theirs == ours => {
                write_replay(out, id, tail);
                Ok(Claim::Replayed(code))
            }
            Some(_) => Ok(Claim::Mismatch),
            // Not a value this store wrote: the key is unusable, like Redis being down.
            None => Err(unexpected()),
        }
    }
}

impl Store for RedisStore {
    fn digest(&self, parts: &[&[u8]]) -> Digest {
        // Unkeyed, so every instance computes the same digest for the same call; SHA-256
        // so a caller still cannot aim two keys at one digest.
        let mut h = Sha256::new();
        for p in parts {
            h.update((p.len() as u64).to_le_bytes());
            h.update(p);
        }
        let full = h.finalize();
        let mut d = [0u8; 16];
        d.copy_from_slice(&full[..16]);
        Digest::from_le_bytes(d)
    }

    fn claim(&self, key: &Digest, fp: &Digest, id: Id<'_>, out: &mut Vec<u8>) -> Claim {
        let nonce = self.nonce();
        let mut sent = false;
        match self.try_claim(key, fp, nonce, id, out, &mut sent) {
            Ok(claim) => claim,
            Err(e) => {
                // The `SET` may have been applied though its reply was lost (a
                // timeout): the claim is taken back, so that retries are not told
                // "in progress" until the TTL for a call that never ran. Only this
                // claim's marker is deleted, now or, if Redis fails again, later. (Not
                // when no connection was made: nothing was sent.)
                if sent {
                    self.release(key, fp, nonce);
                    if e.is_timeout() {
                        // A stalled Redis may yet run the `SET` after that release:
                        // released once more, a while later.
                        let again = self.release_write(key, fp, nonce);
                        self.retries.push_later(again, IO_TIMEOUT);
                    }
                }
                if self.fail_open {
                    Claim::Bypass
                } else {
                    Claim::Unavailable
                }
            }
        }
    }

    /// If Redis fails, the answer is stored later ([`super::redis_retry`]); until
    /// then retries answer `-32042`.
    fn finish(&self, key: &Digest, fp: &Digest, slot: u64, tail: &[u8], code: Option<i32>) {
        let mut value = Vec::with_capacity(1 + 32 + 11 + 1 + tail.len());
        value.push(b'D');
        value.extend_from_slice(hex(fp).as_bytes());
        if let Some(code) = code {
            value.extend_from_slice(itoa::Buffer::new().format(code).as_bytes());
        }
        value.push(b'\n');
        value.extend_from_slice(tail);
        self.write(Write {
            key: redis_key(key),
            marker: marker(fp, slot),
            value: Some(value),
            ttl_ms: self.ttl_ms,
        });
    }

    /// If Redis fails, the marker is deleted later ([`super::redis_retry`]); until then
    /// retries answer `-32042`.
    fn release(&self, key: &Digest, fp: &Digest, slot: u64) {
        self.write(self.release_write(key, fp, slot));
    }

    fn remote(&self) -> bool {
        true
    }
}

impl RedisStore {
    /// The write that releases the claim of `key` with `fp` and nonce `slot`.
    fn release_write(&self, key: &Digest, fp: &Digest, slot: u64) -> Write {
        Write {
            key: redis_key(key),
            marker: marker(fp, slot),
            value: None,
            ttl_ms: self.ttl_ms,
        }
    }

    /// Makes `w` now, or, if Redis fails, later.
    fn write(&self, w: Write) {
        if self.with_conn(|c| w.run(c)).is_err() {
            self.retries.push(w);
        }
    }
}

/// What ends a claim: its answer stored, or (released) its marker deleted; either only
/// while the key still holds this claim's marker, so it may be made late or twice.
pub(super) struct Write {
    key: String,
    marker: String,
    /// The answer's value (a finish), or none (a release).
    value: Option<Vec<u8>>,
    ttl_ms: u64,
}

impl Write {
    /// Makes it on `c`.
    pub(super) fn run(&self, c: &mut Connection) -> RedisResult<()> {
        let mut cmd = redis::cmd("EVAL");
        match &self.value {
            Some(value) => cmd
                .arg(FINISH)
                .arg(1)
                .arg(&self.key)
                .arg(&self.marker)
                .arg(value)
                .arg(self.ttl_ms),
            None => cmd.arg(RELEASE).arg(1).arg(&self.key).arg(&self.marker),
        };
        cmd.query::<Value>(c).map(drop)
    }

    /// What it holds, in bytes (to bound those waiting).
    pub(super) fn bytes(&self) -> usize {
        self.key.len() + self.marker.len() + self.value.as_ref().map_or(0, Vec::len)
    }

    /// A finish storing `len` bytes, for a key of its own (for tests).
    #[cfg(test)]
    pub(super) fn sample(n: u64, len: usize) -> Self {
        let fp = Digest::from(n);
        Self {
            key: redis_key(&fp),
            marker: marker(&fp, n),
            value: Some(vec![b'x'; len]),
            ttl_ms: 60_000,
        }
    }
}

/// What a claim's `SET NX` (and `GET`) found.
enum Found {
    /// The key was free: claimed.
    Claimed,
    /// The key's value.
    Value(Vec<u8>),
    /// Taken, then expired before it could be read, twice.
    Churning,
}

/// A value read back from a key.
#[derive(Debug, PartialEq, Eq)]
enum Stored<'a> {
    /// A claim marker: its fingerprint (hex; its nonce is not compared).
    Running(&'a [u8]),
    /// An answer: its fingerprint (hex), code and tail.
    Done(&'a [u8], Option<i32>, &'a [u8]),
}

/// Reads a value this store wrote; `None` for anything else.
fn parse(value: &[u8]) -> Option<Stored<'_>> {
    let (&kind, rest) = value.split_first()?;
    let fp = rest.get(..FP_HEX)?;
    let rest = rest.get(FP_HEX..)?;
    match kind {
        // (Without a nonce: a marker of a build before nonces.)
        b'R' if rest.is_empty() || rest.len() == 16 => Some(Stored::Running(fp)),
        b'D' => {
            let nl = memchr::memchr(b'\n', rest)?;
            let code = match &rest[..nl] {
                [] => None,
                digits => Some(std::str::from_utf8(digits).ok()?.parse().ok()?),
            };
            Some(Stored::Done(fp, code, &rest[nl + 1..]))
        }
        _ => None,
    }
}

fn redis_key(key: &Digest) -> String {
    let mut k = String::with_capacity(PREFIX.len() + 32);
    k.push_str(PREFIX);
    k.push_str(&hex(key));
    k
}

/// A fingerprint's length in hex.
const FP_HEX: usize = 32;

/// The marker of a claim of `fp` with `nonce`.
fn marker(fp: &Digest, nonce: u64) -> String {
    let mut m = String::with_capacity(1 + FP_HEX + 16);
    m.push('R');
    m.push_str(&hex(fp));
    // (Writing to a String cannot fail.)
    let _ = write!(m, "{nonce:016x}");
    m
}

fn hex(d: &Digest) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(32);
    for b in d.to_le_bytes() {
        s.push(char::from(HEX[usize::from(b >> 4)]));
        s.push(char::from(HEX[usize::from(b & 15)]));
    }
    s
}

fn unexpected() -> RedisError {
    RedisError::from((
        ErrorKind::UnexpectedReturnType,
        "a reply or value this store did not write",
    ))
}

/// `url` without the password of its user info: it goes into an error message.
fn redact(url: &str) -> String {
    let Some(start) = url.find("://").map(|i| i + 3) else {
        return url.to_owned();
    };
    let authority_end = url[start..]
        .find(['/', '?', '#'])
        .map_or(url.len(), |i| start + i);
    match url[start..authority_end].rfind('@') {
        Some(at) => format!("{}***{}", &url[..start], &url[start + at..]),
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> RedisStore {
        RedisStore::new("redis://127.0.0.1:1/", Duration::from_secs(60), false).unwrap()
    }

    #[test]
    fn digests_are_the_same_everywhere_and_length_prefixed() {
        let (a, b) = (store(), store());
        assert_eq!(
            a.digest(&[b"id", b"app", b"i", b"7"]),
            b.digest(&[b"id", b"app", b"i", b"7"])
        );
        // The parts' boundaries count.
        assert_ne!(a.digest(&[b"ab", b"c"]), a.digest(&[b"a", b"bc"]));
        // SHA-256 of u64 LE 0: fixed across versions and machines, so instances of
        // different builds agree.
        assert_eq!(hex(&a.digest(&[b""])), "af5570f5a1810b7af78caf4bc70a660f");
    }

    #[test]
    fn values_round_trip() {
        let fp = Digest::from_le_bytes([0xab; 16]);
        let h = hex(&fp);
        assert_eq!(
            parse(marker(&fp, 0x0123_4567_89ab_cdef).as_bytes()),
            Some(Stored::Running(h.as_bytes()))
        );
        assert_eq!(marker(&fp, 1).len(), 1 + 32 + 16);
        // A marker of a build before nonces is still read as one.
        assert_eq!(
            parse(format!("R{h}").as_bytes()),
            Some(Stored::Running(h.as_bytes()))
        );
        let done = format!("D{h}-32001\n\"error\":{{}}}}");
        assert_eq!(
            parse(done.as_bytes()),
            Some(Stored::Done(h.as_bytes(), Some(-32001), b"\"error\":{}}"))
        );
        let done = format!("D{h}\n\"result\":\"a\nb\"}}");
        assert_eq!(
            parse(done.as_bytes()),
            Some(Stored::Done(h.as_bytes(), None, b"\"result\":\"a\nb\"}"))
        );
        for bad in [
            "",
            "R",
            "Rabc",
            &format!("R{h}x"),
            &format!("R{h}0123456789abcdef0"),
            &format!("D{h}"),
            &format!("D{h}x\n"),
            &format!("X{h}"),
        ] {
            assert_eq!(parse(bad.as_bytes()), None, "{bad:?}");
        }
    }

    #[test]
    fn keys_are_prefixed_hex() {
        let mut d = [0u8; 16];
        d[0] = 0x0f;
        d[15] = 0xf0;
        assert_eq!(
            redis_key(&Digest::from_le_bytes(d)),
            "ringrpc:dedup:0f0000000000000000000000000000f0"
        );
    }

    #[test]
    fn bad_urls_are_refused_without_their_password() {
        let err = RedisStore::new("http://user:secret@host/", Duration::from_secs(1), false)
            .err()
            .expect("not a Redis URL");
        let text = err.to_string();
        assert!(!text.contains("secret"), "{text}");
        assert!(text.contains("http://***@host/"), "{text}");
        assert_eq!(redact("redis://h:6379/0"), "redis://h:6379/0");
        assert_eq!(redact("redis://:p@ss@h/0?x=@"), "redis://***@h/0?x=@");
    }

    #[test]
    fn an_unreachable_redis_is_unavailable_or_bypassed_quickly() {
        // Port 1 on loopback refuses at once.
        let mut out = Vec::new();
        let (k, fp) = (
            Digest::from_le_bytes([1; 16]),
            Digest::from_le_bytes([2; 16]),
        );
        assert_eq!(
            store().claim(&k, &fp, Id::Int(1), &mut out),
            Claim::Unavailable
        );
        let open = RedisStore::new("redis://127.0.0.1:1/", Duration::from_secs(60), true).unwrap();
        assert_eq!(open.claim(&k, &fp, Id::Int(1), &mut out), Claim::Bypass);
        assert!(out.is_empty());
        // Neither panics nor blocks.
        open.finish(&k, &fp, 0, b"x}", None);
        open.release(&k, &fp, 0);
    }
}
