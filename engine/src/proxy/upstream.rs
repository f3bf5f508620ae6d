//! The upstream loop: it writes what the lanes queued, reads answers, and gives each to
//! its caller's `Responder` with the upstream's `result` or `error` bytes as they came
//! (the server writes the caller's own id around them). It also times calls out and
//! reconnects lost upstreams.
//!
//! It runs in two places. The upstream thread runs one over the proxy's shared lanes
//! (the `connections` per upstream that every thread may forward to). Each server
//! reactor the proxy is attached to runs one more over lanes of its own (one
//! connection per upstream, see [`OnReactor`]): a call its clients send is written
//! upstream at the end of the reactor's turn and answered when the reactor reads the
//! upstream's answer, on that one thread, with no hand-off to another.

use std::cell::RefCell;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use mio::{Events, Interest, Poll, Token};
use simd_json::Node;

use super::lane::{Call, Lane, Sent};
use super::share::Answer;
use super::timing::quantile;
use super::{later, one_line, HedgeAfter, Shared};
use crate::client::address::Address;
use crate::client::http::Decoder as HttpDecoder;
use crate::codec::raw::RawCtx;
use crate::codec::response::{validate_response, Body};
use crate::codec::tape::{elements, members};
use crate::codec::{Id, LineDecoder};
use crate::engine::Scratch;
use crate::error::{Reason, RpcError};
use crate::metrics::histogram::DURATION_BUCKETS;
use crate::server::attach::{self, Attach, Attached};
use crate::transport::io::read_into;

/// The waker's token; upstream connection `i` has token `i`.
pub(crate) const WAKER: Token = Token(usize::MAX);

/// How often timeouts and reconnects are checked while there is anything to check.
const TICK: Duration = Duration::from_millis(20);
/// The first wait before reconnecting a lost upstream; doubled per failure.
const FIRST_BACKOFF: Duration = Duration::from_millis(50);
/// The longest wait between reconnection attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(2);
/// Calls timed out in a row, with no answer between them, that take an upstream out
/// (the circuit breaker).
const BREAK_AFTER: u32 = 3;
/// How long a health probe may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// The method of health probes: any JSON-RPC answer (`-32601` included) proves the
/// upstream serves.
const PROBE: &[u8] = br#""method":"rpc.proxy.health"}
"#;
/// The window over which quantile hedging measures its groups' upstream times.
const HEDGE_WINDOW: Duration = Duration::from_secs(1);
/// Answers a window needs before its quantile is believed.
const HEDGE_SAMPLES: u64 = 20;
/// Bytes asked of each read(2).
const READ_CHUNK: usize = 64 * 1024;
/// The deepest nesting accepted in an upstream's answer (the server's default).
const MAX_DEPTH: usize = 128;

/// A connected (or connecting) upstream socket.
enum Stream {
    Tcp(mio::net::TcpStream),
    Unix(mio::net::UnixStream),
}

impl Stream {
    fn source(&mut self) -> &mut dyn mio::event::Source {
        match self {
            Self::Tcp(s) => s,
            Self::Unix(s) => s,
        }
    }

    /// The pending error of a non-blocking connect, or whether it is still under way.
    fn connected(&self) -> io::Result<bool> {
        let (err, peer) = match self {
            Self::Tcp(s) => (s.take_error()?, s.peer_addr().map(|_| ())),
            Self::Unix(s) => (s.take_error()?, s.peer_addr().map(|_| ())),
        };
        if let Some(e) = err {
            return Err(e);
        }
        match peer {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotConnected => Ok(false),
            Err(e) => Err(e),
        }
    }
}

