//! The `conform` binary against ringrpc's demo server (nothing may fail), against
//! deliberately broken servers (each breaks one rule; the cases of that rule must fail),
//! and against a third-party implementation with known deviations: Python's
//! `jsonrpcserver` 5.0.9 from PyPI behind `benches/scripts/jsonrpcserver_http.py` (needs
//! `python3 -m pip install jsonrpcserver==5.0.9`; `.ci/run` installs it). Also ringrpc's
//! proxy in front of the demo server: forwarding must not change a verdict.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::process::Command;

use ringrpc::proxy::Proxy;
use ringrpc::server::Server;
use ringrpc::{demo, Config, Engine, Outcome, Registry};

/// Runs `conform` with `args`; its exit code and stdout.
fn conform(args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_conform"))
        .args(args)
        .output()
        .expect("run conform");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// The summary line's three counts.
fn summary(stdout: &str) -> (usize, usize, usize) {
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.contains(" passed, "))
        .unwrap_or_else(|| panic!("no summary line in {stdout}"));
    let n: Vec<usize> = line
        .split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .take(3)
        .map(|s| s.parse().unwrap())
        .collect();
    (n[0], n[1], n[2])
}

/// The names of the failed cases.
fn failed(stdout: &str) -> Vec<String> {
    stdout
        .lines()
        .filter_map(|l| l.strip_prefix("FAIL "))
        .map(|l| l.split(':').next().unwrap_or("").to_string())
        .collect()
}

/// Runs `conform` against `url` (`how`: how it is reached, for messages): nothing may
/// fail or be skipped, more than 400 cases pass, exit 0.
fn passes_every_case(url: &str, how: &str) {
    let (code, out) = conform(&[url]);
    let (passed, failed, skipped) = summary(&out);
    assert_eq!((failed, skipped), (0, 0), "{url}{how}:\n{out}");
    assert!(passed > 400, "{url}{how}: only {passed} passed\n{out}");
    assert_eq!(code, Some(0), "{url}{how}");
}

#[test]
fn ringrpc_passes_every_case() {
    let mut server = Server::new(demo::engine(Config::default())).unwrap();
    let tcp = server.listen_tcp("127.0.0.1:0").unwrap();
    let http = server.listen_http("127.0.0.1:0").unwrap();
    let sock = std::env::temp_dir().join(format!("ringrpc-conform-{}.sock", std::process::id()));
    let _ = std::fs::remove_file(&sock);
    server.listen_unix(&sock).unwrap();
    let stop = server.handle();
    let thread = std::thread::spawn(move || server.run());
    for url in [
        format!("tcp://{tcp}"),
        format!("http://{http}/"),
        format!("unix://{}", sock.display()),
        format!("ws://{http}/"),
    ] {
        passes_every_case(&url, "");
    }
    stop.shutdown();
    thread.join().unwrap().unwrap();
    let _ = std::fs::remove_file(&sock);
}

#[test]
fn the_proxy_in_front_of_ringrpc_passes_every_case() {
    // Envelope-only forwarding must be invisible: the same 0 failures through the proxy,
    // to a tcp:// and to an http:// upstream, for clients over TCP and HTTP.
    let mut upstream = Server::new(demo::engine(Config::default())).unwrap();
    let up_tcp = upstream.listen_tcp("127.0.0.1:0").unwrap();
    let up_http = upstream.listen_http("127.0.0.1:0").unwrap();
    let stop_upstream = upstream.handle();
    let upstream = std::thread::spawn(move || upstream.run());
    for up in [format!("tcp://{up_tcp}"), format!("http://{up_http}/")] {
        let proxy = Proxy::builder().upstream("default", &up).start().unwrap();
        let mut methods = Registry::builder();
        proxy.install(&mut methods).unwrap();
        let mut front = Server::new(Engine::new(methods.freeze(), Config::default())).unwrap();
        let tcp = front.listen_tcp("127.0.0.1:0").unwrap();
        let http = front.listen_http("127.0.0.1:0").unwrap();
        let stop = front.handle();
        let thread = std::thread::spawn(move || front.run());
        for url in [format!("tcp://{tcp}"), format!("http://{http}/")] {
            passes_every_case(&url, &format!(" via {up}"));
        }
        stop.shutdown();
        thread.join().unwrap().unwrap();
        drop(proxy);
    }
    stop_upstream.shutdown();
    upstream.join().unwrap().unwrap();
}

