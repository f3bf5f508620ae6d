//! Connection drivers: one `mio` poll per thread driving its share of the connections,
//! framing answers per transport (newline-delimited TCP, HTTP/1.1, WebSocket).

use std::collections::VecDeque;
use std::fmt;
use std::io::{self, Read, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier, OnceLock};
use std::time::{Duration, Instant};

use std::os::fd::{AsRawFd, OwnedFd};

use mio::event::Source;
use mio::net::{TcpStream, UnixStream};
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Registry, Token};
use rustix::time::{
    timerfd_create, timerfd_settime, Itimerspec, TimerfdClockId, TimerfdFlags, TimerfdTimerFlags,
    Timespec,
};

use super::output::Progress;
use super::plan::{Addr, Hello, Plan, Transport};
use super::stats::{Problem, Stats};
use super::verify::{put_id, snippet, verify_frame};
use super::workload::{next, ID_BASE, ID_END};

#[derive(Clone, Copy)]
pub(crate) struct MsgSlot {
    pub(crate) template: u32,
    pub(crate) gen: u64,
    /// When it was due: its write in closed loop, its place in the schedule in open loop
    /// (latency is measured from here, so a stall is charged for the calls it delayed).
    pub(crate) sent: Instant,
    /// When it was written (open loop: the service time is measured from here).
    pub(crate) written: Instant,
    pub(crate) remaining: u32,
    pub(crate) measured: bool,
}

/// Messages and calls in flight on one connection. Message slot `m` owns call slots
/// `m * per .. (m + 1) * per`; a call's id is `ID_BASE + gen * stride + base + slot`
/// (`Plan::stride`, `Conn::id_base`), so an id leads straight to its slot, a slot's reuse
/// gets new ids, and no two connections of a run send the same id (a de-duplicating
/// server keys calls by identity and id: a repeat would be a replay).
pub(crate) struct Track {
    pub(crate) msgs: Vec<MsgSlot>,
    /// The id of each call slot in flight; 0 when free.
    pub(crate) calls: Vec<u64>,
    pub(crate) free: Vec<u32>,
    /// Messages in the order written (HTTP, and TCP without verification: answers come
    /// in order).
    pub(crate) fifo: VecDeque<u32>,
    pub(crate) in_flight: usize,
    /// The fast path's (id, offset of its digits) per answer of one frame.
    pub(crate) seen: Vec<(u64, usize)>,
}

impl Track {
    /// Room for `depth` messages of `per` calls; their first ids are of generation
    /// `first_gen` (≥ 1).
    pub(crate) fn new(depth: usize, per: usize, first_gen: u64, now: Instant) -> Track {
        Track {
            msgs: vec![
                MsgSlot {
                    template: 0,
                    gen: first_gen - 1,
                    sent: now,
                    written: now,
                    remaining: 0,
                    measured: false,
                };
                depth
            ],
            calls: vec![0; depth * per],
            free: (0..depth as u32).rev().collect(),
            fifo: VecDeque::with_capacity(depth),
            in_flight: 0,
            seen: Vec::with_capacity(per),
        }
    }

    /// The call slot of `id` if it is in flight.
    pub(crate) fn slot_of(&self, id: u64) -> Option<usize> {
        let n = id.checked_sub(ID_BASE)?;
        let slot = (n % self.calls.len() as u64) as usize;
        (self.calls[slot] == id).then_some(slot)
    }

    /// Frees message `m`, counting it if it was measured.
    pub(crate) fn complete(&mut self, m: usize, now: Instant, plan: &Plan, stats: &mut Stats) {
        let s = self.msgs[m];
        stats.all_responses += 1;
        if s.measured {
            stats.responses += 1;
            stats.elements += plan.templates[s.template as usize].calls.len() as u64;
            let label = plan.templates[s.template as usize].label;
            stats.record(label, now.saturating_duration_since(s.sent));
            if plan.rate.is_some() {
                stats.record_service(now.saturating_duration_since(s.written));
            }
            stats.last_done = Some(now);
        }
        self.free.push(m as u32);
        self.in_flight -= 1;
    }

