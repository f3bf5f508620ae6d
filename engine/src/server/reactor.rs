//! The event loop: accept, read, decode, answer, write; hand blocking calls to the pool
//! and put their answers back in order.

use std::io::{self, Read};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use mio::{Events, Interest, Token};
use slab::Slab;

use super::attach::{self, Attached};
use super::conn::{Conn, Decoder, OpenGuard, Stream};
use super::pending::{Completed, Pending, Slot};
use super::pool::Pool;
use super::scrape::{Refused, Scraper};
use super::{Listener, Proto, Server};

use crate::config::ServerConfig;
use crate::dispatch::context::{Connection, Headers, Peer, Source, Transport};
use crate::dispatch::subscription::{PushQueue, PushTo, SinkClosed, SubState};
use crate::engine::{Engine, Outcome, Scratch, Split};
use crate::error::FrameError;
use crate::trace::Trace;
use crate::transport::http::{self, HttpEvent, Reply, ServerHeaders};
use crate::transport::io::{peer_cred, read_into};
use crate::transport::websocket::{self, WsDecoder, WsEvent};

pub(super) const WAKER: Token = Token(0);
const SIGNALS: Token = Token(1);
const LISTENER0: usize = 2;
/// Attachments' tokens (see `attach`): `SPAN` each from here, below `CONN0`.
const ATTACHED0: usize = 1 << 15;
const CONN0: usize = 1 << 16;

/// How long accepting pauses after running out of file descriptors.
const ACCEPT_PAUSE: Duration = Duration::from_millis(100);

/// Free space asked for before each read.
const READ_CHUNK: usize = 16 * 1024;

/// Read buffers a reactor keeps for reuse (at most 2 MiB in all). A spare's earlier
/// frames are all dropped by then (deferred calls copy theirs), so the next read's
/// `reserve` takes its whole allocation back without allocating.
const SPARE_BUFFERS: usize = 32;

/// Connection ids, unique in the process (numbered from 1).
static NEXT_CONNECTION: AtomicU64 = AtomicU64::new(1);

/// Everything the answering code needs besides the connection itself.
struct Ctx {
    engine: Arc<Engine>,
    settings: Arc<ServerConfig>,
    scratch: Scratch,
    /// Read buffers given back by quiet connections (see [`SPARE_BUFFERS`]).
    spare: Vec<BytesMut>,
    /// Connections open across all reactors.
    open: Arc<AtomicUsize>,
    /// Calls answered later: pool calls and deferred methods.
    pending: Pending,
    /// Connections given answers in this round of completions (reused).
    touched: Vec<usize>,
    /// The lines every HTTP response carries (`Date`, `Keep-Alive`, CORS), refreshed
    /// once per loop turn.
    http: ServerHeaders,
    /// The CORS policy, for new HTTP connections' decoders.
    cors: Option<Arc<http::Cors>>,
    /// Subscriptions with notifications to deliver, and the list they are taken into.
    push: Arc<PushQueue>,
    ready: Vec<Arc<SubState>>,
}

/// What one reactor thread owns.
struct Parts {
    engine: Arc<Engine>,
    settings: Arc<ServerConfig>,
    poll: mio::Poll,
    listeners: Vec<Listener>,
    stop: Arc<AtomicBool>,
    waker: Arc<mio::Waker>,
    signals: Option<std::os::unix::net::UnixStream>,
    pool: Arc<Pool>,
    scraper: Option<Arc<Scraper>>,
    open: Arc<AtomicUsize>,
    /// The other reactors' wakers (on the first reactor only), woken at shutdown.
    peers: Vec<Arc<mio::Waker>>,
}

pub(super) fn run(server: Server) -> io::Result<()> {
    let Server {
        engine,
        settings,
        poll,
        listeners,
        stop,
        waker,
        signals,
        reload: _,
    } = server;
    let pool = Arc::new(Pool::start(
        Arc::clone(&engine),
        settings.workers,
        settings.queue_capacity,
    )?);
    if let Some(m) = engine.metrics() {
        // Reported while the server runs; a stopped server's pool reports nothing.
        let weak = Arc::downgrade(&pool);
        m.add_queue(move || weak.upgrade().map(|p| p.queued()));
    }
    // Scrapes are rendered off the reactors (see `scrape`), where there are any: with
    // metrics on and a listener for HTTP. Without its thread, the reactors render them.
    let serves_http = listeners
        .iter()
        .any(|l| matches!(l, Listener::Tcp(_, Proto::Http | Proto::Metrics)));
    let scraper = match engine.metrics() {
        Some(m) if serves_http => Scraper::start(m.clone()).ok().map(Arc::new),
        _ => None,
    };
    let open = Arc::new(AtomicUsize::new(0));
    // Further reactors: their own poll and their own TCP listeners bound beside the
    // first ones (SO_REUSEPORT).
    let mut peers = Vec::new();
    let mut threads = Vec::new();
    let stop_all = |peers: &[Arc<mio::Waker>],
                    threads: Vec<std::thread::JoinHandle<io::Result<()>>>| {
        stop.store(true, Ordering::SeqCst);
        for p in peers {
            let _ = p.wake();
        }
        let mut first_err = None;
        for t in threads {
            if let Ok(Err(e)) = t.join() {
                first_err.get_or_insert(e);
            }
        }
        first_err
    };
    for i in 1..settings.reactors {
        let started =
            (|| -> io::Result<(Arc<mio::Waker>, std::thread::JoinHandle<io::Result<()>>)> {
                let poll = mio::Poll::new()?;
                let waker = Arc::new(mio::Waker::new(poll.registry(), WAKER)?);
                let mut mine = Vec::new();
                for l in &listeners {
                    if let Listener::Tcp(l, proto) = l {
                        mine.push(Listener::Tcp(
                            super::bind_tcp(l.local_addr()?, true)?,
                            *proto,
                        ));
                    }
                }
                let parts = Parts {
                    engine: Arc::clone(&engine),
                    settings: Arc::clone(&settings),
                    poll,
                    listeners: mine,
                    stop: Arc::clone(&stop),
                    waker: Arc::clone(&waker),
                    signals: None,
                    pool: Arc::clone(&pool),
                    scraper: scraper.clone(),
                    open: Arc::clone(&open),
                    peers: Vec::new(),
                };
                let t = std::thread::Builder::new()
                    .name(format!("ringrpc-reactor-{i}"))
                    .spawn(move || serve(parts))?;
                Ok((waker, t))
            })();
        match started {
            Ok((waker, t)) => {
                peers.push(waker);
                threads.push(t);
            }
            Err(e) => {
                // Stop the reactors already running before reporting.
                stop_all(&peers, threads);
                return Err(e);
            }
        }
    }
    let result = serve(Parts {
        engine,
        settings,
        poll,
        listeners,
        stop: Arc::clone(&stop),
        waker,
        signals,
        pool: Arc::clone(&pool),
        scraper,
        open,
        peers: peers.clone(),
    });
    let peer_err = stop_all(&peers, threads);
    if let Ok(pool) = Arc::try_unwrap(pool) {
        pool.shutdown();
    }
    match (result, peer_err) {
        (Err(e), _) | (Ok(()), Some(e)) => Err(e),
        (Ok(()), None) => Ok(()),
    }
}