/// A newline-delimited TCP server answering each line as ringrpc's demo engine does,
/// then passing the answer (None: no answer) and the request line through `mangle`.
fn broken(mangle: fn(&[u8], Option<String>) -> Option<String>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        let engine = std::sync::Arc::new(demo::engine(Config::default()));
        for conn in listener.incoming() {
            let Ok(conn) = conn else { continue };
            let engine = engine.clone();
            std::thread::spawn(move || {
                let mut w = conn.try_clone().unwrap();
                let mut r = BufReader::new(conn);
                let mut scratch = engine.scratch();
                let mut line = Vec::new();
                loop {
                    line.clear();
                    match r.read_until(b'\n', &mut line) {
                        Ok(0) | Err(_) => return,
                        Ok(_) => {}
                    }
                    let frame = line.strip_suffix(b"\n").unwrap_or(&line);
                    let frame = frame.strip_suffix(b"\r").unwrap_or(frame);
                    if frame.iter().all(|b| b.is_ascii_whitespace()) {
                        continue;
                    }
                    let mut out = Vec::new();
                    let answer = match engine.handle(frame, &mut scratch, &mut out) {
                        Outcome::Reply => Some(String::from_utf8_lossy(&out).into_owned()),
                        Outcome::Nothing => None,
                    };
                    match mangle(frame, answer) {
                        Some(a) if a == "CLOSE" => return,
                        Some(a)
                            if w.write_all(format!("{}\n", a.trim_end()).as_bytes())
                                .is_err() =>
                        {
                            return
                        }
                        Some(_) => {}
                        None => {}
                    }
                }
            });
        }
    });
    format!("tcp://{addr}")
}

/// Runs `conform` (no corpus unless `corpus`) against a broken server; the failed names.
fn broken_run(mangle: fn(&[u8], Option<String>) -> Option<String>, only: &[&str]) -> Vec<String> {
    let url = broken(mangle);
    let mut args = vec!["--timeout-ms", "3000"];
    for o in only {
        args.push("--only");
        args.push(o);
    }
    args.push(&url);
    let (code, out) = conform(&args);
    let f = failed(&out);
    assert_eq!(summary(&out).1, f.len(), "{out}");
    assert_eq!(code, Some(if f.is_empty() { 0 } else { 1 }), "{out}");
    f
}

fn is_probe(frame: &[u8]) -> bool {
    String::from_utf8_lossy(frame).contains("conform-probe")
}

#[test]
fn the_unmodified_engine_passes() {
    // The harness itself adds no failure: the same engine behind the scripted server.
    let f = broken_run(|_, a| a, &["spec.", "id.", "notify.", "batch.", "request."]);
    assert!(f.is_empty(), "{f:?}");
}

