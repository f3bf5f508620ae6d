//! `loadgen` against `floor` (TCP and HTTP, unverified), `jsonrpsee_server` (HTTP,
//! verified: single requests, a mix, pipelining and batches) and over WebSocket (jsonrpsee
//! and ringrpc, verified), each on an ephemeral port, for a short `--count`: exit code 0
//! and the summary's counts. Open loop (`--rate`): against a server that stalls once, the
//! latency measured from the due times carries the stall where closed loop hides it; and
//! against `delay [1]` the median is about 1 ms.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use benches::inputs::KEYS;
use serde_json::Value;

/// A server process, killed when dropped.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `bin` and returns it with the addresses of its `listening KIND ADDR` lines.
fn start(bin: &str, args: &[&str], lines: usize) -> (Server, Vec<(String, String)>) {
    let mut child = Command::new(bin)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {bin}: {e}"));
    let stdout = child.stdout.take().expect("piped stdout");
    let server = Server(child);
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut found = Vec::new();
    while found.len() < lines {
        let line = rx
            .recv_timeout(Duration::from_secs(20))
            .unwrap_or_else(|_| panic!("{bin} did not print its listening lines"));
        let mut words = line.split_whitespace();
        if let (Some("listening"), Some(kind), Some(addr)) =
            (words.next(), words.next(), words.next())
        {
            assert!(
                !addr.ends_with(":0"),
                "{bin} printed an unbound port: {line}"
            );
            found.push((kind.to_string(), addr.to_string()));
        }
    }
    (server, found)
}

fn addr_of<'a>(found: &'a [(String, String)], kind: &str) -> &'a str {
    &found
        .iter()
        .find(|(k, _)| k == kind)
        .unwrap_or_else(|| panic!("no `listening {kind}` line"))
        .1
}

/// Runs loadgen and returns its summary, asserting exit code 0.
fn loadgen(args: &[&str]) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_loadgen"))
        .args(args)
        .args(["--timeout", "5"])
        .stderr(Stdio::piped())
        .output()
        .expect("loadgen runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "loadgen {args:?} failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("summary {stdout:?}: {e}"))
}

fn n(v: &Value, key: &str) -> u64 {
    v[key].as_u64().unwrap_or_else(|| panic!("{key} in {v}"))
}

/// Every message sent was answered, none failed, and `elements` calls were answered.
fn assert_clean(v: &Value, count: u64, elements: u64) {
    assert_eq!(n(v, "requests"), count, "{v}");
    assert_eq!(n(v, "responses"), count, "{v}");
    assert_eq!(n(v, "elements"), elements, "{v}");
    assert_eq!(n(v, "errors"), 0, "{v}");
    assert_eq!(n(v, "mismatches"), 0, "{v}");
    assert!(v["rps"].as_f64().unwrap_or(0.0) > 0.0, "{v}");
    assert!(v["latency_us"]["p50"].as_f64().unwrap_or(0.0) > 0.0, "{v}");
}

#[test]
fn loadgen_against_floor() {
    let (_floor, found) = start(
        env!("CARGO_BIN_EXE_floor"),
        &["--tcp", "127.0.0.1:0", "--http", "127.0.0.1:0"],
        2,
    );
    let tcp = addr_of(&found, "tcp");
    let url = format!("http://{}/", addr_of(&found, "http"));

    let v = loadgen(&[
        "--tcp",
        tcp,
        "--no-verify",
        "--count",
        "2000",
        "--connections",
        "4",
        "--depth",
        "8",
    ]);
    assert_clean(&v, 2000, 2000);
    assert_eq!(v["transport"], "tcp");
    assert_eq!(v["verify"], false);

    let v = loadgen(&[
        "--http",
        &url,
        "--no-verify",
        "--count",
        "2000",
        "--connections",
        "4",
        "--depth",
        "8",
        "--threads",
        "2",
    ]);
    assert_clean(&v, 2000, 2000);
    assert_eq!(v["transport"], "http");
    assert_eq!(v["threads"], 2);
}

