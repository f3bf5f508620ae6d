//! The `process_*` metrics every Prometheus client library exports, read from `/proc`
//! at scrape time (Linux; elsewhere they are left out).

use std::fmt::Write as _;

/// Clock ticks per second in `/proc/<pid>/stat` (`USER_HZ`): 100 on every Linux
/// architecture Rust targets but Alpha; Prometheus' own `procfs` fixes it the same way.
const USER_HZ: f64 = 100.0;

/// Appends the process metrics that could be read.
pub(crate) fn encode(out: &mut String) {
    if let Some((cpu, start_ticks)) = stat() {
        family(
            out,
            "process_cpu_seconds_total",
            "counter",
            "Total user and system CPU time spent in seconds.",
            cpu,
        );
        if let Some(boot) = boot_time() {
            let start = boot + start_ticks / USER_HZ;
            family(
                out,
                "process_start_time_seconds",
                "gauge",
                "Start time of the process since unix epoch in seconds.",
                start,
            );
        }
    }
    if let Some((rss, vsize)) = memory() {
        family(
            out,
            "process_resident_memory_bytes",
            "gauge",
            "Resident memory size in bytes.",
            rss,
        );
        family(
            out,
            "process_virtual_memory_bytes",
            "gauge",
            "Virtual memory size in bytes.",
            vsize,
        );
    }
    if let Ok(dir) = std::fs::read_dir("/proc/self/fd") {
        // The directory's own descriptor, open while it is read, is not counted.
        let n = dir.count().saturating_sub(1);
        family(
            out,
            "process_open_fds",
            "gauge",
            "Number of open file descriptors.",
            n as f64,
        );
    }
    if let Some(max) = max_fds() {
        family(
            out,
            "process_max_fds",
            "gauge",
            "Maximum number of open file descriptors.",
            max,
        );
    }
}

fn family(out: &mut String, name: &str, kind: &str, help: &str, value: f64) {
    let _ = writeln!(
        out,
        "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
    );
}

/// CPU seconds (user + system) and the start time in ticks after boot.
fn stat() -> Option<(f64, f64)> {
    let s = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The command name may hold spaces and parentheses: fields start after the last ')'.
    let rest = &s[s.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3 (state): utime is field 14, stime 15, starttime 22.
    let field = |n: usize| f.get(n - 3).and_then(|v| v.parse::<f64>().ok());
    Some(((field(14)? + field(15)?) / USER_HZ, field(22)?))
}

/// Resident and virtual sizes in bytes.
fn memory() -> Option<(f64, f64)> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let kib = |key: &str| {
        s.lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
            .map(|k| k * 1024.0)
    };
    Some((kib("VmRSS:")?, kib("VmSize:")?))
}

/// The boot time, in seconds since the epoch.
fn boot_time() -> Option<f64> {
    let s = std::fs::read_to_string("/proc/stat").ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
}

/// The soft limit on open files.
fn max_fds() -> Option<f64> {
    let s = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = s.lines().find(|l| l.starts_with("Max open files"))?;
    line["Max open files".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    #[test]
    fn reads_this_process() {
        let mut out = String::new();
        super::encode(&mut out);
        for name in [
            "process_cpu_seconds_total",
            "process_start_time_seconds",
            "process_resident_memory_bytes",
            "process_virtual_memory_bytes",
            "process_open_fds",
            "process_max_fds",
        ] {
            let line = out
                .lines()
                .find(|l| l.starts_with(&format!("{name} ")))
                .unwrap_or_else(|| panic!("{name} missing in\n{out}"));
            let v: f64 = line[name.len() + 1..].parse().expect("a number");
            assert!(v >= 0.0, "{line}");
        }
        let start = super::stat()
            .zip(super::boot_time())
            .map(|((_, t), b)| b + t / 100.0);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or_default();
        let start = start.expect("a start time");
        assert!(
            start <= now + 1.0 && start > now - 86_400.0 * 365.0,
            "{start} vs {now}"
        );
    }
}