impl AsRawFd for Stream {
    fn as_raw_fd(&self) -> RawFd {
        match self {
            Self::Tcp(s) => s.as_raw_fd(),
            Self::Unix(s) => s.as_raw_fd(),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Self::Tcp(s) => s.write(buf),
            Self::Unix(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Where a connection stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// connect(2) issued; writable means done (or failed).
    Connecting,
    /// Requests are written, answers read.
    Open,
    /// Lost or refused; the next attempt is at this time.
    Down(Instant),
}

/// The upstream thread's half of one upstream connection.
struct Link {
    stream: Option<Stream>,
    state: State,
    /// Bytes taken from the lane, written from `written` on.
    wbuf: Vec<u8>,
    written: usize,
    rbuf: BytesMut,
    lines: LineDecoder,
    /// HTTP upstreams: responses decoded off `rbuf` instead of lines.
    http: Option<HttpDecoder>,
    backoff: Duration,
    /// Answers read since this connection was made.
    answered: u64,
    /// Calls timed out in a row with no answer between them.
    stalls: u32,
    /// Taken out by a failure: a new connection must answer a health probe before
    /// calls are sent on it.
    suspect: bool,
    /// The probe in flight: its private id and deadline.
    probe: Option<(u64, Instant)>,
    /// `answered` at the last health check.
    checked: u64,
}

/// Why a connection is dropped.
#[derive(Debug)]
enum Lost {
    Io(io::Error),
    Closed,
    Garbage(&'static str),
    Stalled(&'static str),
}

impl std::fmt::Display for Lost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Io(e) => write!(f, "{e}"),
            Self::Closed => f.write_str("it closed the connection"),
            Self::Garbage(why) => write!(f, "it sent {why}; the connection was dropped"),
            Self::Stalled(why) => write!(f, "it {why}; the connection was dropped"),
        }
    }
}

/// The loop's state.
struct Upstreams {
    shared: Arc<Shared>,
    /// Where its sockets are registered: the upstream thread's poll, or a reactor's.
    registry: mio::Registry,
    /// The lanes it drives (`links[i]` is `lanes[i]`'s connection).
    lanes: Arc<[Lane]>,
    /// They are the proxy's shared lanes (the upstream thread's): their indices are
    /// those subscriptions and hedging know. A reactor's own lanes carry neither.
    shared_lanes: bool,
    /// Link `i` has token `base + i`.
    base: usize,
    links: Vec<Link>,
    scratch: Scratch,
    /// Reused: calls being failed or timed out, slab keys.
    calls: Vec<Call>,
    keys: Vec<usize>,
    last_sweep: Instant,
    /// Calls were resent onto other lanes since their bytes were last taken.
    resent: bool,
    /// When idle connections are next probed (with health checks on).
    next_health: Instant,
    /// Quantile hedging's measures (the shared lanes only).
    hedging: Option<Hedging>,
}

/// Quantile hedging's measure of each group: the delay after which its calls are
/// hedged, from its upstreams' answer times over the last window.
struct Hedging {
    /// The group of each lane.
    lane_group: Vec<usize>,
    /// The upstreams of each group.
    members: Vec<Vec<usize>>,
    /// Each group's delay (`None`: not measured yet, no hedging).
    delays: Vec<Option<Duration>>,
    /// Each group's bucket counts at the window's start.
    seen: Vec<[u64; DURATION_BUCKETS]>,
    window: Instant,
}

impl Hedging {
    fn new(shared: &Shared) -> Self {
        let mut lane_group = vec![0; shared.lanes.len()];
        let mut members = Vec::new();
        for (g, group) in shared.groups.iter().enumerate() {
            let mut ups: Vec<usize> = group
                .lanes
                .iter()
                .map(|&i| shared.lanes[i].upstream)
                .collect();
            ups.dedup();
            for &i in &group.lanes {
                lane_group[i] = g;
            }
            members.push(ups);
        }
        let n = members.len();
        Self {
            lane_group,
            members,
            delays: vec![None; n],
            seen: vec![[0; DURATION_BUCKETS]; n],
            window: Instant::now(),
        }
    }

    /// At the end of a window, each group's delay becomes the `q` quantile of the
    /// answer times its upstreams counted in it (kept when it counted too few).
    fn measure(&mut self, shared: &Shared, now: Instant, q: f64) {
        if now.duration_since(self.window) < HEDGE_WINDOW {
            return;
        }
        self.window = now;
        for (g, ups) in self.members.iter().enumerate() {
            let mut counts = [0u64; DURATION_BUCKETS];
            for &u in ups {
                shared.timings.add_upstream_counts(u, &mut counts);
            }
            let mut window = [0u64; DURATION_BUCKETS];
            for ((w, c), s) in window.iter_mut().zip(&counts).zip(&self.seen[g]) {
                *w = c.wrapping_sub(*s);
            }
            self.seen[g] = counts;
            if let Some(d) = quantile(&window, q, HEDGE_SAMPLES) {
                self.delays[g] = Some(d);
            }
        }
    }
}

/// Runs the upstream thread until the proxy stops (`registry`: `poll`'s).
pub(crate) fn run(shared: Arc<Shared>, mut poll: Poll, registry: mio::Registry) {
    let lanes = Arc::clone(&shared.lanes);
    let mut up = Upstreams::new(shared, registry, lanes, true, 0);
    let mut events = Events::with_capacity(1024);
    loop {
        // Idle, the loop still wakes for the health checks.
        let timeout = up.next_wake();
        if let Err(e) = poll.poll(&mut events, timeout) {
            if e.kind() != io::ErrorKind::Interrupted {
                tracing::error!("proxy: polling the upstream connections failed: {e}");
                break;
            }
        }
        if up.shared.stop.load(Ordering::Acquire) {
            break;
        }
        up.shared.woken.store(false, Ordering::Release);
        for event in &events {
            if event.token() == WAKER {
                continue;
            }
            up.event(event.token().0, event);
        }
        if up.shared.revived.swap(false, Ordering::AcqRel) {
            up.revived();
        }
        up.maybe_sweep();
        // Client subscriptions that ended: an upstream one left without any is
        // unsubscribed, written below in this turn.
        up.shared.subs.reap(&up.shared);
        // Calls resent from a failed connection, and hedged copies, are written in
        // the same turn.
        loop {
            up.take_queued();
            if !std::mem::take(&mut up.resent) {
                break;
            }
        }
    }
    // Stopping: nothing more will be answered from upstream.
    for i in 0..up.links.len() {
        up.fail(i, "the proxy is stopping", false);
    }
}

impl Upstreams {
    /// A loop over `lanes` (the shared ones: `shared_lanes`), their sockets registered
    /// in `registry` under tokens from `base`; it starts connecting them.
    fn new(
        shared: Arc<Shared>,
        registry: mio::Registry,
        lanes: Arc<[Lane]>,
        shared_lanes: bool,
        base: usize,
    ) -> Self {
        let links = lanes
            .iter()
            .map(|_| Link {
                stream: None,
                state: State::Down(Instant::now()),
                wbuf: Vec::with_capacity(64 * 1024),
                written: 0,
                rbuf: BytesMut::with_capacity(READ_CHUNK),
                lines: LineDecoder::new(shared.max_answer_bytes),
                http: None,
                backoff: FIRST_BACKOFF,
                answered: 0,
                stalls: 0,
                suspect: false,
                probe: None,
                checked: 0,
            })
            .collect();
        let next_health = later(Instant::now(), shared.health.unwrap_or_default());
        let hedging = shared_lanes.then(|| Hedging::new(&shared));
        let mut up = Self {
            shared,
            registry,
            lanes,
            shared_lanes,
            base,
            links,
            scratch: Scratch::with_max_depth(MAX_DEPTH),
            calls: Vec::new(),
            keys: Vec::new(),
            last_sweep: Instant::now(),
            resent: false,
            next_health,
            hedging,
        };
        for i in 0..up.links.len() {
            up.connect(i);
        }
        up
    }

    /// How long the loop may sleep without events: a tick while anything is to be
    /// timed out or reconnected, else until the next health check.
    fn next_wake(&self) -> Option<Duration> {
        if self.needs_ticks() {
            Some(TICK)
        } else {
            self.shared.health
        }
    }

    /// Serves an event of link `i`'s socket.
    fn event(&mut self, i: usize, event: &mio::event::Event) {
        if i >= self.links.len() {
            return;
        }
        if event.is_writable() || event.is_error() {
            self.on_writable(i);
        }
        if event.is_readable() || event.is_read_closed() {
            self.on_readable(i, event.is_read_closed() || event.is_error());
        }
    }

    /// Sweeps (timeouts, reconnects, health checks) if a tick has passed since the last.
    fn maybe_sweep(&mut self) {
        let now = Instant::now();
        if now.duration_since(self.last_sweep) >= TICK {
            self.last_sweep = now;
            self.sweep(now);
        }
    }

    fn lane(&self, i: usize) -> &Lane {
        &self.lanes[i]
    }

    /// Lane `i`'s index among the proxy's shared lanes, if it is one of them.
    fn shared_index(&self, i: usize) -> Option<usize> {
        self.shared_lanes.then_some(i)
    }

    /// Whether timeouts or reconnects need the loop to wake without events.
    fn needs_ticks(&self) -> bool {
        self.links.iter().enumerate().any(|(i, l)| {
            matches!(l.state, State::Down(_))
                || l.probe.is_some()
                || self.lane(i).outstanding.load(Ordering::Relaxed) > 0
        })
    }

    /// Starts connecting link `i`; a failure to even start marks it down.
    fn connect(&mut self, i: usize) {
        let u = self.lane(i).upstream;
        let address = &self.shared.upstreams[u].address;
        let http = matches!(address, Address::Http { .. });
        let stream = match address {
            Address::Unix(path) => mio::net::UnixStream::connect(path).map(Stream::Unix),
            _ => match self.shared.upstreams[u].resolved.get() {
                Some(addr) => mio::net::TcpStream::connect(addr).map(|s| {
                    let _ = s.set_nodelay(true);
                    Stream::Tcp(s)
                }),
                None => Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    "its name is not resolved (yet)",
                )),
            },
        };
        let mut stream = match stream {
            Ok(s) => s,
            Err(e) => return self.down(i, &Lost::Io(e)),
        };
        if let Err(e) = self.registry.register(
            stream.source(),
            Token(self.base + i),
            Interest::READABLE | Interest::WRITABLE,
        ) {
            return self.down(i, &Lost::Io(e));
        }
        let link = &mut self.links[i];
        link.stream = Some(stream);
        link.state = State::Connecting;
        link.wbuf.clear();
        link.written = 0;
        link.rbuf.clear();
        link.lines = LineDecoder::new(self.shared.max_answer_bytes);
        link.http = http.then(HttpDecoder::default);
        link.answered = 0;
        link.checked = 0;
        link.stalls = 0;
        link.probe = None;
        if !link.suspect {
            self.lane(i).up.store(true, Ordering::Release);
        }
    }