    /// Marks every call of message `m` answered; returns how many were still open.
    pub(crate) fn close_calls(&mut self, m: usize, per: usize) -> u64 {
        let mut open = 0;
        for c in &mut self.calls[m * per..(m + 1) * per] {
            if *c != 0 {
                open += 1;
                *c = 0;
            }
        }
        self.msgs[m].remaining = 0;
        open
    }
}

pub(crate) struct Conn {
    pub(crate) index: usize,
    /// Where this connection's ids start within a generation: index × its call slots.
    pub(crate) id_base: u64,
    pub(crate) stream: Stream,
    pub(crate) out: Vec<u8>,
    pub(crate) wpos: usize,
    pub(crate) inbuf: Vec<u8>,
    /// Unconsumed input is `inbuf[rstart..rlen]`; `scan` is where the newline search
    /// resumes (TCP).
    pub(crate) rstart: usize,
    pub(crate) rlen: usize,
    pub(crate) scan: usize,
    pub(crate) track: Track,
    pub(crate) next_template: usize,
    pub(crate) quota: u64,
    pub(crate) last_rx: Instant,
    pub(crate) dead: bool,
    /// Open loop: when the next message is due, and the time between two.
    pub(crate) next_due: Instant,
    pub(crate) interval: Duration,
    /// The random values' generator state.
    pub(crate) rng: u64,
    /// Stopped sending notifications with more due: wants another turn without waiting.
    pub(crate) eager: bool,
}

/// What the steady state needs from the run, per thread.
pub(crate) struct Clock {
    pub(crate) measure_from: Instant,
    pub(crate) end: Option<Instant>,
}

impl Conn {
    /// Whether a message due at `at` is part of the run (warm-up, the measured window or
    /// the count not yet reached).
    pub(crate) fn may_send(&self, at: Instant, clock: &Clock) -> bool {
        !self.dead
            && match clock.end {
                Some(end) => at < end,
                None => at < clock.measure_from || self.quota > 0,
            }
    }

    /// When the next message may be sent: now in closed loop, its due time in open loop.
    fn due(&self, now: Instant, plan: &Plan) -> Instant {
        if plan.rate.is_some() {
            self.next_due
        } else {
            now
        }
    }

    pub(crate) fn finished(&self, now: Instant, plan: &Plan, clock: &Clock) -> bool {
        self.dead || (self.track.in_flight == 0 && !self.may_send(self.due(now, plan), clock))
    }

    /// Open loop: when this connection next needs the thread's attention to send (its
    /// next message's due time, if it has room for it and the run wants it).
    pub(crate) fn wake_at(&self, plan: &Plan, clock: &Clock) -> Option<Instant> {
        (plan.rate.is_some()
            && self.track.in_flight < plan.depth
            && self.may_send(self.next_due, clock))
        .then_some(self.next_due)
    }

    /// Tops the connection up to `depth` messages in flight and writes.
    pub(crate) fn fill(&mut self, plan: &Plan, clock: &Clock, stats: &mut Stats) {
        if self.dead || self.track.in_flight == plan.depth {
            return;
        }
        let now = Instant::now();
        if self.wpos > 0 && self.wpos < self.out.len() {
            self.out.drain(..self.wpos);
            self.wpos = 0;
        }
        let per = plan.per;
        let stride = plan.stride;
        let open_loop = plan.rate.is_some();
        let mut silent_sent = 0;
        self.eager = false;
        while self.track.in_flight < plan.depth {
            // Closed loop: now. Open loop: the schedule's time, once it has come; a
            // message sent late keeps its due time, so its wait counts in its latency.
            let due = self.due(now, plan);
            if due > now || !self.may_send(due, clock) {
                break;
            }
            let t = self.next_template;
            let template = &plan.templates[t];
            // Notifications only: nothing answers them (HTTP answers 204), so they take
            // no slot; at most `depth` per call, the rest at the next turn.
            let silent = template.calls.is_empty() && plan.transport != Transport::Http;
            if silent && silent_sent == plan.depth {
                self.eager = true;
                break;
            }
            if open_loop {
                self.next_due += self.interval;
            }
            self.next_template = (t + 1) % plan.templates.len();
            let measured = due >= clock.measure_from;
            if measured && clock.end.is_none() {
                self.quota -= 1;
            }
            let start = self.out.len();
            self.out.extend_from_slice(&template.bytes);
            for r in &template.randoms {
                r.write(&mut self.out[start..], &mut self.rng);
            }
            if silent {
                silent_sent += 1;
                if measured {
                    stats.notifications += 1;
                    stats.last_done = Some(now);
                }
                continue;
            }
            if measured {
                stats.requests += 1;
            }
            // Free slots = depth - in flight: there is one.
            let Some(m) = self.track.free.pop() else {
                break;
            };
            let m = m as usize;
            let slot = &mut self.track.msgs[m];
            slot.gen += 1;
            if ID_BASE + (slot.gen + 1) * stride >= ID_END {
                slot.gen = 0;
            }
            let first = ID_BASE + slot.gen * stride + self.id_base + (m * per) as u64;
            for (j, call) in template.calls.iter().enumerate() {
                let id = first + j as u64;
                put_id(&mut self.out[start + call.at..], id);
                self.track.calls[m * per + j] = id;
            }
            *slot = MsgSlot {
                template: t as u32,
                gen: slot.gen,
                sent: due,
                written: now,
                remaining: template.calls.len() as u32,
                measured,
            };
            if self.track.in_flight == 0 {
                self.last_rx = now;
            }
            self.track.in_flight += 1;
            if plan.transport == Transport::Http || !plan.verify {
                self.track.fifo.push_back(m as u32);
            }
        }
        self.flush(stats);
    }

