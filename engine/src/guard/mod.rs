//! Protecting a service: who may call (authentication), what they may call
//! (allow-lists), and how often (rate limits), checked for every call and every batch
//! element before it runs.
//!
//! A [`Guard`] is set on the engine ([`Engine::with_guard`]) before serving. Without one
//! nothing changes: every caller is anonymous and may call everything, and the hot path
//! pays nothing for it. With one:
//!
//! - **Keys** (a TOML key file, [`Guard::with_key_file`]; see docs/OPERATIONS.md): over
//!   HTTP each request carries `Authorization: Bearer TOKEN` (the server answers a
//!   missing or unknown token with HTTP 401); on TCP, Unix sockets and stdio the first
//!   call on a connection is `rpc.auth` with `{"token": "…"}`, answered
//!   `{"identity": "NAME"}`, and any other call before it answers `-32040`. A Unix
//!   peer may instead be allowed by its user id (`[[peer]] uid = …`).
//! - **JWT** (HS256, [`Guard::with_jwt_secret_file`]): a token may also be a JSON Web
//!   Token signed with the shared secret, `iat` within 60 s; verified once per
//!   connection and token, not per request.
//! - **Allow-lists**: a call to a method the identity may not call answers `-32041`.
//!   An empty list allows nothing.
//! - **Rate limits** (GCRA): per identity (`rate`/`burst` in the key file) and per
//!   peer address for anonymous callers ([`Guard::with_peer_rate_limit`]). Every batch
//!   element is charged (`[weights]` per method); a limited call answers `-32005` with
//!   `retryAfterMs`, and an HTTP request whose every call was limited gets 429.
//! - **Failed authentications** may be limited per peer address
//!   ([`Guard::with_auth_failure_limit`], off by default): past the limit, a token from
//!   that address is not even looked at (`-32005`, over HTTP 429) until the bucket
//!   refills, so a token cannot be guessed at the speed of the network.
//!
//! ```
//! use ringrpc::guard::{Guard, Session};
//! use ringrpc::{demo, Config, Connection, Peer, Source, Transport};
//!
//! let guard = Guard::new().with_keys_toml(r#"
//!     [[key]]
//!     name  = "reader"
//!     token = "r3ader"
//!     allow = ["ping"]
//! "#)?;
//! let engine = demo::engine(Config::default()).with_guard(guard);
//! // One session per connection: it remembers who authenticated on it.
//! let conn = Connection::new(Transport::Tcp, Peer::Unknown, 1);
//! let session = Session::new();
//! let source = Source::new(&conn).with_session(&session);
//! let (mut scratch, mut out) = (engine.scratch(), Vec::new());
//! let mut call = |frame: &[u8]| {
//!     out.clear();
//!     let _ = engine.handle_from(frame, &source, &mut scratch, &mut out);
//!     String::from_utf8(out.clone()).unwrap()
//! };
//! assert!(call(br#"{"jsonrpc":"2.0","method":"ping","id":1}"#).contains("-32040"));
//! assert_eq!(
//!     call(br#"{"jsonrpc":"2.0","method":"rpc.auth","params":{"token":"r3ader"},"id":2}"#),
//!     r#"{"jsonrpc":"2.0","id":2,"result":{"identity":"reader"}}"#
//! );
//! assert_eq!(call(br#"{"jsonrpc":"2.0","method":"ping","id":3}"#), r#"{"jsonrpc":"2.0","id":3,"result":"pong"}"#);
//! assert!(call(br#"{"jsonrpc":"2.0","method":"echo","params":[1],"id":4}"#).contains("-32041"));
//! # Ok::<(), ringrpc::guard::GuardError>(())
//! ```
//!
//! [`Engine::with_guard`]: crate::Engine::with_guard

pub(crate) mod jwt;
pub(crate) mod keys;
pub(crate) mod rate;

use std::borrow::Cow;
use std::cell::RefCell;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use subtle::ConstantTimeEq;

use crate::codec::{Id, Params};
use crate::dispatch::context::{Headers, Peer, Source, Transport};
use crate::error::{ErrorCode, Reason};
use crate::serializer::json::write_str;
use crate::serializer::response::{write_prefix, write_reason_tail};
use jwt::{JwtCache, JwtSecret};
use keys::{Allow, Keys, Principal};
use rate::{now_ns, Limited, PeerLimiter, Rate};