/// One reactor's event loop, until shutdown.
fn serve(parts: Parts) -> io::Result<()> {
    let Parts {
        engine,
        settings,
        mut poll,
        mut listeners,
        stop,
        waker,
        signals,
        pool,
        scraper,
        open,
        peers,
    } = parts;
    let mut signals = match signals {
        Some(s) => {
            let mut s = mio::net::UnixStream::from_std(s);
            poll.registry()
                .register(&mut s, SIGNALS, Interest::READABLE)?;
            Some(s)
        }
        None => None,
    };
    for (i, l) in listeners.iter_mut().enumerate() {
        let t = Token(LISTENER0 + i);
        match l {
            Listener::Tcp(l, _) => poll.registry().register(l, t, Interest::READABLE)?,
            Listener::Unix(l, _) => poll.registry().register(l, t, Interest::READABLE)?,
        }
    }
    let cors = http::Cors::new(&settings.cors_origins).map_err(|o| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("bad CORS origin {o:?}"),
        )
    })?;
    let mut ctx = Ctx {
        scratch: engine.scratch(),
        http: ServerHeaders::new(settings.idle_timeout, cors.clone()),
        cors,
        pending: Pending::new(pool, scraper, Arc::clone(&waker), &engine, &settings),
        push: PushQueue::new(Arc::clone(&waker)),
        ready: Vec::new(),
        settings,
        touched: Vec::new(),
        engine,
        spare: Vec::new(),
        open,
    };
    // What the registry runs in this loop (a proxy's own upstream connections).
    let mut attached: Vec<Box<dyn Attached>> = Vec::new();
    for a in ctx.engine.registry().attachments() {
        let base = ATTACHED0 + attached.len() * attach::SPAN;
        if base + attach::SPAN > CONN0 {
            break;
        }
        if let Some(x) = a.attach(poll.registry(), base) {
            attached.push(x);
        }
    }
    let mut conns: Slab<Conn> = Slab::new();
    let mut events = Events::with_capacity(1024);
    let mut generation = 0u64;
    let mut last_sweep = Instant::now();
    let mut stopping: Option<Instant> = None;
    // Accepting is paused until then after running out of file descriptors.
    let mut accept_paused: Option<Instant> = None;
    // Connections that used up their read budget with bytes possibly left.
    let mut again: Vec<(usize, u64)> = Vec::new();
    let mut again_next: Vec<(usize, u64)> = Vec::new();
    loop {
        let timeout = if again.is_empty() {
            let t = next_timeout(&ctx, stopping.is_some());
            let t = attached
                .iter()
                .filter_map(|a| a.next_wake())
                .fold(t, Duration::min);
            accept_paused.map_or(t, |at| t.min(at.saturating_duration_since(Instant::now())))
        } else {
            Duration::ZERO
        };
        if let Err(e) = poll.poll(&mut events, Some(timeout)) {
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
        if !attached.is_empty() {
            // Answers this thread gives in this turn (an attachment's, read from its
            // upstream) are drained by `completions` below: no wake-up for them.
            ctx.pending.hold_wakes();
        }
        ctx.http.refresh(std::time::SystemTime::now());
        for ev in events.iter() {
            match ev.token() {
                WAKER => {}
                Token(t) if (ATTACHED0..CONN0).contains(&t) => {
                    let n = (t - ATTACHED0) / attach::SPAN;
                    if let Some(a) = attached.get_mut(n) {
                        a.event(t - ATTACHED0 - n * attach::SPAN, ev);
                    }
                }
                SIGNALS => {
                    if let Some(s) = signals.as_mut() {
                        let mut b = [0u8; 64];
                        while matches!(s.read(&mut b), Ok(n) if n > 0) {}
                    }
                    stop.store(true, Ordering::SeqCst);
                }
                Token(t) if t >= CONN0 => {
                    let key = t - CONN0;
                    if let Some(conn) = conns.get_mut(key) {
                        if ev.is_read_closed() || ev.is_error() {
                            conn.hup = true;
                        }
                        if ev.is_readable() || ev.is_read_closed() || ev.is_error() {
                            conn.unread = true;
                        }
                        if drive(&mut ctx, conn, key) {
                            again_next.push((key, conn.generation));
                        }
                        if conn.finished() {
                            close(&ctx, &poll, &mut conns, key);
                        }
                    }
                }
                Token(t) => {
                    if stopping.is_none() {
                        if let Some(l) = listeners.get_mut(t - LISTENER0) {
                            if accept(&poll, l, &mut conns, &mut generation, &ctx)? {
                                accept_paused = Some(Instant::now() + ACCEPT_PAUSE);
                            }
                        }
                    }
                }
            }
        }
        for (key, generation) in again.drain(..) {
            if let Some(conn) = conns.get_mut(key) {
                if conn.generation == generation {
                    if drive(&mut ctx, conn, key) {
                        again_next.push((key, generation));
                    }
                    if conn.finished() {
                        close(&ctx, &poll, &mut conns, key);
                    }
                }
            }
        }
        if accept_paused.is_some_and(|at| Instant::now() >= at) && stopping.is_none() {
            // Readiness edges were consumed while paused: try every listener again.
            accept_paused = None;
            for l in listeners.iter_mut() {
                if accept(&poll, l, &mut conns, &mut generation, &ctx)? {
                    accept_paused = Some(Instant::now() + ACCEPT_PAUSE);
                }
            }
        }
        completions(&mut ctx, &mut conns, &poll, &mut again_next);
        pushes(&mut ctx, &mut conns, &poll);
        std::mem::swap(&mut again, &mut again_next);
        expire(&mut ctx, &mut conns, &poll, &mut again);
        if last_sweep.elapsed() >= Duration::from_secs(1) {
            last_sweep = Instant::now();
            let lingering: Vec<usize> = conns
                .iter()
                .filter(|(_, c)| c.linger_until.is_some())
                .map(|(k, _)| k)
                .collect();
            for k in lingering {
                if conns.get_mut(k).is_some_and(|c| c.finished()) {
                    close(&ctx, &poll, &mut conns, k);
                }
            }
            if let Some(limit) = ctx.settings.request_read_timeout {
                slow_senders(&ctx, &mut conns, &poll, limit);
            }
            if let Some(every) = ctx.settings.subscriber_ping_interval {
                subscribers_alive(&ctx, &mut conns, &poll, every);
            }
            if let Some(guard) = ctx.engine.guard() {
                revoke_subscribers(&ctx, &mut conns, guard);
            }
            if let Some(idle) = ctx.settings.idle_timeout {
                stalled_peers(&ctx, &mut conns, &poll, idle);
                // A connection with subscriptions is listening, not idle.
                let stale: Vec<usize> = conns
                    .iter()
                    .filter(|(_, c)| {
                        c.idle()
                            && c.last_active.elapsed() > idle
                            && c.subs.borrow().iter().all(|s| s.finished())
                    })
                    .map(|(k, _)| k)
                    .collect();
                for k in stale {
                    let Some(c) = conns.get_mut(k) else { continue };
                    if matches!(c.decoder, Decoder::Ws(_)) {
                        // A WebSocket is told why (1001), then winds down as any
                        // connection the server closes (lingering: not told twice).
                        if c.read_closed {
                            continue;
                        }
                        c.read_closed = true;
                        websocket::write_close(
                            &mut c.out,
                            Some(websocket::GOING_AWAY),
                            "idle for too long",
                        );
                        c.flush();
                        if !c.finished() {
                            continue;
                        }
                    }
                    close(&ctx, &poll, &mut conns, k);
                }
            }
        }
        // What this turn's calls queued for attachments goes out, once per turn.
        for a in &mut attached {
            a.turn_end();
        }
        if stop.load(Ordering::SeqCst) && stopping.is_none() {
            // Stop accepting; read nothing new; answer what was received.
            stopping = Some(Instant::now());
            for p in &peers {
                let _ = p.wake();
            }
            for l in listeners.iter_mut() {
                let _ = match l {
                    Listener::Tcp(l, _) => poll.registry().deregister(l),
                    Listener::Unix(l, _) => poll.registry().deregister(l),
                };
            }
            let keys: Vec<usize> = conns.iter().map(|(k, _)| k).collect();
            for k in keys {
                if let Some(c) = conns.get_mut(k) {
                    // Requests already received are answered, all of them (even past
                    // the high-water mark: one read's worth at most).
                    let _ = drive(&mut ctx, c, k);
                    if c.held {
                        decode(&mut ctx, c, k, None);
                        c.flush();
                    }
                    let was_closed = std::mem::replace(&mut c.read_closed, true);
                    match c.decoder {
                        Decoder::Http(_) => close_after_last(c),
                        // After the last answer, a Close (unless one was sent).
                        Decoder::Ws(_) if !was_closed => {
                            let mark = c.out.len();
                            websocket::write_close(
                                &mut c.out,
                                Some(websocket::GOING_AWAY),
                                "the server is shutting down",
                            );
                            queue_if_behind(c, mark);
                            c.flush();
                        }
                        _ => {}
                    }
                    if c.finished() {
                        close(&ctx, &poll, &mut conns, k);
                    }
                }
            }
        }
        if let Some(since) = stopping {
            let grace = ctx
                .engine
                .config()
                .request_timeout
                .unwrap_or(Duration::from_secs(30))
                + Duration::from_secs(1);
            if conns.is_empty() || since.elapsed() > grace {
                break;
            }
        }
    }
    for l in &listeners {
        if let Listener::Unix(_, path) = l {
            let _ = std::fs::remove_file(path);
        }
    }
    for (_, c) in conns.iter_mut() {
        count_closed(&ctx, c);
    }
    drop(conns);
    Ok(())
}

