//! The server example's protection flags end to end, on real processes: `--auth-file`
//! reloaded by a real SIGHUP, `--rate-limit`, and `--dedup` — in memory, and in one
//! Redis shared by two server processes (a real `redis-server`, started here).

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use common::Server;
use serde_json::{json, Value};

// The engine tests' real redis-server launcher (one copy in the repository).
#[allow(dead_code)]
#[path = "../../engine/tests/util/redis.rs"]
mod redis;

/// Starts the server example with `args` on an ephemeral TCP port, HTTP off; it and
/// its TCP address.
fn start(args: &[&str]) -> (Server, String) {
    let mut all = vec!["--tcp", "127.0.0.1:0", "--http", "off"];
    all.extend_from_slice(args);
    let (server, mut lines) = Server::start(&all);
    let first = lines
        .next()
        .expect("the server exited before saying where it listens")
        .expect("its stdout");
    let addr = first
        .strip_prefix("listening tcp ")
        .unwrap_or_else(|| panic!("{first}"))
        .to_owned();
    (server, addr)
}

struct Line(BufReader<TcpStream>);

impl Line {
    fn new(addr: &str) -> Self {
        let s = TcpStream::connect(addr).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        Self(BufReader::new(s))
    }

    fn call(&mut self, method: &str, params: Value, id: Value) -> Value {
        let req = json!({"jsonrpc": "2.0", "method": method, "params": params, "id": id});
        let mut line = serde_json::to_vec(&req).unwrap();
        line.push(b'\n');
        self.0.get_mut().write_all(&line).unwrap();
        let mut answer = String::new();
        self.0.read_line(&mut answer).unwrap();
        serde_json::from_str(&answer).unwrap_or_else(|e| panic!("{e}: {answer:?}"))
    }
}

fn code(v: &Value) -> i64 {
    v["error"]["code"].as_i64().unwrap_or(0)
}

fn temp(name: &str, text: &str) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!("ringrpc-protect-{}-{name}", std::process::id()));
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn sighup_reloads_the_key_file_without_dropping_connections() {
    let keys = temp(
        "keys.toml",
        "[[key]]\nname = \"reader\"\ntoken = \"r3ader\"\nallow = [\"ping\"]\n",
    );
    let (server, addr) = start(&["--auth-file", keys.to_str().unwrap()]);
    let mut c = Line::new(&addr);
    assert_eq!(code(&c.call("ping", json!([]), json!(1))), -32040);
    let v = c.call("rpc.auth", json!({"token": "r3ader"}), json!(2));
    assert_eq!(v["result"]["identity"], "reader", "{v}");
    assert_eq!(code(&c.call("echo", json!([1]), json!(3))), -32041);

    std::fs::write(
        &keys,
        "[[key]]\nname = \"reader\"\ntoken = \"r3ader\"\nallow = [\"*\"]\n",
    )
    .unwrap();
    let status = Command::new("kill")
        .args(["-HUP", &server.pid().to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    // The reload happens on the server's own thread: poll for it, bounded.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut id = 10;
    loop {
        id += 1;
        let v = c.call("echo", json!([1]), json!(id));
        if v["result"] == json!([1]) {
            break;
        }
        assert_eq!(code(&v), -32041, "{v}");
        assert!(
            Instant::now() < deadline,
            "SIGHUP did not reload the key file"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // The same connection, still open and authenticated.
    assert_eq!(
        c.call("whoami", json!([]), json!(99))["result"]["identity"],
        "reader"
    );
    let _ = std::fs::remove_file(&keys);
}

#[test]
fn rate_limit_flag() {
    let (_server, addr) = start(&["--rate-limit", "1:3"]);
    let mut c = Line::new(&addr);
    let batch: Vec<Value> = (1..=5)
        .map(|i| json!({"jsonrpc": "2.0", "method": "ping", "id": i}))
        .collect();
    let req = serde_json::to_vec(&batch).unwrap();
    c.0.get_mut().write_all(&req).unwrap();
    c.0.get_mut().write_all(b"\n").unwrap();
    let mut line = String::new();
    c.0.read_line(&mut line).unwrap();
    let v: Value = serde_json::from_str(&line).unwrap();
    let codes: Vec<i64> = v.as_array().unwrap().iter().map(code).collect();
    assert_eq!(codes, [0, 0, 0, -32005, -32005], "{v}");
}

#[test]
fn dedup_memory_flag() {
    let keys = temp(
        "dedup-keys.toml",
        "[[key]]\nname = \"app\"\ntoken = \"t\"\nallow = [\"*\"]\n",
    );
    let (_server, addr) = start(&["--auth-file", keys.to_str().unwrap(), "--dedup", "memory"]);
    let mut c = Line::new(&addr);
    c.call("rpc.auth", json!({"token": "t"}), json!(0));
    assert_eq!(c.call("incr", json!([2]), json!(7))["result"], 2);
    assert_eq!(c.call("incr", json!([2]), json!(7))["result"], 2);
    assert_eq!(c.call("get_counter", json!([]), json!(8))["result"], 2);
    let _ = std::fs::remove_file(&keys);
}

#[test]
fn two_instances_share_one_redis() {
    let redis = redis::RedisServer::start();
    let url = redis.url();
    let keys = temp(
        "shared-keys.toml",
        "[[key]]\nname = \"app\"\ntoken = \"t\"\nallow = [\"*\"]\n",
    );
    let args = [
        "--auth-file",
        keys.to_str().unwrap(),
        "--dedup",
        url.as_str(),
    ];
    let (_a, addr_a) = start(&args);
    let (_b, addr_b) = start(&args);
    let mut a = Line::new(&addr_a);
    let mut b = Line::new(&addr_b);
    a.call("rpc.auth", json!({"token": "t"}), json!(0));
    b.call("rpc.auth", json!({"token": "t"}), json!(0));
    // `incr` with id 7 on A; the same request retried on B replays A's answer, and B's
    // own counter is unchanged: the call ran once, on A.
    assert_eq!(a.call("incr", json!([5]), json!(7))["result"], 5);
    let v = b.call("incr", json!([5]), json!(7));
    assert_eq!((&v["id"], &v["result"]), (&json!(7), &json!(5)), "{v}");
    assert_eq!(b.call("get_counter", json!([]), json!(8))["result"], 0);
    assert_eq!(a.call("get_counter", json!([]), json!(8))["result"], 5);
    // The same id with other params, on either instance: -32043.
    assert_eq!(code(&b.call("incr", json!([6]), json!(7))), -32043);
    // A new id runs where it lands.
    assert_eq!(b.call("incr", json!([1]), json!(9))["result"], 1);
    let _ = std::fs::remove_file(&keys);
}