    pub(crate) fn flush(&mut self, stats: &mut Stats) {
        while self.wpos < self.out.len() {
            match self.stream.write(&self.out[self.wpos..]) {
                Ok(0) => {
                    self.fail(Problem::Io, stats, format_args!("write returned 0"));
                    return;
                }
                Ok(n) => self.wpos += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    self.fail(Problem::Io, stats, format_args!("write: {e}"));
                    return;
                }
            }
        }
        self.out.clear();
        self.wpos = 0;
    }

    /// Gives the connection up: one `p`, plus every call still in flight as unanswered.
    pub(crate) fn fail(&mut self, p: Problem, stats: &mut Stats, what: fmt::Arguments<'_>) {
        if self.dead {
            return;
        }
        self.dead = true;
        stats.problem(p, 1, self.index, what);
        let open = self.track.calls.iter().filter(|&&c| c != 0).count() as u64;
        stats.problem(
            Problem::Unanswered,
            open,
            self.index,
            format_args!("{open} calls in flight when the connection was given up"),
        );
        self.track.calls.iter_mut().for_each(|c| *c = 0);
        self.track.in_flight = 0;
        self.track.fifo.clear();
    }

    /// Reads until `WouldBlock`, handling every complete answer.
    pub(crate) fn read(&mut self, plan: &Plan, clock: &Clock, stats: &mut Stats) {
        while !self.dead {
            if self.rlen == self.inbuf.len() {
                if self.rstart > 0 {
                    self.inbuf.copy_within(self.rstart..self.rlen, 0);
                    self.rlen -= self.rstart;
                    self.scan -= self.rstart;
                    self.rstart = 0;
                } else {
                    // One answer larger than the buffer.
                    self.inbuf.resize(self.inbuf.len() * 2, 0);
                }
            }
            match self.stream.read(&mut self.inbuf[self.rlen..]) {
                Ok(0) => {
                    let now = Instant::now();
                    if self.track.in_flight > 0 || self.may_send(self.due(now, plan), clock) {
                        self.fail(
                            Problem::Closed,
                            stats,
                            format_args!("the server closed the connection"),
                        );
                    }
                    self.dead = true;
                    return;
                }
                Ok(n) => {
                    let now = Instant::now();
                    self.rlen += n;
                    self.last_rx = now;
                    match plan.transport {
                        Transport::Tcp | Transport::Unix => self.tcp_frames(now, plan, stats),
                        Transport::Http => self.http_frames(now, plan, stats),
                        Transport::Ws => self.ws_frames(now, plan, stats),
                    }
                    if self.rstart == self.rlen {
                        self.rstart = 0;
                        self.rlen = 0;
                        self.scan = 0;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    self.fail(Problem::Io, stats, format_args!("read: {e}"));
                    return;
                }
            }
        }
    }

    pub(crate) fn tcp_frames(&mut self, now: Instant, plan: &Plan, stats: &mut Stats) {
        while let Some(p) = memchr::memchr(b'\n', &self.inbuf[self.scan..self.rlen]) {
            let end = self.scan + p;
            let line = &self.inbuf[self.rstart..end];
            self.rstart = end + 1;
            self.scan = end + 1;
            if line.iter().all(|b| matches!(b, b' ' | b'\t' | b'\r')) {
                continue;
            }
            if plan.verify {
                verify_frame(&mut self.track, self.index, line, None, now, plan, stats);
            } else {
                match self.track.fifo.pop_front() {
                    Some(m) => {
                        let m = m as usize;
                        self.track.close_calls(m, plan.per);
                        self.track.complete(m, now, plan, stats);
                    }
                    None => {
                        self.fail(
                            Problem::BadFrame,
                            stats,
                            format_args!("an answer with nothing in flight"),
                        );
                        return;
                    }
                }
            }
            if self.dead {
                return;
            }
        }
        self.scan = self.rlen;
    }

    pub(crate) fn ws_frames(&mut self, now: Instant, plan: &Plan, stats: &mut Stats) {
        while self.rstart < self.rlen && !self.dead {
            let data = &self.inbuf[self.rstart..self.rlen];
            let Some((opcode, at, len)) = ws_frame(data) else {
                return;
            };
            if at + len > data.len() {
                if at + len > self.inbuf.len() {
                    self.inbuf.resize((at + len).next_power_of_two(), 0);
                }
                return;
            }
            if opcode != 1 && opcode != 2 {
                let s = snippet(&data[at..at + len]);
                self.fail(
                    Problem::BadFrame,
                    stats,
                    format_args!("a WebSocket frame of opcode {opcode} (not a message): {s}"),
                );
                return;
            }
            let payload = &self.inbuf[self.rstart + at..self.rstart + at + len];
            self.rstart += at + len;
            if plan.verify {
                verify_frame(&mut self.track, self.index, payload, None, now, plan, stats);
            } else if let Some(m) = self.track.fifo.pop_front() {
                let m = m as usize;
                self.track.close_calls(m, plan.per);
                self.track.complete(m, now, plan, stats);
            } else {
                self.fail(
                    Problem::BadFrame,
                    stats,
                    format_args!("an answer with nothing in flight"),
                );
                return;
            }
        }
    }

    pub(crate) fn http_frames(&mut self, now: Instant, plan: &Plan, stats: &mut Stats) {
        while self.rstart < self.rlen && !self.dead {
            let data = &self.inbuf[self.rstart..self.rlen];
            let mut headers = [httparse::EMPTY_HEADER; 32];
            let mut resp = httparse::Response::new(&mut headers);
            let head = match resp.parse(data) {
                Ok(httparse::Status::Complete(n)) => n,
                Ok(httparse::Status::Partial) => return,
                Err(e) => {
                    let s = snippet(data);
                    self.fail(
                        Problem::BadFrame,
                        stats,
                        format_args!("bad HTTP response ({e}): {s}"),
                    );
                    return;
                }
            };
            let status = resp.code.unwrap_or(0);
            let mut length = None;
            let mut chunked = false;
            for h in resp.headers.iter() {
                if h.name.eq_ignore_ascii_case("content-length") {
                    length = std::str::from_utf8(h.value)
                        .ok()
                        .and_then(|v| v.trim().parse::<usize>().ok());
                    if length.is_none() {
                        chunked = true;
                    }
                } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
                    chunked = true;
                }
            }
            if (100..200).contains(&status) {
                // An interim response (100 Continue): no body, the real one follows.
                self.rstart += head;
                continue;
            }
            let length = match (length, chunked) {
                (Some(n), false) => n,
                (None, false) if status == 204 || status == 304 => 0,
                _ => {
                    self.fail(
                        Problem::BadFrame,
                        stats,
                        format_args!(
                            "HTTP {status} without a usable Content-Length (chunked bodies are not supported)"
                        ),
                    );
                    return;
                }
            };
            if data.len() < head + length {
                if head + length > self.inbuf.len() {
                    self.inbuf.resize((head + length).next_power_of_two(), 0);
                }
                return;
            }
            let body = &data[head..head + length];
            let Some(m) = self.track.fifo.pop_front() else {
                let s = snippet(data);
                self.fail(
                    Problem::BadFrame,
                    stats,
                    format_args!("an HTTP response with nothing in flight: {s}"),
                );
                return;
            };
            let m = m as usize;
            let silent = plan.templates[self.track.msgs[m].template as usize]
                .calls
                .is_empty();
            if silent {
                // Notifications only: 204, or 200 (202) with nothing in the body.
                let empty = body.iter().all(u8::is_ascii_whitespace);
                if !(matches!(status, 200 | 202 | 204) && empty) {
                    let s = snippet(body);
                    stats.problem(
                        Problem::BadResponse,
                        1,
                        self.index,
                        format_args!("HTTP {status} to notifications only: {s}"),
                    );
                }
            } else if status != 200 {
                let s = snippet(body);
                stats.problem(
                    Problem::HttpStatus,
                    1,
                    self.index,
                    format_args!("HTTP {status}: {s}"),
                );
            } else if plan.verify {
                verify_frame(&mut self.track, self.index, body, Some(m), now, plan, stats);
                let missing = self.track.close_calls(m, plan.per);
                stats.problem(
                    Problem::Missing,
                    missing,
                    self.index,
                    format_args!("{missing} calls of the message were not answered"),
                );
            }
            self.track.close_calls(m, plan.per);
            self.track.complete(m, now, plan, stats);
            self.rstart += head + length;
        }
    }
}