/// The most peer addresses the per-address rate limiter keeps in each of its two
/// generations (a flood of new addresses evicts idle ones rather than growing memory:
/// it never holds more than twice this).
pub const PEER_TABLE_CAPACITY: usize = rate::DEFAULT_PEER_CAPACITY;

/// A guard that cannot be set up: a bad key file, secret or rate.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GuardError {
    /// The key file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The key file is not valid (TOML syntax, or a rule of its format).
    #[error("bad key file: {0}")]
    KeyFile(String),
    /// The JWT secret file is not valid.
    #[error("bad JWT secret: {0}")]
    Jwt(String),
    /// A rate limit that cannot be parsed.
    #[error("bad rate limit: {0}")]
    Rate(String),
    /// [`Guard::reload`] on a guard with no key file.
    #[error("no key file to reload")]
    NoKeyFile,
}

/// Authentication, allow-lists and rate limits for an [`Engine`](crate::Engine); see
/// the [module docs](self).
pub struct Guard {
    key_file: Option<PathBuf>,
    keys: RwLock<Arc<Keys>>,
    /// Bumped by every reload: sessions holding an older identity look it up again.
    generation: AtomicU64,
    /// Keys or a JWT secret are set: anonymous callers are refused.
    required: bool,
    jwt: Option<JwtSecret>,
    peers: Option<PeerLimiter>,
    /// Failed authentications per peer address, if limited.
    failures: Option<PeerLimiter>,
    peer_capacity: usize,
}

impl fmt::Debug for Guard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Guard")
            .field("key_file", &self.key_file)
            .field("required", &self.required)
            .field("jwt", &self.jwt.is_some())
            .field("peer_rate_limit", &self.peers.is_some())
            .field(
                "auth_failure_limit",
                &self.failures.as_ref().map(PeerLimiter::rate),
            )
            .finish_non_exhaustive()
    }
}

impl Default for Guard {
    fn default() -> Self {
        Self::new()
    }
}

impl Guard {
    /// A guard that lets everyone call everything: add keys, a JWT secret or a rate limit.
    pub fn new() -> Self {
        Self {
            key_file: None,
            keys: RwLock::new(Arc::new(Keys::default())),
            generation: AtomicU64::new(1),
            required: false,
            jwt: None,
            peers: None,
            failures: None,
            peer_capacity: PEER_TABLE_CAPACITY,
        }
    }

    /// Requires callers to authenticate with the keys of the TOML file at `path` (see
    /// docs/OPERATIONS.md for its format); [`Guard::reload`] reads it again.
    ///
    /// # Errors
    ///
    /// If the file cannot be read or is not a valid key file.
    pub fn with_key_file(mut self, path: impl AsRef<Path>) -> Result<Self, GuardError> {
        let path = path.as_ref().to_owned();
        let keys = Keys::parse(&read(&path)?, None)?;
        *self.keys.get_mut().unwrap_or_else(|p| p.into_inner()) = Arc::new(keys);
        self.key_file = Some(path);
        self.required = true;
        Ok(self)
    }

    /// As [`Guard::with_key_file`], with the file's text (no reload).
    ///
    /// # Errors
    ///
    /// If `text` is not a valid key file.
    pub fn with_keys_toml(mut self, text: &str) -> Result<Self, GuardError> {
        *self.keys.get_mut().unwrap_or_else(|p| p.into_inner()) =
            Arc::new(Keys::parse(text, None)?);
        self.required = true;
        Ok(self)
    }

    /// Also accepts JSON Web Tokens (HS256) signed with the 32-byte secret in the file at
    /// `path` (64 hex digits), as go-ethereum's authenticated API does. A JWT caller is
    /// named by its `sub` claim (`"jwt"` without one) and may call everything.
    ///
    /// # Errors
    ///
    /// If the file cannot be read or does not hold a 32-byte hex secret.
    pub fn with_jwt_secret_file(mut self, path: impl AsRef<Path>) -> Result<Self, GuardError> {
        let secret = JwtSecret::load(path.as_ref()).map_err(|e| GuardError::Jwt(e.to_string()))?;
        self.jwt = Some(secret);
        self.required = true;
        Ok(self)
    }

