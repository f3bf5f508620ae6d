//! `GET /metrics` rendered on a thread of its own, not on the reactor that read it.
//!
//! Why: a scrape reads several `/proc` files (`/proc/self/fd` lists one entry per open
//! connection, `/proc/stat` one line per CPU) and writes every series: ~0.2 ms on the
//! demo server with a handful of methods, milliseconds with thousands of connections.
//! On the reactor, every call of every connection it serves would wait that long.
//!
//! The reactor keeps the scrape's place among the connection's answers (a slot, as for
//! a call answered later, see [`super::pending`]) and queues it here; this thread
//! renders the text and gives it back through the reactor's completion queue, where
//! the reactor heads it with its own current header lines. Answers pipelined after
//! the scrape on the same connection wait for it, as HTTP/1.1 requires; other
//! connections' calls do not (other scrapes queue behind it on the one thread).
//!
//! The thread runs at a lower priority (nice 10 on Linux): where it shares a CPU with a
//! reactor (a server pinned to one CPU), the reactor is not preempted for long by a
//! render that can wait.

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Sender, TrySendError};

use super::pending::ReplyTo;
use crate::dispatch::responder::{Complete, Tag};
use crate::metrics::Metrics;

/// Scrapes waiting for the thread, besides the one it renders. More at once are
/// answered `503` (Prometheus scrapes a target once per interval; a queue this long
/// means something scrapes in a loop).
pub(crate) const QUEUED: usize = 16;

/// The longest a scrape waits for its text (Prometheus' own default `scrape_timeout`):
/// then it is answered `503`, and the text, if it comes, dropped.
pub(crate) const TIMEOUT: Duration = Duration::from_secs(10);

/// How long a scrape waits for its text: 90 % of the time its scraper said it waits
/// (`X-Prometheus-Scrape-Timeout-Seconds`, timed from its own send), so that it sees
/// the `503` before it gives up; at most [`TIMEOUT`].
pub(crate) fn deadline(timeout: Option<Duration>) -> Duration {
    timeout.map_or(TIMEOUT, |t| t.mul_f64(0.9).min(TIMEOUT))
}

/// How long dropping the [`Scraper`] waits for its thread to end (a render that hangs
/// must not hang the server's shutdown): then the thread is left to end on its own.
const JOIN_WAIT: Duration = Duration::from_secs(1);

/// The code a scrape whose rendering panicked is completed with (answered `500`).
pub(crate) const FAILED: i32 = 500;

/// A scrape to render: where its text goes back to.
struct Job {
    tag: Tag,
    reply_to: Arc<ReplyTo>,
}

/// The thread rendering scrapes for every reactor of a server; stopped (after the
/// scrapes queued) when dropped.
pub(crate) struct Scraper {
    jobs: Option<Sender<Job>>,
    thread: Option<JoinHandle<()>>,
}

/// Why a scrape was not queued.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Refused {
    /// [`QUEUED`] scrapes wait already.
    Full,
    /// There is no thread to render it (it could not be started, or has ended): the
    /// reactor renders the scrape itself.
    Gone,
}

impl Scraper {
    /// Starts the thread rendering `metrics`.
    pub(crate) fn start(metrics: Metrics) -> std::io::Result<Self> {
        let (jobs, rx) = crossbeam_channel::bounded::<Job>(QUEUED);
        let thread = std::thread::Builder::new()
            .name("ringrpc-scrape".into())
            .spawn(move || {
                lower_priority();
                for job in rx {
                    // A panic (in a section a proxy added, say) answers this scrape
                    // 500 (`Some` code) rather than leaving it, and the thread, dead.
                    let text =
                        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| metrics.render()));
                    match text {
                        Ok(text) => job.reply_to.complete(job.tag, text.into_bytes(), None),
                        Err(_) => job.reply_to.complete(job.tag, Vec::new(), Some(FAILED)),
                    }
                }
            })?;
        Ok(Self {
            jobs: Some(jobs),
            thread: Some(thread),
        })
    }

    /// Queues a scrape: its text goes to `reply_to` as the answer of `tag`.
    pub(crate) fn submit(&self, tag: Tag, reply_to: Arc<ReplyTo>) -> Result<(), Refused> {
        let jobs = self.jobs.as_ref().ok_or(Refused::Gone)?;
        match jobs.try_send(Job { tag, reply_to }) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(_)) => Err(Refused::Full),
            Err(TrySendError::Disconnected(_)) => Err(Refused::Gone),
        }
    }
}

impl Drop for Scraper {
    fn drop(&mut self) {
        // The thread ends once the queue is closed and empty: waited for, within bounds.
        drop(self.jobs.take());
        if let Some(t) = self.thread.take() {
            let end = Instant::now() + JOIN_WAIT;
            while !t.is_finished() && Instant::now() < end {
                std::thread::sleep(Duration::from_millis(1));
            }
            if t.is_finished() {
                let _ = t.join();
            }
        }
    }
}

