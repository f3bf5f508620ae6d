//! The serde_json baseline as a stdio server: newline-delimited requests on stdin, one
//! reply line per answered request on stdout — the counterpart of ringrpc's `stdio`
//! example for whole-process comparisons.
//!
//! ```text
//! cargo run --release -p benches --bin gen_requests -- 1000000 > /tmp/req.ndjson
//! ./target/release/stdio_serde < /tmp/req.ndjson > /dev/null
//! ```
//!
//! Input is read through a 64 KiB `BufReader`, output written through a 64 KiB
//! `BufWriter`, flushed whenever the read buffer runs dry (before a read that may block)
//! and at end of input. Like the `stdio` example, a `\r` before the `\n` is dropped and
//! blank lines are skipped.

use std::io::{self, BufRead, BufReader, BufWriter, Write};

use benches::serde_json_baseline;

const BUF: usize = 64 * 1024;

fn main() -> io::Result<()> {
    let mut stdin = BufReader::with_capacity(BUF, io::stdin().lock());
    let mut stdout = BufWriter::with_capacity(BUF, io::stdout().lock());
    let mut line = Vec::with_capacity(4096);
    let mut out = Vec::with_capacity(4096);
    loop {
        line.clear();
        if stdin.read_until(b'\n', &mut line)? == 0 {
            stdout.flush()?;
            return Ok(());
        }
        let mut frame = &line[..];
        if let [rest @ .., b'\n'] = frame {
            frame = rest;
        }
        if let [rest @ .., b'\r'] = frame {
            frame = rest;
        }
        if !frame.iter().all(u8::is_ascii_whitespace) {
            out.clear();
            if serde_json_baseline::handle(frame, &mut out) {
                out.push(b'\n');
                stdout.write_all(&out)?;
            }
        }
        if stdin.buffer().is_empty() {
            stdout.flush()?;
        }
    }
}