    fn on_writable(&mut self, i: usize) {
        let link = &mut self.links[i];
        if link.state == State::Connecting {
            match link.stream.as_ref().map(Stream::connected) {
                Some(Ok(true)) => self.opened(i),
                Some(Ok(false)) => return,
                Some(Err(e)) => return self.down(i, &Lost::Io(e)),
                None => return,
            }
        }
        self.flush(i);
    }

    /// Link `i`'s connection is made. After a failure it must first answer a health
    /// probe (the lane stays out until then).
    fn opened(&mut self, i: usize) {
        let link = &mut self.links[i];
        link.state = State::Open;
        if !link.suspect {
            link.backoff = FIRST_BACKOFF;
            return;
        }
        self.probe(i, PROBE_TIMEOUT);
    }

    /// Sends link `i` a health probe, to be answered within `timeout`.
    fn probe(&mut self, i: usize, timeout: Duration) {
        let lane = &self.lanes[i];
        let mut q = lane.lock();
        let id = q.next_id();
        q.write(id, PROBE);
        lane.has_out.store(true, Ordering::SeqCst);
        self.links[i].probe = Some((id, Instant::now() + timeout));
    }

    /// Probes the open connections that answered nothing since the last check and
    /// have no call outstanding (one with calls is watched by their timeouts: a slow
    /// call ahead of a probe must not fail it).
    fn check_health(&mut self, every: Duration) {
        for i in 0..self.links.len() {
            let link = &self.links[i];
            let idle = self.lane(i).outstanding.load(Ordering::Relaxed) == 0;
            if link.state == State::Open
                && link.probe.is_none()
                && idle
                && link.answered == link.checked
            {
                self.probe(i, every.min(PROBE_TIMEOUT));
            }
            let link = &mut self.links[i];
            link.checked = link.answered;
        }
    }

    /// The probe of link `i` was answered: calls may go there again.
    fn healthy(&mut self, i: usize) {
        let link = &mut self.links[i];
        link.probe = None;
        // The probe's own answer is no sign of use: the next check probes again.
        link.checked = link.answered;
        link.suspect = false;
        link.backoff = FIRST_BACKOFF;
        self.lane(i).up.store(true, Ordering::Release);
    }

    /// Reconnects now the shared lanes another connection's first answer brought back
    /// (see `Shared::revive`: they are up while their link is still out after a
    /// failure), without a probe: that answer showed the upstream serves.
    fn revived(&mut self) {
        for i in 0..self.links.len() {
            let link = &mut self.links[i];
            // Up and suspect only when revived: a failure clears `up`, and only a
            // probe's answer sets it again on a suspect link.
            if !link.suspect || !self.lanes[i].up.load(Ordering::Acquire) {
                continue;
            }
            link.suspect = false;
            link.backoff = FIRST_BACKOFF;
            if matches!(link.state, State::Down(_)) {
                self.connect(i);
            }
        }
    }

