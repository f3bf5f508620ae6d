//! Forwarding JSON-RPC to upstream servers without re-encoding it (cargo feature
//! `proxy`).
//!
//! A [`Proxy`] is installed as a server's fallback route
//! ([`RegistryBuilder::deferred_fallback`]): every call the registry does not serve
//! itself goes to an upstream group chosen by method, over a few pipelined upstream
//! connections that every client connection shares. Installed on a server, the proxy
//! also gives each reactor a connection of its own to each upstream, served in the
//! reactor's own event loop, and the reactor's clients' calls go there: no hand-off to
//! another thread (see [`ProxyBuilder::reactor_connections`]).
//!
//! **Envelope only.** The request sent upstream is the method and the params' original
//! bytes under a *private* id; the upstream's `result` or `error` comes back as its
//! original bytes, and the server writes the caller's own id around them. Nothing is
//! decoded into values or re-encoded, and ids of every kind reach the upstream only as
//! the proxy's own integers, so colliding client ids (across clients, or within a
//! batch) can never cross: private ids name one call each, never reused for another.
//!
//! **Batches** are split by the engine into elements; those going to the same
//! upstream connection are sent there as one batch (see [`ProxyBuilder::batch_max`]),
//! each element answered on its own and merged back in order by the server (so one
//! failing upstream fails only the elements sent to it); **notifications** are
//! forwarded and never answered.
//!
//! **Subscriptions** declared with [`ProxyBuilder::subscription`] are forwarded to
//! stream upstreams (`tcp://`, `unix://`): identical ones (the same method and params,
//! compared canonically) of any number of clients share one upstream subscription, each
//! client with its own subscription id, its own bounded queue, and every notification's
//! `result` as its bytes came. See docs/PROXY.md, "Subscriptions".
//!
//! **Failures** are answered, never lost: an upstream that cannot be reached, closes
//! the connection, or sends something that is not a JSON-RPC response fails the calls
//! waiting on that connection with `-32000` (`data.reason` `"upstream_unavailable"`),
//! and is reconnected with backoff; a call without an answer within
//! [`ProxyBuilder::timeout`] gets `-32001` (`"upstream_timeout"`). A call is written
//! upstream at most once: none is resent.
//!
//! ```
//! use ringrpc::proxy::Proxy;
//! use ringrpc::{demo, server::Server, Config, Engine, Registry};
//!
//! // An upstream: the demo server on TCP.
//! let mut upstream = Server::new(demo::engine(Config::default()))?;
//! let addr = upstream.listen_tcp("127.0.0.1:0")?;
//! let stop_upstream = upstream.handle();
//! let upstream = std::thread::spawn(move || upstream.run());
//!
//! // The proxy: every method goes to the group `default`.
//! let proxy = Proxy::builder()
//!     .upstream("default", &format!("tcp://{addr}"))
//!     .start()?;
//! let mut methods = Registry::builder();
//! proxy.install(&mut methods)?;
//! let engine = Engine::new(methods.freeze(), Config::default());
//!
//! // The no-I/O API waits for the forwarded answer.
//! let mut out = Vec::new();
//! let frame = br#"{"jsonrpc":"2.0","method":"subtract","params":[42,23],"id":"a\u0062"}"#;
//! let _ = engine.handle(frame, &mut engine.scratch(), &mut out);
//! assert_eq!(out, br#"{"jsonrpc":"2.0","id":"ab","result":19}"#);
//!
//! drop(proxy);
//! stop_upstream.shutdown();
//! upstream.join().unwrap()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! [`RegistryBuilder::deferred_fallback`]: crate::RegistryBuilder::deferred_fallback

mod config;
mod lane;
mod resolve;
mod route;
mod share;
pub(crate) mod sub_batch;
mod subs;
mod timing;
mod upstream;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use self::lane::{Call, Copy, Deadline, Keyed, Lane, Reply, Retry, MAX_CALLS};
use self::route::{Pattern, Rules};
use self::share::Answer;
use crate::client::address::Address;
use crate::codec::Params;
use crate::dispatch::context::Context;
use crate::dispatch::registry::RegistryBuilder;
use crate::dispatch::responder::Responder;
use crate::dispatch::subscription::{Subscribing, SubscriptionConfig};
use crate::error::{Reason, RegisterError, RpcError};
use crate::serializer::json::{write_str, write_value};

/// Why a proxy could not be built or started.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProxyError {
    /// No upstream was given.
    #[error("no upstream: give at least one (NAME=URL)")]
    NoUpstream,
    /// An upstream's URL is not one the proxy can connect to.
    #[error("upstream {url:?}: {reason}")]
    Address {
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A route names a group no upstream belongs to.
    #[error("route {pattern:?} goes to group {group:?}, which has no upstream")]
    UnknownGroup {
        /// The route's method pattern.
        pattern: String,
        /// The group it names.
        group: String,
    },
    /// A configuration file could not be read (syntax, unknown keys, types).
    #[error("proxy configuration: {0}")]
    Config(String),
    /// A subscription routes to a group with an HTTP upstream, which cannot carry
    /// notifications.
    #[error(
        "subscription {method:?} routes to group {group:?}, whose upstream {url} is HTTP: \
         notifications need a stream upstream (tcp:// or unix://); route {method:?} to a \
         group of those"
    )]
    SubscriptionOverHttp {
        /// The subscribe method.
        method: String,
        /// The group it routes to.
        group: String,
        /// The group's HTTP upstream.
        url: String,
    },
    /// A subscription's methods are not three names, distinct where they must be.
    #[error("subscription {0:?}: expected SUBSCRIBE:NOTIFICATION:UNSUBSCRIBE, three non-empty names, the subscribe and unsubscribe methods different")]
    Subscription(String),
    /// The upstream thread's poller or waker could not be made.
    #[error("starting the upstream thread: {0}")]
    Io(#[from] std::io::Error),
}