/// A connection's socket.
pub(crate) enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            Stream::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(buf),
            Stream::Unix(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Source for Stream {
    fn register(&mut self, r: &Registry, token: Token, interest: Interest) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.register(r, token, interest),
            Stream::Unix(s) => s.register(r, token, interest),
        }
    }

    fn reregister(&mut self, r: &Registry, token: Token, interest: Interest) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.reregister(r, token, interest),
            Stream::Unix(s) => s.reregister(r, token, interest),
        }
    }

    fn deregister(&mut self, r: &Registry) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.deregister(r),
            Stream::Unix(s) => s.deregister(r),
        }
    }
}

/// Connects (blocking, with the WebSocket handshake), then hands the socket to mio.
pub(crate) fn connect(plan: &Plan) -> io::Result<Stream> {
    match &plan.addr {
        Addr::Inet(addr) => {
            let mut s = std::net::TcpStream::connect_timeout(addr, Duration::from_secs(5))?;
            s.set_nodelay(true)?;
            if plan.transport == Transport::Ws {
                ws_handshake(&mut s, plan)?;
            }
            if let Some(h) = &plan.hello {
                s.set_read_timeout(Some(plan.timeout))?;
                hello(&mut s, plan, h)?;
                s.set_read_timeout(None)?;
            }
            s.set_nonblocking(true)?;
            Ok(Stream::Tcp(TcpStream::from_std(s)))
        }
        Addr::Unix(path) => {
            let mut s = std::os::unix::net::UnixStream::connect(path)?;
            if let Some(h) = &plan.hello {
                s.set_read_timeout(Some(plan.timeout))?;
                hello(&mut s, plan, h)?;
                s.set_read_timeout(None)?;
            }
            s.set_nonblocking(true)?;
            Ok(Stream::Unix(UnixStream::from_std(s)))
        }
    }
}