    /// Writes what link `i` holds until done or the socket is full.
    fn flush(&mut self, i: usize) {
        let link = &mut self.links[i];
        if link.state != State::Open {
            return;
        }
        let Some(stream) = link.stream.as_mut() else {
            return;
        };
        while link.written < link.wbuf.len() {
            match stream.write(&link.wbuf[link.written..]) {
                Ok(0) => return self.down(i, &Lost::Closed),
                Ok(n) => link.written += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return self.down(i, &Lost::Io(e)),
            }
        }
        link.wbuf.clear();
        link.written = 0;
    }

    /// Moves what forwarding threads queued into the links, and writes it.
    fn take_queued(&mut self) {
        for i in 0..self.links.len() {
            let lane = &self.lanes[i];
            if !lane.has_out.load(Ordering::Acquire) {
                continue;
            }
            let link = &mut self.links[i];
            if matches!(link.state, State::Down(_)) {
                // Queued between the connection's loss and the lane's marking: fail
                // them now rather than at the next attempt. (A lane still up is
                // reconnecting: its bytes wait for the connection.)
                if !lane.up.load(Ordering::Acquire) {
                    self.fail(i, "the connection is down", true);
                }
                continue;
            }
            {
                let now = Instant::now();
                let mut q = lane.lock();
                // A sub-batch being written goes as it is; the batch's later
                // elements start another.
                q.close();
                q.taken(now);
                lane.has_out.store(false, Ordering::Release);
                if link.wbuf.is_empty() {
                    std::mem::swap(&mut link.wbuf, &mut q.out);
                } else {
                    link.wbuf.extend_from_slice(&q.out);
                    q.out.clear();
                }
            }
            self.flush(i);
        }
    }