    /// Limits anonymous callers per peer address (IPv6: per /64) to `spec`, `RATE` or
    /// `RATE:BURST` calls per second, each batch element counted.
    ///
    /// # Errors
    ///
    /// If `spec` is not a positive rate with an optional burst of at least 1.
    pub fn with_peer_rate_limit(mut self, spec: &str) -> Result<Self, GuardError> {
        let rate = Rate::parse(spec).map_err(|e| GuardError::Rate(e.to_string()))?;
        self.peers = Some(PeerLimiter::new(rate, self.peer_capacity));
        Ok(self)
    }

    /// Limits failed authentications (an unknown or expired token, by `rpc.auth` or an
    /// HTTP `Authorization` header) per peer address (IPv6: per /64) to `spec`, `RATE`
    /// or `RATE:BURST` a second (`"1:10"`: ten at once, then one a second, ~86,000 a
    /// day instead of millions a second), or `"off"`, the default. Past it, a token
    /// from that address is refused without being looked at, `-32005` (over HTTP 429
    /// with `Retry-After`), until the bucket refills: a right token too, or the limit
    /// would tell a guesser when it guessed. Only failures count (an attempt is charged
    /// while its token is checked, so attempts made at once cannot overdraw the bucket,
    /// and refunded if it was right).
    ///
    /// So every client behind one address shares its bucket: behind a load balancer
    /// or TLS terminator, where every connection comes from the proxy's address, any
    /// client failing on purpose locks every other client out of authenticating (a
    /// connection already authenticated keeps its identity until it presents another
    /// token). Turn it on where clients reach the server directly. Peers with no
    /// address are never limited: Unix-socket and stdio ones, and an embedder's
    /// connections given [`Peer::Unknown`].
    ///
    /// # Errors
    ///
    /// If `spec` is neither `"off"` nor a positive rate with an optional burst of at
    /// least 1.
    pub fn with_auth_failure_limit(mut self, spec: &str) -> Result<Self, GuardError> {
        self.failures = match spec {
            "off" => None,
            spec => {
                let rate = Rate::parse(spec).map_err(|e| GuardError::Rate(e.to_string()))?;
                Some(PeerLimiter::new(rate, self.peer_capacity))
            }
        };
        Ok(self)
    }

    /// Sets how many peer addresses each per-address limiter (calls, failed
    /// authentications) keeps per generation (default [`PEER_TABLE_CAPACITY`]; it never
    /// holds more than twice this).
    pub fn with_peer_table_capacity(mut self, capacity: usize) -> Self {
        self.peer_capacity = capacity.max(1);
        if let Some(old) = &self.peers {
            self.peers = Some(PeerLimiter::new(old.rate(), self.peer_capacity));
        }
        if let Some(old) = &self.failures {
            self.failures = Some(PeerLimiter::new(old.rate(), self.peer_capacity));
        }
        self
    }

    /// Reads the key file again (say, on SIGHUP). Connections stay open; from their next
    /// call on, each identity has the new file's rights, and a key no longer in the file
    /// is refused. Rate-limit buckets are kept by identity name. On error the old keys
    /// stay in force.
    ///
    /// # Errors
    ///
    /// [`GuardError::NoKeyFile`] without a key file; otherwise as [`Guard::with_key_file`].
    pub fn reload(&self) -> Result<(), GuardError> {
        let path = self.key_file.as_ref().ok_or(GuardError::NoKeyFile)?;
        let text = read(path)?;
        let mut keys = self.keys.write().unwrap_or_else(|p| p.into_inner());
        *keys = Arc::new(Keys::parse(&text, Some(&keys))?);
        self.generation.fetch_add(1, Ordering::Release);
        Ok(())
    }

    /// Whether callers must authenticate (keys or a JWT secret are set).
    pub fn requires_auth(&self) -> bool {
        self.required
    }

    /// The addresses the per-peer rate limiter remembers now (at most twice its
    /// capacity).
    pub fn peer_table_len(&self) -> usize {
        self.peers.as_ref().map_or(0, PeerLimiter::len)
    }

    fn keys(&self) -> Arc<Keys> {
        Arc::clone(&self.keys.read().unwrap_or_else(|p| p.into_inner()))
    }