#[test]
fn loadgen_against_jsonrpsee() {
    let (_server, found) = start(
        env!("CARGO_BIN_EXE_jsonrpsee_server"),
        &["--http", "127.0.0.1:0"],
        1,
    );
    let url = format!("http://{}/", addr_of(&found, "http"));

    // Single requests, every method but sleep, one in flight per connection.
    let mix = "subtract:3,ping:1,echo:1,add:1,get_data:1,sum:1";
    let v = loadgen(&["--http", &url, "--count", "2000", "--mix", mix]);
    assert_clean(&v, 2000, 2000);
    assert_eq!(v["verify"], true);

    // Pipelined.
    let v = loadgen(&[
        "--http",
        &url,
        "--count",
        "2000",
        "--connections",
        "4",
        "--depth",
        "16",
        "--mix",
        mix,
    ]);
    assert_clean(&v, 2000, 2000);

    // Batches of 16 `add`, and a batch mixing methods (sleep included).
    let v = loadgen(&[
        "--http", &url, "--count", "200", "--batch", "16", "--mix", "add", "--depth", "2",
    ]);
    assert_clean(&v, 200, 3200);
    let v = loadgen(&[
        "--http",
        &url,
        "--count",
        "40",
        "--batch",
        "5",
        "--mix",
        "add,echo,ping,sleep",
        "--connections",
        "4",
    ]);
    assert_clean(&v, 40, 200);
}

#[test]
fn loadgen_over_websocket() {
    // jsonrpsee's WebSocket server, and ringrpc's (an engine served in this process).
    let (_server, found) = start(
        env!("CARGO_BIN_EXE_jsonrpsee_server"),
        &["--http", "127.0.0.1:0", "--ws"],
        1,
    );
    let jsonrpsee = format!("ws://{}/", addr_of(&found, "http"));
    let mut server =
        ringrpc::server::Server::new(ringrpc::demo::engine(ringrpc::Config::default())).unwrap();
    let addr = server.listen_http("127.0.0.1:0").unwrap();
    let handle = server.handle();
    let thread = std::thread::spawn(move || server.run());
    let ringrpc = format!("ws://{addr}/");
    let mix = "subtract:3,ping:1,echo:1,add:1,get_data:1,sum:1";
    for url in [&jsonrpsee, &ringrpc] {
        let v = loadgen(&[
            "--ws",
            url,
            "--count",
            "2000",
            "--mix",
            mix,
            "--connections",
            "4",
            "--depth",
            "16",
        ]);
        assert_clean(&v, 2000, 2000);
        assert_eq!(v["transport"], "ws");
        // Batches, with answers of 126 bytes and more (a longer frame header).
        let v = loadgen(&[
            "--ws", url, "--count", "200", "--batch", "16", "--mix", "add,echo", "--depth", "2",
        ]);
        assert_clean(&v, 200, 3200);
    }
    // Subscribers: every subscription answered, ticks counted.
    for url in [&jsonrpsee, &ringrpc] {
        let v = loadgen(&[
            "--ws",
            url,
            "--ticks",
            "1",
            "--connections",
            "8",
            "--duration",
            "1",
        ]);
        assert_eq!(n(&v, "subscribed"), 8, "{v}");
        assert_eq!(n(&v, "errors"), 0, "{v}");
        // Counted (how many depends on the machine: no bound is asserted).
        assert!(n(&v, "notifications") > 0, "{v}");
    }
    handle.shutdown();
    thread.join().unwrap().unwrap();
}

/// A newline-delimited TCP server answering every request `19` (ids echoed), one thread
/// per connection, that stalls every connection for `stall` once, when its `at`-th
/// request arrives. Returns its address; it serves until the test process ends.
fn stalling_server(at: u64, stall: Duration) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let seen = Arc::new(AtomicU64::new(0));
    let until = Arc::new(Mutex::new(None::<Instant>));
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { return };
            let (seen, until) = (seen.clone(), until.clone());
            std::thread::spawn(move || serve_stalling(conn, at, stall, &seen, &until));
        }
    });
    addr
}

