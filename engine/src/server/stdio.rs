//! The stdio transport (MCP's convention): newline-delimited requests on stdin, one
//! response line per answered request on stdout.

use std::io::{self, Read, Write};

use bytes::BytesMut;

use crate::dispatch::context::{Connection, Peer, Source, Transport};
use crate::engine::Engine;
use crate::guard::Session;

/// Bytes asked of each `read`.
const READ_CHUNK: usize = 64 * 1024;
/// Pending output that is written even while input keeps arriving.
const FLUSH_AT: usize = 64 * 1024;

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

/// Serves `engine` on stdin/stdout until end of input.
///
/// Output is flushed whenever reading more would block, when 64 KiB are pending, and at
/// end of input. Every method, blocking ones included, runs on this thread, in order.
/// A last line without a newline at end of input is still answered.
///
/// # Errors
///
/// If reading stdin or writing stdout fails.
pub fn serve_stdio(engine: &Engine) -> io::Result<()> {
    let (mut decoder, mut scratch) = (engine.decoder(), engine.scratch());
    // The process's one connection: its peer is whoever started it.
    let conn = Connection::new(Transport::Stdio, Peer::Unknown, 0);
    let session = Session::new();
    let source = Source::new(&conn).with_session(&session);
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
        if !out.is_empty() && (out.len() >= FLUSH_AT || !stdin_ready()) {
            count(&|m| m.sent(Transport::Stdio, out.len()));
            stdout.write_all(&out)?;
            stdout.flush()?;
            out.clear();
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
            count(&|m| m.sent(Transport::Stdio, out.len()));
            stdout.write_all(&out)?;
            return stdout.flush();
        }
        engine.handle_lines_from(&mut buf, &mut decoder, &source, &mut scratch, &mut out);
    })();
    count(&|m| m.connections(Transport::Stdio, -1));
    result
}