    /// Authenticates an HTTP request from its `Authorization: Bearer` header, for the
    /// calls of its body: the identity is kept in `session` (a connection sending the
    /// same token again costs one constant-time comparison).
    pub(crate) fn authenticate_http(
        &self,
        session: &Session,
        headers: &Headers<'_>,
        peer: Peer,
    ) -> Result<(), Denied> {
        if !self.required {
            return Ok(());
        }
        let mut st = session.state.borrow_mut();
        let Some(token) = headers.authorization().and_then(bearer) else {
            st.forget();
            return Err(Denied::Unauthenticated(
                "missing `Authorization: Bearer TOKEN` header",
            ));
        };
        let generation = self.generation.load(Ordering::Acquire);
        if st.generation == generation && st.principal.is_some() && st.is_token(token) {
            if let Via::Jwt = st.via {
                return self.check_jwt_time(&mut st, token);
            }
            return Ok(());
        }
        self.resolve_from(peer, &mut st, token, generation)
    }

    /// [`Guard::resolve_token`] for a token from `peer`, unless that address has failed
    /// too often ([`Guard::with_auth_failure_limit`]); a failure stays charged to it.
    fn resolve_from(
        &self,
        peer: Peer,
        st: &mut State,
        token: &[u8],
        generation: u64,
    ) -> Result<(), Denied> {
        let (Some(failures), Peer::Ip(addr)) = (&self.failures, peer) else {
            return self.resolve_token(st, token, generation);
        };
        // Charged first, refunded if right: attempts made at once on other threads each
        // take their unit before any token is looked at.
        if let Err(limited) = failures.charge(addr.ip(), now_ns(), 1) {
            st.forget();
            return Err(Denied::AuthThrottled(limited));
        }
        let verdict = self.resolve_token(st, token, generation);
        if verdict.is_ok() {
            failures.refund(addr.ip());
        }
        verdict
    }

    /// Looks `token` up (a key's, else a JWT) and keeps the identity in `st`.
    fn resolve_token(&self, st: &mut State, token: &[u8], generation: u64) -> Result<(), Denied> {
        st.forget();
        let keys = self.keys();
        if let Some(p) = keys.by_token(token) {
            st.principal = Some(Arc::clone(p));
            st.via = Via::Token;
        } else if let Some(secret) = &self.jwt {
            let claims = st
                .jwt
                .check(secret, token, jwt::now_unix())
                .map_err(|_| Denied::Unauthenticated("unknown token"))?;
            let name: Arc<str> = claims.sub.as_deref().unwrap_or("jwt").into();
            let exp = claims.exp;
            st.principal = Some(Arc::new(Principal {
                dedup_state: crate::dedup::Identity::new(&name).state,
                name,
                allow: Allow::everything(),
                limit: None,
            }));
            st.via = Via::Jwt;
            st.jwt_exp = exp;
        } else {
            return Err(Denied::Unauthenticated("unknown token"));
        }
        st.token.extend_from_slice(token);
        st.generation = generation;
        st.keys = Some(keys);
        Ok(())
    }

    /// A cached JWT is still within its time window.
    fn check_jwt_time(&self, st: &mut State, token: &[u8]) -> Result<(), Denied> {
        let Some(secret) = &self.jwt else {
            return Err(Denied::Unauthenticated("unknown token"));
        };
        match st.jwt.check(secret, token, jwt::now_unix()) {
            Ok(_) => Ok(()),
            Err(_) => {
                st.forget();
                Err(Denied::Unauthenticated("token expired"))
            }
        }
    }

    /// Answers `rpc.auth` (`params`: `{"token": "…"}`): authenticates the connection of
    /// `source` and writes `{"identity": NAME}` as the result of `id`.
    pub(crate) fn rpc_auth(
        &self,
        source: &Source<'_>,
        params: &Params<'_>,
        id: Id<'_>,
        out: &mut Vec<u8>,
    ) -> Result<(), Denied> {
        if !self.required {
            return Err(Denied::NoAuth);
        }
        if source.conn.transport() == Transport::Http {
            return Err(Denied::HttpAuth);
        }
        let Some(session) = source.session else {
            return Err(Denied::Unauthenticated(
                "rpc.auth needs a connection (an embedder passes a Session)",
            ));
        };
        #[derive(serde::Deserialize)]
        struct AuthParams<'a> {
            #[serde(borrow)]
            token: Cow<'a, str>,
        }
        let p: AuthParams<'_> = params.parse().map_err(|_| Denied::AuthParams)?;
        let mut st = session.state.borrow_mut();
        let generation = self.generation.load(Ordering::Acquire);
        self.resolve_from(source.conn.peer(), &mut st, p.token.as_bytes(), generation)?;
        let name = st.principal.as_ref().map(|p| Arc::clone(&p.name));
        drop(st);
        write_prefix(out, id);
        out.extend_from_slice(br#""result":{"identity":"#);
        write_str(out, name.as_deref().unwrap_or_default());
        out.extend_from_slice(b"}}");
        Ok(())
    }

