//! `loadgen` against `floor` (TCP and HTTP, unverified), `jsonrpsee_server` (HTTP,
//! verified: single requests, a mix, pipelining and batches) and over WebSocket (jsonrpsee
//! and ringrpc, verified), each on an ephemeral port, for a short `--count`: exit code 0
//! and the summary's counts.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

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