/// Checks connections holding subscriptions for a live peer (see
/// [`ServerConfig::subscriber_ping_interval`](crate::ServerConfig::subscriber_ping_interval)):
/// TCP keepalive turned on once, a Ping to a silent WebSocket, and a WebSocket that
/// answered nothing within `every` of its Ping closed.
fn subscribers_alive(ctx: &Ctx, conns: &mut Slab<Conn>, poll: &mio::Poll, every: Duration) {
    let mut dead = Vec::new();
    for (k, c) in conns.iter_mut() {
        if c.read_closed || c.subs.borrow().iter().all(|s| s.finished()) {
            c.ping_sent = None;
            continue;
        }
        if !c.keepalive {
            c.keepalive = true;
            if let Stream::Tcp(s) = &c.stream {
                let probes = socket2::TcpKeepalive::new()
                    .with_time(every)
                    .with_interval((every / 3).max(Duration::from_secs(1)))
                    .with_retries(3);
                // Best effort: without it, only the WebSocket Ping finds a dead peer.
                let _ = socket2::SockRef::from(s).set_tcp_keepalive(&probes);
            }
        }
        if !matches!(c.decoder, Decoder::Ws(_)) {
            continue;
        }
        match c.ping_sent {
            Some(at) if c.last_active >= at => c.ping_sent = None,
            Some(at) if at.elapsed() >= every => {
                dead.push(k);
                continue;
            }
            Some(_) => continue,
            None => {}
        }
        if c.last_active.elapsed() >= every {
            let mark = c.out.len();
            websocket::write_ping(&mut c.out, b"ringrpc");
            queue_if_behind(c, mark);
            c.flush();
            c.ping_sent = Some(Instant::now());
        }
    }
    for k in dead {
        let Some(c) = conns.get_mut(k) else { continue };
        tracing::debug!(
            peer = %c.info.peer(),
            "a subscriber's WebSocket did not answer a ping: closed"
        );
        // It answers nothing: a Close is written for form's sake, and the connection
        // dropped without waiting for the peer's.
        websocket::write_close(&mut c.out, Some(websocket::GOING_AWAY), "no answer to ping");
        c.flush();
        c.broken = true;
        close(ctx, poll, conns, k);
    }
}

/// Ends the subscriptions of connections whose identity a key reload revoked: a
/// subscriber may make no further call to find out at.
fn revoke_subscribers(ctx: &Ctx, conns: &mut Slab<Conn>, guard: &crate::guard::Guard) {
    for (key, c) in conns.iter() {
        if c.subs.borrow().iter().all(|s| s.finished()) {
            continue;
        }
        let push = PushTo {
            queue: &ctx.push,
            conn: (key, c.generation),
            subs: &c.subs,
        };
        let source = Source::new(&c.info)
            .with_push(push)
            .with_session(&c.session);
        if guard.revoked(&source) {
            push.close_all(SinkClosed::Revoked);
        }
    }
}

/// At shutdown, an HTTP connection's last answer says `Connection: close`, so the
/// client sends nothing more on it: whether it is still being computed, framed and
/// waiting its turn, or framed in the output and not yet sent. (Already sent: the
/// client sees the connection close, as after any idle keep-alive connection.)
fn close_after_last(conn: &mut Conn) {
    match conn.slots.back_mut() {
        Some(last) if !last.ready => {
            if let Some(reply) = &mut last.http {
                reply.keep_alive = false;
            }
        }
        Some(last) => {
            http::close_after_last(&mut last.buf, 0);
        }
        None => {
            http::close_after_last(&mut conn.out, conn.written);
        }
    }
}

