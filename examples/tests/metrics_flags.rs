//! The server example's metrics flags on real processes: metrics on by default at
//! `GET /metrics` on the HTTP listener, `--metrics ADDR` (a listener of their own, also
//! beside `--stdio`), and `--no-metrics`.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{examples_dir, Server};

/// `GET path` on `addr`: the status line and the body.
fn get(addr: &str, path: &str) -> (String, String) {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    (
        head.lines().next().unwrap_or_default().to_owned(),
        body.to_owned(),
    )
}

/// Starts the server example with `args`; its addresses by kind (`tcp`, `http`, ...), in
/// the order it printed them.
fn start(args: &[&str], listeners: usize) -> (Server, Vec<(String, String)>) {
    let (server, mut lines) = Server::start(args);
    let addrs = (0..listeners)
        .map(|_| {
            let line = lines.next().expect("a listening line").expect("stdout");
            let rest = line
                .strip_prefix("listening ")
                .unwrap_or_else(|| panic!("{line}"));
            let (kind, addr) = rest.split_once(' ').expect("kind and address");
            (kind.to_owned(), addr.to_owned())
        })
        .collect();
    (server, addrs)
}

fn ping(addr: &str) {
    let s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut r = BufReader::new(s);
    r.get_mut()
        .write_all(b"{\"jsonrpc\":\"2.0\",\"method\":\"ping\",\"id\":1}\n")
        .unwrap();
    let mut answer = String::new();
    r.read_line(&mut answer).unwrap();
    assert!(answer.contains("pong"), "{answer}");
}

const PING_TCP: &str = r#"ringrpc_requests_total{method="ping",transport="tcp",code="0"} 1"#;

#[test]
fn metrics_are_served_on_http_and_on_their_own_listener() {
    let args = [
        "--tcp",
        "127.0.0.1:0",
        "--http",
        "127.0.0.1:0",
        "--metrics",
        "127.0.0.1:0",
    ];
    let (_server, addrs) = start(&args, 3);
    let kinds: Vec<&str> = addrs.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(kinds, ["tcp", "http", "metrics"]);
    ping(&addrs[0].1);
    for (_, addr) in &addrs[1..] {
        let (status, body) = get(addr, "/metrics");
        assert_eq!(status, "HTTP/1.1 200 OK");
        assert!(body.contains(PING_TCP), "{body}");
        assert!(body.contains("# TYPE ringrpc_request_duration_seconds histogram"));
    }
}

#[test]
fn no_metrics_turns_them_off() {
    let args = [
        "--tcp",
        "127.0.0.1:0",
        "--http",
        "127.0.0.1:0",
        "--no-metrics",
    ];
    let (_server, addrs) = start(&args, 2);
    ping(&addrs[0].1);
    let (status, _) = get(&addrs[1].1, "/metrics");
    assert_eq!(status, "HTTP/1.1 404 Not Found");
}

#[test]
fn a_stdio_server_serves_metrics_beside() {
    let mut child = Command::new(examples_dir().join("server"))
        .args(["--stdio", "--metrics", "127.0.0.1:0"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the example binary");
    let mut stderr = BufReader::new(child.stderr.take().expect("stderr"));
    let mut line = String::new();
    stderr.read_line(&mut line).unwrap();
    let addr = line
        .trim()
        .strip_prefix("listening metrics ")
        .unwrap_or_else(|| panic!("{line}"))
        .to_owned();
    let mut stdin = child.stdin.take().expect("stdin");
    stdin
        .write_all(b"{\"jsonrpc\":\"2.0\",\"method\":\"ping\",\"id\":1}\n")
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
    let mut answer = String::new();
    stdout.read_line(&mut answer).unwrap();
    assert!(answer.contains("pong"), "{answer}");
    let (status, body) = get(&addr, "/metrics");
    assert_eq!(status, "HTTP/1.1 200 OK");
    for want in [
        r#"ringrpc_requests_total{method="ping",transport="stdio",code="0"} 1"#,
        r#"ringrpc_connections{transport="stdio"} 1"#,
        r#"ringrpc_bytes_received_total{transport="stdio"} 41"#,
    ] {
        assert!(body.contains(want), "{want} in\n{body}");
    }
    drop(stdin);
    let status = child.wait().unwrap();
    assert!(status.success());
}