/// One upstream server.
pub(crate) struct Upstream {
    /// As given (for messages).
    pub(crate) url: String,
    pub(crate) address: Address,
    /// TCP and HTTP: where its name resolved to.
    pub(crate) resolved: resolve::Resolved,
    /// HTTP: the request head up to the `Content-Length` value (for a lane to it).
    pub(crate) http_head: Option<Box<[u8]>>,
    /// The most elements of a sub-batch sent to it.
    pub(crate) batch_max: usize,
}

/// Upstreams of one name, balanced by least outstanding calls.
struct Group {
    name: Box<str>,
    /// Its lanes (indices into `Shared::lanes`).
    lanes: Vec<usize>,
    /// Its upstreams (indices into `Shared::upstreams`, and into a reactor's own lanes).
    upstreams: Vec<usize>,
    /// Where the next search for the least loaded lane starts, so equally loaded lanes
    /// take turns.
    next: AtomicUsize,
}

/// What forwarding threads and the upstream thread share.
pub(crate) struct Shared {
    pub(crate) upstreams: Vec<Upstream>,
    /// The shared lanes: `connections` per upstream, served by the upstream thread.
    pub(crate) lanes: Arc<[Lane]>,
    /// Each server reactor the proxy is installed on opens lanes of its own (one per
    /// upstream; see `upstream::OnReactor`).
    pub(crate) reactor_lanes: bool,
    groups: Vec<Group>,
    routes: Rules<usize>,
    /// Methods that may be sent again after a failure (`--idempotent`).
    idempotent: Rules<()>,
    /// Whether identical in-flight calls to idempotent methods share one upstream call.
    coalesce: bool,
    /// Calls sent upstream that identical ones wait on.
    pub(crate) inflight: share::InFlight,
    /// Hedging: (when, the largest fraction of idempotent calls hedged).
    pub(crate) hedge: Option<(HedgeAfter, f64)>,
    /// How often idle upstream connections are probed (`None`: never).
    pub(crate) health: Option<Duration>,
    /// Copies sent by hedging, and idempotent calls forwarded (counted with hedging on).
    pub(crate) hedged: AtomicU64,
    pub(crate) forwarded: AtomicU64,
    /// Methods whose results are cached, and for how long.
    cache_rules: Rules<Duration>,
    pub(crate) cache: share::Cache,
    /// Where methods no route matches go.
    default_group: usize,
    timeout: Duration,
    /// The longest answer line read from an upstream.
    pub(crate) max_answer_bytes: usize,
    /// Where forwarded calls spend their time, per upstream.
    pub(crate) timings: timing::Timings,
    /// Subscriptions forwarded upstream, shared by identical ones.
    pub(crate) subs: subs::Subs,
    waker: mio::Waker,
    /// Set by the first forward since the upstream thread last looked: later ones do
    /// not wake it again.
    pub(crate) woken: AtomicBool,
    /// Set when [`Shared::revive`] brought a shared lane back: the upstream thread
    /// reconnects it.
    pub(crate) revived: AtomicBool,
    pub(crate) stop: AtomicBool,
}

/// Of `candidates` (searched in turn from `start`, so equally loaded lanes take turns;
/// `lane` gives a candidate's lane, or `None` to pass it over), the one whose lane is up
/// with the fewest calls outstanding.
fn least_loaded<'a>(
    candidates: &[usize],
    start: usize,
    lane: impl Fn(usize) -> Option<&'a Lane>,
) -> Option<usize> {
    let n = candidates.len();
    let mut best = None;
    let mut least = usize::MAX;
    for k in 0..n {
        let c = candidates[start.wrapping_add(k) % n];
        let Some(lane) = lane(c) else {
            continue;
        };
        if !lane.up.load(Ordering::Acquire) {
            continue;
        }
        let outstanding = lane.outstanding.load(Ordering::Relaxed);
        if outstanding < least {
            (best, least) = (Some(c), outstanding);
        }
    }
    best
}

impl Shared {
    /// The up lane of `group` (other than `except`) with the fewest calls outstanding.
    fn pick(&self, group: &Group, except: Option<usize>) -> Option<usize> {
        self.pick_where(group, |i, _| except != Some(i))
    }

    /// The up lane of `group` that `allowed` (given its index) allows with the fewest calls outstanding.
    fn pick_where(&self, group: &Group, allowed: impl Fn(usize, &Lane) -> bool) -> Option<usize> {
        let start = group.next.fetch_add(1, Ordering::Relaxed);
        least_loaded(&group.lanes, start, |i| {
            let lane = &self.lanes[i];
            allowed(i, lane).then_some(lane)
        })
    }