    /// Reads link `i`'s answers. A read shorter than asked emptied the socket, and
    /// edge-triggered readiness reports any byte arriving after it: reading on until
    /// `WouldBlock` would cost a system call per wake-up for nothing, so it stops there
    /// unless the peer closed (`closed`: then reading goes on to the end of stream).
    fn on_readable(&mut self, i: usize, closed: bool) {
        if self.links[i].state == State::Connecting {
            // Readable before writable: the connect failed (or data came early).
            match self.links[i].stream.as_ref().map(Stream::connected) {
                Some(Ok(true)) => self.opened(i),
                Some(Ok(false)) | None => return,
                Some(Err(e)) => return self.down(i, &Lost::Io(e)),
            }
        }
        loop {
            let link = &mut self.links[i];
            let Some(stream) = link.stream.as_mut() else {
                return;
            };
            let n = read_into(stream.as_raw_fd(), &mut link.rbuf, READ_CHUNK);
            match n {
                Ok(0) => {
                    let _ = self.answers(i, true);
                    return self.down(i, &Lost::Closed);
                }
                Ok(n) => {
                    if let Err(lost) = self.answers(i, false) {
                        return self.down(i, &lost);
                    }
                    if n < READ_CHUNK && !closed {
                        return;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return self.down(i, &Lost::Io(e)),
            }
        }
    }

    /// Relays every whole answer in link `i`'s read buffer (`eof`: the upstream has
    /// closed, so a body delimited by the close is whole).
    fn answers(&mut self, i: usize, eof: bool) -> Result<(), Lost> {
        if self.links[i].http.is_some() {
            return self.http_answers(i, eof);
        }
        loop {
            let link = &mut self.links[i];
            let max = self.shared.max_answer_bytes;
            // An answer about to be found over the limit: the call it answers is failed
            // if its id comes early enough to be read; the rest of the line is skipped
            // and the connection kept (the other calls on it are fine).
            let oversized = !link.lines.is_discarding()
                && link.rbuf.len() > max + 1
                && memchr::memchr(b'\n', &link.rbuf[..=max + 1]).is_none();
            let id = oversized.then(|| leading_id(&link.rbuf)).flatten();
            let mut line = match link.lines.decode(&mut link.rbuf) {
                Ok(Some(line)) => line,
                Ok(None) => return Ok(()),
                Err(_) => {
                    let lane = &self.lanes[i];
                    if let Some(call) = id.and_then(|id| lane.take(id)) {
                        let why = format!(
                            "Server busy: the upstream's answer is over the proxy's \
                             max_answer_bytes ({max})"
                        );
                        let e = RpcError::new(Reason::UpstreamUnavailable, why);
                        self.shared.finish(call.reply, &Answer::Error(&e));
                    }
                    tracing::warn!(
                        "proxy: upstream {} sent an answer over max_answer_bytes ({max}); \
                         it was dropped",
                        self.shared.upstreams[lane.upstream].url
                    );
                    continue;
                }
            };
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            link.answered += 1;
            link.stalls = 0;
            let first = link.answered == 1;
            one_line(&mut line);
            let probe = link.probe.map(|(id, _)| id);
            let lane = &self.lanes[i];
            let seen = timer(&self.shared, lane.upstream);
            let shared_index = self.shared_index(i);
            if relay(
                &mut self.scratch,
                &line,
                &self.shared,
                (shared_index, lane),
                probe,
                seen,
            )? {
                self.healthy(i);
            }
            if first {
                // A new connection's first answer, a JSON-RPC one: its upstream
                // serves. (Garbage, which drops the connection, shows nothing: it
                // must not bring lanes back from their backoff.)
                self.shared.revive(self.lanes[i].upstream);
            }
        }
    }

    /// Relays every whole HTTP response in link `i`'s read buffer, each to the oldest
    /// request without one (HTTP/1.1 answers in order).
    fn http_answers(&mut self, i: usize, eof: bool) -> Result<(), Lost> {
        loop {
            let link = &mut self.links[i];
            let Some(decoder) = link.http.as_mut() else {
                return Ok(());
            };
            let mut reply = match decoder.decode(&mut link.rbuf, self.shared.max_answer_bytes, eof)
            {
                Ok(Some(reply)) => reply,
                Ok(None) => return Ok(()),
                Err(_) => return Err(Lost::Garbage("a malformed HTTP response")),
            };
            link.answered += 1;
            link.stalls = 0;
            let first = link.answered == 1;
            one_line(&mut reply.body);
            let probe = link.probe.map(|(id, _)| id);
            let lane = &self.lanes[i];
            let Some(sent) = lane.lock().answered() else {
                return Err(Lost::Garbage("an HTTP response to no request"));
            };
            if matches!(sent, Sent::One(id) if Some(id) == probe) {
                // Any response proves the upstream serves.
                self.healthy(i);
                if first {
                    self.shared.revive(self.lanes[i].upstream);
                }
                if reply.close {
                    return Err(Lost::Closed);
                }
                continue;
            }
            let seen = timer(&self.shared, lane.upstream);
            let relayed = relay_http(
                &mut self.scratch,
                &self.shared,
                (reply.status, &reply.body),
                &sent,
                lane,
                seen,
            );
            if let Sent::Batch(members) = sent {
                lane.lock().keep_members(members);
            }
            relayed?;
            if first {
                // A new connection's first response: its upstream serves.
                self.shared.revive(self.lanes[i].upstream);
            }
            if reply.close {
                return Err(Lost::Closed);
            }
        }
    }

    /// Marks link `i` down: its calls fail, and it is reconnected after a backoff.
    fn down(&mut self, i: usize, why: &Lost) {
        let url = &self.shared.upstreams[self.lane(i).upstream].url;
        let link = &mut self.links[i];
        // An upstream that closes a connection it served (an idle timeout, HTTP's
        // `Connection: close`) is not down: reconnect at once, and keep sending to it.
        // Anything else (refused, reset, garbage, a close before any answer) takes it
        // out until a reconnection, tried after a growing backoff, succeeds.
        let quick = matches!(why, Lost::Closed) && link.answered > 0;
        let why = format!("upstream {url} is unavailable: {why}");
        if quick {
            tracing::debug!("proxy: {why}; reconnecting");
        } else {
            tracing::warn!("proxy: {why}");
        }
        if let Some(mut s) = link.stream.take() {
            let _ = self.registry.deregister(s.source());
        }
        link.wbuf.clear();
        link.written = 0;
        if quick {
            link.state = State::Down(Instant::now());
        } else {
            // Its name may have moved: looked up again before the next attempt.
            super::resolve::again(&self.shared, self.lanes[i].upstream);
            link.state = State::Down(Instant::now() + link.backoff);
            link.backoff = (link.backoff * 2).min(MAX_BACKOFF);
            link.suspect = true;
            link.probe = None;
            self.lane(i).up.store(false, Ordering::Release);
        }
        self.fail(i, &why, true);
        if quick {
            self.connect(i);
        }
    }

    /// Takes every call waiting on link `i`: with `resend`, idempotent ones go to
    /// another upstream of their group if one is up; the rest are answered
    /// `upstream_unavailable`.
    fn fail(&mut self, i: usize, why: &str, resend: bool) {
        let mut calls = std::mem::take(&mut self.calls);
        if self.lane(i).up.load(Ordering::Acquire) && resend {
            // Reconnecting at once: calls never written wait for the new connection.
            self.lanes[i].drain_written(&mut self.keys, &mut calls);
        } else {
            self.lanes[i].drain(&mut calls);
        }
        for call in calls.drain(..) {
            let call = if resend {
                // A lane still up (reconnecting at once) may take its own calls back.
                // (A reactor's own lane is no shared lane: any of those may take it.)
                let lost = !self.lane(i).up.load(Ordering::Acquire);
                let except = lost.then_some(i).and_then(|i| self.shared_index(i));
                // A reactor's own connection that went down: its upstream is avoided.
                let down = (lost && !self.shared_lanes).then(|| self.lane(i).upstream);
                match self.shared.resend(call, except, down) {
                    None => {
                        self.resent = true;
                        continue;
                    }
                    Some(call) => call,
                }
            } else {
                call
            };
            let e = RpcError::new(Reason::UpstreamUnavailable, format!("Server busy: {why}"));
            self.shared.finish(call.reply, &Answer::Error(&e));
        }
        self.calls = calls;
        // The subscriptions this connection carried are gone with it.
        if let Some(i) = self.shared_index(i) {
            self.shared.subs.lost(i, why);
        }
    }

    /// Sends copies of idempotent calls waiting longer than `after` to other upstreams,
    /// within the budget of `fraction` of the idempotent calls forwarded.
    fn hedge(&mut self, now: Instant, after: HedgeAfter, fraction: f64) {
        let Some(hedging) = self.hedging.as_mut() else {
            return;
        };
        if let HedgeAfter::Quantile(q) = after {
            hedging.measure(&self.shared, now, q);
        }
        let forwarded = self.shared.forwarded.load(Ordering::Relaxed) as f64;
        let hedged = self.shared.hedged.load(Ordering::Relaxed) as f64;
        let mut budget = (forwarded * fraction - hedged).max(0.0) as usize;
        for i in 0..self.links.len() {
            if budget == 0 {
                return;
            }
            let lane = &self.lanes[i];
            if lane.outstanding.load(Ordering::Relaxed) == 0 {
                continue;
            }
            let delay = match after {
                HedgeAfter::Fixed(d) => Some(d),
                HedgeAfter::Quantile(_) => self
                    .hedging
                    .as_ref()
                    .and_then(|h| h.delays[h.lane_group[i]]),
            };
            let Some(cutoff) = delay.and_then(|d| now.checked_sub(d)) else {
                continue;
            };
            let mut copies = Vec::new();
            lane.hedge(cutoff, budget, &mut copies);
            budget -= copies.len();
            for copy in copies {
                self.shared.send_copy(copy, i);
                self.resent = true;
            }
        }
    }

    /// Times out calls past their deadline, and reconnects links whose backoff is over.
    fn sweep(&mut self, now: Instant) {
        if self.shared_lanes {
            // The proxy's own work, done once (on the upstream thread): a reactor's
            // lanes carry no subscriptions, and no calls that may be hedged.
            self.shared.subs.sweep(now);
            if let Some((after, fraction)) = self.shared.hedge {
                self.hedge(now, after, fraction);
            }
        }
        if let Some(every) = self.shared.health {
            if now >= self.next_health {
                self.next_health = later(now, every);
                self.check_health(every);
            }
        }
        for i in 0..self.links.len() {
            let lane = &self.lanes[i];
            if lane.outstanding.load(Ordering::Relaxed) > 0 {
                lane.expired(now, &mut self.keys, &mut self.calls);
                // Only the proxy's own timeout says the upstream stalls: a caller's
                // short budget must not let one client take an upstream out.
                let mut expired = 0u32;
                for call in self.calls.drain(..) {
                    let e = if call.deadline.callers {
                        RpcError::new(
                            Reason::UpstreamTimeout,
                            "Request timed out: the upstream did not answer within the \
                             call's deadline",
                        )
                    } else {
                        expired = expired.saturating_add(1);
                        RpcError::new(
                            Reason::UpstreamTimeout,
                            "Request timed out: the upstream did not answer within the \
                             proxy's upstream timeout",
                        )
                    };
                    self.shared.finish(call.reply, &Answer::Error(&e));
                }
                let link = &mut self.links[i];
                link.stalls = link.stalls.saturating_add(expired);
                if link.stalls >= BREAK_AFTER && link.state == State::Open {
                    self.down(i, &Lost::Stalled("left calls unanswered past the timeout"));
                    continue;
                }
            }
            if matches!(self.links[i].probe, Some((_, at)) if at <= now) {
                self.down(i, &Lost::Stalled("did not answer a health probe in time"));
                continue;
            }
            if matches!(self.links[i].state, State::Down(at) if at <= now) {
                self.connect(i);
            }
        }
    }
}

/// A reactor's own lanes for one proxy: the address of the proxy's `Shared`, the lanes
/// (one per upstream), and a xorshift state that picks where a search for the least
/// loaded lane starts (equally loaded lanes are chosen at random: a counter would fall
/// in step with a client's pattern of calls, say sending every other method to the
/// same upstream).
struct Own {
    shared: usize,
    lanes: Arc<[Lane]>,
    seed: u64,
}

thread_local! {
    /// The lanes of the reactor running on this thread, per proxy attached to it:
    /// where its calls go.
    static OWN: RefCell<Vec<Own>> = const { RefCell::new(Vec::new()) };
}

/// On a reactor thread with lanes of its own for `shared`: the lane (one per upstream)
/// of `upstreams` that is up and has the fewest calls outstanding.
pub(crate) fn own_lane(shared: &Shared, upstreams: &[usize]) -> Option<(Arc<[Lane]>, usize)> {
    if !shared.reactor_lanes {
        return None;
    }
    let me = std::ptr::from_ref(shared) as usize;
    OWN.with(|own| {
        let mut own = own.borrow_mut();
        let Own { lanes, seed, .. } = own.iter_mut().find(|o| o.shared == me)?;
        // xorshift64* (state never 0), its output's high half: xorshift64's own low
        // bits change slowly from a seed with long runs of equal bits, and the low bit
        // alone chose between two upstreams.
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        let start = (seed.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 32) as usize;
        let lanes: &Arc<[Lane]> = lanes;
        super::least_loaded(upstreams, start, |u| lanes.get(u)).map(|u| (Arc::clone(lanes), u))
    })
}

/// The proxy's part in every server reactor (see the module docs): a connection of
/// the reactor's own to each upstream.
pub(crate) struct Attachment {
    shared: Arc<Shared>,
}

impl Attachment {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        Self { shared }
    }
}

impl Attach for Attachment {
    fn attach(&self, registry: &mio::Registry, base: usize) -> Option<Box<dyn Attached>> {
        let shared = &self.shared;
        if shared.upstreams.len() > attach::SPAN || shared.stop.load(Ordering::Acquire) {
            return None;
        }
        let registry = match registry.try_clone() {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!("proxy: a reactor's own upstream connections: {e}");
                return None;
            }
        };
        let lanes: Arc<[Lane]> = shared
            .upstreams
            .iter()
            .enumerate()
            .map(|(u, up)| Lane::new(u, up.http_head.clone(), up.batch_max))
            .collect();
        let me = Arc::as_ptr(shared) as usize;
        OWN.with(|own| {
            own.borrow_mut().push(Own {
                shared: me,
                lanes: Arc::clone(&lanes),
                // Random, not the address: an allocation's address has long runs of
                // zeros, which xorshift64 spreads only slowly.
                seed: crate::trace::random() | 1,
            })
        });
        let up = Upstreams::new(Arc::clone(shared), registry, lanes, false, base);
        Some(Box::new(OnReactor { up, stopped: false }))
    }
}

