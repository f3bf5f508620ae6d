//! The load generator behind the `loadgen` binary (documented there), in modules:
//! [`workload`] (the messages), [`plan`] (a run against one server), [`drivers`]
//! (connections), [`verify`] (answers), [`stats`] (counters, histograms), [`output`]
//! (progress, summary, table, JSON) and [`ticks`] (subscriber mode).

mod drivers;
mod output;
mod plan;
mod plot;
mod stats;
mod ticks;
mod verify;
mod workload;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier, OnceLock};
use std::time::{Instant, SystemTime};

use clap::Parser;
use serde::Serialize;

use drivers::worker;
use output::{curve, summarize, Progress, Summary};
use plan::{build_plan, Plan, Target, Transport};
use stats::Stats;
use ticks::subscribers;
use workload::{messages, ID_BASE, ID_END};

#[derive(Parser, Clone)]
#[command(
    about = "Load generator and verifier for JSON-RPC 2.0 servers (TCP, Unix, HTTP or WebSocket)"
)]
pub(crate) struct Args {
    /// Newline-delimited JSON over TCP to ADDR (host:port).
    #[arg(
        long,
        value_name = "ADDR",
        conflicts_with_all = ["http", "ws", "unix", "compare"],
        required_unless_present_any = ["http", "ws", "unix", "compare"]
    )]
    pub(crate) tcp: Option<String>,
    /// Newline-delimited JSON over the Unix socket at PATH.
    #[arg(long, value_name = "PATH", conflicts_with_all = ["http", "ws", "compare"])]
    pub(crate) unix: Option<PathBuf>,
    /// HTTP/1.1 keep-alive POSTs to URL (http://host:port/path).
    #[arg(long, value_name = "URL", conflicts_with_all = ["ws", "compare"])]
    pub(crate) http: Option<String>,
    /// WebSocket messages to URL (ws://host:port/path).
    #[arg(long, value_name = "URL", conflicts_with = "compare")]
    pub(crate) ws: Option<String>,
    /// Several servers, the same load against each, in interleaved rounds (see
    /// --rounds): `[NAME=]URL` with URL `tcp://HOST:PORT`, `unix:///PATH`,
    /// `http://HOST:PORT/PATH` or `ws://HOST:PORT/PATH`. Prints a table with the ratios
    /// to the first server instead of the JSON summary (that goes to --json).
    #[arg(long, value_name = "URL", num_args = 2..)]
    pub(crate) compare: Vec<String>,
    /// With --compare: rounds; each runs every server once (--duration or --count each),
    /// in alternating order (A B, B A, ...), so drift on the machine hits all alike.
    #[arg(long, default_value_t = 3, requires = "compare")]
    pub(crate) rounds: usize,
    /// Writes every figure as JSON to FILE: per server, the summary of each round and of
    /// all rounds together (per method, errors by code) and the latency percentile curve.
    #[arg(long, value_name = "FILE")]
    pub(crate) json: Option<PathBuf>,
    /// Draws the latency percentile curves of every server of the run on one SVG chart
    /// (the percentile axis log-scaled, as HdrHistogram plots do).
    #[arg(long, value_name = "FILE.svg")]
    pub(crate) plot: Option<PathBuf>,
    /// An extra header line in every HTTP request and in the WebSocket handshake,
    /// `'NAME: VALUE'` (repeatable), e.g. `--header 'Authorization: Bearer TOKEN'`.
    #[arg(long = "header", value_name = "NAME: VALUE")]
    pub(crate) headers: Vec<String>,
    /// One JSON-RPC request sent on each connection (TCP, Unix, WebSocket) right after it
    /// connects, before any load or warm-up, which must be answered with a result (else
    /// the connection fails, exit 2); not counted. How a TCP client authenticates:
    /// `{"jsonrpc":"2.0","method":"rpc.auth","params":{"token":"TOKEN"},"id":0}`.
    #[arg(long, value_name = "JSON")]
    pub(crate) hello: Option<String>,
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
    /// delay, incr).
    #[arg(long, default_value = "subtract:1")]
    pub(crate) mix: String,
    /// Messages from FILE instead of --mix: NDJSON request templates, weighted, with
    /// `{{id}}`, `{{int LO HI}}` and `{{str N}}` placeholders, batches and notifications
    /// (docs/LOADGEN.md).
    #[arg(long, value_name = "FILE", conflicts_with = "mix")]
    pub(crate) workload: Option<PathBuf>,
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
    /// Poll without ever sleeping (closed loop only): the generator's CPU never idles,
    /// so the server's writes never pay to wake it. Waking a sleeping CPU is an
    /// interrupt sent from the writer's kernel path (on a VM, an exit to the
    /// hypervisor), and the slower a server, the more often the generator has gone to
    /// sleep by its next answer: without this, servers of different speeds are charged
    /// differently for the same writes (docs/PERFORMANCE.md, "Stop 36"). Takes the
    /// generator's CPU whole.
    #[arg(long, conflicts_with = "rate")]
    pub(crate) busy_poll: bool,
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
    /// With --ticks: each connection's subscribe call differs (its interval written
    /// `MS.000000000NNN`, NNN its number: the same interval to a microsecond's
    /// billionth, but another call to a proxy that shares identical subscriptions).
    #[arg(long, requires = "ticks")]
    pub(crate) ticks_distinct: bool,
}