    /// Admits a call to `method` from `source`, or says why not: the identity must be
    /// known (when keys are required), may call `method`, and has rate left (each call,
    /// each batch element, charged its method's weight).
    #[inline]
    pub(crate) fn admit(&self, source: &Source<'_>, method: &str) -> Result<(), Denied> {
        let Some(session) = source.session else {
            return self.admit_stateless(source, method);
        };
        let mut st = session.state.borrow_mut();
        let generation = self.generation.load(Ordering::Acquire);
        if st.generation != generation && self.required {
            self.refresh(&mut st, source, generation);
        }
        // A JWT presented once (`rpc.auth`, a WebSocket's upgrade) holds until its `exp`
        // (its `iat` was checked when it was presented).
        if st.jwt_expired() {
            st.forget();
            drop(st);
            if let Some(push) = source.push {
                push.close_all(crate::dispatch::subscription::SinkClosed::Revoked);
            }
            return Err(Denied::Unauthenticated("token expired"));
        }
        match &st.principal {
            Some(p) => {
                if !p.allow.allows(method) {
                    return Err(Denied::Forbidden);
                }
                if let Some((rate, bucket)) = &p.limit {
                    let cost = st.keys.as_ref().map_or(1, |k| k.weight(method));
                    bucket
                        .charge(rate, now_ns(), cost)
                        .map_err(Denied::Limited)?;
                }
                Ok(())
            }
            None if self.required => {
                drop(st);
                // An identity gone (its key revoked by a reload) takes its
                // subscriptions with it.
                if let Some(push) = source.push {
                    push.close_all(crate::dispatch::subscription::SinkClosed::Revoked);
                }
                Err(Denied::Unauthenticated(match source.conn.transport() {
                    Transport::Http => "missing `Authorization: Bearer TOKEN` header",
                    _ => "call rpc.auth with a token first",
                }))
            }
            None => {
                drop(st);
                self.charge_peer(source)
            }
        }
    }

    /// [`Guard::admit`] without a session: an embedder's frame.
    #[cold]
    fn admit_stateless(&self, source: &Source<'_>, method: &str) -> Result<(), Denied> {
        if self.required {
            // Only an HTTP request carries its credentials with it.
            let session = Session::new();
            let headers = source
                .headers
                .ok_or(Denied::Unauthenticated("no session to authenticate"))?;
            self.authenticate_http(&session, &headers, source.conn.peer())?;
            let src = Source {
                session: Some(&session),
                ..*source
            };
            return self.admit(&src, method);
        }
        self.charge_peer(source)
    }

    /// An anonymous call: charged to its peer address, if limited. Each call costs 1:
    /// weights come from a key file, and with one there are no anonymous callers.
    fn charge_peer(&self, source: &Source<'_>) -> Result<(), Denied> {
        match (&self.peers, source.conn.peer()) {
            (Some(limiter), Peer::Ip(addr)) => limiter
                .charge(addr.ip(), now_ns(), 1)
                .map_err(Denied::Limited),
            _ => Ok(()),
        }
    }

    /// After a reload: the session's identity again, from the new keys.
    #[cold]
    /// Whether the identity of `source`'s session lost its credentials since it was
    /// last looked up: keys are required, a reload happened, and the current keys no
    /// longer know it. (For subscribers, whose connections may make no further call.)
    pub(crate) fn revoked(&self, source: &Source<'_>) -> bool {
        let Some(session) = source.session.filter(|_| self.required) else {
            return false;
        };
        let mut st = session.state.borrow_mut();
        if st.jwt_expired() {
            st.forget();
            return true;
        }
        let generation = self.generation.load(Ordering::Acquire);
        if st.generation == generation || st.principal.is_none() {
            return false;
        }
        self.refresh(&mut st, source, generation);
        st.principal.is_none()
    }

