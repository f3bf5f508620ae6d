//! The no-I/O entry point: one frame in, its reply (if any) appended to an output buffer.

use std::ops::Range;

use bytes::BytesMut;
use simd_json::{Buffers, ErrorType, Node, Tape, INPUT_PADDING};

use crate::codec::raw::RawCtx;
use crate::codec::request::{span, validate};
use crate::codec::{Id, LineDecoder};
use crate::config::Config;
use crate::dispatch::dispatch;
use crate::dispatch::registry::Registry;
use crate::error::{ErrorCode, FrameError};
use crate::serializer::response::write_error;

/// What [`Engine::handle`] did with a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub enum Outcome {
    /// A reply (a response object or a batch array) was appended to the output.
    Reply,
    /// Nothing is to be sent: the frame held only notifications.
    Nothing,
}

/// Per-thread parse state, reused for every frame: the padded working copy simd-json
/// parses in place, simd-json's `Buffers`, and the tape.
///
/// Make one per thread (or connection) with [`Engine::scratch`] and keep it; after the
/// first few frames it has grown to fit and parsing allocates nothing.
pub struct Scratch {
    /// The frame's bytes plus `INPUT_PADDING`: simd-json reads and unescapes here, so
    /// the frame itself stays untouched.
    input: Vec<u8>,
    buffers: Buffers,
    /// Always empty between calls; its allocation is what is reused.
    tape: Tape<'static>,
}

impl std::fmt::Debug for Scratch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scratch")
            .field("tape_capacity", &self.tape.0.capacity())
            .finish_non_exhaustive()
    }
}

#[cfg(feature = "client")]
impl Scratch {
    /// Fresh parse state nesting at most `max_depth` levels (the client's own scratch).
    pub(crate) fn with_max_depth(max_depth: usize) -> Self {
        Self {
            input: Vec::with_capacity(4096),
            buffers: Buffers::with_max_depth(4096, max_depth),
            tape: Tape(Vec::new()),
        }
    }

    /// Parses `frame` on the padded working copy (as [`Engine::handle`] does) and runs
    /// `f` over the tape; the frame is left untouched, so `RawCtx` can find raw text.
    pub(crate) fn parse<R>(
        &mut self,
        frame: &[u8],
        f: impl FnOnce(Result<RawCtx<'_>, simd_json::Error>) -> R,
    ) -> R {
        let len = frame.len();
        self.input.clear();
        self.input.extend_from_slice(frame);
        self.input.resize(len + INPUT_PADDING, b' ');
        let mut tape: Tape<'_> = std::mem::replace(&mut self.tape, Tape(Vec::new())).reset();
        let r =
            match simd_json::fill_tape_padded(&mut self.input, len, &mut self.buffers, &mut tape) {
                Ok(()) => f(Ok(RawCtx {
                    frame,
                    structurals: self.buffers.structural_indexes(),
                    root: &tape.0,
                })),
                Err(e) => f(Err(e)),
            };
        self.tape = tape.reset();
        r
    }
}

/// A JSON-RPC 2.0 engine: a frozen [`Registry`] and its [`Config`]. Bytes in, bytes
/// out, no I/O; share it between threads by reference or `Arc`.
#[derive(Debug)]
pub struct Engine {
    registry: Registry,
    config: Config,
}

impl Engine {
    /// An engine serving `registry` under `config`.
    pub fn new(registry: Registry, config: Config) -> Self {
        Self { registry, config }
    }

    /// The limits in force.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The methods served.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Fresh parse state for one thread.
    pub fn scratch(&self) -> Scratch {
        Scratch {
            input: Vec::with_capacity(4096),
            buffers: Buffers::with_max_depth(4096, self.config.max_depth),
            tape: Tape(Vec::new()),
        }
    }

    /// A newline framer enforcing this engine's `max_request_bytes`.
    pub fn decoder(&self) -> LineDecoder {
        LineDecoder::new(self.config.max_request_bytes)
    }