fn serve_stalling(
    conn: TcpStream,
    at: u64,
    stall: Duration,
    seen: &AtomicU64,
    until: &Mutex<Option<Instant>>,
) {
    conn.set_nodelay(true).unwrap();
    let mut out = conn.try_clone().unwrap();
    for line in BufReader::new(conn).lines() {
        let Ok(line) = line else { return };
        if seen.fetch_add(1, Ordering::SeqCst) + 1 == at {
            *until.lock().unwrap() = Some(Instant::now() + stall);
        }
        let wait = until
            .lock()
            .unwrap()
            .map(|u| u.saturating_duration_since(Instant::now()));
        if let Some(w) = wait.filter(|w| !w.is_zero()) {
            std::thread::sleep(w);
        }
        let req: Value = serde_json::from_str(&line).unwrap();
        let answer = format!(r#"{{"jsonrpc":"2.0","id":{},"result":19}}"#, req["id"]);
        if writeln!(out, "{answer}").is_err() {
            return;
        }
    }
}

fn us(v: &Value, which: &str, q: &str) -> f64 {
    v[which][q]
        .as_f64()
        .unwrap_or_else(|| panic!("{which}.{q} in {v}"))
}

#[test]
fn open_loop_charges_a_stall() {
    // 1000 messages, the server stalls 200 ms at the 300th. Closed loop: only the two in
    // flight then wait, 0.2% of the calls, so the p99 stays far below the stall. Open loop
    // at 1000/s: the ~200 messages due during the stall are charged from their due time
    // (200 ms down to 0), 20% of the calls, so the p99 is most of the stall; the service
    // time of the same run (from each actual write) hides it as closed loop does.
    let stall = Duration::from_millis(200);
    let half = stall.as_micros() as f64 / 2.0;
    let common = ["--count", "1000", "--connections", "2"];

    let closed = loadgen(&[&["--tcp", &stalling_server(300, stall)][..], &common].concat());
    assert_clean(&closed, 1000, 1000);
    assert!(
        us(&closed, "latency_us", "max") >= stall.as_micros() as f64,
        "{closed}"
    );
    assert!(us(&closed, "latency_us", "p99") < half, "{closed}");
    assert!(closed.get("service_us").is_none(), "{closed}");

    let open = loadgen(
        &[
            &["--tcp", &stalling_server(300, stall), "--rate", "1000"][..],
            &common,
        ]
        .concat(),
    );
    assert_clean(&open, 1000, 1000);
    assert_eq!(open["rate"], 1000.0);
    assert!(us(&open, "latency_us", "p99") >= half, "{open}");
    assert!(
        us(&open, "latency_us", "p90") > us(&closed, "latency_us", "p90"),
        "{open}"
    );
    assert!(us(&open, "service_us", "p99") < half, "{open}");
}

#[test]
fn open_loop_against_a_fixed_delay() {
    // `delay [1]` answers 1 ms after the call: at a rate the server meets easily, the
    // median latency measured from the due times is about that (a generous band: the
    // point is that nothing is added, not how fast this machine is).
    let mut server =
        ringrpc::server::Server::new(ringrpc::demo::engine(ringrpc::Config::default())).unwrap();
    let addr = server.listen_tcp("127.0.0.1:0").unwrap().to_string();
    let handle = server.handle();
    let thread = std::thread::spawn(move || server.run());
    let v = loadgen(&[
        "--tcp",
        &addr,
        "--rate",
        "200",
        "--count",
        "200",
        "--connections",
        "4",
        "--mix",
        "delay",
        "--sleep-ms",
        "1",
    ]);
    assert_clean(&v, 200, 200);
    let p50 = us(&v, "latency_us", "p50");
    assert!((900.0..=5000.0).contains(&p50), "{v}");
    // Measured from the due time, never less than from the write.
    assert!(p50 >= us(&v, "service_us", "p50"), "{v}");
    handle.shutdown();
    thread.join().unwrap().unwrap();
}

/// A ringrpc demo server in this process on TCP, HTTP and a Unix socket; stopped when
/// dropped.
struct Ringrpc {
    tcp: String,
    http: String,
    unix: std::path::PathBuf,
    handle: ringrpc::server::ServerHandle,
    thread: Option<std::thread::JoinHandle<std::io::Result<()>>>,
}

impl Ringrpc {
    fn start(name: &str) -> Ringrpc {
        Ringrpc::serve(name, ringrpc::demo::engine(ringrpc::Config::default()))
    }

    fn serve(name: &str, engine: ringrpc::Engine) -> Ringrpc {
        let mut server = ringrpc::server::Server::new(engine).unwrap();
        let tcp = server.listen_tcp("127.0.0.1:0").unwrap().to_string();
        let http = format!("http://{}/", server.listen_http("127.0.0.1:0").unwrap());
        let unix = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}.sock"));
        let _ = std::fs::remove_file(&unix);
        server.listen_unix(&unix).unwrap();
        let handle = server.handle();
        let thread = Some(std::thread::spawn(move || server.run()));
        Ringrpc {
            tcp,
            http,
            unix,
            handle,
            thread,
        }
    }
}