pub(crate) fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(clean) => {
            if clean {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Err(e) => {
            eprintln!("loadgen: {e}");
            ExitCode::from(2)
        }
    }
}

/// Runs what `args` asks; `Ok(false)` when there were errors or mismatches.
fn run(args: &Args) -> Result<bool, String> {
    let msgs = messages(args)?;
    if !args.compare.is_empty() {
        return compare(args, &msgs);
    }
    let target = Target::of_args(args)?;
    let plan = Arc::new(build_plan(args, &target, &msgs)?);
    if let Some(ms) = args.ticks {
        if plan.transport == Transport::Http {
            return Err("--ticks needs --tcp, --unix or --ws (HTTP cannot push)".into());
        }
        return subscribers(args, &plan, ms);
    }
    let outcome = run_once(args, plan.clone(), &target.name)?;
    let summary = summarize(
        args,
        &plan,
        &outcome.stats,
        outcome.duration_s,
        outcome.threads,
    );
    let line = serde_json::to_string(&summary).map_err(|e| format!("summary: {e}"))?;
    println!("{line}");
    let servers = [Server {
        name: target.name.clone(),
        url: target.url.clone(),
        rounds: Vec::new(),
        curve_us: curve(&outcome.stats.hist),
        summary,
    }];
    write_outputs(args, &servers, None)?;
    Ok(outcome.stats.errors() == 0 && outcome.stats.mismatches() == 0)
}

/// One run's merged counters.
struct Outcome {
    stats: Stats,
    duration_s: f64,
    threads: usize,
}

/// Where the next run's ids start (0: not yet known). Ids are unique across the runs of
/// one process (--compare's rounds), each starting above the last one's.
static NEXT_ID: AtomicU64 = AtomicU64::new(0);

/// The first id generation of a run whose generations are `stride` ids wide. A process
/// starts where the clock says, 5 million ids a second (wrapping every half hour), so
/// that a run started after another one ended normally sends none of its ids either (a
/// de-duplicating server would take them for retries).
fn first_gen(stride: u64) -> u64 {
    let space = ID_END - ID_BASE;
    let next = match NEXT_ID.load(Ordering::Relaxed) {
        0 => {
            let ns = SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos());
            ID_BASE + (ns / 200 % u128::from(space)) as u64
        }
        n => n,
    };
    let gen = (next - ID_BASE).div_ceil(stride).max(1);
    if ID_BASE + (gen + 1) * stride >= ID_END {
        1
    } else {
        gen
    }
}

/// One run against `plan`'s server: connects every connection, loads, joins.
fn run_once(args: &Args, plan: Arc<Plan>, name: &str) -> Result<Outcome, String> {
    let threads = args.threads.min(args.connections);
    let first_gen = first_gen(plan.stride);
    let barrier = Arc::new(Barrier::new(threads + 1));
    let abort = Arc::new(AtomicBool::new(false));
    let start = Arc::new(OnceLock::new());
    let mut handles = Vec::new();
    let mut progress = Vec::new();
    for t in 0..threads {
        let p = Arc::new(Progress::default());
        progress.push(p.clone());
        let (plan, barrier, abort, start) =
            (plan.clone(), barrier.clone(), abort.clone(), start.clone());
        let connections = args.connections;
        let h = std::thread::Builder::new()
            .name(format!("loadgen-{t}"))
            .spawn(move || {
                worker(
                    t,
                    threads,
                    plan,
                    connections,
                    first_gen,
                    barrier,
                    abort,
                    p,
                    &start,
                )
            });
        match h {
            Ok(h) => handles.push(h),
            Err(e) => return Err(format!("cannot start a thread: {e}")),
        }
    }
    barrier.wait();
    if abort.load(Ordering::SeqCst) {
        for h in handles {
            let _ = h.join();
        }
        return Err(format!("{name}: could not connect"));
    }
    let start = *start.get_or_init(Instant::now);
    output::watch(&progress, start, &plan, name);
    let mut stats = Stats::new(usize::MAX, plan.labels.len());
    for h in handles {
        match h.join() {
            Ok(s) => stats.merge(&s),
            Err(_) => return Err("a worker thread panicked".into()),
        }
    }
    NEXT_ID.store(
        ID_BASE + (stats.max_gen + 1).saturating_mul(plan.stride),
        Ordering::Relaxed,
    );
    let measure_from = start + plan.warmup;
    let duration_s = stats.last_done.map_or(0.0, |t| {
        t.saturating_duration_since(measure_from).as_secs_f64()
    });
    Ok(Outcome {
        stats,
        duration_s,
        threads,
    })
}

/// One server's figures in the `--json` file.
#[derive(Serialize)]
struct Server {
    name: String,
    url: String,
    /// All rounds together.
    summary: Summary,
    /// Each round's own summary (--compare).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    rounds: Vec<Summary>,
    /// (percentile as a fraction, latency µs), the plotted curve.
    curve_us: Vec<(f64, f64)>,
}