    /// Handles one frame: a single request, a notification or a batch.
    ///
    /// `frame` is left untouched: it is copied once into the scratch's padded buffer,
    /// where simd-json parses it in place (the copy simd-json's own `fill_tape` would
    /// make anyway), so raw byte ranges of the frame can be re-emitted verbatim and
    /// the caller can still log or forward it. The reply, if any, is appended to `out`
    /// as one compact JSON text without a trailing newline. Every input gets the answer the
    /// specification requires: bad JSON a `-32700`, a non-request a `-32600`, and
    /// notifications nothing at all.
    ///
    /// Cost: one parse of the frame; no heap allocation once `scratch` and `out` have
    /// grown to fit (error paths with formatted messages aside).
    ///
    /// ```
    /// use ringrpc::{Config, Engine, Outcome, Params, Registry, RpcError};
    ///
    /// let mut methods = Registry::builder();
    /// methods.method("add", |p: Params<'_>| -> Result<i64, RpcError> {
    ///     let [a, b]: [i64; 2] = p.parse()?;
    ///     Ok(a + b)
    /// })?;
    /// let engine = Engine::new(methods.freeze(), Config::default());
    ///
    /// let mut scratch = engine.scratch();
    /// let mut out = Vec::new();
    /// let frame = br#"{"jsonrpc":"2.0","method":"add","params":[2,3],"id":7}"#;
    /// assert_eq!(engine.handle(frame, &mut scratch, &mut out), Outcome::Reply);
    /// assert_eq!(out, br#"{"jsonrpc":"2.0","id":7,"result":5}"#);
    ///
    /// out.clear();
    /// let note = br#"{"jsonrpc":"2.0","method":"add","params":[2,3]}"#;
    /// assert_eq!(engine.handle(note, &mut scratch, &mut out), Outcome::Nothing);
    /// assert!(out.is_empty());
    /// # Ok::<(), ringrpc::RegisterError>(())
    /// ```
    pub fn handle(&self, frame: &[u8], scratch: &mut Scratch, out: &mut Vec<u8>) -> Outcome {
        match self.parse_and(frame, scratch, out, None) {
            Split::Done(outcome) => outcome,
            // Without a deferral list nothing is deferred.
            Split::Single | Split::Batch { .. } => Outcome::Nothing,
        }
    }

    /// Parses `frame` on the scratch's padded copy and answers it.
    fn parse_and(
        &self,
        frame: &[u8],
        scratch: &mut Scratch,
        out: &mut Vec<u8>,
        defer: Option<&mut Vec<Deferred>>,
    ) -> Split {
        let len = frame.len();
        if len > self.config.max_request_bytes {
            let limit = self.config.max_request_bytes;
            return Split::Done(self.write_frame_error(FrameError::TooLarge { limit }, out));
        }
        scratch.input.clear();
        scratch.input.extend_from_slice(frame);
        scratch.input.resize(len + INPUT_PADDING, b' ');
        let mut tape: Tape<'_> = std::mem::replace(&mut scratch.tape, Tape(Vec::new())).reset();
        let parsed =
            simd_json::fill_tape_padded(&mut scratch.input, len, &mut scratch.buffers, &mut tape);
        let split = match parsed {
            Ok(()) => {
                let raw = RawCtx {
                    frame,
                    structurals: scratch.buffers.structural_indexes(),
                    root: &tape.0,
                };
                self.respond(raw, out, defer)
            }
            Err(e) => {
                self.parse_error(&e, out);
                Split::Done(Outcome::Reply)
            }
        };
        scratch.tape = tape.reset();
        split
    }

    /// Appends the answer to a framing error: `-32600` naming the limit, id `null`.
    pub fn write_frame_error(&self, err: FrameError, out: &mut Vec<u8>) -> Outcome {
        match err {
            FrameError::TooLarge { limit } => write_error(
                out,
                Id::Null,
                ErrorCode::InvalidRequest,
                format_args!("Invalid Request: request exceeds max_request_bytes ({limit} bytes)"),
            ),
        }
        Outcome::Reply
    }