impl Drop for Ringrpc {
    fn drop(&mut self) {
        self.handle.shutdown();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.unix);
    }
}

const WORKLOAD: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/workloads/demo.ndjson");

#[test]
fn workload_file_over_every_transport() {
    // benches/workloads/demo.ndjson: 12 messages a cycle: subtract x4 (expect 19), add x3
    // (random operands), echo (random strings), a batch of 10 sum, a batch of ping and a
    // notification, notify_hello x2 (notifications only: no answer, no slot).
    let server = Ringrpc::start("workload");
    let unix = server.unix.to_string_lossy().into_owned();
    for target in [
        ["--tcp", &server.tcp],
        ["--http", &server.http],
        ["--unix", &unix],
    ] {
        let v = loadgen(
            &[
                &target[..],
                &[
                    "--workload",
                    WORKLOAD,
                    "--count",
                    "1200",
                    "--connections",
                    "4",
                    "--depth",
                    "4",
                ],
            ]
            .concat(),
        );
        // 1200 messages: 100 cycles; the 200 of notifications are written, not answered
        // (over HTTP they are answered 204 and count as requests).
        let silent = if target[0] == "--http" { 0 } else { 200 };
        assert_eq!(n(&v, "notifications"), silent, "{v}");
        assert_clean(&v, 1200 - silent, 100 * (4 + 3 + 1 + 10 + 1));
        let m = &v["methods"];
        for (label, count) in [
            ("subtract", 400),
            ("add", 300),
            ("echo", 100),
            ("sum x10", 100),
        ] {
            assert_eq!(m[label]["count"], count, "{label} in {v}");
            assert!(m[label]["latency_us"]["p99"].as_f64().unwrap() > 0.0, "{v}");
        }
        assert_eq!(v["transport"], target[0].trim_start_matches("--"), "{v}");
        assert_eq!(v["workload"], WORKLOAD);
    }
}

#[test]
fn workload_answers_are_checked() {
    // A wrong `expect`, and a method the server lacks: each counted, the run fails (1).
    let server = Ringrpc::start("wrong");
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
    let file = dir.join("wrong.ndjson");
    std::fs::write(
        &file,
        concat!(
            r#"{"request": {"jsonrpc": "2.0", "method": "subtract", "params": [42, 23], "id": "{{id}}"}, "expect": 20}"#,
            "\n",
            r#"{"jsonrpc": "2.0", "method": "foobar", "id": "{{id}}"}"#,
            "\n"
        ),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_loadgen"))
        .args(["--tcp", &server.tcp, "--count", "10", "--connections", "1"])
        .arg("--workload")
        .arg(&file)
        .stderr(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["problems"]["wrong_result"], 5, "{v}");
    assert_eq!(v["error_codes"]["-32601"], 5, "{v}");
    assert_eq!(n(&v, "responses"), 10, "{v}");
}

#[test]
fn compare_prints_a_table_and_writes_the_json_and_the_chart() {
    // ringrpc over TCP against ringrpc over HTTP (both in this process), 2 rounds.
    let server = Ringrpc::start("compare");
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
    let (json, svg) = (dir.join("compare.json"), dir.join("compare.svg"));
    let _ = std::fs::remove_file(&json);
    let _ = std::fs::remove_file(&svg);
    let out = Command::new(env!("CARGO_BIN_EXE_loadgen"))
        .arg("--compare")
        .arg(format!("tcp=tcp://{}", server.tcp))
        .arg(format!("http={}", server.http))
        .args(["--rounds", "2", "--count", "2000", "--connections", "2"])
        .args(["--mix", "subtract:3,ping:1"])
        .arg("--json")
        .arg(&json)
        .arg("--plot")
        .arg(&svg)
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The table: a header, a row per server, the ratio row.
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(lines[0].starts_with("server"), "{stdout}");
    assert!(lines[1].starts_with("tcp "), "{stdout}");
    assert!(lines[2].starts_with("http "), "{stdout}");
    assert!(lines[3].starts_with("http / tcp "), "{stdout}");

    let v: Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let servers = v["servers"].as_array().unwrap();
    assert_eq!(servers.len(), 2, "{v}");
    for (s, transport) in servers.iter().zip(["tcp", "http"]) {
        assert_eq!(s["summary"]["transport"], transport, "{v}");
        // Both rounds, merged: every message answered.
        assert_eq!(s["rounds"].as_array().unwrap().len(), 2, "{v}");
        assert_clean(&s["summary"], 4000, 4000);
        assert_eq!(s["summary"]["methods"]["subtract"]["count"], 3000, "{v}");
        let curve = s["curve_us"].as_array().unwrap();
        assert!(curve.len() > 10, "{v}");
        assert_eq!(curve.last().unwrap()[0], 1.0, "{v}");
    }
    let ratio = v["ratios"][0]["rps"].as_f64().unwrap();
    let rps = |i: usize| servers[i]["summary"]["rps"].as_f64().unwrap();
    assert!((ratio - rps(1) / rps(0)).abs() < 0.01, "{v}");

    // The chart renders: a PNG of the SVG's size, not blank (the curves' colours).
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.contains("<svg"), "{text}");
    let tree = resvg::usvg::Tree::from_str(&text, &resvg::usvg::Options::default()).unwrap();
    let size = tree.size().to_int_size();
    assert_eq!((size.width(), size.height()), (960, 560));
    let mut pixmap = resvg::tiny_skia::Pixmap::new(size.width(), size.height()).unwrap();
    resvg::render(
        &tree,
        resvg::tiny_skia::Transform::default(),
        &mut pixmap.as_mut(),
    );
    let png = pixmap.encode_png().unwrap();
    assert!(png.len() > 2000, "a {} byte PNG", png.len());
    std::fs::write(dir.join("compare.png"), &png).unwrap();
    let coloured = |(r, g, b): (u8, u8, u8)| {
        pixmap
            .pixels()
            .iter()
            .filter(|p| (p.red(), p.green(), p.blue()) == (r, g, b) && p.alpha() == 255)
            .count()
    };
    // The first two curve colours of the chart (plot.rs), each drawn.
    assert!(coloured((0x1f, 0x77, 0xb4)) > 100, "no first curve");
    assert!(coloured((0xd6, 0x27, 0x28)) > 100, "no second curve");
    let white = coloured((255, 255, 255));
    assert!(white < pixmap.pixels().len() * 99 / 100, "blank");
}

