//! A batch's answer array, written in one place: `[`, the answers separated by commas,
//! `]` — never `[]` (a batch of only notifications is answered with nothing at all) —
//! and the `max_response_bytes` budget every answer must fit in, whether it is written
//! inline while the batch is read or arrives later from the pool or a responder. The
//! answers are in the batch's order: one that arrives later is kept aside and put in
//! its element's place when the last one is in (`assemble`).

use crate::codec::Id;
use crate::dispatch::too_large;
use crate::engine::Outcome;
use crate::serializer::response::write_rpc_error;

/// What [`BatchWriter::push_late`] did with an answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Late {
    /// Nothing to write (no answer, or one too large with no id to answer).
    Skipped,
    /// Written as it was.
    Pushed,
    /// Past the batch's budget: `code`'s error (-32002) of `len` bytes written instead,
    /// which is what its call is counted and logged as.
    Cut { code: i32, len: usize },
}

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

    /// Where the next element would go, as an offset from the array's `[` (an element
    /// answered later is placed there by [`BatchWriter::assemble`]).
    pub(crate) fn offset(&self, out: &[u8]) -> usize {
        out.len() - self.start
    }

    /// Keeps an answer that arrived later in `late`, for [`BatchWriter::assemble`] to
    /// put in its element's place. `used`: the array's bytes so far (inline and late).
    /// Over `max_response_bytes` the element is answered `-32002` instead, as in
    /// [`BatchWriter::push`]. Returns whether anything was kept.
    pub(crate) fn push_late(
        &mut self,
        late: &mut Vec<u8>,
        used: usize,
        answer: &[u8],
        id: Option<Id<'_>>,
    ) -> Late {
        if answer.is_empty() {
            return Late::Skipped;
        }
        let pushed = if used + answer.len() + 2 > self.max {
            let Some(id) = id else {
                return Late::Skipped;
            };
            let at = late.len();
            let e = too_large(self.max);
            write_rpc_error(late, id, &e);
            Late::Cut {
                code: e.code(),
                len: late.len() - at,
            }
        } else {
            late.extend_from_slice(answer);
            Late::Pushed
        };
        self.wrote += 1;
        pushed
    }

    /// Writes the whole array into `out`, every answer in its element's place: `inline`
    /// is the array as written while the batch was read (from its `[`, unclosed), and
    /// `places` gives, in element order, each element answered later: its offset in
    /// `inline` (from [`BatchWriter::offset`]) and its answer's range in `late` (empty
    /// for none). Nothing at all when no element was answered (never `[]`).
    pub(crate) fn assemble(
        self,
        inline: &[u8],
        late: &[u8],
        places: impl Iterator<Item = (usize, std::ops::Range<usize>)>,
        out: &mut Vec<u8>,
    ) -> Outcome {
        if self.wrote == 0 {
            return Outcome::Nothing;
        }
        // Inline answers were written with a comma before all but the first inline
        // one; each piece is taken without its leading comma and given one when an
        // answer precedes it here.
        let mut any = false;
        let mut piece = |out: &mut Vec<u8>, text: &[u8]| {
            let text = text.strip_prefix(b",").unwrap_or(text);
            if !text.is_empty() {
                if any {
                    out.push(b',');
                }
                out.extend_from_slice(text);
                any = true;
            }
        };
        out.push(b'[');
        let mut cursor = 1.min(inline.len());
        for (at, answer) in places {
            let at = at.clamp(cursor, inline.len());
            piece(out, &inline[cursor..at]);
            cursor = at;
            piece(out, late.get(answer).unwrap_or_default());
        }
        piece(out, &inline[cursor..]);
        out.push(b']');
        Outcome::Reply
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
    fn late_answers_take_their_elements_places() {
        // Elements: 0 inline, 1 later, 2 inline, 3 later, 4 notification (later, none).
        let mut out = Vec::new();
        let mut b = BatchWriter::begin(&mut out, 1 << 20);
        let m = b.element(&mut out);
        out.extend_from_slice(b"{\"a\":0}");
        b.kept();
        let m1 = b.element(&mut out);
        b.discard(&mut out, m1);
        let at1 = b.offset(&out);
        let m2 = b.element(&mut out);
        out.extend_from_slice(b"{\"a\":2}");
        b.kept();
        let m3 = b.element(&mut out);
        b.discard(&mut out, m3);
        let at3 = b.offset(&out);
        let at4 = b.offset(&out);
        let _ = (m, m2);
        let mut late = Vec::new();
        // Answers arrive out of order.
        let r3 = {
            let s = late.len();
            assert_eq!(
                b.push_late(&mut late, out.len(), b"{\"a\":3}", Some(Id::Int(3))),
                Late::Pushed
            );
            s..late.len()
        };
        let r1 = {
            let s = late.len();
            assert_eq!(
                b.push_late(&mut late, out.len(), b"{\"a\":1}", Some(Id::Int(1))),
                Late::Pushed
            );
            s..late.len()
        };
        assert_eq!(b.push_late(&mut late, out.len(), b"", None), Late::Skipped);
        let mut array = Vec::new();
        let places = [(at1, r1), (at3, r3), (at4, 0..0)].into_iter();
        assert_eq!(b.assemble(&out, &late, places, &mut array), Outcome::Reply);
        assert_eq!(
            String::from_utf8(array).unwrap(),
            r#"[{"a":0},{"a":1},{"a":2},{"a":3}]"#
        );

        // Every element later, the first one a notification.
        let mut out = Vec::new();
        let mut b = BatchWriter::begin(&mut out, 1 << 20);
        let mut late = Vec::new();
        let at = b.offset(&out);
        b.push_late(&mut late, 1, b"{\"b\":1}", Some(Id::Int(1)));
        let mut array = Vec::new();
        let places = [(at, 0..0), (at, 0..late.len())].into_iter();
        assert_eq!(b.assemble(&out, &late, places, &mut array), Outcome::Reply);
        assert_eq!(array, br#"[{"b":1}]"#);

        // Nothing answered: nothing at all.
        let mut out = Vec::new();
        let b = BatchWriter::begin(&mut out, 1 << 20);
        let mut array = Vec::new();
        let places = [(1, 0..0)].into_iter();
        assert_eq!(b.assemble(&out, &[], places, &mut array), Outcome::Nothing);
        assert!(array.is_empty());
    }

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
        let m = b.element(&mut out);
        out.extend_from_slice(b"{\"b\":2}");
        b.kept();
        assert_eq!(m, 14);
        assert_eq!(b.finish(&mut out), Outcome::Reply);
        assert_eq!(out, b"prefix[{\"a\":1},{\"b\":2}]");

        let mut out = b"prefix".to_vec();
        let b = BatchWriter::begin(&mut out, 1 << 20);
        assert_eq!(b.finish(&mut out), Outcome::Nothing);
        assert_eq!(out, b"prefix");
    }

    #[test]
    fn a_late_answer_over_the_budget_is_answered_too_large() {
        let mut inline = Vec::new();
        let mut b = BatchWriter::begin(&mut inline, 200);
        let at = b.offset(&inline);
        let mut late = Vec::new();
        let pushed = b.push_late(&mut late, inline.len(), &[b'x'; 150], Some(Id::Int(1)));
        assert_eq!(pushed, Late::Pushed);
        let first = 0..late.len();
        let used = inline.len() + late.len();
        let cut = b.push_late(&mut late, used, &[b'y'; 150], Some(Id::Int(2)));
        let second = first.end..late.len();
        assert_eq!(
            cut,
            Late::Cut {
                code: -32002,
                len: second.len()
            }
        );
        let mut out = Vec::new();
        let _ = b.assemble(
            &inline,
            &late,
            [(at, first), (at, second)].into_iter(),
            &mut out,
        );
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
