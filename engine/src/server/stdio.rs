//! The stdio transport (MCP's convention): newline-delimited requests on stdin, one
//! response line per answered request on stdout, and the notifications of the
//! subscriptions opened on it between them.

use std::cell::RefCell;
use std::io::{self, Read, Write};
use std::sync::Arc;

use bytes::BytesMut;
use mio::unix::SourceFd;
use mio::{Events, Interest, Token};

use crate::dispatch::context::{Connection, Peer, Source, Transport};
use crate::dispatch::subscription::{PushQueue, PushTo, SinkClosed, SubState};
use crate::engine::Engine;
use crate::guard::Session;

/// Bytes asked of each `read`.
const READ_CHUNK: usize = 64 * 1024;
/// Pending output that is written even while input keeps arriving; notifications are
/// added to the output only while it is under this.
const FLUSH_AT: usize = 64 * 1024;

const STDIN: Token = Token(0);
const WAKE: Token = Token(1);

/// Whether stdin has bytes (or end of file) ready, so a `read` would not block.
fn stdin_ready() -> bool {
    let mut fds = libc::pollfd {
        fd: 0,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: `fds` is a valid, initialized pollfd array of length 1 for the duration
    // of the call, and a zero timeout never blocks.
    let n = unsafe { libc::poll(&mut fds, 1, 0) };
    n > 0
}

/// How the loop learns of notifications to write while it would otherwise block
/// reading stdin: an event queue holding stdin and the subscriptions' waker.
struct Pump {
    poll: mio::Poll,
    events: Events,
    /// Whether stdin could be registered. epoll refuses regular files (and devices
    /// such as /dev/null): reading those never blocks, so notifications are written
    /// between reads instead, until end of input.
    waits: bool,
    /// Subscriptions taken from the queue (the list reused).
    ready: Vec<Arc<SubState>>,
    /// Subscriptions with notifications held back while the output was full.
    waiting: Vec<Arc<SubState>>,
}

impl Pump {
    fn new() -> io::Result<(Self, Arc<PushQueue>)> {
        let poll = mio::Poll::new()?;
        let waker = Arc::new(mio::Waker::new(poll.registry(), WAKE)?);
        // Edge-triggered, so the loop asks poll(2) whether stdin is ready before it
        // waits: an edge consumed earlier is never waited for.
        let waits = poll
            .registry()
            .register(&mut SourceFd(&0), STDIN, Interest::READABLE)
            .is_ok();
        let pump = Self {
            poll,
            events: Events::with_capacity(4),
            waits,
            ready: Vec::new(),
            waiting: Vec::new(),
        };
        Ok((pump, PushQueue::new(waker)))
    }

    /// Whether notifications may come: subscriptions are open, or some are held back.
    /// (Plain calls never open one, and keep the loop as it was: a blocking read.)
    fn active(&self, subs: &RefCell<Vec<Arc<SubState>>>) -> bool {
        !self.waiting.is_empty() || !subs.borrow().is_empty()
    }

    /// Writes the notifications queued into `out`, a line each, while it is under
    /// [`FLUSH_AT`]; the rest stay queued on their subscriptions (bounded there) and
    /// are held back until the output is written.
    fn deliver(&mut self, queue: &PushQueue, out: &mut Vec<u8>) {
        queue.take(&mut self.ready);
        // Those held back were ready first.
        let mut ready = std::mem::take(&mut self.waiting);
        ready.append(&mut self.ready);
        for sub in ready.drain(..) {
            let done = sub.deliver(
                out,
                |out, json| {
                    out.extend_from_slice(json);
                    out.push(b'\n');
                },
                |out| out.len() < FLUSH_AT,
            );
            if !done && !self.waiting.iter().any(|s| Arc::ptr_eq(s, &sub)) {
                self.waiting.push(sub);
            }
        }
        self.ready = ready;
    }

    /// Blocks until stdin is readable or a notification is queued (or spuriously).
    fn wait(&mut self) -> io::Result<()> {
        match self.poll.poll(&mut self.events, None) {
            Err(e) if e.kind() != io::ErrorKind::Interrupted => Err(e),
            _ => Ok(()),
        }
    }
}

/// Serves `engine` on stdin/stdout until end of input.
///
/// Output is flushed whenever reading more would block, when 64 KiB are pending, and at
/// end of input. Every method, blocking ones included, runs on this thread, in order.
/// A last line without a newline at end of input is still answered.
///
/// Subscriptions work as on TCP: their notifications, pushed from any thread, are
/// written between answers (each subscription's id answered first) and promptly while
/// the loop waits for input; while stdout is not read, they wait in their
/// subscriptions' bounded queues. End of input ends every subscription
/// ([`SinkClosed::ConnectionClosed`]). As [`Server::run`](crate::server::Server::run)
/// does, it has a Redis de-duplication store make the answers it could not store yet
/// before it returns.
///
/// # Errors
///
/// If reading stdin or writing stdout fails, or the OS refuses an event queue.
pub fn serve_stdio(engine: &Engine) -> io::Result<()> {
    let (mut decoder, mut scratch) = (engine.decoder(), engine.scratch());
    // The process's one connection: its peer is whoever started it.
    let conn = Connection::new(Transport::Stdio, Peer::Unknown, 0);
    let session = Session::new();
    let (mut pump, queue) = Pump::new()?;
    let subs = RefCell::new(Vec::new());
    let push = PushTo {
        queue: &queue,
        // The reactor's key for a connection; the one connection here needs none.
        conn: (0, 0),
        subs: &subs,
    };
    let source = Source::new(&conn).with_session(&session).with_push(push);
    let mut buf = BytesMut::with_capacity(READ_CHUNK);
    let mut out = Vec::with_capacity(FLUSH_AT * 2);
    let mut stdin = io::stdin().lock();
    let mut stdout = io::stdout().lock();
    // The connection and its bytes (the calls count themselves in the engine).
    let metrics = engine.metrics().map(crate::metrics::Metrics::claim);
    let count = |f: &dyn Fn(&crate::metrics::Local)| {
        if let Some(m) = &metrics {
            f(m);
        }
    };
    count(&|m| m.connections(Transport::Stdio, 1));
    let result = (|| loop {
        let pushing = pump.active(&subs);
        if pushing {
            pump.deliver(&queue, &mut out);
        }
        // Whether reading stdin would block: asked at most once a turn, and only with
        // output to write or notifications to wait for.
        let mut idle = None;
        let mut would_block = || *idle.get_or_insert_with(|| !stdin_ready());
        if !out.is_empty() && (out.len() >= FLUSH_AT || would_block()) {
            count(&|m| m.sent(Transport::Stdio, out.len()));
            stdout.write_all(&out)?;
            stdout.flush()?;
            out.clear();
            if !pump.waiting.is_empty() && would_block() {
                // Notifications held back by the full output go next, unless input
                // waits (it is not starved by a producer faster than the reader).
                continue;
            }
        }
        if pushing && pump.waits && would_block() {
            // Subscriptions ended by their producer and delivered are forgotten here:
            // with none left, the loop goes back to plain blocking reads.
            subs.borrow_mut().retain(|s| !s.finished());
            if pump.active(&subs) {
                pump.wait()?;
                continue;
            }
        }
        // Zeroing the free space costs ~1 µs per 64 KiB read, a few ns per request.
        let old = buf.len();
        buf.resize(old + READ_CHUNK, 0);
        let n = match stdin.read(&mut buf[old..]) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {
                buf.truncate(old);
                continue;
            }
            Err(e) => return Err(e),
        };
        buf.truncate(old + n);
        count(&|m| m.received(Transport::Stdio, n));
        if n == 0 {
            if !buf.is_empty() {
                buf.extend_from_slice(b"\n");
                engine.handle_lines_from(&mut buf, &mut decoder, &source, &mut scratch, &mut out);
            }
            // What is owed is answered; no notification follows the end of input.
            push.close_all(SinkClosed::ConnectionClosed);
            count(&|m| m.sent(Transport::Stdio, out.len()));
            stdout.write_all(&out)?;
            return stdout.flush();
        }
        engine.handle_lines_from(&mut buf, &mut decoder, &source, &mut scratch, &mut out);
    })();
    // However the loop ended, its subscriptions' producers are told.
    push.close_all(SinkClosed::ConnectionClosed);
    count(&|m| m.connections(Transport::Stdio, -1));
    engine.flush_dedup();
    result
}