/// Lowers the calling thread's priority to nice 10 (Linux, where nice is per thread).
/// Best effort: a failure leaves it as it was. Measured: with the thread at normal
/// priority, p99 under scrapes stayed at 3.8 ms against 1.1-1.9 (docs/PERFORMANCE.md,
/// "Scrapes off the reactor").
fn lower_priority() {
    #[cfg(target_os = "linux")]
    // SAFETY: `setpriority` only reads its arguments and fails cleanly (ignored: the
    // thread keeps its priority). On Linux, `PRIO_PROCESS` with 0 is the calling
    // thread (nice is per thread there); `gettid` is not called, as glibc has it only
    // from 2.30.
    unsafe {
        let _ = libc::setpriority(libc::PRIO_PROCESS, 0, 10);
    }
}

#[cfg(test)]
mod tests {
    use std::io::{BufRead, BufReader, Write};
    use std::net::{SocketAddr, TcpStream};
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::{Condvar, Mutex};
    use std::time::{Duration, Instant};

    use super::*;
    use crate::server::{Server, ServerHandle};
    use crate::{demo, Config, ServerConfig};

    const IO_TIMEOUT: Duration = Duration::from_secs(10);

    /// Holds every render in the section the test adds until opened; counts the
    /// renders that reached it; panics the next render when told to.
    #[derive(Default)]
    struct Gate {
        held: Mutex<bool>,
        opened: Condvar,
        entered: AtomicUsize,
        panic_next: AtomicBool,
    }

    impl Gate {
        fn hold(&self) {
            *self.held.lock().unwrap() = true;
        }

        fn open(&self) {
            *self.held.lock().unwrap() = false;
            self.opened.notify_all();
        }

        /// Waits (bounded) until `n` renders have reached the section.
        fn wait_entered(&self, n: usize) {
            let end = Instant::now() + IO_TIMEOUT;
            while self.entered.load(Ordering::SeqCst) < n {
                assert!(Instant::now() < end, "no render reached the section");
                std::thread::sleep(Duration::from_millis(2));
            }
        }
    }

    /// A server with one reactor (so a render on it would hold up every connection),
    /// HTTP and newline TCP, whose metrics end with a section behind `gate`.
    fn serve(gate: &Arc<Gate>) -> (SocketAddr, SocketAddr, ServerHandle, Running) {
        let engine = demo::engine(Config::default());
        let g = Arc::clone(gate);
        engine
            .metrics()
            .unwrap()
            .add_section(move |out: &mut String| {
                g.entered.fetch_add(1, Ordering::SeqCst);
                if g.panic_next.swap(false, Ordering::SeqCst) {
                    panic!("a section failed (on purpose, in a test)");
                }
                let mut held = g.held.lock().unwrap();
                while *held {
                    held = g.opened.wait(held).unwrap();
                }
                out.push_str("# TYPE test_gate gauge\ntest_gate 1\n");
            });
        let mut server = Server::with_config(engine, ServerConfig::default().reactors(1)).unwrap();
        let http = server.listen_http("127.0.0.1:0").unwrap();
        let tcp = server.listen_tcp("127.0.0.1:0").unwrap();
        let handle = server.handle();
        let running = std::thread::spawn(move || server.run());
        (http, tcp, handle, running)
    }

    type Running = std::thread::JoinHandle<std::io::Result<()>>;

    fn connect(addr: SocketAddr) -> TcpStream {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
        s
    }

    /// One HTTP response: its status, header lines (lower-cased names) and body.
    fn response(r: &mut impl BufRead) -> (u16, Vec<(String, String)>, Vec<u8>) {
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        let status = line.split(' ').nth(1).unwrap().parse().unwrap();
        let mut headers = Vec::new();
        loop {
            line.clear();
            r.read_line(&mut line).unwrap();
            let l = line.trim_end();
            if l.is_empty() {
                break;
            }
            let (name, value) = l.split_once(':').unwrap();
            headers.push((name.to_ascii_lowercase(), value.trim().to_owned()));
        }
        let len: usize = headers
            .iter()
            .find(|(n, _)| n == "content-length")
            .map_or(0, |(_, v)| v.parse().unwrap());
        let mut body = vec![0; len];
        r.read_exact(&mut body).unwrap();
        (status, headers, body)
    }

    /// Sends `request` on `r`'s connection and reads its response.
    fn ask(r: &mut BufReader<TcpStream>, request: &[u8]) -> (u16, Vec<(String, String)>, Vec<u8>) {
        r.get_mut().write_all(request).unwrap();
        response(r)
    }