    /// Decodes and handles every complete newline-delimited frame in `buf`, appending
    /// each reply and a `\n` to `out`. Returns the number of replies written. Partial
    /// frames stay in `buf` for the next call.
    ///
    /// This is the whole stream-transport loop body; see the `stdio` example.
    pub fn handle_lines(
        &self,
        buf: &mut BytesMut,
        decoder: &mut LineDecoder,
        scratch: &mut Scratch,
        out: &mut Vec<u8>,
    ) -> usize {
        let mut replies = 0;
        loop {
            let outcome = match decoder.decode(buf) {
                Ok(Some(frame)) => self.handle(&frame, scratch, out),
                Ok(None) => return replies,
                Err(e) => self.write_frame_error(e, out),
            };
            if outcome == Outcome::Reply {
                out.push(b'\n');
                replies += 1;
            }
        }
    }

    #[cold]
    fn parse_error(&self, e: &simd_json::Error, out: &mut Vec<u8>) {
        let code = ErrorCode::ParseError;
        if let ErrorType::DepthLimitExceeded = e.error() {
            return write_error(
                out,
                Id::Null,
                code,
                format_args!(
                    "Parse error: nesting deeper than max_depth ({} levels)",
                    self.config.max_depth
                ),
            );
        }
        let what = match e.error() {
            ErrorType::Eof => "unexpected end of input",
            ErrorType::InvalidUtf8 => "invalid UTF-8",
            ErrorType::InvalidEscape => "invalid escape in a string",
            ErrorType::InvalidUnicodeEscape | ErrorType::InvalidUnicodeCodepoint => {
                "invalid \\u escape in a string"
            }
            ErrorType::InvalidNumber | ErrorType::InvalidExponent | ErrorType::Overflow => {
                "invalid or out-of-range number"
            }
            ErrorType::UnterminatedString => "unterminated string",
            ErrorType::TrailingData => "data after the JSON value",
            ErrorType::NoStructure => "no JSON value",
            ErrorType::ExpectedObjectColon => "expected `:` in an object",
            ErrorType::ExpectedArrayComma | ErrorType::ExpectedMapComma => {
                "expected `,` or a closing bracket"
            }
            ErrorType::ExpectedObjectKey | ErrorType::KeyMustBeAString => {
                "expected a string key in an object"
            }
            _ => "invalid JSON",
        };
        write_error(
            out,
            Id::Null,
            code,
            format_args!("Parse error: {what} (near byte {})", e.index()),
        );
    }

    /// Answers a parsed document: a single request or a batch. With `defer`, requests
    /// for blocking methods are not run: their byte ranges are pushed there instead.
    fn respond(
        &self,
        raw: RawCtx<'_>,
        out: &mut Vec<u8>,
        mut defer: Option<&mut Vec<Deferred>>,
    ) -> Split {
        let nodes = raw.root;
        let start = out.len();
        let limit = start.saturating_add(self.config.max_response_bytes);
        let max = self.config.max_response_bytes;
        match nodes.first() {
            Some(Node::Array { len: 0, .. }) => {
                write_error(
                    out,
                    Id::Null,
                    ErrorCode::InvalidRequest,
                    format_args!("Invalid Request: empty batch"),
                );
                Split::Done(Outcome::Reply)
            }
            Some(&Node::Array { len, .. }) if len > self.config.max_batch_len => {
                write_error(
                    out,
                    Id::Null,
                    ErrorCode::InvalidRequest,
                    format_args!(
                        "Invalid Request: batch of {len} exceeds max_batch_len ({})",
                        self.config.max_batch_len
                    ),
                );
                Split::Done(Outcome::Reply)
            }
            Some(&Node::Array { len, .. }) => {
                out.push(b'[');
                let mut rest = &nodes[1..];
                let mut wrote = 0;
                let mut deferred = 0;
                for _ in 0..len {
                    let n = rest.first().map_or(0, span).min(rest.len());
                    let (elem, tail) = rest.split_at(n);
                    rest = tail;
                    let mark = out.len();
                    if wrote > 0 {
                        out.push(b',');
                    }
                    match self.single(elem, raw, out, limit, max, defer.as_deref_mut()) {
                        Answer::Wrote => wrote += 1,
                        Answer::Nothing => out.truncate(mark),
                        Answer::Deferred => {
                            out.truncate(mark);
                            deferred += 1;
                        }
                    }
                }
                if deferred > 0 {
                    Split::Batch { wrote }
                } else if wrote > 0 {
                    out.push(b']');
                    Split::Done(Outcome::Reply)
                } else {
                    // Only notifications: nothing at all, never `[]`.
                    out.truncate(start);
                    Split::Done(Outcome::Nothing)
                }
            }
            _ => match self.single(nodes, raw, out, limit, max, defer) {
                Answer::Wrote => Split::Done(Outcome::Reply),
                Answer::Nothing => Split::Done(Outcome::Nothing),
                Answer::Deferred => Split::Single,
            },
        }
    }