#[test]
fn answering_notifications_fails_the_notification_cases() {
    let f = broken_run(
        |_, a| Some(a.unwrap_or_else(|| r#"{"jsonrpc":"2.0","result":null,"id":null}"#.into())),
        &["spec.", "notify.", "id."],
    );
    for name in [
        "spec.notification-update",
        "spec.batch-all-notifications",
        "notify.call-method",
    ] {
        assert!(f.iter().any(|n| n == name), "{name} did not fail: {f:?}");
    }
    assert!(!f.iter().any(|n| n.starts_with("id.")), "{f:?}");
}

#[test]
fn ids_as_strings_fail_the_id_cases() {
    // Every numeric id comes back as a string.
    let f = broken_run(
        |_, a| {
            let mut v: serde_json::Value = serde_json::from_str(&a?).ok()?;
            if let Some(id) = v.get_mut("id") {
                if id.is_number() {
                    *id = serde_json::Value::String(id.to_string());
                }
            }
            Some(v.to_string())
        },
        &["id.", "notify."],
    );
    for name in ["id.zero", "id.exponent", "id.int-u64-max"] {
        assert!(f.iter().any(|n| n == name), "{name} did not fail: {f:?}");
    }
    assert!(
        !f.iter()
            .any(|n| n == "id.string" || n.starts_with("notify.")),
        "{f:?}"
    );
}

#[test]
fn rejecting_whole_batches_fails_the_batch_cases() {
    let f = broken_run(
        |frame, a| {
            if frame.first() == Some(&b'[') && frame.len() > 2 && !is_probe(frame) {
                Some(
                    r#"{"jsonrpc":"2.0","error":{"code":-32600,"message":"no batches"},"id":null}"#
                        .into(),
                )
            } else {
                a
            }
        },
        &["batch.", "spec."],
    );
    for name in [
        "batch.one-call",
        "batch.bad-element-others-stand",
        "spec.batch",
        "spec.invalid-batch",
    ] {
        assert!(f.iter().any(|n| n == name), "{name} did not fail: {f:?}");
    }
    assert!(
        !f.iter()
            .any(|n| n == "spec.positional-1" || n == "spec.empty-array"),
        "{f:?}"
    );
}

#[test]
fn wrong_parse_error_codes_fail_the_parse_and_corpus_cases() {
    let f = broken_run(
        |_, a| a.map(|a| a.replace("-32700", "-32600")),
        &["parse.", "corpus.n_", "spec.positional"],
    );
    assert!(f.iter().any(|n| n == "parse.truncated"), "{f:?}");
    assert!(
        f.iter().filter(|n| n.starts_with("corpus.n_")).count() > 100,
        "{f:?}"
    );
    assert!(!f.iter().any(|n| n.starts_with("spec.")), "{f:?}");
}

#[test]
fn a_server_dying_on_bad_json_fails_robustness_and_corpus() {
    // The connection is dropped on a parse error: the request after it goes unanswered.
    let f = broken_run(
        |_, a| match a {
            Some(a) if a.contains("-32700") => Some("CLOSE".into()),
            a => a,
        },
        &["corpus.n_string", "parse.", "robust.", "spec.positional"],
    );
    assert!(f.iter().any(|n| n.starts_with("corpus.n_string")), "{f:?}");
    assert!(f.iter().any(|n| n == "parse.trailing-garbage"), "{f:?}");
    assert!(!f.iter().any(|n| n.starts_with("spec.")), "{f:?}");
}

#[test]
fn malformed_responses_fail_the_shape_cases() {
    // "jsonrpc" left out of every answer but the probe's.
    let f = broken_run(
        |frame, a| {
            let a = a?;
            if is_probe(frame) {
                return Some(a);
            }
            Some(a.replace(r#""jsonrpc":"2.0","#, ""))
        },
        &["response.", "spec.positional-1"],
    );
    for name in [
        "response.result-shape",
        "response.error-shape",
        "spec.positional-1",
    ] {
        assert!(f.iter().any(|n| n == name), "{name} did not fail: {f:?}");
    }
}

#[test]
fn stdio_serde_baseline_passes_and_a_missing_method_skips() {
    // The serde_json baseline over stdio (a child process per case) has no `sum`: the
    // mixed batch of section 7 is skipped with a note, not failed.
    let url = format!("stdio:{}", env!("CARGO_BIN_EXE_stdio_serde"));
    let (code, out) = conform(&[&url]);
    let (passed, failed, skipped) = summary(&out);
    assert_eq!(failed, 0, "{out}");
    assert!(passed > 400, "{out}");
    assert_eq!(skipped, 1, "{out}");
    assert!(
        out.contains("SKIP spec.batch: the server has no `sum`"),
        "{out}"
    );
    assert_eq!(code, Some(0));
}

/// The deviations docs/CONFORMANCE.md lists for jsonrpcserver 5.0.9: it validates a batch
/// against one JSON schema, so one bad element (or none good) makes the whole batch a
/// single -32600; and Python's `json.loads` takes `NaN` and `Infinity`, which are not JSON.
const JSONRPCSERVER_DEVIATIONS: &[&str] = &[
    "spec.invalid-batch-one",
    "spec.invalid-batch",
    "spec.batch",
    "batch.bad-element-others-stand",
    "batch.bad-version-element",
    "batch.nested",
    "corpus.n_number_NaN",
    "corpus.n_number_infinity",
    "corpus.n_number_minus_infinity",
];

/// A child process killed when dropped, so a failed assertion leaves no server behind.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn python_jsonrpcserver_fails_exactly_its_known_deviations() {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/jsonrpcserver_http.py");
    let version = Command::new("python3")
        .args([
            "-c",
            "import importlib.metadata as m; print(m.version('jsonrpcserver'))",
        ])
        .output()
        .expect("this test needs python3");
    assert_eq!(
        String::from_utf8_lossy(&version.stdout).trim(),
        "5.0.9",
        "this test needs jsonrpcserver 5.0.9 (python3 -m pip install jsonrpcserver==5.0.9; .ci/run does): {}",
        String::from_utf8_lossy(&version.stderr)
    );
    let mut child = Child(
        Command::new("python3")
            .args([script, "--port", "0"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("start the jsonrpcserver wrapper"),
    );
    let mut line = String::new();
    BufReader::new(child.0.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .trim()
        .strip_prefix("listening http ")
        .unwrap_or_else(|| panic!("the wrapper printed {line:?}"));
    let url = format!("http://{addr}/");
    let (code, out) = conform(&[&url]);
    let (passed, _, skipped) = summary(&out);
    let mut got = failed(&out);
    got.sort();
    let mut want: Vec<String> = JSONRPCSERVER_DEVIATIONS
        .iter()
        .map(|s| s.to_string())
        .collect();
    want.sort();
    assert_eq!(got, want, "{out}");
    // Rejected whole: the mixed batch comes back as one -32600 object, not an array.
    assert!(
        out.contains("FAIL batch.bad-element-others-stand: not an array"),
        "{out}"
    );
    assert_eq!(skipped, 0, "{out}");
    assert_eq!(passed + want.len(), 402, "{out}");
    assert_eq!(code, Some(1));
}
