//! Newline-delimited JSON-RPC over stdin/stdout (MCP's stdio convention), serving the
//! demo methods.
//!
//! ```text
//! echo '{"jsonrpc":"2.0","method":"subtract","params":[42,23],"id":1}' \
//!     | cargo run --release --example stdio
//! ```
//!
//! One response line per answered request. Output is flushed whenever reading more
//! input would block, when the pending output grows past 64 KiB, and at end of input;
//! then the process exits 0.

use std::io::{self, Read, Write};

use bytes::BytesMut;
use ringrpc::{demo, Config};

/// Bytes asked of each `read`.
const READ_CHUNK: usize = 64 * 1024;
/// Pending output that is written even while input keeps arriving.
const FLUSH_AT: usize = 64 * 1024;

/// Whether stdin has bytes (or EOF) ready, so a `read` would not block.
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

fn main() -> io::Result<()> {
    let engine = demo::engine(Config::default());
    let (mut decoder, mut scratch) = (engine.decoder(), engine.scratch());
    let mut buf = BytesMut::with_capacity(READ_CHUNK);
    let mut out = Vec::with_capacity(FLUSH_AT * 2);
    let mut stdin = io::stdin().lock();
    let mut stdout = io::stdout().lock();
    loop {
        if !out.is_empty() && (out.len() >= FLUSH_AT || !stdin_ready()) {
            stdout.write_all(&out)?;
            stdout.flush()?;
            out.clear();
        }
        // Read straight into the buffer's tail: the bytes are not copied again.
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
        if n == 0 {
            // End of input: a last line without a newline is still a request.
            if !buf.is_empty() {
                buf.extend_from_slice(b"\n");
                engine.handle_lines(&mut buf, &mut decoder, &mut scratch, &mut out);
            }
            stdout.write_all(&out)?;
            stdout.flush()?;
            return Ok(());
        }
        engine.handle_lines(&mut buf, &mut decoder, &mut scratch, &mut out);
    }
}