/// A reactor's own upstream connections, driven by its loop: calls its clients
/// forward are queued on its lanes during the turn, written at the turn's end (one
/// write per connection per turn, as the upstream thread gathers them), and answered
/// when the reactor reads the upstream's answers — into the reactor's completion
/// queue, drained in the same turn without a wake-up.
struct OnReactor {
    up: Upstreams,
    /// The proxy was dropped: its calls here were answered and no more come.
    stopped: bool,
}

impl OnReactor {
    /// Answers every call waiting here `upstream_unavailable`, closes the connections
    /// and takes the lanes out (new calls go to the shared lanes).
    fn stop(&mut self, why: &str) {
        if std::mem::replace(&mut self.stopped, true) {
            return;
        }
        for i in 0..self.up.links.len() {
            self.up.lane(i).up.store(false, Ordering::Release);
            if let Some(mut s) = self.up.links[i].stream.take() {
                let _ = self.up.registry.deregister(s.source());
            }
            self.up.links[i].state = State::Down(later(Instant::now(), MAX_BACKOFF));
            self.up.fail(i, why, false);
        }
    }
}

impl Attached for OnReactor {
    fn event(&mut self, token: usize, event: &mio::event::Event) {
        if !self.stopped {
            self.up.event(token, event);
        }
    }

