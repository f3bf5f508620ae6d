//! Helpers for the tests that run the example binaries.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Lines};
use std::path::PathBuf;
use std::process::{Child, ChildStdout, Command, Stdio};

/// target/debug/examples (beside this test's own binary in target/debug/deps).
pub fn examples_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>/deps")
        .join("examples");
    for name in ["server", "client", "stdio", "async_methods"] {
        assert!(
            dir.join(name).is_file(),
            "example binary {} is missing: `cargo test --workspace` builds it \
             (or run `cargo build --examples` first)",
            dir.join(name).display()
        );
    }
    dir
}

/// An example server, killed when dropped.
pub struct Server(Child);

impl Server {
    /// Starts the server example with `args`; it and its stdout's lines (`listening …`).
    pub fn start(args: &[&str]) -> (Self, Lines<BufReader<ChildStdout>>) {
        Self::example("server", args)
    }

    /// Starts the example `name` with `args`; it and its stdout's lines.
    pub fn example(name: &str, args: &[&str]) -> (Self, Lines<BufReader<ChildStdout>>) {
        let mut child = Command::new(examples_dir().join(name))
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .expect("the example binary");
        let stdout = child.stdout.take().expect("piped stdout");
        (Self(child), BufReader::new(stdout).lines())
    }
}

impl Server {
    /// The server process's id (to signal it).
    pub fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