/// Sends `--hello` on a fresh (blocking) connection and reads its answer: anything but
/// a result fails the connection, with the server's error.
fn hello<S: Read + Write>(s: &mut S, plan: &Plan, h: &Hello) -> io::Result<()> {
    s.write_all(&h.bytes)?;
    let answer = match plan.transport {
        Transport::Ws => ws_read_message(s),
        _ => read_line(s),
    }
    .map_err(|e| match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => io::Error::new(
            e.kind(),
            format!(
                "no answer to --hello within {} s",
                plan.timeout.as_secs_f64()
            ),
        ),
        _ => e,
    })?;
    h.check(&answer).map_err(io::Error::other)
}

/// The most bytes of a blocking read's answer (--hello).
const MAX_BLOCKING_ANSWER: usize = 16 << 20;

/// One non-blank line, byte by byte: nothing after it is taken from the socket.
fn read_line<S: Read>(s: &mut S) -> io::Result<Vec<u8>> {
    let mut line = Vec::new();
    let mut b = [0u8; 1];
    loop {
        if s.read(&mut b)? == 0 {
            return Err(io::Error::other("the server closed the connection"));
        }
        match b[0] {
            b'\n' if line.iter().all(u8::is_ascii_whitespace) => line.clear(),
            b'\n' => return Ok(line),
            _ if line.len() >= MAX_BLOCKING_ANSWER => {
                return Err(io::Error::other("an answer line over 16 MiB"))
            }
            c => line.push(c),
        }
    }
}