    /// Forwards one call (see [`Proxy::forward`]).
    fn forward(self: &Arc<Self>, ctx: &Context<'_>, params: Params<'_>, responder: Responder) {
        let method = ctx.method();
        let g = self.routes.find(method).unwrap_or(self.default_group);
        let group = &self.groups[g];
        let idempotent = self.idempotent.find(method).is_some();
        // Waited for on this thread (a handler calling `Engine::handle`): sent at once
        // by the upstream thread, neither on this reactor's own lanes (written at the
        // end of its turn) nor in the enclosing batch's sub-batch (closed at its end),
        // which would wait for this thread while it waits for them.
        let waited = responder.waited_here();
        // On a reactor with lanes of its own, the call goes on one of those (written and
        // answered on this thread), unless it may be hedged (hedging watches the shared
        // lanes) or joins a client batch's sub-batch (sub-batches are the shared lanes').
        let own = if waited || idempotent && self.hedge.is_some() {
            None
        } else {
            upstream::own_lane(self, &group.upstreams)
                .filter(|(lanes, i)| lanes[*i].batch_max <= 1 || sub_batch::owner().is_none())
        };
        let (lane, target) = match &own {
            Some((lanes, i)) => (&lanes[*i], None),
            None => {
                let Some(i) = self.pick(group, None) else {
                    return responder.error(RpcError::new(
                        Reason::UpstreamUnavailable,
                        format!(
                            "Server busy: no upstream of group `{}` is reachable",
                            group.name
                        ),
                    ));
                };
                (&self.lanes[i], Some(i))
            }
        };
        // An element of a client batch joins the batch's sub-batch for this lane.
        let batch = match target {
            Some(_) if lane.batch_max > 1 && !waited => {
                sub_batch::owner().map(|owner| (owner, lane.batch_max))
            }
            _ => None,
        };
        if responder.is_notification() {
            {
                let mut q = lane.lock();
                q.request(batch, None, |out| write_tail(out, method, &params));
                lane.mark_out(batch.is_some());
            }
            if let Some(i) = target {
                self.written(batch, i);
            }
            // Its answer is dropped; its hooks see success.
            return responder.respond_raw(b"null");
        }
        if idempotent && self.hedge.is_some() {
            self.forwarded.fetch_add(1, Ordering::Relaxed);
        }
        let ttl = self.cache_rules.find(method);
        let now = Instant::now();
        let mut responder = responder;
        let mut keyed = None;
        // A call waited for on this thread joins no identical call in flight (that one
        // may be on this reactor's own lane, or in the enclosing batch's sub-batch,
        // which wait for this thread), nor is it joined.
        let coalesced = idempotent && self.coalesce && !waited;
        if coalesced || ttl.is_some() {
            // The key is written into a reused buffer; it is copied only for a call
            // that goes upstream.
            let keying = KEY.with(|k| {
                let mut k = k.borrow_mut();
                k.clear();
                share::write_key(&mut k, method, params.nodes(), Some(params.raw()));
                if ttl.is_some() {
                    if let Some(hit) = self.cache.get(&k, now) {
                        return Keying::Cached(responder, hit);
                    }
                }
                if coalesced {
                    match self.inflight.join(&k, responder) {
                        Some((r, key)) => Keying::Send(r, key),
                        None => Keying::Joined,
                    }
                } else {
                    Keying::Send(responder, Arc::from(k.as_slice()))
                }
            });
            let key = match keying {
                Keying::Send(r, key) => {
                    responder = r;
                    key
                }
                Keying::Cached(r, hit) => return r.respond_raw(&hit),
                // It waits on an identical call already upstream.
                Keying::Joined => return,
            };
            keyed = Some(Keyed {
                key,
                coalesced,
                ttl,
            });
        }
        {
            let mut q = lane.lock();
            if q.calls.len() >= MAX_CALLS {
                drop(q);
                let busy = RpcError::new(
                    Reason::ServerBusy,
                    "Server busy: too many calls in flight on the upstream connection",
                );
                return self.settle(responder, keyed.as_ref(), &Answer::Error(&busy));
            }
            let id = q.next_id();
            let retry = if idempotent {
                let mut tail = q.tail();
                write_tail(&mut tail, method, &params);
                q.request(batch, Some(id), |out| out.extend_from_slice(&tail));
                Some(Retry {
                    group: g,
                    tail,
                    attempts: 1,
                })
            } else {
                q.request(batch, Some(id), |out| write_tail(out, method, &params));
                None
            };
            let until = later(now, self.timeout);
            let deadline = match ctx.deadline() {
                Some(d) if d < until => Deadline {
                    at: d,
                    callers: true,
                },
                _ => Deadline {
                    at: until,
                    callers: false,
                },
            };
            q.park(
                id,
                (now, deadline),
                Reply::Own(responder, keyed),
                (retry, false),
            );
            lane.outstanding.fetch_add(1, Ordering::Relaxed);
            lane.mark_out(batch.is_some());
        }
        // A reactor's own lane is written at the end of its turn: nobody to wake.
        if let Some(i) = target {
            self.written(batch, i);
        }
    }

    /// After a request was written to lane `i`: wakes the upstream thread, or, for an
    /// element of a batch, leaves that to the batch's end.
    fn written(self: &Arc<Self>, batch: Option<(u64, usize)>, i: usize) {
        match batch {
            Some(_) => sub_batch::wrote(self, i),
            None => self.wake(),
        }
    }

    /// Answers the caller of `reply` with `answer`, if this copy of the call is the one
    /// that answers (see [`Reply::take`]).
    pub(crate) fn finish(&self, reply: Reply, answer: &Answer<'_>) {
        if let Reply::Sub { entry, uid } = reply {
            return self.subs.answered(self, entry, uid, answer);
        }
        if let Some((r, k)) = reply.take(matches!(answer, Answer::Error(_))) {
            self.settle(r, k.as_ref(), answer);
        }
    }

