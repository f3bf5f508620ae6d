//! The README's commands, run as a reader would run them, against a real server.
//!
//! Every `console` block of README.md is a transcript: `$ command` lines, each followed
//! by what it prints (stdout and stderr, as a terminal shows them). This test starts
//! the demo server the README starts (on free ports), runs every command with `sh`, and
//! checks the output line for line. `cargo run --release --example NAME [--]` is run as
//! the example binary `cargo test` built (target/debug/examples/NAME), so the test
//! checks the programs, not cargo's build messages; the README's ports 7700 and 7701 are
//! replaced by the server's.
//!
//! The commands need `curl` and `sh` on the PATH (.ci/run installs curl).
//!
//! Also here: every example answers `--help` with its usage and exit code 0.

mod common;

use std::io::Read;
use std::process::{Command, Stdio};

use common::{examples_dir, Server};
use std::time::{Duration, Instant};

/// The longest one README command may take.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(20);

/// One `$ command` of a console block and the lines it must print.
#[derive(Debug)]
struct Transcript {
    command: String,
    output: Vec<String>,
    /// Where it stands in README.md, for failure messages.
    line: usize,
}

/// Every `$` command in README.md's ```console blocks, in order.
fn transcripts(readme: &str) -> Vec<Transcript> {
    let mut out: Vec<Transcript> = Vec::new();
    let mut in_console = false;
    for (i, line) in readme.lines().enumerate() {
        let trimmed = line.trim_end();
        if !in_console {
            in_console = trimmed == "```console";
            continue;
        }
        if trimmed == "```" {
            in_console = false;
        } else if let Some(command) = trimmed.strip_prefix("$ ") {
            out.push(Transcript {
                command: command.to_owned(),
                output: Vec::new(),
                line: i + 1,
            });
        } else {
            let t = out
                .last_mut()
                .unwrap_or_else(|| panic!("README.md:{}: output before any `$` line", i + 1));
            t.output.push(trimmed.to_owned());
        }
    }
    assert!(!in_console, "README.md: a console block is not closed");
    out
}

/// `command` with `cargo run --release --example NAME [--]` turned into the built
/// example's path and the README's ports into `ports`' (tcp, http).
fn localize(command: &str, examples: &std::path::Path, ports: (u16, u16)) -> String {
    let mut c = command.to_owned();
    for name in ["server", "client", "stdio"] {
        let bin = examples.join(name).display().to_string();
        c = c.replace(&format!("cargo run --release --example {name} --"), &bin);
        c = c.replace(&format!("cargo run --release --example {name}"), &bin);
    }
    c.replace("127.0.0.1:7700", &format!("127.0.0.1:{}", ports.0))
        .replace("127.0.0.1:7701", &format!("127.0.0.1:{}", ports.1))
}

/// Runs `command` with `sh`, stderr merged into stdout as on a terminal; its output, or
/// a panic naming the command if it outlives [`COMMAND_TIMEOUT`].
fn run(command: &str) -> String {
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(format!("exec 2>&1; {command}"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("sh");
    let mut stdout = child.stdout.take().expect("piped stdout");
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout.read_to_string(&mut s);
        s
    });
    let deadline = Instant::now() + COMMAND_TIMEOUT;
    while child.try_wait().expect("wait").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("`{command}` did not finish within {COMMAND_TIMEOUT:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    reader.join().expect("the reader thread")
}

#[test]
fn readme_commands_print_what_the_readme_says() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md"))
        .expect("README.md at the workspace root");
    let all = transcripts(&readme);
    // Every curl and client command the README shows must be one this test runs: a
    // `$` line of a console block, not a line of some other block.
    for (i, line) in readme.lines().enumerate() {
        let line = line.trim_start();
        assert!(
            !(line.starts_with("curl ")
                || line.starts_with("cargo run --release --example client")),
            "README.md:{}: a command outside a console transcript, which no test runs: {line}",
            i + 1
        );
    }
    let examples = examples_dir();
    let (server_cmd, rest): (Vec<Transcript>, Vec<Transcript>) = all
        .into_iter()
        .partition(|t| t.command == "cargo run --release --example server");
    let [server_cmd] = &server_cmd[..] else {
        panic!(
            "README.md must show `$ cargo run --release --example server` once, with its output"
        );
    };
    assert!(
        rest.len() >= 6,
        "expected the README's curl, stdio and client transcripts, found {}: {rest:?}",
        rest.len()
    );

    // The server, on free ports; its first lines must be the README's but for the ports.
    let (server, mut lines) = Server::start(&["--tcp", "127.0.0.1:0", "--http", "127.0.0.1:0"]);
    let mut ports = (0, 0);
    for want in &server_cmd.output {
        let got = lines
            .next()
            .expect("the server exited before saying where it listens")
            .expect("the server's stdout");
        let (kind, addr) = got.rsplit_once(' ').expect("`listening KIND ADDR`");
        let port: u16 = addr
            .rsplit_once(':')
            .and_then(|(_, p)| p.parse().ok())
            .expect("ADDR:PORT");
        match kind {
            "listening tcp" => ports.0 = port,
            "listening http" => ports.1 = port,
            _ => {}
        }
        let readme_port = if kind == "listening tcp" { 7700 } else { 7701 };
        assert_eq!(
            got.replace(&format!(":{port}"), &format!(":{readme_port}")),
            *want,
            "README.md:{}: the server's output",
            server_cmd.line
        );
    }
    assert!(ports.0 != 0 && ports.1 != 0, "{ports:?}");

    for t in &rest {
        let command = localize(&t.command, &examples, ports);
        let got = run(&command);
        let got: Vec<&str> = got.lines().map(str::trim_end).collect();
        assert_eq!(
            got, t.output,
            "README.md:{}: `{}` (run as `{command}`)",
            t.line, t.command
        );
    }
    drop(server);
}

#[test]
fn every_example_answers_help() {
    let examples = examples_dir();
    for name in ["server", "client", "stdio"] {
        let out = Command::new(examples.join(name))
            .arg("--help")
            .stdin(Stdio::null())
            .output()
            .expect("the example");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{name} --help: {:?}", out.status);
        assert!(
            stdout.contains(&format!("Usage: {name}")),
            "{name} --help printed: {stdout}"
        );
    }
}

#[test]
fn the_server_flag_cors_origin_answers_preflights() {
    use std::io::Write;
    let (_server, mut lines) = Server::start(&[
        "--tcp",
        "off",
        "--http",
        "127.0.0.1:0",
        "--cors-origin",
        "http://localhost:3000",
    ]);
    let first = lines
        .next()
        .expect("a listening line")
        .expect("the server's stdout");
    let addr = first
        .strip_prefix("listening http ")
        .unwrap_or_else(|| panic!("{first}"));
    let mut s = std::net::TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(COMMAND_TIMEOUT)).expect("timeout");
    s.write_all(
        b"OPTIONS / HTTP/1.1\r\nHost: x\r\nOrigin: http://localhost:3000\r\n\
          Access-Control-Request-Method: POST\r\nConnection: close\r\n\r\n",
    )
    .expect("write");
    let mut answer = String::new();
    s.read_to_string(&mut answer).expect("read");
    assert!(
        answer.starts_with("HTTP/1.1 204 No Content\r\n"),
        "{answer}"
    );
    assert!(
        answer.contains("\r\nAccess-Control-Allow-Origin: http://localhost:3000\r\n"),
        "{answer}"
    );
}
