//! The JSONTestSuite parsing corpus (vendored in `tests/data/jsontestsuite/test_parsing`,
//! MIT, see its README) through the engine, with the default `Config` (`max_depth` 64).
//!
//! - `n_` (must reject): exactly one reply, a JSON object with code `-32700` and id `null`.
//! - `y_` (must accept): not `-32700`; a well-formed JSON-RPC error object or response
//!   array (`-32600` unless the file happens to be a valid request).
//! - `i_` (either way): answered without panicking, with a well-formed reply.
//!
//! Each file is one frame given whole to `Engine::handle` (files hold raw newlines and
//! arbitrary bytes); every file is also streamed through `handle_lines` with a trailing
//! `\n`, where each line of output must be a well-formed reply.
//!
//! All mismatches are collected and reported together.

mod util;

use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};

use ringrpc::{Config, Outcome};
use serde_json::Value;
use util::{check_reply, error_code, is_parse_error, show, Harness, INVALID_REQUEST, PARSE_ERROR};

/// The corpus files, sorted by name, with their bytes.
fn corpus() -> Vec<(String, Vec<u8>)> {
    let dir = util::data_dir("jsontestsuite/test_parsing");
    let files: Vec<(String, Vec<u8>)> = util::read_dir_sorted(&dir)
        .into_iter()
        .filter(|(name, _)| name.ends_with(".json"))
        .collect();
    assert!(
        files.len() > 300,
        "expected the full JSONTestSuite corpus (318 files) in {}, found {}",
        dir.display(),
        files.len()
    );
    files
}

/// How one file was answered, for the per-category summary.
fn describe(v: &Value) -> String {
    match v {
        Value::Array(items) => format!("batch of {}", items.len()),
        _ => match v.get("error") {
            Some(e) => format!("{}", e.get("code").unwrap_or(&Value::Null)),
            None => "result".into(),
        },
    }
}

/// Checks one file given whole to `handle`; `Err` explains the mismatch.
fn check_whole(h: &mut Harness, name: &str, bytes: &[u8]) -> Result<String, String> {
    let (outcome, out) = catch_unwind(AssertUnwindSafe(|| h.handle(bytes)))
        .map_err(|_| "handle panicked".to_string())?;
    if outcome == Outcome::Nothing {
        return if out.is_empty() {
            Err("no reply (Outcome::Nothing)".into())
        } else {
            Err(format!("Outcome::Nothing but wrote {}", show(&out)))
        };
    }
    let v = check_reply(&out)?;
    let kind = describe(&v);
    match name.as_bytes()[0] {
        b'n' if !is_parse_error(&v) => {
            return Err(format!(
                "must be rejected with one -32700 object, id null; got {}",
                show(&out)
            ));
        }
        b'y' => {
            if error_code(&v) == Some(PARSE_ERROR) {
                return Err(format!("valid JSON rejected: {}", show(&out)));
            }
            // No `y_` file is a JSON-RPC request, so every answer (the single object, or
            // each element of a batch reply) must be `-32600`.
            let answers = match &v {
                Value::Array(items) => items.iter().collect(),
                _ => vec![&v],
            };
            if let Some(a) = answers
                .iter()
                .find(|a| error_code(a) != Some(INVALID_REQUEST))
            {
                return Err(format!("expected -32600, got {a} in {}", show(&out)));
            }
        }
        _ => {}
    }
    Ok(kind)
}

/// Checks one file streamed through `handle_lines` with a trailing newline.
fn check_lines(h: &mut Harness, bytes: &[u8]) -> Result<(), String> {
    let mut input = bytes.to_vec();
    input.push(b'\n');
    let (out, rest) = catch_unwind(AssertUnwindSafe(|| h.handle_lines_pieces([&input[..]])))
        .map_err(|_| "handle_lines panicked".to_string())?;
    if !rest.is_empty() {
        return Err(format!("handle_lines left {} in the buffer", show(&rest)));
    }
    if !(out.is_empty() || out.ends_with(b"\n")) {
        return Err(format!(
            "output does not end with a newline: {}",
            show(&out)
        ));
    }
    for line in out.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
        check_reply(line).map_err(|e| format!("handle_lines: {e}"))?;
    }
    Ok(())
}

#[test]
fn jsontestsuite_parsing_corpus() {
    let mut h = Harness::new(Config::default());
    let mut failures = Vec::new();
    // category -> (files, answer kind -> count)
    let mut summary: BTreeMap<char, (usize, BTreeMap<String, usize>)> = BTreeMap::new();
    let mut i_answers = Vec::new();
    let mut deep = Vec::new();

    for (name, bytes) in corpus() {
        let category = name.chars().next().unwrap_or('?');
        assert!(
            matches!(category, 'n' | 'y' | 'i'),
            "unexpected file name {name}"
        );
        match check_whole(&mut h, &name, &bytes) {
            Ok(kind) => {
                let entry = summary.entry(category).or_default();
                entry.0 += 1;
                *entry.1.entry(kind.clone()).or_default() += 1;
                if category == 'i' {
                    i_answers.push(format!("{name}: {kind}"));
                }
            }
            Err(e) => failures.push(format!("{name} (handle): {e}")),
        }
        if let Err(e) = check_lines(&mut h, &bytes) {
            failures.push(format!("{name} (handle_lines): {e}"));
        }
        let (_, out) = h.handle(&bytes);
        if out.windows(9).any(|w| w == b"max_depth") {
            deep.push(format!("{name}: {}", String::from_utf8_lossy(&out)));
        }
    }

    for (category, (files, kinds)) in &summary {
        eprintln!("{category}_ files answered as expected: {files}  (answers: {kinds:?})");
    }
    eprintln!("i_ answers:\n  {}", i_answers.join("\n  "));
    eprintln!(
        "files answered with the depth limit:\n  {}",
        deep.join("\n  ")
    );
    assert!(
        failures.is_empty(),
        "{} mismatch(es):\n{}",
        failures.len(),
        failures.join("\n")
    );
    for category in ['n', 'y', 'i'] {
        assert!(
            summary.contains_key(&category),
            "no {category}_ files checked"
        );
    }
}
