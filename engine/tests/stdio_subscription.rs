//! Subscriptions over stdio, through a real child process speaking on its stdin/stdout
//! pipes: ticks in order with no gap, the id answered before the first tick, nothing
//! after the unsubscribe call's answer, two subscriptions on one stdout, the end of
//! input ending the process (exit 0) and telling the handlers, a reader that stops
//! reading (the server's memory stays bounded; every notification is delivered or
//! counted by a `lagged` one), and stdin redirected from a regular file (which epoll
//! refuses).
//!
//! The child is this test binary again (`serve_stdio` serves the process's own stdin
//! and stdout, so it needs a process of its own): with [`CHILD`] set, `main` serves the
//! demo methods plus the two subscriptions below. The harness is ours (`harness =
//! false`): libtest would print on the child's stdout. Every read has a timeout, so a
//! hang fails the test instead of stalling it.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use ringrpc::{demo, server::serve_stdio, Config, Context, Engine, Params, RpcError, Sink};
use serde_json::{json, Value};

/// Set in the child's environment: serve stdio instead of running the tests.
const CHILD: &str = "RINGRPC_STDIO_SUBSCRIPTION_CHILD";

/// How long any one line, or the child's exit, may take before the test fails.
const PATIENCE: Duration = Duration::from_secs(20);

/// The child: the demo methods, and
/// - `watch`: `"first"` sent by the handler itself (before the call is answered), then
///   `"x"` every 2 ms until the send fails; the reason goes to stderr
///   (`watch ended: REASON`) before the process exits;
/// - `flood [count]`: `count` notifications `[n, "ppp…"]` sent as fast as the producer
///   can, then `flood sent N` on stderr (N accepted).
fn child() -> std::io::Result<()> {
    let (ended_tx, ended) = mpsc::channel();
    let opened = Arc::new(AtomicUsize::new(0));
    let mut methods = demo::builder();
    let watches = Arc::clone(&opened);
    methods
        .subscription(
            "watch",
            "seen",
            "unwatch",
            move |_ctx: &Context<'_>, _p: Params<'_>, sink: Sink| -> Result<(), RpcError> {
                watches.fetch_add(1, Ordering::SeqCst);
                // One queued before the call is even answered: it still follows the id.
                let _ = sink.send("first");
                let tx = ended_tx.clone();
                std::thread::spawn(move || loop {
                    if let Err(why) = sink.send("x") {
                        let _ = tx.send(why);
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(2));
                });
                Ok(())
            },
        )
        .expect("watch registers");
    methods
        .subscription(
            "flood",
            "data",
            "unflood",
            |_ctx: &Context<'_>, p: Params<'_>, sink: Sink| -> Result<(), RpcError> {
                let [count]: [u64; 1] = p.parse()?;
                std::thread::spawn(move || {
                    let payload = "p".repeat(100);
                    let mut sent = 0u64;
                    for n in 0..count {
                        if sink.send(&json!([n, payload])).is_err() {
                            break;
                        }
                        sent += 1;
                    }
                    eprintln!("flood sent {sent}");
                });
                Ok(())
            },
        )
        .expect("flood registers");
    let engine = Engine::new(methods.freeze(), Config::default());
    serve_stdio(&engine)?;
    // Each watch's producer learns why its subscription ended; wait to hear it.
    for _ in 0..opened.load(Ordering::SeqCst) {
        match ended.recv_timeout(PATIENCE) {
            Ok(why) => eprintln!("watch ended: {why:?}"),
            Err(_) => eprintln!("watch never told"),
        }
    }
    Ok(())
}

/// The child process, its stdin, its stdout's lines (handed over one at a time: while
/// the test takes none, the reader holds one line and a small buffer, so the pipe fills
/// as with a client that stops reading) and its stderr's.
struct Served {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
    errors: mpsc::Receiver<String>,
}