/// The --compare run: every server once per round, alternating the order.
fn compare(args: &Args, msgs: &workload::Messages) -> Result<bool, String> {
    if args.ticks.is_some() {
        return Err("--ticks does not go with --compare".into());
    }
    if args.rounds == 0 {
        return Err("--rounds must be at least 1".into());
    }
    let targets = args
        .compare
        .iter()
        .map(|s| Target::parse(s))
        .collect::<Result<Vec<_>, _>>()?;
    let plans = targets
        .iter()
        .map(|t| build_plan(args, t, msgs).map(Arc::new))
        .collect::<Result<Vec<_>, _>>()?;
    let mut totals: Vec<Option<Outcome>> = targets.iter().map(|_| None).collect();
    let mut rounds: Vec<Vec<Summary>> = targets.iter().map(|_| Vec::new()).collect();
    for round in 0..args.rounds {
        let order: Vec<usize> = if round % 2 == 0 {
            (0..targets.len()).collect()
        } else {
            (0..targets.len()).rev().collect()
        };
        for i in order {
            let name = format!("{} (round {}/{})", targets[i].name, round + 1, args.rounds);
            let o = run_once(args, plans[i].clone(), &name)?;
            rounds[i].push(summarize(
                args,
                &plans[i],
                &o.stats,
                o.duration_s,
                o.threads,
            ));
            match &mut totals[i] {
                Some(t) => {
                    t.stats.merge(&o.stats);
                    t.duration_s += o.duration_s;
                }
                None => totals[i] = Some(o),
            }
        }
    }
    let mut servers = Vec::new();
    let mut clean = true;
    for ((t, total), rounds) in targets.iter().zip(totals).zip(rounds) {
        let Some(o) = total else { continue };
        let p = &plans[servers.len()];
        clean &= o.stats.errors() == 0 && o.stats.mismatches() == 0;
        servers.push(Server {
            name: t.name.clone(),
            url: t.url.clone(),
            summary: summarize(args, p, &o.stats, o.duration_s, o.threads),
            rounds,
            curve_us: curve(&o.stats.hist),
        });
    }
    let table = output::table(&servers_view(&servers), args.rate.is_some());
    print!("{table}");
    write_outputs(args, &servers, Some(&table))?;
    Ok(clean)
}

fn servers_view(servers: &[Server]) -> Vec<(&str, &Summary)> {
    servers
        .iter()
        .map(|s| (s.name.as_str(), &s.summary))
        .collect()
}

/// The --json file and the --plot chart, when asked for.
fn write_outputs(args: &Args, servers: &[Server], table: Option<&str>) -> Result<(), String> {
    if let Some(path) = &args.json {
        #[derive(Serialize)]
        struct File<'a> {
            servers: &'a [Server],
            /// Each server's figures divided by the first's (--compare).
            #[serde(skip_serializing_if = "Vec::is_empty")]
            ratios: Vec<output::Ratios>,
            #[serde(skip_serializing_if = "Option::is_none")]
            table: Option<&'a str>,
            rounds: usize,
            command: Vec<String>,
        }
        let file = File {
            servers,
            ratios: output::ratios(&servers_view(servers)),
            table,
            rounds: if args.compare.is_empty() {
                1
            } else {
                args.rounds
            },
            command: std::env::args().collect(),
        };
        let text = serde_json::to_string_pretty(&file).map_err(|e| e.to_string())?;
        std::fs::write(path, text + "\n").map_err(|e| format!("{}: {e}", path.display()))?;
    }
    if let Some(path) = &args.plot {
        let curves: Vec<(&str, &[(f64, f64)])> = servers
            .iter()
            .map(|s| (s.name.as_str(), s.curve_us.as_slice()))
            .collect();
        plot::draw(path, &curves, &plot_title(args))
            .map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(())
}

/// The chart's caption: what was run.
fn plot_title(args: &Args) -> String {
    let load = match args.rate {
        Some(r) => format!("open loop, {r} msg/s"),
        None => format!("closed loop, depth {}", args.depth),
    };
    let what = match &args.workload {
        Some(w) => w
            .file_name()
            .map_or_else(String::new, |f| f.to_string_lossy().into_owned()),
        None => args.mix.clone(),
    };
    format!(
        "latency by percentile: {what}, {} connections, {load}",
        args.connections
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run starts above the generations the last one reached; near the end of the id
    /// range it starts again from the first.
    #[test]
    fn runs_start_above_the_last_one() {
        let stride = 1024;
        assert!(first_gen(stride) >= 1, "from the clock");
        NEXT_ID.store(ID_BASE + 5 * stride, Ordering::Relaxed);
        assert_eq!(first_gen(stride), 5);
        NEXT_ID.store(ID_BASE + 5 * stride + 1, Ordering::Relaxed);
        assert_eq!(first_gen(stride), 6);
        NEXT_ID.store(ID_END - stride, Ordering::Relaxed);
        assert_eq!(first_gen(stride), 1);
    }
}