    /// Sends a copy of a hedged call on another connected upstream connection of its
    /// group than `from`; without one, the copy is forgotten.
    pub(crate) fn send_copy(&self, copy: Copy, from: usize) {
        let Some(i) = self.pick(&self.groups[copy.group], Some(from)) else {
            return copy.cell.forget_one();
        };
        let lane = &self.lanes[i];
        let mut q = lane.lock();
        let id = q.next_id();
        q.write(id, &copy.tail);
        let retry = Retry {
            group: copy.group,
            tail: copy.tail,
            attempts: MAX_ATTEMPTS,
        };
        q.park(
            id,
            (copy.sent, copy.deadline),
            Reply::Shared(copy.cell),
            (Some(retry), true),
        );
        lane.outstanding.fetch_add(1, Ordering::SeqCst);
        lane.has_out.store(true, Ordering::SeqCst);
        self.hedged.fetch_add(1, Ordering::Relaxed);
    }

    /// Answers `responder` (a call's, keyed by `keyed` if its answer is shared) and
    /// every call that waited on it; caches a result if its method is cached.
    pub(crate) fn settle(&self, responder: Responder, keyed: Option<&Keyed>, answer: &Answer<'_>) {
        let mut waiting = Vec::new();
        if let Some(k) = keyed {
            if let (Some(ttl), Answer::Result(text)) = (k.ttl, answer) {
                self.cache.put(Arc::clone(&k.key), text, ttl);
            }
            if k.coalesced {
                waiting = self.inflight.settle(&k.key);
            }
        }
        answer.give(responder);
        for r in waiting {
            answer.give(r);
        }
    }

    /// A new connection to upstream `u` answered (any thread's: a reactor's own, or a
    /// shared one): the upstream serves again. The shared lanes to it still out after
    /// a failure are brought back now — calls and subscribes queue on them, written
    /// once the upstream thread has reconnected them (at once, with no probe of their
    /// own) — instead of after their own backoff. Otherwise, for up to the longest
    /// backoff, calls through a reactor's connection would be answered while
    /// subscribes, which only the shared lanes carry, were refused as unreachable.
    pub(crate) fn revive(&self, u: usize) {
        if self.stop.load(Ordering::Acquire) {
            return;
        }
        let mut any = false;
        for lane in self.lanes.iter().filter(|l| l.upstream == u) {
            // Read first: mostly they are up, and stay untouched.
            any |= !lane.up.load(Ordering::Acquire) && !lane.up.swap(true, Ordering::AcqRel);
        }
        if any {
            self.revived.store(true, Ordering::Release);
            self.wake();
        }
    }

    /// Wakes the upstream thread, unless a forward since it last looked did.
    pub(crate) fn wake(&self) {
        if !self.woken.swap(true, Ordering::SeqCst) {
            let _ = self.waker.wake();
        }
    }

    /// Sends `call` again on a connected upstream connection of its group other than
    /// `failed` (the upstream thread does this when a connection is lost; `None`: the
    /// lost connection is being remade and may take it too). Gives the call back
    /// (`Some`) when it may not be resent: not idempotent, sent 3 times already, or no
    /// connection of its group is up.
    ///
    /// `down`: the upstream a reactor's own connection to it just failed: lanes to
    /// other upstreams of the group are preferred (the shared lanes to it may not have
    /// seen the failure yet, and would take the call only to fail it again).
    pub(crate) fn resend(
        &self,
        mut call: Call,
        failed: Option<usize>,
        down: Option<usize>,
    ) -> Option<Call> {
        let Some(mut retry) = call.retry.take() else {
            return Some(call);
        };
        let group = &self.groups[retry.group];
        let elsewhere = down.and_then(|u| self.pick_where(group, |_, l| l.upstream != u));
        let lane = match elsewhere.or_else(|| self.pick(group, failed)) {
            Some(i) if retry.attempts < MAX_ATTEMPTS => &self.lanes[i],
            _ => {
                call.retry = Some(retry);
                return Some(call);
            }
        };
        retry.attempts += 1;
        let mut q = lane.lock();
        let id = q.next_id();
        q.write(id, &retry.tail);
        q.park(
            id,
            (call.sent, call.deadline),
            call.reply,
            (Some(retry), call.hedged),
        );
        lane.outstanding.fetch_add(1, Ordering::Relaxed);
        lane.has_out.store(true, Ordering::SeqCst);
        None
    }
}

/// When an unanswered idempotent call is hedged.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum HedgeAfter {
    /// After a fixed delay.
    Fixed(Duration),
    /// After this quantile (0 to 1) of its group's recent upstream times.
    Quantile(f64),
}

/// What the key of a call being forwarded decided.
enum Keying {
    /// Send it upstream, keyed.
    Send(Responder, Arc<[u8]>),
    /// Answer it with this cached result.
    Cached(Responder, Arc<[u8]>),
    /// It joined an identical call in flight.
    Joined,
}

