//! The load generator behind the `loadgen` binary (documented there), in modules:
//! [`workload`] (the messages), [`drivers`] (connections), [`verify`] (answers),
//! [`stats`] (counters, histograms) and [`output`] (progress, summary).

mod drivers;
mod output;
mod stats;
mod ticks;
mod verify;
mod workload;

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use clap::Parser;

use drivers::worker;
use output::{Latency, Progress, Summary, START};
use stats::{Stats, PROBLEMS};
use ticks::subscribers;
use workload::{build_plan, Transport};

#[derive(Parser, Clone)]
#[command(about = "Load generator and verifier for JSON-RPC 2.0 servers (TCP, HTTP or WebSocket)")]
pub(crate) struct Args {
    /// Newline-delimited JSON over TCP to ADDR (host:port).
    #[arg(
        long,
        value_name = "ADDR",
        conflicts_with_all = ["http", "ws"],
        required_unless_present_any = ["http", "ws"]
    )]
    pub(crate) tcp: Option<String>,
    /// HTTP/1.1 keep-alive POSTs to URL (http://host:port/path).
    #[arg(long, value_name = "URL", conflicts_with = "ws")]
    pub(crate) http: Option<String>,
    /// WebSocket messages to URL (ws://host:port/path).
    #[arg(long, value_name = "URL")]
    pub(crate) ws: Option<String>,
    /// Connections.
    #[arg(long, default_value_t = 16)]
    pub(crate) connections: usize,
    /// Messages in flight per connection (pipelining).
    #[arg(long, default_value_t = 1)]
    pub(crate) depth: usize,
    /// 0: single requests; B ≥ 1: each message is a batch of B calls.
    #[arg(long, default_value_t = 0)]
    pub(crate) batch: usize,
    /// Request mix, `method[:weight],...` (subtract, add, sum, ping, echo, get_data, sleep,
    /// delay).
    #[arg(long, default_value = "subtract:1")]
    pub(crate) mix: String,
    /// Open loop: send N messages per second in all, on a fixed schedule spread over the
    /// connections (each still keeps at most --depth in flight; one that is due waits
    /// for room). Latency is then measured from each message's due time, so a server
    /// that stalls is charged for every call it delayed (coordinated omission corrected,
    /// as wrk2 does). Without it: closed loop, each connection sending as soon as it may.
    #[arg(long, value_name = "N")]
    pub(crate) rate: Option<f64>,
    /// Seconds to measure (after the warm-up); the default when --count is not given is 10.
    #[arg(long, conflicts_with = "count")]
    pub(crate) duration: Option<f64>,
    /// Messages to measure in total (after the warm-up), spread over the connections.
    #[arg(long)]
    pub(crate) count: Option<u64>,
    /// Seconds of load before measuring.
    #[arg(long, default_value_t = 0.0)]
    pub(crate) warmup: f64,
    /// Threads, each with its own poll and its share of the connections.
    #[arg(long, default_value_t = 1)]
    pub(crate) threads: usize,
    /// Do not check the responses (for a server with a fixed answer): only frame them.
    #[arg(long)]
    pub(crate) no_verify: bool,
    /// The `ms` of `sleep` and `delay` calls.
    #[arg(long, default_value_t = 1)]
    pub(crate) sleep_ms: u64,
    /// Seconds without any byte received, while requests are outstanding, after which a
    /// connection is given up as stalled.
    #[arg(long, default_value_t = 10.0)]
    pub(crate) timeout: f64,
    /// Subscriber mode (TCP or WebSocket): each connection calls `subscribe_ticks [MS]`
    /// once and then only reads, counting the `tick` notifications delivered (and any
    /// `lagged` counts of dropped ones); the summary gives notifications per second.
    #[arg(long, value_name = "MS")]
    pub(crate) ticks: Option<f64>,
}