/// The key file of the protected server below.
const HELLO: &str = r#"{"jsonrpc":"2.0","method":"rpc.auth","params":{"token":"r3ader"},"id":0}"#;

/// Runs loadgen expecting it to fail with `code`; returns its stderr.
fn loadgen_fails(args: &[&str], code: i32) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_loadgen"))
        .args(args)
        .args(["--timeout", "5"])
        .output()
        .expect("loadgen runs");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(code), "{args:?}: {stderr}");
    stderr
}

/// The demo counter's value, read with `incr [0]` over TCP as `reader`.
fn counter(tcp: &str) -> i64 {
    let mut s = TcpStream::connect(tcp).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut call = |line: &str| {
        s.write_all(format!("{line}\n").as_bytes()).unwrap();
        let mut answer = String::new();
        r.read_line(&mut answer).unwrap();
        serde_json::from_str::<Value>(&answer).unwrap()
    };
    assert_eq!(call(HELLO)["result"]["identity"], "reader");
    // An id of its own each time: a repeated one would be answered the first reading.
    static READS: AtomicU64 = AtomicU64::new(0);
    let n = READS.fetch_add(1, Ordering::Relaxed);
    let v = call(&format!(
        r#"{{"jsonrpc":"2.0","method":"incr","params":[0],"id":"count-{n}"}}"#
    ));
    v["result"].as_i64().unwrap_or_else(|| panic!("{v}"))
}

