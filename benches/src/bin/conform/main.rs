//! `conform`: a black-box JSON-RPC 2.0 conformance runner for any server.
//!
//! ```text
//! conform [--list] [--only PATTERN]… [--json FILE] [--timeout-ms N] [--corpus DIR] URL
//! ```
//!
//! URL is `http://HOST:PORT/PATH`, `ws://HOST:PORT/PATH`, `tcp://HOST:PORT`,
//! `unix:///PATH` or `stdio:COMMAND ARGS…` (everything after it is the command's). One
//! line per failed (and skipped) case, then `N passed, M failed, K skipped`; the exit
//! status is 0 only when nothing failed (2: the server could not be reached at all).
//! docs/CONFORMANCE.md lists the cases.

mod cases;
mod check;
mod run;
mod wire;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use serde_json::json;

use check::Verdict;

#[derive(Parser)]
#[command(about = "JSON-RPC 2.0 conformance cases against any server")]
struct Args {
    /// List the cases (name and what each checks) and exit.
    #[arg(long)]
    list: bool,
    /// Run only the cases whose name contains PATTERN (repeatable: any of them).
    #[arg(long, value_name = "PATTERN")]
    only: Vec<String>,
    /// Write every case's verdict, what was sent and what came back as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// How long to wait for an answer after a case's last byte.
    #[arg(long, default_value_t = 5000)]
    timeout_ms: u64,
    /// The JSONTestSuite `test_parsing` directory (default: the repository's copy).
    #[arg(long, value_name = "DIR")]
    corpus: Option<PathBuf>,
    /// The server: http://HOST:PORT/PATH, ws://HOST:PORT/PATH, tcp://HOST:PORT,
    /// unix:///PATH or stdio:COMMAND (then the command's arguments).
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "URL"
    )]
    target: Vec<String>,
}

/// `bytes` for a report line: UTF-8 (lossy) with control characters escaped, cut after
/// `max` characters.
pub fn show(bytes: &[u8], max: usize) -> String {
    let text = String::from_utf8_lossy(bytes);
    let mut out = String::new();
    for (n, c) in text.chars().enumerate() {
        if n == max {
            out.push_str(&format!("… ({} bytes)", bytes.len()));
            break;
        }
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    out
}

fn default_corpus() -> PathBuf {
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../engine/tests/data/jsontestsuite/test_parsing"
    ))
}

fn main() -> ExitCode {
    let args = Args::parse();
    let mut all = cases::all();
    match cases::corpus(&args.corpus.clone().unwrap_or_else(default_corpus)) {
        Ok(c) => all.extend(c),
        Err(e) => eprintln!("conform: no JSONTestSuite corpus ({e}); its cases are left out"),
    }
    let selected: Vec<&cases::Case> = all
        .iter()
        .filter(|c| args.only.is_empty() || args.only.iter().any(|p| c.name.contains(p.as_str())))
        .collect();
    if args.list {
        for c in &selected {
            println!("{}\t{}", c.name, c.what);
        }
        return ExitCode::SUCCESS;
    }
    let Some((url, extra)) = args.target.split_first() else {
        eprintln!("conform: a URL is needed (see --help)");
        return ExitCode::from(2);
    };
    let target = match wire::Target::parse(url, extra) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("conform: {e}");
            return ExitCode::from(2);
        }
    };
    let kind = target.kind();
    let settings = run::Settings {
        timeout: Duration::from_millis(args.timeout_ms),
    };
    let started = Instant::now();
    let (mut passed, mut failed, mut skipped) = (0usize, 0usize, 0usize);
    let mut report = Vec::new();
    let mut reached = false;
    for case in selected.iter().filter(|c| c.applies(kind)) {
        let o = run::run(case, &target, &settings);
        let (verdict, note) = match &o.verdict {
            Verdict::Pass(n) => {
                passed += 1;
                reached = true;
                ("pass", n.clone())
            }
            Verdict::Skip(n) => {
                skipped += 1;
                reached = true;
                println!("SKIP {}: {n}", case.name);
                ("skip", Some(n.clone()))
            }
            Verdict::Fail(why) => {
                failed += 1;
                if why.starts_with("cannot connect") || why.starts_with("cannot start") {
                    if !reached {
                        eprintln!("conform: {why}");
                        return ExitCode::from(2);
                    }
                } else {
                    reached = true;
                }
                println!(
                    "FAIL {}: {why}\n    sent:     {}\n    expected: {}\n    got:      {}",
                    case.name, o.sent, o.expected, o.got
                );
                ("fail", Some(why.clone()))
            }
        };
        report.push(json!({
            "name": case.name,
            "family": case.family(),
            "verdict": verdict,
            "note": note,
            "what": case.what,
            "rule": case.rule,
            "sent": o.sent,
            "expected": o.expected,
            "got": o.got,
        }));
    }
    println!(
        "{passed} passed, {failed} failed, {skipped} skipped ({} over {}, {:.1} s)",
        url,
        kind.name(),
        started.elapsed().as_secs_f64()
    );
    if let Some(path) = &args.json {
        let doc = json!({
            "target": url,
            "transport": kind.name(),
            "passed": passed,
            "failed": failed,
            "skipped": skipped,
            "cases": report,
        });
        let text = serde_json::to_string_pretty(&doc).unwrap_or_default();
        if let Err(e) = std::fs::write(path, text) {
            eprintln!("conform: cannot write {}: {e}", path.display());
            return ExitCode::from(2);
        }
    }
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
