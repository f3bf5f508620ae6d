//! Replays the committed fuzz corpora on stable Rust, through the same checks the fuzz
//! targets apply (`ringrpc::fuzzing`), so `cargo test --workspace` re-runs every input
//! the fuzzer kept: `fuzz/corpus/<target>/` for `engine`, `differential`, `lines`,
//! `http`, `websocket` and `client`, and, for `structured` (whose corpus files are `arbitrary`'s encoding), the
//! JSON frames they render to in `fuzz/rendered/structured/`. See docs/FUZZING.md.
//!
//! All failing inputs of a target are reported together, each by file name.

mod util;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;

use ringrpc::fuzzing;

fn fuzz_dir(rel: &str) -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../fuzz")).join(rel)
}

/// The files of `fuzz/<rel>`, sorted by name, with their bytes; there must be some.
fn files(rel: &str) -> Vec<(String, Vec<u8>)> {
    let dir = fuzz_dir(rel);
    let files = util::read_dir_sorted(&dir);
    assert!(!files.is_empty(), "no corpus in {}", dir.display());
    files
}

/// Runs `check` on every file of `fuzz/<rel>`; fails listing every input that panics.
fn replay(rel: &str, check: impl Fn(&[u8])) -> usize {
    let files = files(rel);
    let failed: Vec<&str> = files
        .iter()
        .filter(|(_, bytes)| catch_unwind(AssertUnwindSafe(|| check(bytes))).is_err())
        .map(|(name, _)| name.as_str())
        .collect();
    assert!(
        failed.is_empty(),
        "{} of {} inputs in fuzz/{rel} fail (messages above): {failed:?}",
        failed.len(),
        files.len()
    );
    files.len()
}

#[test]
fn engine_corpus() {
    replay("corpus/engine", fuzzing::check_engine);
}

#[test]
fn differential_corpus() {
    replay("corpus/differential", fuzzing::check_differential);
}

#[test]
fn lines_corpus() {
    replay("corpus/lines", fuzzing::check_lines);
}

#[test]
fn websocket_corpus() {
    replay("corpus/websocket", fuzzing::check_websocket);
}

#[test]
fn http_corpus() {
    replay("corpus/http", fuzzing::check_http);
}

#[cfg(feature = "client")]
#[test]
fn client_corpus() {
    replay("corpus/client", fuzzing::check_client);
}

/// The `structured` target's inputs, rendered; each rendered frame must come from a
/// corpus file (`<name>.json` for `corpus/structured/<name>`), so a re-minimized corpus
/// without a fresh rendering is noticed.
#[test]
fn structured_corpus_rendered() {
    let n = replay("rendered/structured", |frame| {
        fuzzing::check_differential(frame);
        fuzzing::check_engine(frame);
    });
    let raw: std::collections::BTreeSet<String> = files("corpus/structured")
        .into_iter()
        .map(|(name, _)| name)
        .collect();
    let orphans: Vec<String> = files("rendered/structured")
        .into_iter()
        .map(|(name, _)| name)
        .filter(|name| {
            !name
                .strip_suffix(".json")
                .is_some_and(|raw_name| raw.contains(raw_name))
        })
        .collect();
    assert!(
        orphans.is_empty(),
        "rendered frames without a corpus file (re-render: see docs/FUZZING.md): {orphans:?}"
    );
    // Most inputs decode; a rendering that lost most of them is stale.
    assert!(
        n * 2 >= raw.len(),
        "only {n} rendered frames for {} corpus files: re-render (docs/FUZZING.md)",
        raw.len()
    );
}