    /// Answers one request object (or batch element).
    #[inline]
    fn single(
        &self,
        nodes: &[Node<'_>],
        raw: RawCtx<'_>,
        out: &mut Vec<u8>,
        limit: usize,
        max: usize,
        defer: Option<&mut Vec<Deferred>>,
    ) -> Answer {
        match validate(nodes, raw) {
            Ok(req) => {
                // One lookup serves both the blocking check and the call.
                let entry = self.registry.get(req.method);
                if let Some(defer) = defer {
                    if entry.is_some_and(|e| e.blocking) {
                        if let Some(range) = raw.container_range(nodes) {
                            let id = req.id.map(OwnedId::from);
                            defer.push(Deferred { range, id });
                            return Answer::Deferred;
                        }
                    }
                }
                if dispatch(entry, req, out, limit, max) {
                    Answer::Wrote
                } else {
                    Answer::Nothing
                }
            }
            Err(invalid) => {
                write_error(
                    out,
                    invalid.id,
                    ErrorCode::InvalidRequest,
                    format_args!("{}", invalid.reason),
                );
                Answer::Wrote
            }
        }
    }

    /// Like [`Engine::handle`], but requests for blocking methods are not run: they are
    /// pushed onto `deferred` (byte range in `frame`, id) for the worker pool, which
    /// answers each with [`Engine::handle`]. For a batch with deferred elements, `out`
    /// is left holding `[` and the inline answers, comma-separated, without the `]`.
    pub(crate) fn handle_split(
        &self,
        frame: &[u8],
        scratch: &mut Scratch,
        out: &mut Vec<u8>,
        deferred: &mut Vec<Deferred>,
    ) -> Split {
        self.parse_and(frame, scratch, out, Some(deferred))
    }
}

/// What is left to do for a frame after [`Engine::handle_split`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Split {
    /// Nothing: the frame is answered (or needs no answer).
    Done(Outcome),
    /// The frame is one call to a blocking method, deferred whole.
    Single,
    /// A batch with deferred elements; `wrote` answers are already in the output.
    Batch {
        /// Inline answers written after the `[`.
        wrote: usize,
    },
}

/// A request left for the worker pool: its bytes in the frame, and its id (`None` for
/// a notification), kept so the server can answer a timeout or a full queue itself.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Deferred {
    pub(crate) range: Range<usize>,
    pub(crate) id: Option<OwnedId>,
}

/// An [`Id`] that outlives the frame's parse.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum OwnedId {
    Null,
    Str(Box<str>),
    Int(i64),
    UInt(u64),
    Float(f64),
}

impl From<Id<'_>> for OwnedId {
    fn from(id: Id<'_>) -> Self {
        match id {
            Id::Null => Self::Null,
            Id::Str(s) => Self::Str(s.into()),
            Id::Int(i) => Self::Int(i),
            Id::UInt(u) => Self::UInt(u),
            Id::Float(f) => Self::Float(f),
        }
    }
}

impl OwnedId {
    pub(crate) fn as_id(&self) -> Id<'_> {
        match self {
            Self::Null => Id::Null,
            Self::Str(s) => Id::Str(s),
            Self::Int(i) => Id::Int(*i),
            Self::UInt(u) => Id::UInt(*u),
            Self::Float(f) => Id::Float(*f),
        }
    }
}

/// What answering one request did.
enum Answer {
    Wrote,
    Nothing,
    Deferred,
}