/// One server message (a final text or binary frame), skipping pings and pongs.
fn ws_read_message<S: Read>(s: &mut S) -> io::Result<Vec<u8>> {
    loop {
        let mut h = [0u8; 2];
        s.read_exact(&mut h)?;
        let len = match h[1] & 0x7f {
            126 => {
                let mut n = [0u8; 2];
                s.read_exact(&mut n)?;
                u64::from(u16::from_be_bytes(n))
            }
            127 => {
                let mut n = [0u8; 8];
                s.read_exact(&mut n)?;
                u64::from_be_bytes(n)
            }
            n => u64::from(n),
        };
        if h[1] & 0x80 != 0 || len > MAX_BLOCKING_ANSWER as u64 {
            return Err(io::Error::other(
                "a WebSocket frame masked or over 16 MiB from the server",
            ));
        }
        let mut payload = vec![0u8; len as usize];
        s.read_exact(&mut payload)?;
        match (h[0] & 0x80 != 0, h[0] & 0x0f) {
            (true, 1 | 2) => return Ok(payload),
            (_, 9 | 10) => {}
            (_, 8) => {
                return Err(io::Error::other(format!(
                    "the server closed the WebSocket: {}",
                    snippet(payload.get(2..).unwrap_or_default())
                )))
            }
            (_, op) => {
                return Err(io::Error::other(format!(
                    "an unexpected WebSocket frame (opcode {op}, fragmented?)"
                )))
            }
        }
    }
}

/// A client text frame's header for `len` payload bytes, masked with an all-zero key
/// (the payload that follows is then its own masked form).
pub(crate) fn ws_header(len: usize) -> Vec<u8> {
    let mut h = vec![0x81];
    if len < 126 {
        h.push(0x80 | len as u8);
    } else if let Ok(n) = u16::try_from(len) {
        h.push(0x80 | 126);
        h.extend_from_slice(&n.to_be_bytes());
    } else {
        h.push(0x80 | 127);
        h.extend_from_slice(&(len as u64).to_be_bytes());
    }
    h.extend_from_slice(&[0; 4]);
    h
}

/// The server frame at the front of `b`: (opcode, payload offset, payload length), once
/// its header is whole.
pub(crate) fn ws_frame(b: &[u8]) -> Option<(u8, usize, usize)> {
    let (b0, b1) = (*b.first()?, *b.get(1)?);
    let (len, at) = match b1 & 0x7f {
        126 => (usize::from(u16::from_be_bytes([*b.get(2)?, *b.get(3)?])), 4),
        127 => (
            usize::try_from(u64::from_be_bytes(b.get(2..10)?.try_into().ok()?)).ok()?,
            10,
        ),
        n => (usize::from(n), 2),
    };
    Some((b0 & 0x0f, at, len))
}

/// The opening handshake (blocking, before the connection joins the poll).
pub(crate) fn ws_handshake(s: &mut std::net::TcpStream, plan: &Plan) -> io::Result<()> {
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    let request = format!(
        "GET {} HTTP/1.1\r\nHost: {}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n{}\r\n",
        plan.path, plan.addr, plan.header_lines
    );
    s.write_all(request.as_bytes())?;
    // Byte by byte up to the head's end: nothing of the frames after it is taken.
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if s.read(&mut b)? == 0 || head.len() > 8192 {
            return Err(io::Error::other("no WebSocket handshake answer"));
        }
        head.push(b[0]);
    }
    if !head.starts_with(b"HTTP/1.1 101") {
        let first = String::from_utf8_lossy(&head);
        let first = first.lines().next().unwrap_or_default();
        return Err(io::Error::other(format!(
            "WebSocket handshake refused: {first}"
        )));
    }
    s.set_read_timeout(None)
}