    fn turn_end(&mut self) {
        if self.stopped {
            return;
        }
        if self.up.shared.stop.load(Ordering::Acquire) {
            return self.stop("the proxy is stopping");
        }
        self.up.maybe_sweep();
        self.up.take_queued();
        // Calls resent from a lost connection went to the shared lanes.
        if std::mem::take(&mut self.up.resent) {
            self.up.shared.wake();
        }
    }

    fn next_wake(&self) -> Option<Duration> {
        if self.stopped {
            return None;
        }
        self.up.next_wake()
    }
}

impl Drop for OnReactor {
    fn drop(&mut self) {
        self.stop("the server is stopping");
        let lanes = &self.up.lanes;
        // The thread may be gone already (its locals torn down): nothing to remove then.
        let _ = OWN.try_with(|own| {
            own.borrow_mut().retain(|o| !Arc::ptr_eq(&o.lanes, lanes));
        });
    }
}

/// Gives one answer line to the call it answers. An answer for no waiting call (late,
/// after a timeout) is dropped; an answer that is not a JSON-RPC response is garbage.
/// `Ok(true)`: it answered the health probe `probe`.
fn relay(
    scratch: &mut Scratch,
    line: &[u8],
    shared: &Shared,
    lane: (Option<usize>, &Lane),
    probe: Option<u64>,
    seen: impl Fn(&Call),
) -> Result<bool, Lost> {
    scratch.parse(line, |parsed| {
        let raw = parsed.map_err(|_| Lost::Garbage("invalid JSON"))?;
        if !matches!(raw.root.first(), Some(Node::Array { .. })) {
            return relay_one(shared, lane, raw, raw.root, probe, &seen);
        }
        // A sub-batch's answers: each goes to its call by its id.
        let mut probed = false;
        for elem in elements(raw.root) {
            probed |= relay_one(shared, lane, raw, elem, probe, &seen)?;
        }
        Ok(probed)
    })
}