/// Closes connections whose peer has taken none of the answers owed it for longer than
/// `limit` (the idle timeout): it stopped reading. What it is owed is bounded (see
/// `ServerConfig::write_high_water`), but would otherwise be held for ever, with the
/// connection. Nothing more can reach the peer: dropped, not wound down.
fn stalled_peers(ctx: &Ctx, conns: &mut Slab<Conn>, poll: &mio::Poll, limit: Duration) {
    let now = Instant::now();
    let stalled: Vec<usize> = conns
        .iter_mut()
        .filter_map(|(k, c)| c.stalled_past(now, limit).then_some(k))
        .collect();
    for key in stalled {
        close(ctx, poll, conns, key);
    }
}

/// Closes connections whose current request has been arriving for longer than `limit`
/// (HTTP: after a `408 Request Timeout`). Answers already owed are still written first.
fn slow_senders(ctx: &Ctx, conns: &mut Slab<Conn>, poll: &mio::Poll, limit: Duration) {
    let slow: Vec<usize> = conns
        .iter()
        .filter(|(_, c)| c.partial_since.is_some_and(|t| t.elapsed() > limit))
        .map(|(k, _)| k)
        .collect();
    for key in slow {
        let Some(conn) = conns.get_mut(key) else {
            continue;
        };
        conn.read_closed = true;
        conn.partial_since = None;
        conn.rbuf = BytesMut::new();
        let mark = conn.out.len();
        match conn.decoder {
            Decoder::Http(_) => {
                if let Some(m) = ctx.pending.metrics() {
                    m.event(crate::metrics::Event::HttpRefused);
                }
                http::write_status(&mut conn.out, 408, Reply::plain(false), &ctx.http, false);
            }
            Decoder::Ws(_) => websocket::write_close(
                &mut conn.out,
                Some(websocket::POLICY),
                "a message took too long to arrive",
            ),
            Decoder::Line(_) => {}
        }
        queue_if_behind(conn, mark);
        conn.flush();
        if conn.finished() {
            close(ctx, poll, conns, key);
        }
    }
}

fn next_timeout(ctx: &Ctx, stopping: bool) -> Duration {
    let tick = if stopping {
        Duration::from_millis(10)
    } else {
        Duration::from_secs(1)
    };
    match ctx.pending.next_deadline() {
        Some(at) => at.saturating_duration_since(Instant::now()).min(tick),
        None => tick,
    }
}

fn close(ctx: &Ctx, poll: &mio::Poll, conns: &mut Slab<Conn>, key: usize) {
    if let Some(mut c) = conns.try_remove(key) {
        let _ = poll.registry().deregister(c.stream.source());
        count_closed(ctx, &mut c);
    }
}

/// Writes the notifications of the subscriptions that have some into their
/// connections' output, and sends them.
fn pushes(ctx: &mut Ctx, conns: &mut Slab<Conn>, poll: &mio::Poll) {
    let mut ready = std::mem::take(&mut ctx.ready);
    ctx.push.take(&mut ready);
    let high_water = ctx.settings.write_high_water;
    ctx.touched.clear();
    for sub in ready.drain(..) {
        let (key, generation) = sub.conn;
        let Some(conn) = conns.get_mut(key).filter(|c| c.generation == generation) else {
            sub.end(SinkClosed::ConnectionClosed);
            continue;
        };
        deliver(conn, &sub, high_water);
        ctx.touched.push(key);
    }
    ctx.ready = ready;
    // Each connection written once, whatever number of its subscriptions had some.
    ctx.touched.sort_unstable();
    ctx.touched.dedup();
    let mut touched = std::mem::take(&mut ctx.touched);
    for key in touched.drain(..) {
        let Some(conn) = conns.get_mut(key) else {
            continue;
        };
        conn.flush();
        pump(conn, high_water);
        if conn.finished() {
            close(ctx, poll, conns, key);
        }
    }
    ctx.touched = touched;
}

/// Delivers notifications held back by a full output once it drained, for as long as
/// the socket takes all of it: a socket that takes everything gives no writable edge
/// to come back on (when it does not, that edge comes and `drive` calls this again).
fn pump(conn: &mut Conn, high_water: usize) {
    while !conn.push_waiting.is_empty() && conn.may_answer(high_water) {
        for sub in std::mem::take(&mut conn.push_waiting) {
            deliver(conn, &sub, high_water);
        }
        conn.flush();
        if !conn.out.is_empty() {
            break;
        }
    }
}

/// Writes what `sub` has queued into `conn`'s output, framed for its transport, behind
/// any answers still owed (so a subscription's first notification never passes the
/// answer with its id), while the output stays under `high_water`; what is left waits
/// for the output to drain.
fn deliver(conn: &mut Conn, sub: &Arc<SubState>, high_water: usize) {
    if conn.read_closed || conn.broken {
        // No more for a connection on its way out (after a WebSocket Close, nothing
        // may follow ours).
        sub.end(SinkClosed::ConnectionClosed);
        return;
    }
    let ws = matches!(conn.decoder, Decoder::Ws(_));
    let budget = high_water.saturating_sub(conn.backlog());
    let mark = conn.out.len();
    let done = sub.deliver(
        &mut conn.out,
        |out, json| {
            if ws {
                websocket::write_message(out, json);
            } else {
                out.extend_from_slice(json);
                out.push(b'\n');
            }
        },
        |out| out.len() - mark < budget,
    );
    if conn.out.len() > mark {
        queue_if_behind(conn, mark);
    }
    if !done && !conn.push_waiting.iter().any(|s| Arc::ptr_eq(s, sub)) {
        conn.push_waiting.push(Arc::clone(sub));
    }
}

/// The metrics of a connection that goes: one fewer open, its last bytes sent.
fn count_closed(ctx: &Ctx, c: &mut Conn) {
    if let Some(m) = ctx.pending.metrics() {
        let t = c.info.transport();
        m.connections(t, -1);
        m.sent(t, c.take_sent());
    }
}