/// The open loop's timer token (connections are 0..).
const TIMER: Token = Token(usize::MAX);

/// A timer fd in the poll: wakes the thread at a due time to the microsecond.
struct Timer(OwnedFd);

impl Timer {
    fn new(poll: &Poll) -> io::Result<Timer> {
        let fd = timerfd_create(
            TimerfdClockId::Monotonic,
            TimerfdFlags::NONBLOCK | TimerfdFlags::CLOEXEC,
        )?;
        poll.registry()
            .register(&mut SourceFd(&fd.as_raw_fd()), TIMER, Interest::READABLE)?;
        Ok(Timer(fd))
    }

    /// Fires once, `after` from now (not zero: that would disarm it).
    fn arm(&self, after: Duration) -> io::Result<()> {
        let zero = Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        let value = Timespec::try_from(after.max(Duration::from_nanos(1)))
            .map_err(|_| io::Error::other("a wait too long for a timespec"))?;
        timerfd_settime(
            &self.0,
            TimerfdTimerFlags::empty(),
            &Itimerspec {
                it_interval: zero,
                it_value: value,
            },
        )?;
        Ok(())
    }

    /// Reads the expiry count, so the next expiry is a new edge.
    fn clear(&self) {
        let mut b = [0u8; 8];
        let _ = rustix::io::read(&self.0, &mut b);
    }
}

