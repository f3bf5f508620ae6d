//! The checks behind the fuzz targets in `fuzz/` and their stable-Rust replay in
//! `engine/tests/fuzz_corpora.rs`, kept here once so both apply exactly the same ones.
//!
//! **Not a stable API**: hidden from the docs; it may change or go away in any release.
//! Every `check_*` function feeds `data` to one entry point that sees peer bytes and
//! *panics* (on purpose: a fuzzer records a panic as a crash) when the outcome is wrong.
//! They use the [`crate::demo`] methods. See docs/FUZZING.md.
//!
//! The oracle for the engine is a small reference built on serde_json: from the bytes
//! alone it predicts each answer's kind (`-32700` / `-32600` / the demo method's result or
//! error code) and id, including what the server path defers to the worker pool. It
//! reads numbers as the engine documents them (docs/PROTOCOL.md; engine/tests/properties.rs
//! pins them): integer literals in `i64`/`u64` exactly (`-0` is the integer 0), every
//! other literal correctly rounded to `f64`, and a literal that rounds to infinity is a
//! parse error. serde_json itself is not correctly rounded at the edge of `f64`'s range,
//! so the reference takes each number's text from the input (see [`reference_parse`]).
//!
//! Built only with the `fuzzing` cargo feature (the fuzz crate and the engine's own
//! replay tests turn it on), one module per concern: [`reference`] (the serde_json
//! oracle), `engine` (the `engine` and `differential` targets), `lines`, `http`,
//! `websocket`, and the
//! client's checks, which live with the client (`client/fuzzing.rs`) so its internals
//! stay private to it.

mod engine;
mod http;
mod lines;
pub(crate) mod reference;
mod websocket;

pub use engine::{check_differential, check_engine};
pub use http::check_http;
pub use lines::check_lines;
pub use reference::number_tokens;
pub use websocket::{check_websocket, frame_all as ws_frame_all};

#[cfg(feature = "client")]
pub use crate::client::fuzzing::check_client;

/// Splits a `lines`/`http` input into its selector byte, its cut offsets and the stream:
/// byte 0 selects the config, byte 1 (mod 8) is the number of cuts, then two bytes
/// (little-endian) per cut; the rest is the stream. Short inputs get what is there.
pub fn split_input(data: &[u8]) -> (u8, Vec<u16>, &[u8]) {
    let sel = data.first().copied().unwrap_or(0);
    let n = usize::from(data.get(1).copied().unwrap_or(0) % 8);
    let mut at = 2.min(data.len());
    let mut cuts = Vec::with_capacity(n);
    for _ in 0..n {
        if let Some(&[a, b]) = data.get(at..at + 2) {
            cuts.push(u16::from_le_bytes([a, b]));
            at += 2;
        }
    }
    (sel, cuts, &data[at..])
}

/// `input` cut at `cuts` (offsets taken modulo its length + 1).
pub(crate) fn pieces<'a>(input: &'a [u8], cuts: &[u16]) -> Vec<&'a [u8]> {
    let mut at: Vec<usize> = cuts
        .iter()
        .map(|&c| usize::from(c) % (input.len() + 1))
        .collect();
    at.push(0);
    at.push(input.len());
    at.sort_unstable();
    at.dedup();
    at.windows(2).map(|w| &input[w[0]..w[1]]).collect()
}

/// Bytes for a failure message (printed with `{:?}`): lossy UTF-8, cut at 400.
pub(crate) fn show(bytes: &[u8]) -> String {
    let s = String::from_utf8_lossy(&bytes[..bytes.len().min(400)]).into_owned();
    if bytes.len() > 400 {
        format!("{s}… ({} bytes)", bytes.len())
    } else {
        s
    }
}