/// Accepts every pending connection on `l`. Returns whether accepting stopped because
/// file descriptors or memory ran out (then retry after a pause).
fn accept(
    poll: &mio::Poll,
    l: &mut Listener,
    conns: &mut Slab<Conn>,
    generation: &mut u64,
    ctx: &Ctx,
) -> io::Result<bool> {
    let settings = &ctx.settings;
    loop {
        let (stream, decoder, transport, peer) = match l {
            Listener::Tcp(l, proto) => match l.accept() {
                Ok((s, addr)) => {
                    let _ = s.set_nodelay(true);
                    let (d, transport) = match proto {
                        Proto::Line => (Decoder::Line(ctx.engine.decoder()), Transport::Tcp),
                        Proto::Http | Proto::Metrics => {
                            let mut limits = http::HttpLimits::from_config(
                                ctx.engine.config(),
                                settings,
                                ctx.cors.clone(),
                            );
                            limits.metrics = ctx.engine.metrics().is_some();
                            limits.rpc = *proto == Proto::Http;
                            let d = http::HttpDecoder::new(limits);
                            (Decoder::Http(Box::new(d)), Transport::Http)
                        }
                    };
                    (Stream::Tcp(s), d, transport, Peer::Ip(addr))
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if is_exhausted(&e) => return Ok(true),
                Err(_) => continue,
            },
            Listener::Unix(l, _) => match l.accept() {
                Ok((s, _)) => {
                    use std::os::fd::AsRawFd;
                    let peer = match peer_cred(s.as_raw_fd()) {
                        Ok((pid, uid, gid)) => Peer::Unix { pid, uid, gid },
                        Err(_) => Peer::Unknown,
                    };
                    let d = Decoder::Line(ctx.engine.decoder());
                    (Stream::Unix(s), d, Transport::Unix, peer)
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if is_exhausted(&e) => return Ok(true),
                Err(_) => continue,
            },
        };
        if ctx.open.load(Ordering::Relaxed) >= settings.max_connections {
            // Refused cleanly: accepted and closed at once; the others are unaffected.
            drop(stream);
            if let Some(m) = ctx.pending.metrics() {
                m.event(crate::metrics::Event::ConnectionRefused);
            }
            continue;
        }
        *generation += 1;
        let entry = conns.vacant_entry();
        let key = entry.key();
        let guard = OpenGuard::new(Arc::clone(&ctx.open));
        let info = Connection::new(
            transport,
            peer,
            NEXT_CONNECTION.fetch_add(1, Ordering::Relaxed),
        );
        let mut conn = Conn::new(info, stream, decoder, *generation, guard);
        let registered = poll.registry().register(
            conn.stream.source(),
            Token(CONN0 + key),
            Interest::READABLE | Interest::WRITABLE,
        );
        // Counted once it is in (its close counts -1); one that could not be
        // registered is dropped uncounted.
        if registered.is_ok() {
            if let Some(m) = ctx.pending.metrics() {
                m.connections(transport, 1);
            }
            entry.insert(conn);
        }
    }
}

/// `accept` failing for lack of file descriptors or memory: the pending connection
/// stays queued, so accepting again at once would fail again (a busy loop). The caller
/// pauses accepting briefly instead. Any other accept error concerns one connection
/// (reset before it was accepted, a network error Linux reports here): skip it.
fn is_exhausted(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    )
}

/// Reads per readiness event before other connections get their turn.
const READ_BUDGET: usize = 4;

/// Handles readiness on a connection: write what is pending, read and answer (at most
/// `READ_BUDGET` reads, and only while the output stays under the high-water mark),
/// write again. Returns whether the connection must be revisited: it was not read dry
/// and may read again, and with edge-triggered readiness no new event would come. The
/// caller revisits it after serving the others, so one busy pipelining client cannot
/// starve the rest.
fn drive(ctx: &mut Ctx, conn: &mut Conn, key: usize) -> bool {
    if conn.linger_until.is_some() {
        conn.discard_input();
        return false;
    }
    conn.flush();
    let high_water = ctx.settings.write_high_water;
    if conn.held && conn.may_answer(high_water) {
        // Requests received earlier waited for the output to drain: they come first.
        decode(ctx, conn, key, Some(high_water));
        conn.flush();
    }
    let mut reads = 0;
    // Whether the socket was read dry (or closed): only then will a new readiness edge
    // come by itself.
    let mut dry = false;
    while conn.unread && conn.may_read(high_water) && reads < READ_BUDGET {
        if conn.rbuf.capacity() == 0 {
            conn.rbuf = ctx
                .spare
                .pop()
                .unwrap_or_else(|| BytesMut::with_capacity(READ_CHUNK * 4));
        }
        match read_into(conn.stream.fd(), &mut conn.rbuf, READ_CHUNK) {
            Ok(0) => {
                // End of stream: a last line without its newline is still a request
                // (as on stdio); the peer may have shut down only its sending side.
                if matches!(conn.decoder, Decoder::Line(_)) && !conn.rbuf.is_empty() {
                    conn.rbuf.extend_from_slice(b"\n");
                    decode(ctx, conn, key, Some(high_water));
                }
                conn.read_closed = true;
                conn.peer_eof = true;
            }
            Ok(n) => {
                reads += 1;
                if let Some(m) = ctx.pending.metrics() {
                    m.received(conn.info.transport(), n);
                    // One clock read per read, not per frame: each call read here is
                    // timed from the end of the one before it (see `Local::call`).
                    m.start();
                }
                conn.last_active = Instant::now();
                // Answers accumulate and leave in one write below: fewer, larger
                // segments for both ends.
                decode(ctx, conn, key, Some(high_water));
                // A read shorter than asked emptied the socket, and edge-triggered
                // readiness reports any byte arriving after it: reading on until
                // `WouldBlock` would cost a read(2) per wake-up for nothing. Unless
                // the peer closed: its end of stream must still be read.
                if n < READ_CHUNK && !conn.hup {
                    dry = true;
                    conn.unread = false;
                    break;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                dry = true;
                conn.unread = false;
                break;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => conn.broken = true,
        }
    }
    // A quiet connection gives its read buffer back, to the reactor's few spares: a
    // connection with one request at a time would otherwise allocate and free 64 KiB
    // per request (~460 instructions of malloc and free, measured with callgrind).
    if conn.rbuf.is_empty() && conn.rbuf.capacity() > 0 {
        let buf = std::mem::take(&mut conn.rbuf);
        if ctx.spare.len() < SPARE_BUFFERS {
            ctx.spare.push(buf);
        }
    }
    conn.track_partial(conn.last_active);
    conn.flush();
    pump(conn, high_water);
    if let Some(m) = ctx.pending.metrics() {
        m.sent(conn.info.transport(), conn.take_sent());
    }
    // Not read dry, and free to read again now that the output went out (or the read
    // budget ran out), or held requests that may now be answered: revisit it, since no
    // new edge may come. If the output is still over the mark, the flush hit a full
    // socket and the writable edge will come.
    (!dry && conn.unread && conn.may_read(high_water)) || (conn.held && conn.may_answer(high_water))
}

/// Answers the complete requests in the read buffer. With `high_water`, stops while the
/// output is over it (or too many answers are owed), leaving the rest `held` in the
/// buffer: a read of small requests with large answers cannot pile up output past the
/// mark. Without it (at shutdown) answers them all.
fn decode(ctx: &mut Ctx, conn: &mut Conn, key: usize, high_water: Option<usize>) {
    decode_frames(ctx, conn, key, high_water);
    // The calls answered from this read are counted now, when their answers are ready.
    if let Some(m) = ctx.pending.metrics() {
        m.flush();
    }
}

/// [`decode`]'s loop over the frames.
fn decode_frames(ctx: &mut Ctx, conn: &mut Conn, key: usize, high_water: Option<usize>) {
    conn.held = false;
    loop {
        // Each request is timed from its own first byte (see `Conn::track_partial`):
        // the clock set for the request still arriving is cleared once it is whole,
        // and kept while more of it is awaited (a read that does not complete it, a
        // `100 Continue`, a ping between a message's fragments), so that a client
        // trickling a request never gets more than `request_read_timeout` for it.
        let since = conn.partial_since.take();
        if conn.read_closed && !matches!(conn.decoder, Decoder::Line(_)) {
            return;
        }
        if let Some(mark) = high_water {
            if !conn.may_answer(mark) {
                conn.held = !conn.rbuf.is_empty();
                return;
            }
        }
        match &mut conn.decoder {
            Decoder::Line(d) => match d.decode(&mut conn.rbuf) {
                Ok(Some(frame)) => {
                    ctx.engine
                        .prefetch_frame(&conn.rbuf, frame.len(), &conn.session);
                    answer_line(ctx, conn, key, &frame);
                }
                Ok(None) => {
                    conn.partial_since = since;
                    return;
                }
                Err(e) => {
                    let mark = conn.out.len();
                    count_frame_error(ctx, conn);
                    let _ = ctx.engine.write_frame_error(e, &mut conn.out);
                    conn.out.push(b'\n');
                    queue_if_behind(conn, mark);
                }
            },
            Decoder::Http(d) => match d.decode(&mut conn.rbuf) {
                None => {
                    conn.partial_since = since;
                    return;
                }
                Some(HttpEvent::Rpc {
                    body,
                    reply,
                    traced,
                    budget,
                    known,
                }) => {
                    let trace = if traced { body.trace() } else { None };
                    if !reply.keep_alive {
                        conn.read_closed = true;
                    }
                    answer(
                        ctx,
                        conn,
                        key,
                        body.body(),
                        Some((reply, Headers::decoded(body.head(), known), budget)),
                        trace,
                    );
                }
                Some(HttpEvent::Health { reply, head }) => {
                    if !reply.keep_alive {
                        conn.read_closed = true;
                    }
                    let mark = conn.out.len();
                    http::write_health(&mut conn.out, reply, &ctx.http, head);
                    queue_if_behind(conn, mark);
                }
                Some(HttpEvent::Metrics {
                    reply,
                    head,
                    timeout,
                }) => {
                    if !reply.keep_alive {
                        conn.read_closed = true;
                    }
                    scrape(ctx, conn, key, reply, head, timeout);
                }
                Some(HttpEvent::Preflight { reply }) => {
                    if !reply.keep_alive {
                        conn.read_closed = true;
                    }
                    let mark = conn.out.len();
                    http::write_preflight(&mut conn.out, reply, &ctx.http);
                    queue_if_behind(conn, mark);
                }
                Some(HttpEvent::Continue { head, reply }) => {
                    conn.partial_since = since;
                    let mark = conn.out.len();
                    // Credentials are checked before the body is asked for: a bad or
                    // missing token is refused now, and the body never sent.
                    if let Some(guard) = ctx.engine.guard() {
                        let headers = Headers::new(conn.rbuf.get(..head).unwrap_or_default());
                        let sent_token = headers.authorization().is_some();
                        if let Err(denied) =
                            guard.authenticate_http(&conn.session, &headers, conn.info.peer())
                        {
                            conn.read_closed = true;
                            let reply = Reply {
                                keep_alive: false,
                                ..reply
                            };
                            refuse_unauthenticated(ctx, conn, reply, denied, sent_token);
                            queue_if_behind(conn, mark);
                            continue;
                        }
                    }
                    http::write_continue(&mut conn.out);
                    queue_if_behind(conn, mark);
                }
                Some(HttpEvent::Upgrade { key, head, reply }) => {
                    upgrade(ctx, conn, &key, &head, reply);
                }
                Some(HttpEvent::Reject {
                    close,
                    origin,
                    head,
                    error,
                    ..
                }) => {
                    if close {
                        conn.read_closed = true;
                    }
                    if let Some(m) = ctx.pending.metrics() {
                        m.event(crate::metrics::Event::HttpRefused);
                    }
                    let mark = conn.out.len();
                    let reply = Reply {
                        keep_alive: !close,
                        origin,
                    };
                    http::write_refusal(&mut conn.out, error, reply, &ctx.http, head);
                    queue_if_behind(conn, mark);
                }
            },
            Decoder::Ws(d) => match d.decode(&mut conn.rbuf) {
                None => {
                    conn.partial_since = since;
                    return;
                }
                Some(WsEvent::Message(frame)) => answer(ctx, conn, key, &frame, None, None),
                Some(WsEvent::TooLarge) => {
                    let mark = conn.out.len();
                    count_frame_error(ctx, conn);
                    let message = websocket::begin_message(&mut conn.out);
                    let limit = ctx.engine.config().max_request_bytes;
                    let _ = ctx
                        .engine
                        .write_frame_error(FrameError::TooLarge { limit }, &mut conn.out);
                    websocket::finish_message(&mut conn.out, message);
                    queue_if_behind(conn, mark);
                }
                // Control frames go out at once, between whole messages: a pong does
                // not wait for answers still being computed.
                Some(WsEvent::Ping(payload)) => {
                    conn.partial_since = since;
                    websocket::write_pong(&mut conn.out, &payload);
                }
                Some(WsEvent::Close(code)) => {
                    // Echoed after the answers owed; then the peer closes the socket.
                    conn.read_closed = true;
                    let mark = conn.out.len();
                    websocket::write_close(&mut conn.out, code, "");
                    queue_if_behind(conn, mark);
                }
                Some(WsEvent::Fail(code, why)) => {
                    conn.read_closed = true;
                    let mark = conn.out.len();
                    websocket::write_close(&mut conn.out, Some(code), why);
                    queue_if_behind(conn, mark);
                }
            },
        }
    }
}

/// Counts a frame over the size limit (a line, a WebSocket message) as an invalid
/// request of no method.
fn count_frame_error(ctx: &Ctx, conn: &Conn) {
    if let Some(m) = ctx.pending.metrics() {
        m.call(
            ctx.engine.unknown(),
            conn.info.transport(),
            Some(crate::error::INVALID_REQUEST),
        );
    }
}

/// A WebSocket handshake on an HTTP connection: checks credentials sent with it (the
/// guard's, if set: a bad token is refused `401`; without one, calls on the WebSocket
/// need `rpc.auth` as on TCP), answers `101`, and decodes what follows as frames.
fn upgrade(ctx: &mut Ctx, conn: &mut Conn, key: &[u8; 24], head: &[u8], reply: Reply) {
    let mark = conn.out.len();
    if let Some(guard) = ctx.engine.guard() {
        let headers = Headers::new(head);
        if headers.authorization().is_none() {
            // No credentials of its own: nothing of an earlier request's carries over.
            let _ = guard.authenticate_http(&conn.session, &headers, conn.info.peer());
        } else {
            if let Err(denied) = guard.authenticate_http(&conn.session, &headers, conn.info.peer())
            {
                conn.read_closed = true;
                refuse_unauthenticated(ctx, conn, reply, denied, true);
                queue_if_behind(conn, mark);
                return;
            }
        }
    }
    websocket::write_switch(&mut conn.out, key);
    queue_if_behind(conn, mark);
    conn.decoder = Decoder::Ws(WsDecoder::new(ctx.engine.config().max_request_bytes));
    if let Some(m) = ctx.pending.metrics() {
        m.connections(Transport::Http, -1);
        m.connections(Transport::WebSocket, 1);
    }
    conn.info = Connection::new(Transport::WebSocket, conn.info.peer(), conn.info.id());
}

/// Answers `GET /metrics`: its place kept among the connection's answers while the
/// scrape thread renders it (see [`super::scrape`]); `503` when too many scrapes wait;
/// rendered here only when there is no such thread.
#[cold]
fn scrape(
    ctx: &mut Ctx,
    conn: &mut Conn,
    key: usize,
    reply: Reply,
    head: bool,
    timeout: Option<Duration>,
) {
    let mark = conn.out.len();
    let slot = (conn.next_slot, reply, head);
    match ctx.pending.scrape(key, conn.generation, slot, timeout) {
        Ok(slot) => {
            conn.next_slot += 1;
            conn.slots.push_back(slot);
            return;
        }
        Err(Refused::Full) => {
            let why = http::ScrapeFailed::Busy;
            http::write_metrics_failed(&mut conn.out, why, reply, &ctx.http, head);
        }
        Err(Refused::Gone) => {
            let text = ctx.engine.metrics().map(|m| m.render()).unwrap_or_default();
            http::write_metrics(&mut conn.out, reply, &ctx.http, head, text.as_bytes());
        }
    }
    queue_if_behind(conn, mark);
}

/// If earlier answers are still pending, the bytes just written at `mark` must wait
/// their turn: move them into a ready slot. (The test inline, the move out of line: a
/// call per frame cost ~15 instructions.)
#[inline(always)]
fn queue_if_behind(conn: &mut Conn, mark: usize) {
    if !conn.slots.is_empty() {
        queue_behind(conn, mark);
    }
}

/// [`queue_if_behind`]'s move.
#[cold]
#[inline(never)]
fn queue_behind(conn: &mut Conn, mark: usize) {
    let buf = conn.out.split_off(mark);
    let id = conn.next_slot;
    conn.next_slot += 1;
    conn.slots.push_back(Slot::ready(id, buf));
}

/// [`answer`] for a line of a TCP or Unix connection, the common case kept short:
/// no HTTP head, no WebSocket frame, no credentials per request. A frame that is to be
/// traced, or has calls answered later, takes the general path.
#[inline]
fn answer_line(ctx: &mut Ctx, conn: &mut Conn, key: usize, frame: &[u8]) {
    if ctx.engine.samples_traces() {
        return answer(ctx, conn, key, frame, None, None);
    }
    let mark = conn.out.len();
    let source = Source::new(&conn.info)
        .with_push(PushTo {
            queue: &ctx.push,
            conn: (key, conn.generation),
            subs: &conn.subs,
        })
        .with_session(&conn.session);
    let slot_id = conn.next_slot;
    let mut sink = ctx
        .pending
        .sink(key, conn.generation, slot_id, conn.info.transport());
    let local = sink.counted_in();
    let split = ctx.engine.handle_split_counted(
        frame,
        &source,
        &mut ctx.scratch,
        &mut conn.out,
        &mut sink,
        local,
    );
    match split {
        Split::Done(Outcome::Reply) => conn.out.push(b'\n'),
        Split::Done(Outcome::Nothing) => conn.out.truncate(mark),
        later => return open_slot(ctx, conn, key, frame, later, (mark, mark), None, None),
    }
    queue_if_behind(conn, mark);
}

/// Answers one frame (a line, or an HTTP body, with its head). Cheap calls are
/// answered here, straight into the connection's output; calls answered later (pool,
/// responders) leave a slot with [`Pending`].
#[inline(always)]
fn answer(
    ctx: &mut Ctx,
    conn: &mut Conn,
    key: usize,
    frame: &[u8],
    http: Option<(Reply, Headers<'_>, Option<u32>)>,
    trace: Option<Trace>,
) {
    let mark = conn.out.len();
    // The caller's trace (HTTP `traceparent`), or one of ours for a sampled frame.
    let trace = trace.or_else(|| ctx.engine.sample_trace());
    if let (Some((reply, headers, _)), Some(guard)) = (http, ctx.engine.guard()) {
        // Credentials come with each HTTP request: checked before its body is read.
        if let Err(denied) = guard.authenticate_http(&conn.session, &headers, conn.info.peer()) {
            let sent_token = headers.authorization().is_some();
            refuse_unauthenticated(ctx, conn, reply, denied, sent_token);
            queue_if_behind(conn, mark);
            return;
        }
    }
    // HTTP: room for the head is reserved first, so the JSON is written in place.
    let head = http.map(|(reply, _, _)| {
        let mark = match trace {
            None => http::begin_json_response(&mut conn.out, reply, &ctx.http),
            Some(_) => http::begin_json_response_traced(&mut conn.out, reply, &ctx.http),
        };
        (mark, reply)
    });
    // WebSocket: room for the frame's header, likewise.
    let ws = (http.is_none() && matches!(conn.decoder, Decoder::Ws(_)))
        .then(|| websocket::begin_message(&mut conn.out));
    let body_at = conn.out.len();
    let source = match http {
        Some((_, headers, budget)) => {
            Source::http_headers(&conn.info, headers).with_header_budget(budget)
        }
        // Connections that can carry notifications: TCP, Unix, WebSocket (and stdio,
        // served elsewhere).
        None => Source::new(&conn.info).with_push(PushTo {
            queue: &ctx.push,
            conn: (key, conn.generation),
            subs: &conn.subs,
        }),
    }
    .with_session(&conn.session)
    .with_trace_if(trace.as_ref());
    let slot_id = conn.next_slot;
    let mut sink = ctx
        .pending
        .sink(key, conn.generation, slot_id, conn.info.transport());
    let local = sink.counted_in();
    let split = ctx.engine.handle_split_counted(
        frame,
        &source,
        &mut ctx.scratch,
        &mut conn.out,
        &mut sink,
        local,
    );
    // Only an HTTP answer has a status to say it with.
    let all_limited = head.as_ref().and_then(|_| sink.all_limited());
    if let Split::Done(outcome) = split {
        match (head, outcome) {
            (None, Outcome::Reply) => match ws {
                None => conn.out.push(b'\n'),
                Some(m) => websocket::finish_message(&mut conn.out, m),
            },
            (None, Outcome::Nothing) => conn.out.truncate(ws.unwrap_or(body_at)),
            (Some((h, reply)), Outcome::Reply) if all_limited.is_some() => {
                // Every call was refused by a rate limit: say so in the status too.
                let body = conn.out.split_off(body_at);
                http::cancel_json_response(&mut conn.out, h);
                let secs = all_limited.map_or(1, |l| l.retry_after_secs());
                write_too_many(&mut conn.out, reply, &ctx.http, secs, &body);
            }
            (Some((h, reply)), Outcome::Reply) => match &trace {
                None => http::finish_json_response(&mut conn.out, h, reply, &ctx.http),
                Some(t) => http::finish_json_response_traced(&mut conn.out, h, reply, &ctx.http, t),
            },
            (Some((h, reply)), Outcome::Nothing) => {
                http::cancel_json_response(&mut conn.out, h);
                match all_limited {
                    // Notifications only, every one refused by a rate limit: no body to
                    // send, but the status says so.
                    Some(l) => {
                        write_too_many(&mut conn.out, reply, &ctx.http, l.retry_after_secs(), &[]);
                    }
                    None => http::write_no_content(&mut conn.out, reply, &ctx.http),
                }
            }
        }
        queue_if_behind(conn, mark);
        return;
    }
    // Answers to come: the JSON so far moves into a slot that waits for them.
    open_slot(ctx, conn, key, frame, split, (mark, body_at), head, trace);
}

/// The rest of [`answer`] for a frame with calls answered later: the JSON written so far
/// (from `body_at`) moves into a slot that waits for them; an HTTP head reserved at
/// `head` is taken back (the slot writes its own).
#[cold]
#[inline(never)]
#[allow(clippy::too_many_arguments)]
fn open_slot(
    ctx: &mut Ctx,
    conn: &mut Conn,
    key: usize,
    frame: &[u8],
    split: Split,
    (mark, body_at): (usize, usize),
    head: Option<(http::JsonResponse, Reply)>,
    trace: Option<Trace>,
) {
    let mut json = ctx.pending.spare_buf();
    json.extend_from_slice(&conn.out[body_at..]);
    conn.out.truncate(body_at);
    let reply = head.map(|(h, reply)| {
        http::cancel_json_response(&mut conn.out, h);
        reply
    });
    conn.out.truncate(mark);
    let slot_id = conn.next_slot;
    conn.next_slot += 1;
    let slot = ctx.pending.open(
        &conn.info,
        key,
        conn.generation,
        slot_id,
        split,
        json,
        frame,
        reply,
        trace,
        ctx.engine
            .access_log()
            .and_then(|_| conn.session.identity()),
        &ctx.http,
    );
    conn.slots.push_back(slot);
    conn.release_ready(&ctx.pending);
}

/// `429 Too Many Requests` with `Retry-After: secs` and `body`, the JSON-RPC errors;
/// with no body at all when it is empty (notifications only).
fn write_too_many(out: &mut Vec<u8>, reply: Reply, server: &ServerHeaders, secs: u64, body: &[u8]) {
    let mut digits = itoa::Buffer::new();
    let extra = [("Retry-After", digits.format(secs))];
    if body.is_empty() {
        http::write_head(out, 429, 0, reply, server, &extra);
    } else {
        http::write_json_status(out, 429, reply, server, &extra, body);
    }
}

/// Answers an HTTP request whose credentials the guard refused: 401 with
/// `WWW-Authenticate` and a JSON-RPC error body (`-32040`, id `null`: the body was not
/// read), counted as an authentication failure; or, when its address failed too often
/// to have its token looked at, 429 with `Retry-After` (`-32005`), counted as limited.
#[cold]
fn refuse_unauthenticated(
    ctx: &Ctx,
    conn: &mut Conn,
    reply: Reply,
    denied: crate::guard::Denied,
    sent_token: bool,
) {
    let mut body = Vec::with_capacity(160);
    denied.write_unbound(&mut body);
    if let crate::guard::Denied::AuthThrottled(l) = denied {
        if let Some(m) = ctx.pending.metrics() {
            m.event(crate::metrics::Event::RateLimited);
        }
        write_too_many(&mut conn.out, reply, &ctx.http, l.retry_after_secs(), &body);
        return;
    }
    if let Some(m) = ctx.pending.metrics() {
        m.event(crate::metrics::Event::AuthFailure);
    }
    // RFC 6750 §3: a token was sent but is not valid: `error="invalid_token"`.
    let challenge = if sent_token {
        r#"Bearer realm="ringrpc", error="invalid_token""#
    } else {
        r#"Bearer realm="ringrpc""#
    };
    let extra = [("WWW-Authenticate", challenge)];
    http::write_json_status(&mut conn.out, 401, reply, &ctx.http, &extra, &body);
}

/// After a slot of connection `key` was answered: moves what is ready into the output,
/// writes, resumes reading (answers owed went down, so it may), and closes the
/// connection if it is done.
fn settle(
    ctx: &mut Ctx,
    conns: &mut Slab<Conn>,
    poll: &mio::Poll,
    key: usize,
    again: &mut Vec<(usize, u64)>,
) {
    let Some(conn) = conns.get_mut(key) else {
        return;
    };
    conn.release_ready(&ctx.pending);
    if drive(ctx, conn, key) {
        again.push((key, conn.generation));
    }
    if conn.finished() {
        close(ctx, poll, conns, key);
    }
}

/// The waiting slot `slot` of connection `key`, if that connection (of `generation`)
/// is still there.
fn waiting_slot(
    conns: &mut Slab<Conn>,
    key: usize,
    generation: u64,
    slot: u64,
) -> Option<&mut Slot> {
    let conn = conns.get_mut(key).filter(|c| c.generation == generation)?;
    conn.slots.iter_mut().find(|s| s.id == slot && !s.ready)
}

/// Puts answers given later (pool, responders) into their slots.
fn completions(
    ctx: &mut Ctx,
    conns: &mut Slab<Conn>,
    poll: &mio::Poll,
    again: &mut Vec<(usize, u64)>,
) {
    ctx.pending.rearm();
    // Every answer first, then each connection written once: a burst of completions
    // for one connection costs one write, not one each.
    let mut touched = std::mem::take(&mut ctx.touched);
    while let Some(done) = ctx.pending.next_done() {
        let completed = ctx.pending.complete(
            done,
            |key, generation, slot| waiting_slot(conns, key, generation, slot),
            &ctx.http,
        );
        if let Completed::Into { conn } = completed {
            if touched.last() != Some(&conn) {
                touched.push(conn);
            }
        }
    }
    touched.sort_unstable();
    touched.dedup();
    for conn in touched.drain(..) {
        settle(ctx, conns, poll, conn, again);
    }
    ctx.touched = touched;
}

/// Answers calls whose deadline has passed with `-32001 Request timed out`.
fn expire(ctx: &mut Ctx, conns: &mut Slab<Conn>, poll: &mio::Poll, again: &mut Vec<(usize, u64)>) {
    if ctx.pending.needs_compaction() {
        ctx.pending.compact(|key, generation, slot| {
            conns
                .get(key)
                .filter(|c| c.generation == generation)
                .is_some_and(|c| c.slots.iter().any(|s| s.id == slot && !s.ready))
        });
    }
    let now = Instant::now();
    while let Some((key, generation, slot)) = ctx.pending.next_expired(now) {
        if let Some(s) = waiting_slot(conns, key, generation, slot) {
            ctx.pending.expire(s, &ctx.http);
            settle(ctx, conns, poll, key, again);
        }
    }
}