impl Served {
    /// The child with `stdin` (piped unless given).
    fn start_with(stdin: Option<std::fs::File>) -> Self {
        let exe = std::env::current_exe().expect("this test binary's path");
        let mut child = Command::new(exe)
            .env(CHILD, "1")
            .stdin(stdin.map_or_else(Stdio::piped, Stdio::from))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the child process");
        let stdout = child.stdout.take().expect("piped stdout");
        let stderr = child.stderr.take().expect("piped stderr");
        let (tx, lines) = mpsc::sync_channel(0);
        std::thread::spawn(move || {
            for line in BufReader::with_capacity(4096, stdout).lines() {
                let Ok(line) = line else { return };
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        let (tx, errors) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { return };
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Self {
            stdin: child.stdin.take(),
            child,
            lines,
            errors,
        }
    }

    fn start() -> Self {
        Self::start_with(None)
    }

    fn send(&mut self, v: &Value) {
        let mut line = serde_json::to_vec(v).unwrap();
        line.push(b'\n');
        let stdin = self.stdin.as_mut().expect("stdin still open");
        stdin.write_all(&line).unwrap();
        stdin.flush().unwrap();
    }

    /// The next line of stdout, as JSON; `None` at its end.
    fn next_or_end(&mut self) -> Option<Value> {
        match self.lines.recv_timeout(PATIENCE) {
            Ok(line) => {
                Some(serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}")))
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => None,
            Err(mpsc::RecvTimeoutError::Timeout) => panic!("nothing on stdout for {PATIENCE:?}"),
        }
    }

    fn next(&mut self) -> Value {
        self.next_or_end().expect("stdout ended")
    }

    /// The answer to call `id`, and the notifications read before it.
    fn answer(&mut self, id: u64) -> (Value, Vec<Value>) {
        let mut notes = Vec::new();
        loop {
            let v = self.next();
            if v.get("method").is_some() {
                notes.push(v);
            } else {
                assert_eq!(v["id"], id, "answers come in request order: {v}");
                return (v, notes);
            }
        }
    }

    /// The next line of stderr that starts with `prefix`.
    fn stderr_line(&mut self, prefix: &str) -> String {
        loop {
            match self.errors.recv_timeout(PATIENCE) {
                Ok(line) if line.starts_with(prefix) => return line,
                Ok(_) => {}
                Err(e) => panic!("no {prefix:?} on stderr: {e}"),
            }
        }
    }

    /// Closes stdin.
    fn close_stdin(&mut self) {
        self.stdin = None;
    }

    /// Waits for the process to exit (after reading what is left on stdout, which
    /// is returned).
    fn finish(&mut self) -> (ExitStatus, Vec<Value>) {
        let mut rest = Vec::new();
        while let Some(v) = self.next_or_end() {
            rest.push(v);
        }
        let since = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return (status, rest);
            }
            assert!(since.elapsed() < PATIENCE, "the child did not exit");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// The child's memory: `VmRSS` or `VmHWM` (its peak), in bytes.
    fn memory(&self, field: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .expect("/proc/PID/status (Linux)");
        let kb: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
            .and_then(|v| v.trim().strip_suffix("kB")?.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {field} in {status}"));
        kb * 1024
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn call(method: &str, params: Value, id: u64) -> Value {
    json!({"jsonrpc": "2.0", "method": method, "params": params, "id": id})
}

/// Follows one subscription's notifications in a mixed stream: each `result` must be
/// the next expected value, a `lagged` note skips as many as it counts.
#[derive(Default)]
struct Follow {
    next: u64,
    delivered: u64,
    lagged: u64,
}

impl Follow {
    fn see(&mut self, v: &Value, result: impl Fn(&Value) -> Option<u64>) {
        assert!(v.get("id").is_none(), "a notification has no id: {v}");
        if let Some(n) = v["params"]["lagged"].as_u64() {
            assert!(n > 0, "{v}");
            self.lagged += n;
            self.next += n;
            return;
        }
        let n = result(&v["params"]["result"]).unwrap_or_else(|| panic!("{v}"));
        assert_eq!(n, self.next, "a gap or a reordering: {v}");
        self.next += 1;
        self.delivered += 1;
    }
}

fn tick(r: &Value) -> Option<u64> {
    r.as_u64()
}

fn ticks_in_order_then_nothing_after_unsubscribing() {
    let mut s = Served::start();
    s.send(&call("subscribe_ticks", json!([1]), 1));
    // The first line is the id: no tick passes it.
    let answer = s.next();
    assert_eq!(answer["id"], 1, "{answer}");
    let sub = answer["result"].clone();
    assert!(sub.is_u64(), "{answer}");
    // 1 ms ticks for 300 ms: every one, in order.
    let mut f = Follow::default();
    while f.next < 300 {
        let v = s.next();
        assert_eq!(v["method"], "tick", "{v}");
        assert_eq!(v["params"]["subscription"], sub, "{v}");
        f.see(&v, tick);
    }
    assert_eq!(f.lagged, 0, "a reader that reads lost ticks");
    // An unknown id is not this connection's.
    s.send(&call(
        "unsubscribe_ticks",
        json!([sub.as_u64().unwrap() + 1000]),
        2,
    ));
    let (no, ticks) = s.answer(2);
    assert_eq!(no["result"], false, "{no}");
    // Ticks go on meanwhile: each still the next one (they were once dropped here
    // unread, and a loaded machine's tick 300, sent before this answer, then looked
    // lost to the check below).
    for v in &ticks {
        f.see(v, tick);
    }
    s.send(&call("unsubscribe_ticks", json!([sub]), 3));
    let (yes, before) = s.answer(3);
    assert_eq!(yes["result"], true, "{yes}");
    // Ticks before the answer are still in order.
    for v in &before {
        f.see(v, tick);
    }
    // Nothing of it after the answer: a ping 50 ms later comes next.
    std::thread::sleep(Duration::from_millis(50));
    s.send(&call("ping", json!([]), 4));
    let (pong, stragglers) = s.answer(4);
    assert_eq!(pong["result"], "pong");
    assert!(
        stragglers.is_empty(),
        "ticks after unsubscribing: {stragglers:?}"
    );
    s.close_stdin();
    let (status, rest) = s.finish();
    assert!(status.success(), "{status}");
    assert!(rest.is_empty(), "{rest:?}");
}

fn two_subscriptions_share_stdout() {
    let mut s = Served::start();
    s.send(&call("subscribe_ticks", json!([1]), 1));
    s.send(&call("subscribe_ticks", json!([2]), 2));
    let (a, early) = s.answer(1);
    assert!(early.is_empty(), "a notification before any id: {early:?}");
    let a = a["result"].as_u64().expect("an id");
    let (b, between) = s.answer(2);
    let b = b["result"].as_u64().expect("an id");
    assert_ne!(a, b);
    let (mut fa, mut fb) = (Follow::default(), Follow::default());
    let mut switches = 0;
    let mut last = None;
    for v in between {
        assert_eq!(v["params"]["subscription"], a, "a tick before its id: {v}");
        fa.see(&v, tick);
        last = Some(a);
    }
    while fa.next < 300 || fb.next < 150 {
        let v = s.next();
        let sub = v["params"]["subscription"].as_u64().expect("a tick");
        match sub {
            _ if sub == a => fa.see(&v, tick),
            _ if sub == b => fb.see(&v, tick),
            _ => panic!("another subscription: {v}"),
        }
        if last.is_some_and(|l| l != sub) {
            switches += 1;
        }
        last = Some(sub);
    }
    assert_eq!(fa.lagged + fb.lagged, 0, "a reader that reads lost ticks");
    // Written as they came (every 1 and 2 ms), not one subscription's after the
    // other's.
    assert!(switches > 1, "not interleaved: {switches} switches");
    eprintln!("  {} + {} ticks, {switches} switches", fa.next, fb.next);
    s.send(&call("unsubscribe_ticks", json!([a]), 3));
    let (yes, before) = s.answer(3);
    assert_eq!(yes["result"], true, "{yes}");
    // Both go on until the answer, each still in order.
    for v in &before {
        match v["params"]["subscription"].as_u64().expect("a tick") {
            sub if sub == a => fa.see(v, tick),
            sub if sub == b => fb.see(v, tick),
            _ => panic!("another subscription: {v}"),
        }
    }
    // The other goes on.
    let more = fb.next + 5;
    while fb.next < more {
        let v = s.next();
        assert_eq!(v["params"]["subscription"], b, "{v}");
        fb.see(&v, tick);
    }
    s.close_stdin();
    let (status, _) = s.finish();
    assert!(status.success(), "{status}");
}

fn the_end_of_input_ends_subscriptions_and_the_process() {
    let mut s = Served::start();
    s.send(&call("subscribe_ticks", json!([1]), 1));
    s.send(&call("watch", json!([]), 2));
    let (ticks, early) = s.answer(1);
    assert!(early.is_empty(), "a notification before any id: {early:?}");
    let (watch, notes) = s.answer(2);
    let (ticks, watch) = (ticks["result"].clone(), watch["result"].clone());
    assert!(ticks.is_u64() && watch.is_u64(), "{ticks} {watch}");
    assert!(
        notes.iter().all(|v| v["params"]["subscription"] == ticks),
        "a notification before its subscription's id: {notes:?}"
    );
    // The handler's own first notification is the watch's first, after its id.
    let first = loop {
        let v = s.next();
        if v["params"]["subscription"] == watch {
            break v;
        }
    };
    assert_eq!(first["params"]["result"], "first", "{first}");
    let mut seen = notes.len();
    while seen < 50 {
        let _ = s.next();
        seen += 1;
    }
    // A last request without its newline is still answered, then both end.
    let stdin = s.stdin.as_mut().unwrap();
    stdin
        .write_all(br#"{"jsonrpc":"2.0","method":"ping","id":3}"#)
        .unwrap();
    s.close_stdin();
    let (status, rest) = s.finish();
    assert!(status.success(), "{status}");
    let last = rest.last().expect("the ping's answer");
    assert_eq!(last["id"], 3, "nothing follows the last answer: {rest:?}");
    assert_eq!(last["result"], "pong");
    assert!(rest[..rest.len() - 1]
        .iter()
        .all(|v| v.get("method").is_some()));
    assert_eq!(
        s.stderr_line("watch "),
        "watch ended: ConnectionClosed",
        "the handler is told why"
    );
}

fn a_reader_that_stops_reading_is_bounded_and_told_what_it_lost() {
    const FLOOD: u64 = 500_000;
    let mut s = Served::start();
    s.send(&call("subscribe_ticks", json!([1]), 1));
    let (ticks, _) = s.answer(1);
    let ticks = ticks["result"].as_u64().expect("an id");
    let baseline = s.memory("VmRSS");
    s.send(&call("flood", json!([FLOOD]), 2));
    // Not read for 3 s: 1 ms ticks, and ~65 MB of notifications from a producer that
    // never waits.
    std::thread::sleep(Duration::from_secs(3));
    let sent: u64 = s
        .stderr_line("flood sent ")
        .trim_start_matches("flood sent ")
        .parse()
        .unwrap();
    assert_eq!(sent, FLOOD, "the producer never waits, nor is refused");
    let peak = s.memory("VmHWM");
    eprintln!(
        "  VmRSS {} KiB before, VmHWM {} KiB after",
        baseline >> 10,
        peak >> 10
    );
    // The queues (1024 each), 64 KiB of output and the pipe: nowhere near the 65 MB.
    assert!(
        peak < baseline + (8 << 20),
        "the server's memory grew from {baseline} to {peak} bytes while unread"
    );
    // Now read: the flood's answer, then every notification delivered or counted.
    let (flood, early) = s.answer(2);
    let flood = flood["result"].as_u64().expect("an id");
    let (mut ft, mut ff) = (Follow::default(), Follow::default());
    // Ticks delivered after their first `lagged` note.
    let mut after_lag = 0;
    let mut early = early.into_iter();
    // Until every flood notification is accounted for, and ticks flow again after
    // what they lost was counted.
    while ff.next < FLOOD || after_lag < 10 {
        let v = early.next().unwrap_or_else(|| s.next());
        match v["params"]["subscription"].as_u64() {
            Some(id) if id == ticks => {
                ft.see(&v, tick);
                if ft.lagged > 0 && v["params"].get("result").is_some() {
                    after_lag += 1;
                }
            }
            Some(id) if id == flood => ff.see(&v, |r| r[0].as_u64()),
            _ => panic!("{v}"),
        }
    }
    eprintln!(
        "  flood: {} delivered + {} dropped = {}; ticks: {} dropped and counted",
        ff.delivered, ff.lagged, sent, ft.lagged
    );
    assert_eq!(ff.delivered + ff.lagged, sent);
    assert!(ff.lagged > 0, "a reader that did not read lost nothing?");
    assert!(ft.lagged > 0, "3 s of unread 1 ms ticks lost nothing?");
    s.send(&call("unsubscribe_ticks", json!([ticks]), 3));
    let (yes, _) = s.answer(3);
    assert_eq!(yes["result"], true, "{yes}");
    s.close_stdin();
    let (status, _) = s.finish();
    assert!(status.success(), "{status}");
}

fn stdin_from_a_regular_file_ends_at_its_end() {
    let path = std::env::temp_dir().join(format!(
        "ringrpc-stdio-subscription-{}.jsonl",
        std::process::id()
    ));
    let mut f = std::fs::File::create(&path).unwrap();
    writeln!(f, "{}", call("subscribe_ticks", json!([1]), 1)).unwrap();
    writeln!(f, "{}", call("ping", json!([]), 2)).unwrap();
    drop(f);
    let file = std::fs::File::open(&path).unwrap();
    let mut s = Served::start_with(Some(file));
    let _ = std::fs::remove_file(&path);
    let (status, lines) = s.finish();
    assert!(status.success(), "{status}");
    let sub = &lines[0];
    assert_eq!(sub["id"], 1, "the id first: {lines:?}");
    assert!(sub["result"].is_u64(), "{sub}");
    // Ticks, if any came before the end, in order; the ping's answer in its place.
    let mut f = Follow::default();
    let mut pong = false;
    for v in &lines[1..] {
        if v.get("id").is_some() {
            assert!(!pong, "{lines:?}");
            assert_eq!(v["result"], "pong", "{v}");
            pong = true;
        } else {
            assert_eq!(v["params"]["subscription"], sub["result"], "{v}");
            f.see(v, tick);
        }
    }
    assert!(pong, "{lines:?}");
}

fn main() {
    if std::env::var_os(CHILD).is_some() {
        if let Err(e) = child() {
            eprintln!("serve_stdio: {e}");
            std::process::exit(1);
        }
        return;
    }
    let tests: &[(&str, fn())] = &[
        (
            "ticks_in_order_then_nothing_after_unsubscribing",
            ticks_in_order_then_nothing_after_unsubscribing,
        ),
        (
            "two_subscriptions_share_stdout",
            two_subscriptions_share_stdout,
        ),
        (
            "the_end_of_input_ends_subscriptions_and_the_process",
            the_end_of_input_ends_subscriptions_and_the_process,
        ),
        (
            "a_reader_that_stops_reading_is_bounded_and_told_what_it_lost",
            a_reader_that_stops_reading_is_bounded_and_told_what_it_lost,
        ),
        (
            "stdin_from_a_regular_file_ends_at_its_end",
            stdin_from_a_regular_file_ends_at_its_end,
        ),
    ];
    // libtest's arguments, as far as they concern choosing tests: names to run (by
    // substring, or exactly with `--exact`), `--skip NAME`, `--list`, `--ignored`
    // (none is); the values of other options are skipped.
    let (mut filters, mut skips, mut exact) = (Vec::new(), Vec::new(), false);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--list" => {
                for (name, _) in tests {
                    println!("{name}: test");
                }
                return;
            }
            "--ignored" => return,
            "--exact" => exact = true,
            "--skip" => skips.extend(args.next()),
            "--test-threads" | "--format" | "--color" | "--logfile" | "-Z" => {
                let _ = args.next();
            }
            _ if a.starts_with('-') => {}
            _ => filters.push(a),
        }
    }
    let matches = |name: &str, f: &String| {
        if exact {
            name == f
        } else {
            name.contains(f.as_str())
        }
    };
    let chosen: Vec<_> = tests
        .iter()
        .filter(|(name, _)| filters.is_empty() || filters.iter().any(|f| matches(name, f)))
        .filter(|(name, _)| !skips.iter().any(|f| matches(name, f)))
        .collect();
    println!("\nrunning {} tests", chosen.len());
    let mut failed = Vec::new();
    let ran = chosen.len();
    for (name, test) in chosen {
        println!("test {name} ...");
        match std::panic::catch_unwind(test) {
            Ok(()) => println!("test {name} ... ok"),
            Err(_) => {
                println!("test {name} ... FAILED");
                failed.push(*name);
            }
        }
    }
    if failed.is_empty() {
        println!("\ntest result: ok. {} passed", ran);
    } else {
        println!("\ntest result: FAILED. failures: {failed:?}");
        std::process::exit(101);
    }
}