    fn refresh(&self, st: &mut State, source: &Source<'_>, generation: u64) {
        let keys = self.keys();
        let principal = match st.via {
            Via::Token => keys.by_token(&st.token).cloned(),
            Via::Jwt => st.principal.clone(),
            Via::Uid | Via::None => match source.conn.peer() {
                Peer::Unix { uid, .. } => keys.by_uid(uid).cloned(),
                _ => None,
            },
        };
        if principal.is_none() {
            st.forget();
        } else if matches!(st.via, Via::None) {
            st.via = Via::Uid;
        }
        st.principal = principal;
        st.generation = generation;
        st.keys = Some(keys);
    }
}

fn read(path: &Path) -> Result<String, GuardError> {
    std::fs::read_to_string(path).map_err(|source| GuardError::Read {
        path: path.to_owned(),
        source,
    })
}

/// The token of an `Authorization: Bearer TOKEN` value (scheme case-insensitive).
fn bearer(value: &[u8]) -> Option<&[u8]> {
    let (scheme, rest) = value.split_at_checked(7)?;
    if !scheme.eq_ignore_ascii_case(b"bearer ") {
        return None;
    }
    let token = rest.trim_ascii();
    (!token.is_empty()).then_some(token)
}

/// How a session's identity was established.
#[derive(Clone, Copy, Debug, Default)]
enum Via {
    #[default]
    None,
    Token,
    Jwt,
    Uid,
}

#[derive(Default)]
struct State {
    /// The guard's generation `principal` was looked up in (0: never).
    generation: u64,
    principal: Option<Arc<Principal>>,
    via: Via,
    /// The token presented (kept to compare the next request's, and to look it up again
    /// after a reload). Never logged.
    token: Vec<u8>,
    /// The key file's snapshot the principal came from (for method weights).
    keys: Option<Arc<Keys>>,
    jwt: JwtCache,
    /// The `exp` of the JWT the identity came from, if it had one.
    jwt_exp: Option<u64>,
}

impl State {
    fn forget(&mut self) {
        self.principal = None;
        self.via = Via::None;
        self.token.clear();
        self.generation = 0;
        self.jwt_exp = None;
    }

    /// Whether the identity came from a JWT whose `exp` has passed.
    fn jwt_expired(&self) -> bool {
        self.jwt_exp.is_some_and(|exp| jwt::now_unix() >= exp)
    }

    fn is_token(&self, token: &[u8]) -> bool {
        self.token.len() == token.len() && bool::from(self.token.ct_eq(token))
    }
}

/// One connection's authentication: who proved themselves on it. The server keeps one
/// per connection; an embedder passing frames to [`Engine::handle_from`] keeps one per
/// its own connection and passes it with [`Source::with_session`].
///
/// [`Engine::handle_from`]: crate::Engine::handle_from
#[derive(Default)]
pub struct Session {
    state: RefCell<State>,
    /// Whether the connection's last call looked at was de-duplicated by identity and
    /// id: only then is the next one's key worth fetching ahead
    /// (`Engine::prefetch_frame`), so that connections calling other methods pay
    /// nothing for it.
    keyed: std::cell::Cell<bool>,
    /// The last such call's id, when a non-negative integer.
    last_id: std::cell::Cell<Option<u64>>,
    /// How that id followed the id before it: 1 when one more, -1 when one less (the
    /// client counts its calls, up or down), else 0.
    step: std::cell::Cell<i8>,
}

impl fmt::Debug for Session {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Session")
            .field("identity", &self.identity())
            .finish()
    }
}

impl Session {
    /// A session no one has authenticated on yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Who authenticated on this connection, if anyone.
    pub fn identity(&self) -> Option<Arc<str>> {
        let st = self.state.try_borrow().ok()?;
        st.principal.as_ref().map(|p| Arc::clone(&p.name))
    }

