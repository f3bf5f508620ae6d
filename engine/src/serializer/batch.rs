//! A batch's answer array, written in one place: `[`, the answers separated by commas,
//! `]` — never `[]` (a batch of only notifications is answered with nothing at all) —
//! and the `max_response_bytes` budget every answer must fit in, whether it is written
//! inline while the batch is read or arrives later from the pool or a responder.

use crate::codec::Id;
use crate::dispatch::too_large;
use crate::engine::Outcome;
use crate::serializer::response::write_rpc_error;

/// One batch's answer array, being written into an output buffer. `Copy`: the server
/// keeps it with a batch whose answers are still coming.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BatchWriter {
    /// Where the `[` is in the output.
    start: usize,
    /// Answers in the array so far.
    wrote: usize,
    /// `max_response_bytes`: the whole array's bound.
    max: usize,
}

impl BatchWriter {
    /// Opens the array at the end of `out`.
    pub(crate) fn begin(out: &mut Vec<u8>, max: usize) -> Self {
        let start = out.len();
        out.push(b'[');
        Self {
            start,
            wrote: 0,
            max,
        }
    }

    /// The absolute length `out` may reach with the array in it (the budget an inline
    /// answer is written under).
    pub(crate) fn limit(&self) -> usize {
        self.start.saturating_add(self.max)
    }

    /// Starts an element: writes the comma before it if needed and returns where the
    /// element starts. Then [`kept`](Self::kept) it, or [`discard`](Self::discard) it.
    pub(crate) fn element(&self, out: &mut Vec<u8>) -> usize {
        let mark = out.len();
        if self.wrote > 0 {
            out.push(b',');
        }
        mark
    }

    /// The element begun at `mark` holds an answer.
    pub(crate) fn kept(&mut self) {
        self.wrote += 1;
    }

    /// The element begun at `mark` has no answer here (a notification, or an answer
    /// that comes later): takes back its comma.
    pub(crate) fn discard(&self, out: &mut Vec<u8>, mark: usize) {
        out.truncate(mark);
    }

    /// Answers already in the array (the fuzz checks compare it with the reference).
    #[cfg(any(test, feature = "fuzzing"))]
    pub(crate) fn answers(&self) -> usize {
        self.wrote
    }

    /// The same array, moved to `start` in another buffer (the bytes from the `[` on
    /// were moved there).
    pub(crate) fn moved_to(self, start: usize) -> Self {
        Self { start, ..self }
    }

    /// Appends an answer that arrived later (a whole response object; empty for a
    /// notification's, which adds nothing). If it would take the array past
    /// `max_response_bytes`, the element is answered `-32002` for `id` instead and the
    /// others stand, as for answers written inline (where, too, the short error object
    /// is written whatever room is left: an element is never lost).
    pub(crate) fn push(&mut self, out: &mut Vec<u8>, answer: &[u8], id: Option<Id<'_>>) {
        if answer.is_empty() {
            return;
        }
        let mark = self.element(out);
        // `+ 2`: the comma and the closing bracket still to come.
        if out.len() - self.start + answer.len() + 1 > self.max {
            out.truncate(mark);
            let Some(id) = id else { return };
            self.element(out);
            write_rpc_error(out, id, &too_large(self.max));
        } else {
            out.extend_from_slice(answer);
        }
        self.wrote += 1;
    }

    /// Closes the array: `]`, or — when no element was answered — takes the `[` back,
    /// leaving nothing (never `[]`).
    pub(crate) fn finish(self, out: &mut Vec<u8>) -> Outcome {
        if self.wrote == 0 {
            out.truncate(self.start);
            Outcome::Nothing
        } else {
            out.push(b']');
            Outcome::Reply
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commas_brackets_and_never_an_empty_array() {
        let mut out = b"prefix".to_vec();
        let mut b = BatchWriter::begin(&mut out, 1 << 20);
        let m = b.element(&mut out);
        b.discard(&mut out, m); // a notification
        let m = b.element(&mut out);
        assert_eq!(m, 7);
        out.extend_from_slice(b"{\"a\":1}");
        b.kept();
        b.push(&mut out, b"", Some(Id::Int(1)));
        b.push(&mut out, b"{\"b\":2}", Some(Id::Int(2)));
        assert_eq!(b.finish(&mut out), Outcome::Reply);
        assert_eq!(out, b"prefix[{\"a\":1},{\"b\":2}]");

        let mut out = b"prefix".to_vec();
        let b = BatchWriter::begin(&mut out, 1 << 20);
        assert_eq!(b.finish(&mut out), Outcome::Nothing);
        assert_eq!(out, b"prefix");
    }

    #[test]
    fn a_late_answer_over_the_budget_is_answered_too_large() {
        let mut out = Vec::new();
        let mut b = BatchWriter::begin(&mut out, 200);
        b.push(&mut out, &[b'x'; 150], Some(Id::Int(1)));
        b.push(&mut out, &[b'y'; 150], Some(Id::Int(2)));
        let _ = b.finish(&mut out);
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.starts_with(&format!("[{},{{", "x".repeat(150))),
            "{text}"
        );
        assert!(
            text.contains("-32002") && text.contains(r#""id":2"#),
            "{text}"
        );
        assert!(!text.contains("yyy"), "{text}");
    }
}