    fn header<'h>(headers: &'h [(String, String)], name: &str) -> Option<&'h str> {
        headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    const SCRAPE: &[u8] = b"GET /metrics HTTP/1.1\r\nHost: t\r\n\r\n";
    const HEALTH: &[u8] = b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n";
    /// A scrape whose scraper waits 2 s: answered `503` after 1.8 s.
    const SCRAPE_2S: &[u8] =
        b"GET /metrics HTTP/1.1\r\nHost: t\r\nX-Prometheus-Scrape-Timeout-Seconds: 2\r\n\r\n";
    const PING: &str = r#"{"jsonrpc":"2.0","method":"ping","id":7}"#;

    #[test]
    fn a_scrape_being_rendered_holds_up_no_other_connection_and_pipelined_answers_wait_for_it() {
        let gate = Arc::new(Gate::default());
        let (http, tcp, handle, _) = serve(&gate);
        // A call answered (and counted) before the scrape.
        let mut b = BufReader::new(connect(tcp));
        let mut line = String::new();
        let ping = format!("{PING}\n");
        b.get_mut().write_all(ping.as_bytes()).unwrap();
        b.read_line(&mut line).unwrap();
        assert!(line.contains(r#""result":"pong""#), "{line}");
        gate.hold();
        // A scrape, and a call pipelined behind it on the same connection.
        let mut a = connect(http);
        let post = format!(
            "POST / HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{PING}",
            PING.len()
        );
        a.write_all(&[SCRAPE, post.as_bytes()].concat()).unwrap();
        gate.wait_entered(1);
        // While it renders, the reactor answers other connections: a line on TCP, a
        // call and the health check over HTTP. (Rendered on the reactor, as before,
        // these waited for the render and timed out.)
        line.clear();
        b.get_mut().write_all(ping.as_bytes()).unwrap();
        b.read_line(&mut line).unwrap();
        assert!(line.contains(r#""result":"pong""#), "{line}");
        let mut c = BufReader::new(connect(http));
        c.get_mut().write_all(post.as_bytes()).unwrap();
        let (status, _, body) = response(&mut c);
        assert_eq!(status, 200);
        assert!(String::from_utf8_lossy(&body).contains("pong"));
        c.get_mut().write_all(HEALTH).unwrap();
        assert_eq!(response(&mut c).0, 200);
        // Nothing for `a` yet: its first answer is the scrape's.
        a.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        let mut byte = [0u8; 1];
        let early = a.peek(&mut byte);
        assert!(
            early.is_err(),
            "an answer came before the scrape's: {early:?}"
        );
        a.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
        gate.open();
        let mut a = BufReader::new(a);
        let (status, headers, body) = response(&mut a);
        assert_eq!(status, 200);
        assert_eq!(
            header(&headers, "content-type"),
            Some(crate::metrics::CONTENT_TYPE)
        );
        let text = String::from_utf8(body).unwrap();
        assert!(text.contains("\ntest_gate 1\n"), "{text}");
        // The ping answered before the scrape is in it.
        assert!(text.contains(r#"method="ping""#), "{text}");
        let (status, _, body) = response(&mut a);
        assert_eq!(status, 200);
        assert!(String::from_utf8_lossy(&body).contains("pong"));
        handle.shutdown();
    }

    /// A server whose renders are held, and a connection whose `request` (a scrape)
    /// is being rendered.
    struct Held {
        gate: Arc<Gate>,
        http: SocketAddr,
        handle: ServerHandle,
        running: Running,
        conn: BufReader<TcpStream>,
    }

    fn held(request: &[u8]) -> Held {
        let gate = Arc::new(Gate::default());
        gate.hold();
        let (http, _, handle, running) = serve(&gate);
        let mut conn = BufReader::new(connect(http));
        conn.get_mut().write_all(request).unwrap();
        gate.wait_entered(1);
        Held {
            gate,
            http,
            handle,
            running,
            conn,
        }
    }

    #[test]
    fn scrapes_past_the_queue_are_answered_503_a_failed_render_500_and_head_no_body() {
        let Held {
            gate,
            http,
            handle,
            conn: mut first,
            ..
        } = held(SCRAPE);
        // QUEUED wait behind the one held; one more than that is refused at once.
        let mut more: Vec<BufReader<TcpStream>> = (0..=QUEUED)
            .map(|_| {
                let mut s = connect(http);
                s.write_all(SCRAPE).unwrap();
                BufReader::new(s)
            })
            .collect();
        let end = Instant::now() + IO_TIMEOUT;
        let refused = loop {
            let ready = more.iter().position(|r| {
                r.get_ref().set_nonblocking(true).unwrap();
                let n = r.get_ref().peek(&mut [0u8; 1]).unwrap_or(0);
                r.get_ref().set_nonblocking(false).unwrap();
                n > 0
            });
            if let Some(i) = ready {
                break i;
            }
            assert!(Instant::now() < end, "no scrape was refused");
            std::thread::sleep(Duration::from_millis(2));
        };
        let (status, headers, body) = response(&mut more[refused]);
        assert_eq!(status, 503);
        assert_eq!(header(&headers, "retry-after"), Some("1"));
        assert!(String::from_utf8_lossy(&body).contains("too many scrapes"));
        gate.open();
        assert_eq!(response(&mut first).0, 200);
        for (i, r) in more.iter_mut().enumerate() {
            if i != refused {
                let (status, _, body) = response(r);
                assert_eq!(status, 200, "queued scrape {i}");
                assert!(String::from_utf8_lossy(&body).contains("\ntest_gate 1\n"));
            }
        }
        // A render that panics answers 500; the thread renders the next scrape.
        gate.panic_next.store(true, Ordering::SeqCst);
        let (status, _, body) = ask(&mut first, SCRAPE);
        assert_eq!(status, 500);
        assert!(String::from_utf8_lossy(&body).contains("could not be rendered"));
        let (status, headers, body) = ask(&mut first, SCRAPE);
        assert_eq!(status, 200);
        assert!(String::from_utf8_lossy(&body).contains("\ntest_gate 1\n"));
        // `HEAD`: the length of the text, and no body.
        let head = b"HEAD /metrics HTTP/1.1\r\nHost: t\r\n\r\n";
        first.get_mut().write_all(head).unwrap();
        let mut line = String::new();
        first.read_line(&mut line).unwrap();
        assert!(line.starts_with("HTTP/1.1 200"), "{line}");
        let mut head_len = None;
        loop {
            line.clear();
            first.read_line(&mut line).unwrap();
            if line.trim_end().is_empty() {
                break;
            }
            if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                head_len = Some(v.trim().parse::<usize>().unwrap());
            }
        }
        let get_len: usize = header(&headers, "content-length").unwrap().parse().unwrap();
        // (Not equal: the uptime and the process's CPU time change between scrapes.)
        assert!(head_len.is_some_and(|n| n > get_len / 2), "{head_len:?}");
        // Nothing follows the head: the next answer on the connection is the next
        // request's.
        first.get_mut().write_all(HEALTH).unwrap();
        assert_eq!(response(&mut first).0, 200);
        handle.shutdown();
    }

    #[test]
    fn a_render_past_its_time_is_answered_503_and_holds_up_no_shutdown() {
        let sent = Instant::now();
        let Held {
            gate,
            handle,
            running,
            conn: mut a,
            ..
        } = held(SCRAPE_2S);
        let (status, headers, body) = response(&mut a);
        let took = sent.elapsed();
        assert!(
            took >= Duration::from_millis(1800) && took < TIMEOUT,
            "answered after {took:?}"
        );
        assert_eq!(status, 503);
        assert_eq!(header(&headers, "retry-after"), None);
        assert!(String::from_utf8_lossy(&body).contains("not rendered in time"));
        // The late text is dropped: the connection's next answers are its next
        // requests'.
        gate.open();
        let (status, _, body) = ask(&mut a, SCRAPE);
        assert_eq!(status, 200);
        assert!(String::from_utf8_lossy(&body).contains("\ntest_gate 1\n"));
        let (status, _, body) = ask(&mut a, HEALTH);
        assert_eq!((status, body.as_slice()), (200, &br#"{"status":"ok"}"#[..]));
        // A render that never ends holds up no shutdown: its scrape is answered at
        // its time, and the server's run returns without the thread.
        gate.hold();
        let entered = gate.entered.load(Ordering::SeqCst);
        a.get_mut().write_all(SCRAPE_2S).unwrap();
        gate.wait_entered(entered + 1);
        handle.shutdown();
        assert_eq!(response(&mut a).0, 503);
        let end = Instant::now() + JOIN_WAIT + IO_TIMEOUT;
        while !running.is_finished() {
            assert!(Instant::now() < end, "run() did not return");
            std::thread::sleep(Duration::from_millis(5));
        }
        running.join().unwrap().unwrap();
        gate.open();
    }

    #[test]
    fn a_scrape_waits_nine_tenths_of_its_scrapers_timeout_at_most_ten_seconds() {
        assert_eq!(deadline(None), TIMEOUT);
        assert_eq!(
            deadline(Some(Duration::from_secs(2))),
            Duration::from_millis(1800)
        );
        assert_eq!(deadline(Some(Duration::from_secs(60))), TIMEOUT);
    }
}