/// One thread of a run: connects its share of the connections (index `thread`, then
/// every `threads`-th), waits for the others at `barrier`, then loads until done.
#[allow(clippy::too_many_arguments)]
pub(crate) fn worker(
    thread: usize,
    threads: usize,
    plan: Arc<Plan>,
    connections: usize,
    first_gen: u64,
    barrier: Arc<Barrier>,
    abort: Arc<AtomicBool>,
    progress: Arc<Progress>,
    start: &OnceLock<Instant>,
) -> Stats {
    let mut stats = Stats::new(thread, plan.labels.len());
    let setup = (|| -> io::Result<(Poll, Vec<Conn>)> {
        let poll = Poll::new()?;
        let now = Instant::now();
        let mut conns = Vec::new();
        for index in (thread..connections).step_by(threads) {
            let mut stream = connect(&plan)
                .map_err(|e| io::Error::new(e.kind(), format!("connect to {}: {e}", plan.addr)))?;
            poll.registry().register(
                &mut stream,
                Token(conns.len()),
                Interest::READABLE | Interest::WRITABLE,
            )?;
            conns.push(Conn {
                index,
                id_base: (index * plan.depth * plan.per) as u64,
                stream,
                out: Vec::with_capacity(plan.depth * plan.max_message + 4096),
                wpos: 0,
                inbuf: vec![0; 256 * 1024],
                rstart: 0,
                rlen: 0,
                scan: 0,
                track: Track::new(plan.depth, plan.per, first_gen, now),
                next_template: index % plan.templates.len(),
                quota: plan.quota.as_ref().map_or(0, |q| q[index]),
                last_rx: now,
                dead: false,
                next_due: now,
                interval: Duration::ZERO,
                rng: next(&mut (index as u64)),
                eager: false,
            });
        }
        Ok((poll, conns))
    })();
    let (mut poll, mut conns) = match setup {
        Ok(x) => x,
        Err(e) => {
            eprintln!("loadgen: {e}");
            abort.store(true, Ordering::SeqCst);
            barrier.wait();
            progress.done.store(true, Ordering::SeqCst);
            return stats;
        }
    };
    barrier.wait();
    if abort.load(Ordering::SeqCst) {
        progress.done.store(true, Ordering::SeqCst);
        return stats;
    }
    let start = *start.get_or_init(Instant::now);
    let measure_from = start + plan.warmup;
    let clock = Clock {
        measure_from,
        end: plan.duration.map(|d| measure_from + d),
    };
    let timer = match plan.rate.map(|_| Timer::new(&poll)).transpose() {
        Ok(t) => t,
        Err(e) => {
            eprintln!("loadgen: timerfd: {e}");
            stats.problem(Problem::Io, 1, usize::MAX, format_args!("timerfd: {e}"));
            progress.done.store(true, Ordering::SeqCst);
            return stats;
        }
    };
    if let Some(rate) = plan.rate {
        // Connection i's messages are due at start + (i + k * connections) / rate: the
        // run's schedule, evenly spread, each connection taking its turn.
        let interval = Duration::from_secs_f64(connections as f64 / rate);
        for c in &mut conns {
            c.interval = interval;
            c.next_due = start + Duration::from_secs_f64(c.index as f64 / rate);
        }
    }
    let mut events = Events::with_capacity(1024);
    for c in &mut conns {
        c.fill(&plan, &clock, &mut stats);
    }
    let mut last_check = start;
    let mut last_p99 = start;
    loop {
        let mut timeout = Duration::from_millis(20);
        if plan.busy_poll || conns.iter().any(|c| c.eager) {
            timeout = Duration::ZERO;
        }
        if let Some(timer) = &timer {
            // Open loop: wake at the next due time. epoll counts whole milliseconds, so
            // the timer fd does it (to the microsecond), not the poll's timeout.
            let now = Instant::now();
            if let Some(wake) = conns.iter().filter_map(|c| c.wake_at(&plan, &clock)).min() {
                let wait = wake.saturating_duration_since(now);
                if wait.is_zero() {
                    timeout = Duration::ZERO;
                } else if wait < timeout {
                    if let Err(e) = timer.arm(wait) {
                        stats.problem(Problem::Io, 1, usize::MAX, format_args!("timerfd: {e}"));
                        break;
                    }
                }
            }
        }
        if let Err(e) = poll.poll(&mut events, Some(timeout)) {
            if e.kind() != io::ErrorKind::Interrupted {
                eprintln!("loadgen: poll: {e}");
                stats.problem(Problem::Io, 1, usize::MAX, format_args!("poll: {e}"));
                break;
            }
        }
        for ev in events.iter() {
            if ev.token() == TIMER {
                if let Some(timer) = &timer {
                    timer.clear();
                }
                continue;
            }
            let Some(c) = conns.get_mut(ev.token().0) else {
                continue;
            };
            if c.dead {
                continue;
            }
            if ev.is_readable() || ev.is_read_closed() || ev.is_error() {
                c.read(&plan, &clock, &mut stats);
            }
            if ev.is_writable() {
                c.flush(&mut stats);
            }
            c.fill(&plan, &clock, &mut stats);
        }
        if plan.rate.is_some() {
            // Open loop: whoever is due sends, events or not.
            for c in &mut conns {
                c.fill(&plan, &clock, &mut stats);
            }
        }
        let now = Instant::now();
        if now.duration_since(last_check) >= Duration::from_millis(20) {
            last_check = now;
            let mut all_done = true;
            for c in &mut conns {
                if !c.dead && c.track.in_flight > 0 && now.duration_since(c.last_rx) > plan.timeout
                {
                    let t = plan.timeout.as_secs_f64();
                    c.fail(
                        Problem::Stalled,
                        &mut stats,
                        format_args!("nothing received for {t} s with requests in flight"),
                    );
                }
                // A connection idle at the start of the measured window (after warm-up
                // in count mode) gets no event: top it up here.
                if !c.dead && c.track.in_flight == 0 {
                    c.fill(&plan, &clock, &mut stats);
                }
                all_done &= c.finished(now, &plan, &clock);
            }
            progress
                .responses
                .store(stats.all_responses, Ordering::Relaxed);
            progress
                .problems
                .store(stats.errors() + stats.mismatches(), Ordering::Relaxed);
            if now.duration_since(last_p99) >= Duration::from_secs(1) {
                last_p99 = now;
                if !stats.hist.is_empty() {
                    let p99 = stats.hist.value_at_quantile(0.99);
                    progress.p99_ns.store(p99, Ordering::Relaxed);
                }
            }
            if all_done {
                break;
            }
        }
    }
    stats.max_gen = conns
        .iter()
        .flat_map(|c| &c.track.msgs)
        .map(|m| m.gen)
        .max()
        .unwrap_or(0);
    progress
        .responses
        .store(stats.all_responses, Ordering::Relaxed);
    progress
        .problems
        .store(stats.errors() + stats.mismatches(), Ordering::Relaxed);
    progress.done.store(true, Ordering::SeqCst);
    stats
}