    /// Notes that a call was just keyed by this session's identity and `id`.
    #[inline]
    pub(crate) fn set_keyed(&self, id: crate::codec::Id<'_>) {
        use crate::codec::Id;
        let counted = match id {
            Id::UInt(u) => Some(u),
            Id::Int(i) => u64::try_from(i).ok(),
            _ => None,
        };
        let step = match (self.last_id.get(), counted) {
            (Some(p), Some(c)) if p.checked_add(1) == Some(c) => 1,
            (Some(p), Some(c)) if p.checked_sub(1) == Some(c) => -1,
            _ => 0,
        };
        self.step.set(step);
        self.last_id.set(counted);
        self.keyed.set(true);
    }

    /// Whether a call was keyed since the last look, forgetting it; and, if so, for a
    /// client counting its calls (see `set_keyed`), the ids it most likely sends next:
    /// the last id's two successors in its direction. (Counting down is what a client
    /// refilling several freed slots at once from a stack does: loadgen's refills.)
    #[inline]
    pub(crate) fn take_keyed(&self) -> Option<Option<(u64, u64)>> {
        if !self.keyed.replace(false) {
            return None;
        }
        let next = |x: u64, n: u64| match self.step.get() {
            1 => x.checked_add(n),
            -1 => x.checked_sub(n),
            _ => None,
        };
        Some(
            self.last_id
                .get()
                .and_then(|x| Some((next(x, 1)?, next(x, 2)?))),
        )
    }

    /// Runs `f` with the identity, borrowed (no reference count touched).
    pub(crate) fn with_identity<R>(
        &self,
        f: impl FnOnce(Option<crate::dedup::Identity<'_>>) -> R,
    ) -> R {
        match self.state.try_borrow() {
            Ok(st) => f(st.principal.as_ref().map(|p| crate::dedup::Identity {
                name: &p.name,
                state: p.dedup_state,
            })),
            Err(_) => f(None),
        }
    }
}

/// Why a call was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Denied {
    /// No identity, or an unknown or expired token: `-32040`.
    Unauthenticated(&'static str),
    /// The identity may not call the method: `-32041`.
    Forbidden,
    /// Over the rate limit: `-32005`.
    Limited(Limited),
    /// A token from an address that failed to authenticate too often, not looked at:
    /// `-32005`.
    AuthThrottled(Limited),
    /// `rpc.auth` on a server without keys: `-32601`.
    NoAuth,
    /// `rpc.auth` over HTTP: `-32601`.
    HttpAuth,
    /// `rpc.auth` with params that are not `{"token": "…"}`: `-32602`.
    AuthParams,
}

impl Denied {
    /// The error code answered.
    pub(crate) fn code(self) -> ErrorCode {
        self.reason().code()
    }

    /// The reason sent with the answer (`data.reason`).
    pub(crate) fn reason(self) -> Reason {
        match self {
            Self::Unauthenticated(_) => Reason::Unauthenticated,
            Self::Forbidden => Reason::PermissionDenied,
            Self::Limited(_) | Self::AuthThrottled(_) => Reason::RateLimited,
            Self::NoAuth | Self::HttpAuth => Reason::MethodNotFound,
            Self::AuthParams => Reason::InvalidParams,
        }
    }