#[test]
fn protected_server_with_header_hello_and_incr() {
    // ringrpc with keys and the memory de-dup store. `incr` is keyed by (identity, id):
    // the counter ends at the number of incr calls only if no id was sent twice, by two
    // connections, two --compare rounds or two runs.
    let engine = ringrpc::demo::engine(ringrpc::Config::default())
        .with_guard(ringrpc::guard::Guard::new().with_keys_toml(KEYS).unwrap())
        .with_dedup(ringrpc::dedup::Dedup::memory(
            64 << 20,
            Duration::from_secs(600),
        ));
    let server = Ringrpc::serve("protected", engine);
    let unix = server.unix.to_string_lossy().into_owned();
    let ws = format!("ws://{}", server.http.trim_start_matches("http://"));
    let header = "Authorization: Bearer r3ader";
    let load = [
        "--mix",
        "ping:1,incr:1",
        "--count",
        "2000",
        "--connections",
        "4",
        "--depth",
        "8",
    ];
    let mut incr = 0;
    assert_eq!(counter(&server.tcp), 0);
    for target in [
        ["--tcp", &server.tcp, "--hello", HELLO],
        ["--unix", &unix, "--hello", HELLO],
        ["--http", &server.http, "--header", header],
        ["--ws", &ws, "--header", header],
        ["--ws", &ws, "--hello", HELLO],
    ] {
        let v = loadgen(&[&target[..], &load[..]].concat());
        assert_clean(&v, 2000, 2000);
        assert_eq!(v["methods"]["incr"]["count"], 1000, "{v}");
        incr += 1000;
        assert_eq!(counter(&server.tcp), incr, "{target:?}: replays");
    }
    // Two rounds against the same server twice: 4 runs in one process.
    let out = Command::new(env!("CARGO_BIN_EXE_loadgen"))
        .arg("--compare")
        .arg(format!("a=tcp://{}", server.tcp))
        .arg(format!("b=tcp://{}", server.tcp))
        .args(["--rounds", "2", "--mix", "incr", "--count", "500"])
        .args(["--connections", "4", "--depth", "8", "--hello", HELLO])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(counter(&server.tcp), incr + 2000, "replays across rounds");

    // A refused hello: a connect failure naming the server's error (exit 2).
    let bad = HELLO.replace("r3ader", "nope");
    let e = loadgen_fails(&["--tcp", &server.tcp, "--count", "10", "--hello", &bad], 2);
    assert!(
        e.contains("-32040") && e.contains("could not connect"),
        "{e}"
    );
    // No credentials: every call answered 401 (HTTP) or -32040 (TCP), exit 1.
    let e = loadgen_fails(&["--http", &server.http, "--count", "10"], 1);
    assert!(e.contains("HTTP 401"), "{e}");
    let e = loadgen_fails(&["--tcp", &server.tcp, "--count", "10"], 1);
    assert!(e.contains("-32040"), "{e}");
    let e = loadgen_fails(
        &[
            "--ws",
            &ws,
            "--count",
            "10",
            "--header",
            "Authorization: Bearer nope",
        ],
        2,
    );
    assert!(e.contains("401"), "{e}");
}

#[test]
fn header_and_hello_are_checked() {
    let server = Ringrpc::start("checked");
    for (args, why) in [
        (
            vec!["--http", &server.http, "--header", "Bad Name: x"],
            "not an HTTP token",
        ),
        (
            vec!["--http", &server.http, "--header", "X-A: a\r\nX-B: b"],
            "CR, LF",
        ),
        (
            vec!["--http", &server.http, "--header", "no colon"],
            "no `:`",
        ),
        (
            vec!["--http", &server.http, "--header", "Content-Length: 5"],
            "writes Content-Length itself",
        ),
        (
            vec!["--tcp", &server.tcp, "--header", "X-A: a"],
            "for HTTP and WebSocket",
        ),
        (
            vec!["--http", &server.http, "--hello", HELLO],
            "over HTTP send",
        ),
        (
            vec![
                "--tcp",
                &server.tcp,
                "--hello",
                r#"{"jsonrpc":"2.0","method":"ping"}"#,
            ],
            "needs an id",
        ),
        (
            vec![
                "--tcp",
                &server.tcp,
                "--hello",
                r#"{"jsonrpc":"2.0","method":"ping","id":1000000001}"#,
            ],
            "loadgen's own ids",
        ),
        // A server that does not authenticate: rpc.auth is -32601, a connect failure.
        (vec!["--tcp", &server.tcp, "--hello", HELLO], "-32601"),
    ] {
        let e = loadgen_fails(&[&args[..], &["--count", "10"]].concat(), 2);
        assert!(e.contains(why), "{args:?}: {e}");
    }
    // Any other hello answered with a result will do; extra headers go with HTTP.
    let ping = r#"{"jsonrpc": "2.0", "method": "ping",
                   "id": "hello"}"#;
    let v = loadgen(&["--tcp", &server.tcp, "--count", "100", "--hello", ping]);
    assert_clean(&v, 100, 100);
    let v = loadgen(&[
        "--http",
        &server.http,
        "--count",
        "100",
        "--header",
        "X-Trace:  a b\t",
    ]);
    assert_clean(&v, 100, 100);
}
