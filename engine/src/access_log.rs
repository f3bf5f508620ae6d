//! The access log: one line per call (each batch element), as JSON or text, written by a
//! thread of its own so a slow log (a full pipe, a slow terminal) never stalls the
//! threads answering calls. Lines that do not fit in its bounded queue are dropped and
//! counted ([`AccessLog::dropped`], and `ringrpc_access_log_dropped_total`).
//!
//! ```
//! use std::sync::{Arc, Mutex};
//! use ringrpc::access_log::{AccessLog, Format};
//! use ringrpc::{demo, Config, Engine};
//!
//! #[derive(Clone, Default)]
//! struct Shared(Arc<Mutex<Vec<u8>>>);
//! impl std::io::Write for Shared {
//!     fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
//!         self.0.lock().unwrap().extend_from_slice(b);
//!         Ok(b.len())
//!     }
//!     fn flush(&mut self) -> std::io::Result<()> { Ok(()) }
//! }
//!
//! let lines = Shared::default();
//! let engine = Engine::new(demo::registry(), Config::default())
//!     .with_access_log(AccessLog::to_writer(Format::Json, lines.clone(), 1024));
//! let mut out = Vec::new();
//! let _ = engine.handle(br#"{"jsonrpc":"2.0","method":"add","params":[1,2],"id":7}"#, &mut engine.scratch(), &mut out);
//! drop(engine); // the log's thread writes what is queued, then ends
//! let text = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
//! assert!(text.contains(r#""method":"add","id":7,"code":0"#), "{text}");
//! ```

use std::io::{BufWriter, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crossbeam_channel::{bounded, Receiver, Sender, TrySendError};

use crate::codec::Id;
use crate::dispatch::context::Connection;
use crate::serializer::json::{escape_into, write_id};
use crate::trace::TraceId;

/// How lines are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Format {
    /// One JSON object per line: `time`, `transport`, `peer`, `identity`, `method`, `id`,
    /// `code` (0: a result), `duration_us`, `bytes_in`, `bytes_out`, `trace_id`.
    Json,
    /// The same fields separated by spaces, `-` for what is absent.
    Text,
}

/// Lines queued before new ones are dropped, by default.
pub const DEFAULT_CAPACITY: usize = 8192;

/// The most bytes of a peer-given string (a method name, a string id) a line holds; a
/// longer one is cut (at a character's boundary) and ends with `…`. A peer calling an
/// unknown method a megabyte long must not have 8192 lines of a megabyte queued.
const MAX_FIELD: usize = 256;

/// Buffers up to this capacity are kept for the next lines; a larger one (a line with
/// many long fields) is let go once written, so a burst of them does not stay held.
const SPARE_MAX: usize = 4096;

/// An access log: where lines go, and the queue in front of it.
pub struct AccessLog {
    format: Format,
    lines: Option<Sender<Vec<u8>>>,
    /// Buffers the writer is done with, for the next lines.
    spare: Receiver<Vec<u8>>,
    dropped: Arc<AtomicU64>,
    writer: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for AccessLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AccessLog")
            .field("format", &self.format)
            .field("dropped", &self.dropped())
            .finish_non_exhaustive()
    }
}

/// One call, as logged.
pub(crate) struct Entry<'a> {
    pub(crate) conn: &'a Connection,
    pub(crate) identity: Option<&'a str>,
    pub(crate) method: &'a str,
    pub(crate) id: Option<Id<'a>>,
    pub(crate) code: Option<i32>,
    pub(crate) took: Duration,
    pub(crate) bytes_in: usize,
    pub(crate) bytes_out: usize,
    pub(crate) trace: Option<TraceId>,
}

impl AccessLog {
    /// Lines on stderr, at most [`DEFAULT_CAPACITY`] queued.
    pub fn stderr(format: Format) -> Self {
        Self::to_writer(format, std::io::stderr(), DEFAULT_CAPACITY)
    }