pub(crate) fn main() -> ExitCode {
    let args = Args::parse();
    let plan = match build_plan(&args) {
        Ok(p) => Arc::new(p),
        Err(e) => {
            eprintln!("loadgen: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(ms) = args.ticks {
        if plan.transport == Transport::Http {
            eprintln!("loadgen: --ticks needs --tcp or --ws (HTTP cannot push)");
            return ExitCode::from(2);
        }
        return subscribers(&args, &plan, ms);
    }
    let threads = args.threads.min(args.connections);
    let barrier = Arc::new(Barrier::new(threads + 1));
    let abort = Arc::new(AtomicBool::new(false));
    let mut handles = Vec::new();
    let mut progress = Vec::new();
    for t in 0..threads {
        let p = Arc::new(Progress::default());
        progress.push(p.clone());
        let (plan, barrier, abort) = (plan.clone(), barrier.clone(), abort.clone());
        let connections = args.connections;
        let h = std::thread::Builder::new()
            .name(format!("loadgen-{t}"))
            .spawn(move || worker(t, threads, plan, connections, barrier, abort, p));
        match h {
            Ok(h) => handles.push(h),
            Err(e) => {
                eprintln!("loadgen: cannot start a thread: {e}");
                return ExitCode::from(2);
            }
        }
    }
    barrier.wait();
    if abort.load(Ordering::SeqCst) {
        for h in handles {
            let _ = h.join();
        }
        return ExitCode::from(2);
    }
    let start = *START.get_or_init(Instant::now);

    // Progress, once a second, until every worker is done.
    let mut tick = 1u64;
    let mut last = 0u64;
    while !progress.iter().all(|p| p.done.load(Ordering::SeqCst)) {
        let due = start + Duration::from_secs(tick);
        let now = Instant::now();
        if now < due {
            std::thread::sleep((due - now).min(Duration::from_millis(50)));
            continue;
        }
        let total: u64 = progress
            .iter()
            .map(|p| p.responses.load(Ordering::Relaxed))
            .sum();
        let problems: u64 = progress
            .iter()
            .map(|p| p.problems.load(Ordering::Relaxed))
            .sum();
        let phase = if due <= start + plan.warmup {
            "  (warm-up)"
        } else {
            ""
        };
        eprintln!(
            "[{:>6.1}s] {:>9} req/s  errors {problems}{phase}",
            now.duration_since(start).as_secs_f64(),
            total - last
        );
        last = total;
        tick += 1;
    }

    let mut stats = Stats::new(usize::MAX);
    for h in handles {
        match h.join() {
            Ok(s) => stats.merge(&s),
            Err(_) => {
                eprintln!("loadgen: a worker thread panicked");
                return ExitCode::from(2);
            }
        }
    }
    let measure_from = start + plan.warmup;
    let duration_s = stats.last_done.map_or(0.0, |t| {
        t.saturating_duration_since(measure_from).as_secs_f64()
    });
    let per_s = |n: u64| {
        if duration_s > 0.0 {
            (n as f64 / duration_s).round()
        } else {
            0.0
        }
    };
    let problems: std::collections::BTreeMap<&str, u64> = PROBLEMS
        .iter()
        .zip(&stats.problems)
        .filter(|(_, &n)| n > 0)
        .map(|(p, &n)| (p.0, n))
        .collect();
    let summary = Summary {
        transport: match plan.transport {
            Transport::Tcp => "tcp",
            Transport::Http => "http",
            Transport::Ws => "ws",
        },
        connections: args.connections,
        depth: args.depth,
        batch: args.batch,
        threads,
        duration_s: (duration_s * 1000.0).round() / 1000.0,
        requests: stats.requests,
        responses: stats.responses,
        errors: stats.errors(),
        mismatches: stats.mismatches(),
        rps: per_s(stats.responses),
        elements_per_s: per_s(stats.elements),
        latency_us: Latency::of(&stats.hist),
        target: &plan.target,
        mix: &args.mix,
        verify: plan.verify,
        warmup_s: plan.warmup.as_secs_f64(),
        elements: stats.elements,
        problems,
        rate: plan.rate,
        service_us: plan.rate.map(|_| Latency::of(&stats.service)),
    };
    let summary = match serde_json::to_string(&summary) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("loadgen: summary: {e}");
            return ExitCode::from(2);
        }
    };
    println!("{summary}");
    if stats.errors() > 0 || stats.mismatches() > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}