thread_local! {
    /// The canonical key of the call being forwarded (reused: no allocation per call
    /// for the lookup).
    static KEY: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// `now` + `d`, or far in the future if that cannot be told (a timeout of "forever").
pub(crate) fn later(now: Instant, d: Duration) -> Instant {
    now.checked_add(d)
        .or_else(|| now.checked_add(FAR))
        .unwrap_or(now)
}

/// A hundred years: what a duration past any clock's range waits.
const FAR: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// The default most elements of a sub-batch to an HTTP upstream.
const HTTP_BATCH_MAX: usize = 100;

/// Times an idempotent call is sent at most (the first time included).
const MAX_ATTEMPTS: u8 = 3;

/// Appends `"method":M,"params":P}` and a newline: the request after its id (or after
/// `{"jsonrpc":"2.0",` for a notification). The params are their original text, with
/// any newline in it (only possible as whitespace between tokens) turned into a space
/// so the request stays one line.
fn write_tail(out: &mut Vec<u8>, method: &str, params: &Params<'_>) {
    out.extend_from_slice(br#""method":"#);
    write_str(out, method);
    match (params.raw_json(), params.nodes()) {
        (Some(text), _) => {
            out.extend_from_slice(br#","params":"#);
            let at = out.len();
            out.extend_from_slice(text);
            one_line(&mut out[at..]);
        }
        (None, Some(nodes)) => {
            out.extend_from_slice(br#","params":"#);
            write_value(out, nodes);
        }
        (None, None) => {}
    }
    out.extend_from_slice(b"}\n");
}

/// Turns the line breaks in JSON text (params, an answer) into spaces: outside
/// strings (where JSON has them escaped) they are whitespace between tokens, as a
/// pretty-printing peer writes them, and sent on as they came they would split the
/// text into several lines for a newline-delimited peer.
pub(crate) fn one_line(text: &mut [u8]) {
    let mut from = 0;
    while let Some(k) = memchr::memchr2(b'\n', b'\r', &text[from..]) {
        text[from + k] = b' ';
        from += k + 1;
    }
}

/// Sets up a [`Proxy`]: upstreams by group, routes, connections and timeouts.
#[derive(Clone, Debug)]
pub struct ProxyBuilder {
    upstreams: Vec<(String, String)>,
    routes: Vec<(String, String)>,
    idempotent: Vec<String>,
    coalesce: bool,
    hedge: Option<(HedgeAfter, f64)>,
    health: Option<Duration>,
    cache: Vec<(String, Duration)>,
    cache_bytes: usize,
    connections: usize,
    reactor_lanes: bool,
    timeout: Duration,
    max_answer_bytes: usize,
    batch_max: Option<usize>,
    subscriptions: Vec<(String, String, String)>,
    subscription_config: SubscriptionConfig,
}

impl ProxyBuilder {
    /// Forwards the subscription whose calls are `subscribe` (routed like any method
    /// to a group, whose upstreams must all be `tcp://` or `unix://`), `notification`
    /// and `unsubscribe`: identical subscriptions (the same method and params,
    /// compared canonically) of any number of clients share one upstream subscription,
    /// each client getting its own subscription id and every notification's `result`
    /// as its bytes came. `unsubscribe` is answered by the proxy; the upstream
    /// subscription is unsubscribed when its last client unsubscribes or goes. See
    /// docs/PROXY.md, "Subscriptions".
    pub fn subscription(
        &mut self,
        subscribe: &str,
        notification: &str,
        unsubscribe: &str,
    ) -> &mut Self {
        self.subscriptions.push((
            subscribe.to_owned(),
            notification.to_owned(),
            unsubscribe.to_owned(),
        ));
        self
    }

    /// The most notifications queued for one client subscription while its client
    /// reads too slowly (default 1,024): past it the oldest are dropped, and counted in
    /// a `lagged` notification (see [`ProxyBuilder::subscription_config`]).
    pub fn subscription_queue(&mut self, n: usize) -> &mut Self {
        self.subscription_config.capacity = n.max(1);
        self
    }

    /// Each client subscription's queue and what happens when its client reads too
    /// slowly (default: 1,024 notifications, the oldest dropped and counted in a
    /// `lagged` notification; at most 1,024 of one method per connection): a slow
    /// client never holds up the others nor the upstream connection.
    pub fn subscription_config(&mut self, config: SubscriptionConfig) -> &mut Self {
        self.subscription_config = config;
        self
    }

    /// Adds the upstream at `url` to group `group`: `tcp://host:port` or
    /// `unix:///path` (newline-delimited JSON), or `http://host[:port][/path]` (HTTP/1.1
    /// keep-alive, requests pipelined). Upstreams of one group share its calls, each call going
    /// to the connection with the fewest calls outstanding.
    pub fn upstream(&mut self, group: &str, url: &str) -> &mut Self {
        self.upstreams.push((group.to_owned(), url.to_owned()));
        self
    }

    /// Sends methods matching `pattern` (an exact name, or a prefix and `*`) to `group`.
    /// Routes are tried in the order added; the first match wins. A method no route
    /// matches goes to the group named `default`, or else to the first group added.
    pub fn route(&mut self, pattern: &str, group: &str) -> &mut Self {
        self.routes.push((pattern.to_owned(), group.to_owned()));
        self
    }

    /// Declares the methods matching `pattern` (an exact name, or a prefix and `*`)
    /// idempotent: when the upstream connection such a call was sent on fails before
    /// its answer, the call is sent again on another connected upstream of its group
    /// (at most 3 times in all). Any other call is written upstream at most once.
    pub fn idempotent(&mut self, pattern: &str) -> &mut Self {
        self.idempotent.push(pattern.to_owned());
        self
    }

    /// Whether identical calls to idempotent methods in flight at once share one
    /// upstream call (default on): the same method and params, compared canonically
    /// (whitespace, escapes and member order do not matter); each caller gets the
    /// answer under its own id.
    pub fn coalesce(&mut self, on: bool) -> &mut Self {
        self.coalesce = on;
        self
    }

    /// Hedges idempotent calls: one without an answer `after` it was forwarded is also
    /// sent to another connected upstream of its group, and the first answer wins (the
    /// other is dropped). At most `max_fraction` (0 to 1) of the idempotent calls
    /// forwarded are hedged, so a slow group is not sent twice its load. The delay is
    /// checked on the upstream thread's 20 ms tick. Off by default.
    pub fn hedge(&mut self, after: Duration, max_fraction: f64) -> &mut Self {
        self.hedge = Some((HedgeAfter::Fixed(after), max_fraction.clamp(0.0, 1.0)));
        self
    }

    /// Hedges idempotent calls as [`ProxyBuilder::hedge`] does, after a delay that
    /// follows the upstreams: the `quantile` (0 to 1, e.g. 0.95) of the times its
    /// group's upstreams took to answer over the last second (from the
    /// `ringrpc_proxy_upstream_seconds` histograms, interpolated within their buckets),
    /// recomputed every second once at least 20 answers were seen in it; until the
    /// first such second, a group's calls are not hedged.
    pub fn hedge_quantile(&mut self, quantile: f64, max_fraction: f64) -> &mut Self {
        self.hedge = Some((
            HedgeAfter::Quantile(quantile.clamp(0.0, 1.0)),
            max_fraction.clamp(0.0, 1.0),
        ));
        self
    }

    /// Probes every upstream connection that answered nothing for `interval` and has
    /// no call outstanding (a `rpc.proxy.health` call: any JSON-RPC answer, an error
    /// included, proves the upstream serves); one not answered within `interval` (at
    /// most 2 s) takes the upstream out until a new connection answers a probe, so a
    /// hung upstream is found before calls are sent to it. Default 5 s;
    /// `Duration::ZERO` turns it off. (Connections with calls outstanding are watched
    /// by the timeouts instead: 3 in a row take the upstream out.)
    pub fn health_interval(&mut self, interval: Duration) -> &mut Self {
        self.health = (!interval.is_zero()).then_some(interval);
        self
    }

    /// Caches the results of methods matching `pattern` for `ttl`: a call identical to
    /// one answered within `ttl` (compared as for [`ProxyBuilder::coalesce`], whole
    /// keys, never by hash alone) is answered from the cache. Errors are not cached.
    pub fn cache(&mut self, pattern: &str, ttl: Duration) -> &mut Self {
        self.cache.push((pattern.to_owned(), ttl));
        self
    }

    /// The most bytes of keys and results the cache holds (default 64 MiB).
    pub fn cache_bytes(&mut self, n: usize) -> &mut Self {
        self.cache_bytes = n;
        self
    }

    /// Connections opened to each upstream (default 2, at least 1): calls from every
    /// client connection are pipelined on them.
    pub fn connections(&mut self, n: usize) -> &mut Self {
        self.connections = n.max(1);
        self
    }

    /// Whether each server reactor the proxy is installed on ([`Proxy::install`])
    /// opens a connection of its own to each upstream (default: yes). Its clients'
    /// calls then go on those, written and answered on the reactor's own thread (no
    /// hand-off to the upstream thread and back: cheaper per call); the shared
    /// [`ProxyBuilder::connections`] still carry subscriptions, sub-batches, hedged
    /// calls, resent calls and calls of a reactor whose own connection is down. An
    /// upstream then has `connections` + reactors connections from the proxy.
    pub fn reactor_connections(&mut self, on: bool) -> &mut Self {
        self.reactor_lanes = on;
        self
    }

    /// How long a call waits for its upstream's answer before it is answered `-32001`
    /// (`upstream_timeout`); default 30 s. The call's own deadline (the server's
    /// `request_timeout`, or the caller's budget) is kept when it is earlier.
    pub fn timeout(&mut self, timeout: Duration) -> &mut Self {
        self.timeout = timeout;
        self
    }

    /// The longest answer accepted from an upstream (default 8 MiB): a longer one
    /// drops that upstream connection.
    pub fn max_answer_bytes(&mut self, n: usize) -> &mut Self {
        self.max_answer_bytes = n;
        self
    }

    /// The most elements of a client batch sent upstream as one batch request (1 sends
    /// each element on its own). The elements of a client batch that go to the same
    /// upstream connection are sent together as a batch (a *sub-batch*: a batch's
    /// elements routed to different groups, or balanced over several connections, go
    /// in several, concurrently); each element is still answered on its own, and the
    /// answers merged back in the client's order.
    ///
    /// Default: 100 for `http://` upstreams, 1 for `tcp://` and `unix://` ones. Over
    /// HTTP a response answers its request, so an upstream refusing a whole batch (one
    /// error with id null, e.g. over its batch limit) has that error given to each
    /// element; on a newline-delimited stream, answers are matched by id alone and
    /// such an error cannot be told apart, so the elements would wait for the
    /// timeout. Set it for stream upstreams known to accept batches of `n`.
    pub fn batch_max(&mut self, n: usize) -> &mut Self {
        self.batch_max = Some(n.max(1));
        self
    }

    /// Checks the setup, starts the upstream thread and begins connecting.
    ///
    /// # Errors
    ///
    /// [`ProxyError`]: no upstream, a bad URL, a route to a group with no upstream, or
    /// the poller could not be made.
    pub fn start(&self) -> Result<Proxy, ProxyError> {
        if self.upstreams.is_empty() {
            return Err(ProxyError::NoUpstream);
        }
        let mut upstreams = Vec::new();
        let mut groups: Vec<Group> = Vec::new();
        let mut lanes = Vec::new();
        for (group, url) in &self.upstreams {
            let address = Address::parse(url).map_err(|e| ProxyError::Address {
                url: url.clone(),
                reason: e.to_string(),
            })?;
            if matches!(address, Address::Ws { .. }) {
                return Err(ProxyError::Address {
                    url: url.clone(),
                    reason: "WebSocket upstreams are not supported yet: use tcp://, unix:// or \
                             http://"
                        .into(),
                });
            }
            let http_head: Option<Box<[u8]>> = match &address {
                Address::Http { authority, path } => Some(
                    format!(
                        "POST {path} HTTP/1.1\r\nHost: {authority}\r\n\
                         Content-Type: application/json\r\nAccept: application/json\r\n\
                         Content-Length: "
                    )
                    .into_bytes()
                    .into(),
                ),
                _ => None,
            };
            let g = match groups.iter().position(|g| *g.name == **group) {
                Some(g) => g,
                None => {
                    groups.push(Group {
                        name: group.as_str().into(),
                        lanes: Vec::new(),
                        upstreams: Vec::new(),
                        next: AtomicUsize::new(0),
                    });
                    groups.len() - 1
                }
            };
            let batch_max = self.batch_max.unwrap_or(if http_head.is_some() {
                HTTP_BATCH_MAX
            } else {
                1
            });
            groups[g].upstreams.push(upstreams.len());
            for _ in 0..self.connections {
                groups[g].lanes.push(lanes.len());
                lanes.push(Lane::new(upstreams.len(), http_head.clone(), batch_max));
            }
            upstreams.push(Upstream {
                url: url.clone(),
                resolved: resolve::first(url, &address),
                address,
                http_head,
                batch_max,
            });
        }
        let mut rules = Vec::new();
        for (pattern, group) in &self.routes {
            let g = groups
                .iter()
                .position(|g| *g.name == **group)
                .ok_or_else(|| ProxyError::UnknownGroup {
                    pattern: pattern.clone(),
                    group: group.clone(),
                })?;
            rules.push((Pattern::parse(pattern), g));
        }
        let default_group = groups
            .iter()
            .position(|g| &*g.name == "default")
            .unwrap_or(0);
        let routes = Rules::new(rules);
        let mut kinds = Vec::new();
        for (subscribe, notification, unsubscribe) in &self.subscriptions {
            if subscribe.is_empty()
                || notification.is_empty()
                || unsubscribe.is_empty()
                || subscribe == unsubscribe
            {
                return Err(ProxyError::Subscription(format!(
                    "{subscribe}:{notification}:{unsubscribe}"
                )));
            }
            let g = routes.find(subscribe).unwrap_or(default_group);
            let http = groups[g]
                .lanes
                .iter()
                .map(|&i| &upstreams[lanes[i].upstream])
                .find(|u| matches!(u.address, Address::Http { .. }));
            if let Some(u) = http {
                return Err(ProxyError::SubscriptionOverHttp {
                    method: subscribe.clone(),
                    group: groups[g].name.to_string(),
                    url: u.url.clone(),
                });
            }
            kinds.push(subs::Kind {
                subscribe: subscribe.as_str().into(),
                notification: notification.as_str().into(),
                unsubscribe: unsubscribe.as_str().into(),
                group: g,
            });
        }
        let upstreams_len = upstreams.len();
        let lanes_len = lanes.len();
        let poll = mio::Poll::new()?;
        let waker = mio::Waker::new(poll.registry(), upstream::WAKER)?;
        let config = self.subscription_config;
        let registry = poll.registry().try_clone()?;
        let shared = Arc::new_cyclic(|me| Shared {
            upstreams,
            lanes: lanes.into(),
            reactor_lanes: self.reactor_lanes,
            groups,
            routes,
            idempotent: Rules::new(self.idempotent.iter().map(|p| (Pattern::parse(p), ()))),
            coalesce: self.coalesce,
            hedge: self.hedge,
            health: self.health,
            hedged: AtomicU64::new(0),
            forwarded: AtomicU64::new(0),
            inflight: share::InFlight::default(),
            cache_rules: Rules::new(self.cache.iter().map(|(p, t)| (Pattern::parse(p), *t))),
            cache: share::Cache::new(self.cache_bytes),
            default_group,
            timeout: self.timeout,
            max_answer_bytes: self.max_answer_bytes,
            timings: timing::Timings::new(upstreams_len),
            subs: subs::Subs::new(kinds, config, lanes_len, std::sync::Weak::clone(me)),
            waker,
            woken: AtomicBool::new(false),
            revived: AtomicBool::new(false),
            stop: AtomicBool::new(false),
        });
        let thread = {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name("ringrpc-upstream".into())
                .spawn(move || upstream::run(shared, poll, registry))?
        };
        Ok(Proxy {
            shared,
            thread: Some(thread),
        })
    }
}

/// A running proxy: its upstream connections and the thread that serves them. Dropping
/// it stops that thread; calls still waiting are answered `upstream_unavailable`.
pub struct Proxy {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proxy")
            .field(
                "upstreams",
                &self
                    .shared
                    .upstreams
                    .iter()
                    .map(|u| &u.url)
                    .collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

impl Proxy {
    /// A builder with no upstreams, 2 connections per upstream and a 30 s timeout.
    pub fn builder() -> ProxyBuilder {
        ProxyBuilder {
            upstreams: Vec::new(),
            routes: Vec::new(),
            idempotent: Vec::new(),
            coalesce: true,
            hedge: None,
            health: Some(Duration::from_secs(5)),
            cache: Vec::new(),
            cache_bytes: 64 << 20,
            connections: 2,
            reactor_lanes: true,
            timeout: Duration::from_secs(30),
            max_answer_bytes: crate::config::defaults::DEFAULT_MAX_RESPONSE_BYTES,
            batch_max: None,
            subscriptions: Vec::new(),
            subscription_config: SubscriptionConfig::default(),
        }
    }

    /// Makes this proxy the fallback route of `methods`: every method it does not
    /// register is forwarded. A server serving `methods` runs the proxy's reactor
    /// connections ([`ProxyBuilder::reactor_connections`]) in each of its reactors. Its subscriptions ([`ProxyBuilder::subscription`]) are
    /// registered in `methods` (answered by the proxy, forwarded as shared upstream
    /// subscriptions).
    ///
    /// # Errors
    ///
    /// A subscription's method is registered in `methods` already (or reserved).
    pub fn install(&self, methods: &mut RegistryBuilder) -> Result<(), RegisterError> {
        for (k, kind) in self.shared.subs.kinds.iter().enumerate() {
            let shared = Arc::clone(&self.shared);
            methods.deferred_subscription(
                &kind.subscribe,
                &kind.notification,
                &kind.unsubscribe,
                self.shared.subs.config,
                move |_ctx: &Context<'_>, params: Params<'_>, s: Subscribing| {
                    shared.subs.subscribe(&shared, k, &params, s);
                },
            )?;
        }
        let forwarder = self.forwarder();
        methods.deferred_fallback(move |ctx, params, responder| {
            forwarder.forward(ctx, params, responder);
        });
        if self.shared.reactor_lanes {
            methods.attach(Arc::new(upstream::Attachment::new(Arc::clone(
                &self.shared,
            ))));
        }
        Ok(())
    }

    /// Adds the proxy's histograms to `metrics` (the engine's, from
    /// [`Engine::metrics`](crate::Engine::metrics)): per upstream,
    /// `ringrpc_proxy_send_seconds` (forward → bytes taken for the upstream socket) and
    /// `ringrpc_proxy_upstream_seconds` (then → answer read). What the proxy adds to a
    /// call is the server's `ringrpc_request_duration_seconds{method="fallback"}` less
    /// the upstream time. Also `ringrpc_proxy_hedged_total` and, per upstream,
    /// `ringrpc_proxy_upstream_up` (1 while calls are sent to it); with subscriptions,
    /// `ringrpc_proxy_subscriptions` (upstream subscriptions open, per upstream),
    /// `ringrpc_proxy_subscribers` (client subscriptions they serve),
    /// `ringrpc_proxy_notifications_total` and
    /// `ringrpc_proxy_notifications_delivered_total` (notifications read from upstreams,
    /// and their copies queued for clients).
    pub fn export_metrics(&self, metrics: &crate::metrics::Metrics) {
        let shared = Arc::clone(&self.shared);
        metrics.add_section(move |out| {
            let urls: Vec<&str> = shared.upstreams.iter().map(|u| u.url.as_str()).collect();
            shared.timings.render(&urls, out);
            let _ = std::fmt::Write::write_fmt(
                out,
                format_args!(
                    "# HELP ringrpc_proxy_hedged_total Copies of idempotent calls sent to a second upstream (hedging).\n\
                     # TYPE ringrpc_proxy_hedged_total counter\n\
                     ringrpc_proxy_hedged_total {}\n",
                    shared.hedged.load(Ordering::Relaxed)
                ),
            );
            out.push_str(
                "# HELP ringrpc_proxy_upstream_up Whether calls are sent to the upstream: 1 while a connection to it is up (not refused, not failing its health probes).\n\
                 # TYPE ringrpc_proxy_upstream_up gauge\n",
            );
            for (u, up) in shared.upstreams.iter().enumerate() {
                let on = shared
                    .lanes
                    .iter()
                    .any(|l| l.upstream == u && l.up.load(Ordering::Relaxed));
                let url = up.url.replace('\\', "\\\\").replace('"', "\\\"");
                let _ = std::fmt::Write::write_fmt(
                    out,
                    format_args!("ringrpc_proxy_upstream_up{{upstream=\"{url}\"}} {}\n", u8::from(on)),
                );
            }
            if !shared.subs.kinds.is_empty() {
                shared.subs.render(&shared, out);
            }
        });
    }

    /// A handle that forwards calls, for a fallback route of one's own (one that
    /// answers some calls itself and forwards the rest).
    pub fn forwarder(&self) -> Forwarder {
        Forwarder {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        let _ = self.shared.waker.wake();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Forwards calls through a [`Proxy`]; cheap to clone, `Send + Sync`.
#[derive(Clone)]
pub struct Forwarder {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Forwarder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Forwarder").finish_non_exhaustive()
    }
}

impl Forwarder {
    /// Forwards the call `ctx` describes (method, id, deadline) with `params` to its
    /// upstream group; `responder` is answered with the upstream's result or error, as
    /// its bytes came, or with the proxy's own error (see the [module docs](self)).
    pub fn forward(&self, ctx: &Context<'_>, params: Params<'_>, responder: Responder) {
        self.shared.forward(ctx, params, responder);
    }
}
