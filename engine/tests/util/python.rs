//! Running a Python client script for the interop tests.

use std::process::Command;

use serde_json::Value;

/// Runs `script` with `python3 -c`, `arg` as its argument, after checking that
/// `module` can be imported (`.ci/run` installs it); its stdout must be one JSON value.
pub fn run(module: &str, script: &str, arg: &str) -> Value {
    let ok = Command::new("python3")
        .args(["-c", &format!("import {module}")])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        ok,
        "this test needs python3 with the `{module}` package (pip install {module})"
    );
    let out = Command::new("python3")
        .args(["-c", script])
        .arg(arg)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "python client failed: {stderr}");
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
}