/// Gives the answer `nodes` (the whole line, or an element of a batch answer) to the
/// call it answers (see [`relay`]). `i`: the lane's index among the shared lanes
/// (`None`: a reactor's own lane, which carries no subscriptions).
fn relay_one(
    shared: &Shared,
    (i, lane): (Option<usize>, &Lane),
    raw: RawCtx<'_>,
    nodes: &[Node<'_>],
    probe: Option<u64>,
    seen: &impl Fn(&Call),
) -> Result<bool, Lost> {
    let Ok(response) = validate_response(nodes) else {
        if is_notification(nodes) {
            // An upstream's server push: a forwarded subscription's notification, or
            // (with none forwarded) one with nowhere to go — no fault of the
            // connection's either way.
            match i {
                Some(i) if !shared.subs.kinds.is_empty() => {
                    shared.subs.notify(shared, i, raw, nodes);
                }
                _ => tracing::debug!("proxy: an upstream sent a notification; dropped"),
            }
            return Ok(false);
        }
        return Err(Lost::Garbage("something that is not a JSON-RPC response"));
    };
    let Id::UInt(id) = response.id else {
        // Not an id the proxy sends (an upstream's error with id null, say).
        return Ok(false);
    };
    if Some(id) == probe {
        return Ok(true);
    }
    let Some(call) = lane.take(id) else {
        // Late (timed out), or an unsubscribe's answer; a timed-out subscribe that
        // succeeded after all is unsubscribed.
        if let Some(i) = i {
            shared.subs.late(shared, i, id, || match response.body {
                Body::Result(value) => raw.value_text(value),
                Body::Error { .. } => None,
            });
        }
        return Ok(false);
    };
    seen(&call);
    match answer_of(raw, nodes, response.body) {
        Some(a) => {
            shared.finish(call.reply, &a);
            Ok(false)
        }
        None => {
            fail(shared, call, UNFOUND);
            Err(Lost::Garbage(UNFOUND))
        }
    }
}

/// Whether `nodes` is a request object without an id (a notification, as a server
/// pushes them): an object with a `method` member and no `id`.
fn is_notification(nodes: &[Node<'_>]) -> bool {
    matches!(nodes.first(), Some(Node::Object { .. }))
        && members(nodes)
            .filter_map(Result::ok)
            .any(|(k, _)| k == "method")
        && !members(nodes)
            .filter_map(Result::ok)
            .any(|(k, _)| k == "id")
}

/// Gives one HTTP response to the request `sent` it answers (`Sent::One(0)`: a
/// notification's, whose answer is dropped). A body that is a JSON-RPC response is
/// relayed whatever the status (an upstream's 401 or 429 carries its JSON-RPC error);
/// anything else fails the request's calls, and the connection stays (HTTP framing is
/// intact). A single answer whose id is another private id than its request's is
/// garbage: the responses are out of step with the requests (an extra or unsolicited
/// response), and trusting the order would give later callers each other's answers.
fn relay_http(
    scratch: &mut Scratch,
    shared: &Shared,
    (status, body): (u16, &[u8]),
    sent: &Sent,
    lane: &Lane,
    seen: impl Fn(&Call),
) -> Result<(), Lost> {
    let members: &[u64] = match sent {
        Sent::One(0) => return Ok(()),
        Sent::One(id) => std::slice::from_ref(id),
        Sent::Batch(members) => members,
    };
    let single = matches!(sent, Sent::One(_));
    let mut astray = false;
    scratch.parse(body, |parsed| {
        let Ok(raw) = parsed else { return };
        if let Some(Node::Array { .. }) = raw.root.first() {
            // A sub-batch's answers, each to its call by its id.
            for elem in elements(raw.root) {
                let Ok(response) = validate_response(elem) else {
                    continue;
                };
                let Id::UInt(id) = response.id else { continue };
                if !members.contains(&id) {
                    continue;
                }
                if let Some(call) = lane.take(id) {
                    seen(&call);
                    match answer_of(raw, elem, response.body) {
                        Some(a) => shared.finish(call.reply, &a),
                        None => fail(shared, call, UNFOUND),
                    }
                }
            }
            return;
        }
        let Ok(response) = validate_response(raw.root) else {
            return;
        };
        if single && !matches!(response.id, Id::Null) && response.id != Id::UInt(members[0]) {
            astray = true;
            return;
        }
        let Some(answer) = answer_of(raw, raw.root, response.body) else {
            return;
        };
        // One answer: to the request's one call whatever its id says (HTTP/1.1's
        // order says which request it answers; an upstream that could not read the
        // request answers with id null); to a sub-batch, it is its call's if its id
        // is one of them, else (an error, id null: the batch refused as a whole) every
        // call's.
        match response.id {
            Id::UInt(id) if !single && members.contains(&id) => {
                if let Some(call) = lane.take(id) {
                    seen(&call);
                    shared.finish(call.reply, &answer);
                }
            }
            _ if single || matches!(answer, Answer::Relayed(..)) => {
                for &id in members {
                    if let Some(call) = lane.take(id) {
                        seen(&call);
                        shared.finish(call.reply, &answer);
                    }
                }
            }
            _ => {}
        }
    });
    if astray {
        // The connection goes down: its calls (this one too) fail or are resent.
        return Err(Lost::Garbage("an HTTP response for another request"));
    }
    // Calls the response did not answer.
    for &id in members {
        if let Some(call) = lane.take(id) {
            seen(&call);
            let why = if single {
                format!(
                    "Server busy: the upstream answered HTTP {status} without a JSON-RPC response"
                )
            } else {
                format!("Server busy: the upstream answered HTTP {status} to a batch without an answer for this call")
            };
            let e = RpcError::new(Reason::UpstreamUnavailable, why);
            shared.finish(call.reply, &Answer::Error(&e));
        }
    }
    Ok(())
}

/// The top-level `"id"` of the JSON object that `text` begins (an answer too long to
/// be parsed whole), if it is in `text` and an unsigned integer (a private id).
/// Strings are skipped with their escapes, so an `"id"` inside the result is not taken.
fn leading_id(text: &[u8]) -> Option<u64> {
    if text.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return None;
    }
    let mut depth = 0u32;
    let mut key_next = false;
    let mut i = 0;
    while let Some(&b) = text.get(i) {
        match b {
            b'"' => {
                let start = i + 1;
                let mut end = start;
                loop {
                    match *text.get(end)? {
                        b'\\' => end += 2,
                        b'"' => break,
                        _ => end += 1,
                    }
                }
                if depth == 1 && std::mem::take(&mut key_next) && &text[start..end] == b"id" {
                    let rest = &text[end + 1..];
                    let colon = rest.iter().position(|b| !b.is_ascii_whitespace())?;
                    if rest[colon] != b':' {
                        return None;
                    }
                    let value = rest[colon + 1..].trim_ascii_start();
                    let digits = value.iter().take_while(|b| b.is_ascii_digit()).count();
                    // The number must end inside `text` to be whole.
                    if digits == 0 || digits == value.len() {
                        return None;
                    }
                    return std::str::from_utf8(&value[..digits]).ok()?.parse().ok();
                }
                i = end + 1;
                continue;
            }
            b'{' | b'[' => {
                depth += 1;
                key_next = depth == 1;
            }
            b'}' | b']' => depth = depth.checked_sub(1)?,
            b',' if depth == 1 => key_next = true,
            _ => {}
        }
        i += 1;
    }
    None
}

/// Why an answer is dropped when its `result` or `error` text cannot be found.
const UNFOUND: &str = "an answer whose text could not be found";

/// Answers `call` with the proxy's `upstream_unavailable` error for `why`.
fn fail(shared: &Shared, call: Call, why: &str) {
    let e = RpcError::new(
        Reason::UpstreamUnavailable,
        format!("Server busy: the upstream sent {why}"),
    );
    shared.finish(call.reply, &Answer::Error(&e));
}

/// Times an answered call into the histograms of upstream `u` (now is when its answer
/// was read).
fn timer(shared: &Shared, u: usize) -> impl Fn(&Call) + '_ {
    move |call| {
        if let Some(at) = call.taken {
            shared.timings.observe(
                u,
                at.saturating_duration_since(call.sent),
                Instant::now().saturating_duration_since(at),
            );
        }
    }
}

/// The answer `nodes` (a response object of `raw`'s tape) carries: its `result` or
/// `error` object's text, as its bytes came.
fn answer_of<'a>(raw: RawCtx<'a>, nodes: &'a [Node<'a>], body: Body<'a>) -> Option<Answer<'a>> {
    match body {
        Body::Result(value) => raw.value_text(value).map(Answer::Result),
        Body::Error { code, .. } => members(nodes)
            .filter_map(Result::ok)
            .find(|(key, _)| *key == "error")
            .and_then(|(_, value)| raw.value_text(value))
            .map(|text| Answer::Relayed(code, text)),
    }
}

#[cfg(test)]
mod tests {
    use super::leading_id;

    #[test]
    fn the_id_of_a_long_answer_is_read_from_its_beginning() {
        assert_eq!(
            leading_id(br#"{"jsonrpc":"2.0","id":1234,"result":"xxxx"#),
            Some(1234)
        );
        assert_eq!(leading_id(br#" { "id" : 7 , "result":[1,"#), Some(7));
        // An "id" inside the result, or inside a string, is not the answer's.
        assert_eq!(
            leading_id(br#"{"result":{"id":5,"a":"\",\"id\":6"},"id":9,"#),
            Some(9)
        );
        assert_eq!(leading_id(br#"{"result":["id",{"id":5}],"x":"#), None);
        // Cut off inside the number, or not a private id.
        assert_eq!(leading_id(br#"{"id":123"#), None);
        assert_eq!(leading_id(br#"{"id":"abc","result":"#), None);
        assert_eq!(leading_id(br#"[{"id":1,"result":"#), None);
    }
}