    /// Writes the error answer to a call to `method` with `id`. No allocation: the
    /// message and `data` are formatted into the output.
    #[cold]
    pub(crate) fn write(self, out: &mut Vec<u8>, id: Id<'_>, method: &str, who: Option<&str>) {
        write_prefix(out, id);
        let reason = self.reason();
        match self {
            Self::Unauthenticated(why) => {
                write_reason_tail(out, reason, format_args!("Unauthenticated: {why}"), None)
            }
            Self::Forbidden => {
                let who = who.unwrap_or("this caller");
                write_reason_tail(
                    out,
                    reason,
                    format_args!("Permission denied: {who} may not call {method}"),
                    None,
                )
            }
            Self::Limited(l) => write_reason_tail(
                out,
                reason,
                format_args!(
                    "Limit exceeded: rate limit reached, retry in {} ms",
                    l.retry_after_ms()
                ),
                Some(l.retry_after_ms()),
            ),
            Self::AuthThrottled(l) => write_reason_tail(
                out,
                reason,
                format_args!(
                    "Limit exceeded: too many failed authentications from this address, retry in {} ms",
                    l.retry_after_ms()
                ),
                Some(l.retry_after_ms()),
            ),
            Self::NoAuth => write_reason_tail(
                out,
                reason,
                format_args!("Method not found: rpc.auth (this server does not authenticate)"),
                None,
            ),
            Self::HttpAuth => write_reason_tail(
                out,
                reason,
                format_args!(
                    "Method not found: rpc.auth is for TCP, Unix and stdio connections; HTTP sends Authorization: Bearer TOKEN with each request"
                ),
                None,
            ),
            Self::AuthParams => write_reason_tail(
                out,
                reason,
                format_args!(r#"Invalid params: rpc.auth takes {{"token": "…"}}"#),
                None,
            ),
        }
    }

    /// The whole error response for an HTTP request refused before its body is read
    /// (id `null`).
    pub(crate) fn write_unbound(self, out: &mut Vec<u8>) {
        self.write(out, Id::Null, "", None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_tells_a_counting_client_from_others() {
        use crate::codec::Id;
        let s = Session::new();
        assert_eq!(s.take_keyed(), None, "nothing keyed yet");
        s.set_keyed(Id::UInt(7));
        assert_eq!(s.take_keyed(), Some(None), "one id: not yet counting");
        assert_eq!(s.take_keyed(), None, "taken");
        s.set_keyed(Id::Int(8));
        assert_eq!(s.take_keyed(), Some(Some((9, 10))), "7 then 8");
        s.set_keyed(Id::UInt(7));
        assert_eq!(
            s.take_keyed(),
            Some(Some((6, 5))),
            "8 then 7: counting down"
        );
        s.set_keyed(Id::UInt(6));
        s.set_keyed(Id::UInt(5));
        assert_eq!(s.take_keyed(), Some(Some((4, 3))), "still down");
        s.set_keyed(Id::UInt(1));
        s.set_keyed(Id::UInt(0));
        assert_eq!(s.take_keyed(), Some(None), "down to 0: no successors");
        s.set_keyed(Id::UInt(2));
        s.set_keyed(Id::UInt(1));
        assert_eq!(s.take_keyed(), Some(None), "down to 1: one successor only");
        s.set_keyed(Id::UInt(10));
        assert_eq!(s.take_keyed(), Some(None), "a gap");
        s.set_keyed(Id::UInt(11));
        s.set_keyed(Id::Str("12"));
        assert_eq!(s.take_keyed(), Some(None), "a string id ends it");
        s.set_keyed(Id::Int(-1));
        s.set_keyed(Id::UInt(0));
        assert_eq!(s.take_keyed(), Some(None), "-1 then 0: not counted ids");
        s.set_keyed(Id::UInt(u64::MAX));
        s.set_keyed(Id::UInt(0));
        assert_eq!(s.take_keyed(), Some(None), "no wrap-around");
        s.set_keyed(Id::UInt(u64::MAX - 1));
        s.set_keyed(Id::UInt(u64::MAX));
        assert_eq!(s.take_keyed(), Some(None), "up to the top: no successors");
    }

    #[test]
    fn bearer_tokens() {
        assert_eq!(bearer(b"Bearer abc"), Some(&b"abc"[..]));
        assert_eq!(bearer(b"bearer   abc "), Some(&b"abc"[..]));
        assert_eq!(bearer(b"Basic abc"), None);
        assert_eq!(bearer(b"Bearer "), None);
        assert_eq!(bearer(b"Bear"), None);
    }

    #[test]
    fn denials_are_well_formed_json() {
        let limited = Denied::Limited(Limited {
            retry_after_ns: 1_500_000,
        });
        for d in [
            Denied::Unauthenticated("unknown token"),
            Denied::Forbidden,
            limited,
            Denied::NoAuth,
            Denied::HttpAuth,
            Denied::AuthParams,
        ] {
            let mut out = Vec::new();
            d.write(&mut out, Id::Int(7), "a\"b", Some("ops"));
            let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
            assert_eq!(v["error"]["code"], d.code().code(), "{v}");
            assert_eq!(v["id"], 7);
        }
        let mut out = Vec::new();
        limited.write(&mut out, Id::Null, "sum", None);
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["error"]["data"]["retryAfterMs"], 2);
        assert_eq!(v["error"]["data"]["reason"], "rate_limited");
    }
}