    /// Lines written to `out` by a thread of the log's own, at most `capacity` queued
    /// (past that, new lines are dropped and counted). The thread ends, having written
    /// every queued line, when the log is dropped.
    pub fn to_writer(format: Format, out: impl Write + Send + 'static, capacity: usize) -> Self {
        let capacity = capacity.max(1);
        let (tx, rx) = bounded::<Vec<u8>>(capacity);
        let (spare_tx, spare_rx) = bounded::<Vec<u8>>(capacity);
        let writer = std::thread::Builder::new()
            .name("ringrpc-access-log".into())
            .spawn(move || write_lines(out, &rx, &spare_tx))
            .ok();
        Self {
            format,
            lines: Some(tx),
            spare: spare_rx,
            dropped: Arc::new(AtomicU64::new(0)),
            writer,
        }
    }

    /// Lines dropped because the queue was full.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// The dropped-lines counter, for the metrics.
    pub(crate) fn dropped_counter(&self) -> Arc<AtomicU64> {
        Arc::clone(&self.dropped)
    }

    /// Queues the line for `e` (no allocation once the spare buffers have grown).
    pub(crate) fn log(&self, e: &Entry<'_>) {
        let Some(lines) = &self.lines else {
            return;
        };
        let mut buf = self.spare.try_recv().unwrap_or_default();
        buf.clear();
        match self.format {
            Format::Json => json_line(&mut buf, e),
            Format::Text => text_line(&mut buf, e),
        }
        if let Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) = lines.try_send(buf) {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl Drop for AccessLog {
    fn drop(&mut self) {
        // Closing the queue lets the writer finish what is queued and end.
        self.lines = None;
        if let Some(w) = self.writer.take() {
            let _ = w.join();
        }
    }
}

fn write_lines(out: impl Write, lines: &Receiver<Vec<u8>>, spare: &Sender<Vec<u8>>) {
    let mut out = BufWriter::with_capacity(64 * 1024, out);
    while let Ok(line) = lines.recv() {
        let mut next = Some(line);
        // Everything queued now, then one flush.
        while let Some(line) = next {
            let _ = out.write_all(&line);
            if line.capacity() <= SPARE_MAX {
                let _ = spare.try_send(line);
            }
            next = lines.try_recv().ok();
        }
        let _ = out.flush();
    }
    let _ = out.flush();
}

fn json_line(out: &mut Vec<u8>, e: &Entry<'_>) {
    out.extend_from_slice(br#"{"time":""#);
    timestamp(out, SystemTime::now());
    out.extend_from_slice(br#"","transport":""#);
    out.extend_from_slice(e.conn.transport().as_str().as_bytes());
    out.extend_from_slice(br#"","peer":""#);
    // An address or a uid: nothing to escape.
    let _ = write!(out, "{}", e.conn.peer());
    out.push(b'"');
    out.extend_from_slice(br#","identity":"#);
    match e.identity {
        Some(who) => quoted(out, who),
        None => out.extend_from_slice(b"null"),
    }
    out.extend_from_slice(br#","method":"#);
    quoted(out, e.method);
    out.extend_from_slice(br#","id":"#);
    match e.id {
        Some(id) => log_id(out, id),
        None => out.extend_from_slice(b"null"),
    }
    out.extend_from_slice(br#","code":"#);
    out.extend_from_slice(itoa::Buffer::new().format(e.code.unwrap_or(0)).as_bytes());
    out.extend_from_slice(br#","duration_us":"#);
    out.extend_from_slice(itoa::Buffer::new().format(e.took.as_micros()).as_bytes());
    out.extend_from_slice(br#","bytes_in":"#);
    out.extend_from_slice(itoa::Buffer::new().format(e.bytes_in).as_bytes());
    out.extend_from_slice(br#","bytes_out":"#);
    out.extend_from_slice(itoa::Buffer::new().format(e.bytes_out).as_bytes());
    out.extend_from_slice(br#","trace_id":"#);
    match e.trace {
        Some(t) => {
            let _ = write!(out, "\"{t}\"");
        }
        None => out.extend_from_slice(b"null"),
    }
    out.extend_from_slice(b"}\n");
}

fn text_line(out: &mut Vec<u8>, e: &Entry<'_>) {
    timestamp(out, SystemTime::now());
    out.push(b' ');
    out.extend_from_slice(e.conn.transport().as_str().as_bytes());
    out.push(b' ');
    // One field: a Unix peer's `pid=P uid=U gid=G` joined by commas.
    let at = out.len();
    let _ = write!(out, "{}", e.conn.peer());
    if let Some(peer) = out.get_mut(at..) {
        peer.iter_mut()
            .filter(|b| **b == b' ')
            .for_each(|b| *b = b',');
    }
    out.push(b' ');
    // Identities and methods are printed JSON-escaped, so a line stays one line.
    match e.identity {
        Some(who) => quoted(out, who),
        None => out.push(b'-'),
    }
    out.push(b' ');
    quoted(out, e.method);
    out.extend_from_slice(b" id=");
    match e.id {
        Some(id) => log_id(out, id),
        None => out.push(b'-'),
    }
    out.extend_from_slice(b" code=");
    out.extend_from_slice(itoa::Buffer::new().format(e.code.unwrap_or(0)).as_bytes());
    out.push(b' ');
    out.extend_from_slice(itoa::Buffer::new().format(e.took.as_micros()).as_bytes());
    out.extend_from_slice(b"us in=");
    out.extend_from_slice(itoa::Buffer::new().format(e.bytes_in).as_bytes());
    out.extend_from_slice(b" out=");
    out.extend_from_slice(itoa::Buffer::new().format(e.bytes_out).as_bytes());
    out.extend_from_slice(b" trace=");
    match e.trace {
        Some(t) => {
            let _ = write!(out, "{t}");
        }
        None => out.push(b'-'),
    }
    out.push(b'\n');
}

/// `s` as a JSON string, cut to [`MAX_FIELD`] bytes.
fn quoted(out: &mut Vec<u8>, s: &str) {
    out.push(b'"');
    if s.len() <= MAX_FIELD {
        escape_into(out, s.as_bytes());
    } else {
        let cut = (0..=MAX_FIELD)
            .rev()
            .find(|&i| s.is_char_boundary(i))
            .unwrap_or(0);
        escape_into(out, s.get(..cut).unwrap_or_default().as_bytes());
        out.extend_from_slice("…".as_bytes());
    }
    out.push(b'"');
}

/// An id as it came, a string one cut as [`quoted`] cuts.
fn log_id(out: &mut Vec<u8>, id: Id<'_>) {
    match id {
        Id::Str(s) => quoted(out, s),
        other => write_id(out, other),
    }
}

/// `2026-12-04T17:38:59.123456Z` (RFC 3339, UTC, microseconds).
fn timestamp(out: &mut Vec<u8>, t: SystemTime) {
    let since = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil(i64::try_from(days).unwrap_or(0));
    let two = |out: &mut Vec<u8>, v: u64| {
        out.push(b'0' + (v / 10 % 10) as u8);
        out.push(b'0' + (v % 10) as u8);
    };
    out.extend_from_slice(itoa::Buffer::new().format(y).as_bytes());
    out.push(b'-');
    two(out, m);
    out.push(b'-');
    two(out, d);
    out.push(b'T');
    two(out, rem / 3600);
    out.push(b':');
    two(out, rem / 60 % 60);
    out.push(b':');
    two(out, rem % 60);
    out.push(b'.');
    let us = since.subsec_micros();
    let digits = itoa::Buffer::new().format(us).len();
    out.extend(std::iter::repeat_n(b'0', 6 - digits));
    out.extend_from_slice(itoa::Buffer::new().format(us).as_bytes());
    out.push(b'Z');
}

/// The date of day `z` since 1970-01-01 (Howard Hinnant's `civil_from_days`).
fn civil(z: i64) -> (i64, u64, u64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u64;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u64;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_rfc3339() {
        let mut out = Vec::new();
        timestamp(
            &mut out,
            UNIX_EPOCH + Duration::from_micros(1_000_000_000_000_042),
        );
        assert_eq!(out, b"2001-09-09T01:46:40.000042Z");
        out.clear();
        // 2024-02-29 12:00:00.5 UTC: a leap day.
        timestamp(
            &mut out,
            UNIX_EPOCH + Duration::from_millis(1_709_208_000_500),
        );
        assert_eq!(out, b"2024-02-29T12:00:00.500000Z");
        out.clear();
        timestamp(&mut out, UNIX_EPOCH);
        assert_eq!(out, b"1970-01-01T00:00:00.000000Z");
    }

    /// A call to `m` on `conn`: no identity, id, code or trace.
    fn plain_entry(conn: &Connection) -> Entry<'_> {
        Entry {
            conn,
            identity: None,
            method: "m",
            id: None,
            code: None,
            took: Duration::ZERO,
            bytes_in: 1,
            bytes_out: 2,
            trace: None,
        }
    }

    #[test]
    fn long_peer_strings_are_cut_and_unix_peers_are_one_field() {
        let ell = "…".len();
        let mut out = Vec::new();
        quoted(&mut out, &"m".repeat(1 << 20));
        assert_eq!(out.len(), MAX_FIELD + 2 + ell);
        assert!(out.ends_with("…\"".as_bytes()));
        out.clear();
        // Cut at a character's boundary, never inside one.
        let s = format!("{}é{}", "a".repeat(MAX_FIELD - 1), "b".repeat(10));
        quoted(&mut out, &s);
        let text = std::str::from_utf8(&out).expect("UTF-8");
        assert_eq!(text, format!("\"{}…\"", "a".repeat(MAX_FIELD - 1)));
        out.clear();
        log_id(&mut out, Id::Str(&"i".repeat(1000)));
        assert_eq!(out.len(), MAX_FIELD + 2 + ell);
        out.clear();
        log_id(&mut out, Id::UInt(7));
        assert_eq!(out, b"7");
        out.clear();
        quoted(&mut out, "short \"one\"");
        assert_eq!(out, b"\"short \\\"one\\\"\"");
        out.clear();

        use crate::dispatch::context::{Peer, Transport};
        let peer = Peer::Unix {
            pid: 1,
            uid: 2,
            gid: 3,
        };
        let conn = Connection::new(Transport::Unix, peer, 5);
        let e = plain_entry(&conn);
        text_line(&mut out, &e);
        let line = std::str::from_utf8(&out).expect("UTF-8");
        let fields: Vec<&str> = line.split(' ').collect();
        assert_eq!(fields[2], "pid=1,uid=2,gid=3", "{line}");
        assert_eq!(fields[4], "\"m\"", "{line}");
    }

    #[test]
    fn a_full_queue_drops_and_counts() {
        /// A writer that says when it is entered, then blocks until told to go on.
        struct Stuck(Sender<()>, Receiver<()>);
        impl Write for Stuck {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                let _ = self.0.send(());
                let _ = self.1.recv();
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let (entered_tx, entered) = bounded(1);
        let (go, wait) = bounded(0);
        let log = AccessLog::to_writer(Format::Text, Stuck(entered_tx, wait), 4);
        let conn = Connection::EMBEDDED;
        let e = plain_entry(&conn);
        log.log(&e);
        // The writer holds the first line, stuck in `write`.
        entered.recv().expect("the writer writes");
        // Not blocked by it: 4 lines queued, the rest dropped and counted.
        for _ in 0..1000 {
            log.log(&e);
        }
        assert_eq!(log.dropped(), 996);
        drop(go);
        drop(entered);
        drop(log);
    }
}
