//! The `lines` target: the newline framer and the engine, whole vs cut vs byte by byte,
//! and against a plain reference line splitter.

use bytes::BytesMut;

use super::reference::{expect, sleeps};
use super::{pieces, show, split_input};
use crate::config::Config;
use crate::{Engine, Outcome, Scratch};

/// Fuzz target `lines`: `data` is `[config][n][n cut offsets, u16 LE][stream]` (see
/// [`split_input`]). The stream fed to [`Engine::handle_lines`] whole, cut at the given
/// offsets, and one byte at a time must give the same output and leftover, and that
/// output must be what a plain reference line splitter and [`Engine::handle`] give.
pub fn check_lines(data: &[u8]) {
    let (sel, cuts, stream) = split_input(data);
    // Odd selectors: a small max_request_bytes (8..=135), so the oversize paths run.
    let max = if sel & 1 == 0 {
        Config::default().request_limit()
    } else {
        8 + usize::from(sel >> 1)
    };
    let engine = Engine::new(
        crate::demo::core_builder().freeze(),
        Config::default().max_request_bytes(max),
    );
    let (frames, leftover) = reference_lines(stream, max);
    // `sleep` runs inline in `handle_lines`; skip streams that would wait.
    if frames.iter().any(|f| match f {
        Line::Frame(b) => sleeps(&expect(b, engine.config())),
        Line::TooLarge => false,
    }) {
        return;
    }
    let mut scratch = engine.scratch();
    let whole = feed_lines(&engine, &mut scratch, [stream]);
    let split = feed_lines(&engine, &mut scratch, pieces(stream, &cuts));
    let bytes = feed_lines(&engine, &mut scratch, stream.chunks(1));
    assert!(
        whole == split,
        "handle_lines: output depends on the split {cuts:?}\nwhole {:?}\nsplit {:?}",
        show(&whole.0),
        show(&split.0)
    );
    assert!(
        whole == bytes,
        "handle_lines: byte-at-a-time output differs\nwhole {:?}\nbytes {:?}",
        show(&whole.0),
        show(&bytes.0)
    );
    let mut want = Vec::new();
    for frame in &frames {
        let reply = match frame {
            Line::TooLarge => {
                let limit = max;
                engine.write_frame_error(crate::FrameError::TooLarge { limit }, &mut want)
            }
            Line::Frame(b) => engine.handle(b, &mut scratch, &mut want),
        };
        if reply == Outcome::Reply {
            want.push(b'\n');
        }
    }
    assert!(
        whole.0 == want,
        "handle_lines output differs from the reference framing\ngot  {:?}\nwant {:?}",
        show(&whole.0),
        show(&want)
    );
    assert!(
        whole.1 == leftover,
        "handle_lines leftover {:?}, reference {:?}",
        show(&whole.1),
        show(leftover)
    );
}

// ---------------------------------------------------------------------------------------
// Newline framing
// ---------------------------------------------------------------------------------------

enum Line<'a> {
    Frame(&'a [u8]),
    TooLarge,
}

/// The frames of a stream, split the obvious way: at `\n`, one `\r` before it dropped,
/// lines of only spaces, tabs and `\r` skipped, lines longer than `max` refused. A last
/// line without `\n` is left over, unless it is already too long (more than `max + 1`
/// bytes, or `max + 1` not ending in a `\r` that a `\n` could still follow).
fn reference_lines(stream: &[u8], max: usize) -> (Vec<Line<'_>>, &[u8]) {
    let mut frames = Vec::new();
    let mut rest = stream;
    while let Some(nl) = memchr::memchr(b'\n', rest) {
        let line = &rest[..nl];
        rest = &rest[nl + 1..];
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.len() > max {
            frames.push(Line::TooLarge);
        } else if !line.iter().all(|b| matches!(b, b' ' | b'\t' | b'\r')) {
            frames.push(Line::Frame(line));
        }
    }
    if rest.len() > max + 1 || (rest.len() == max + 1 && rest[max] != b'\r') {
        frames.push(Line::TooLarge);
        rest = &[];
    }
    (frames, rest)
}

fn feed_lines<'p>(
    engine: &Engine,
    scratch: &mut Scratch,
    pieces: impl IntoIterator<Item = &'p [u8]>,
) -> (Vec<u8>, Vec<u8>) {
    let mut decoder = engine.decoder();
    let mut buf = BytesMut::new();
    let mut out = Vec::new();
    let mut replies = 0;
    for piece in pieces {
        buf.extend_from_slice(piece);
        replies += engine.handle_lines(&mut buf, &mut decoder, scratch, &mut out);
    }
    // Each reply ends in the one `\n` it adds (replies are compact JSON text).
    assert_eq!(
        replies,
        out.iter().filter(|&&b| b == b'\n').count(),
        "handle_lines' count is not the number of replies written"
    );
    (out, buf.to_vec())
}
