//! The no-I/O entry point: one frame in, its reply (if any) appended to an output buffer.

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
        let len = frame.len();
        if len > self.config.max_request_bytes {
            return self.write_frame_error(
                FrameError::TooLarge {
                    limit: self.config.max_request_bytes,
                },
                out,
            );
        }
        scratch.input.clear();
        scratch.input.extend_from_slice(frame);
        scratch.input.resize(len + INPUT_PADDING, b' ');
        let mut tape: Tape<'_> = std::mem::replace(&mut scratch.tape, Tape(Vec::new())).reset();
        let parsed =
            simd_json::fill_tape_padded(&mut scratch.input, len, &mut scratch.buffers, &mut tape);
        let outcome = match parsed {
            Ok(()) => {
                let raw = RawCtx {
                    frame,
                    structurals: scratch.buffers.structural_indexes(),
                    root: &tape.0,
                };
                self.respond(raw, out)
            }
            Err(e) => {
                self.parse_error(&e, out);
                Outcome::Reply
            }
        };
        scratch.tape = tape.reset();
        outcome
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

    /// Answers a parsed document: a single request or a batch.
    fn respond(&self, raw: RawCtx<'_>, out: &mut Vec<u8>) -> Outcome {
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
                Outcome::Reply
            }
            Some(&Node::Array { len, .. }) => {
                out.push(b'[');
                let mut rest = &nodes[1..];
                let mut any = false;
                for _ in 0..len {
                    let n = rest.first().map_or(0, span).min(rest.len());
                    let (elem, tail) = rest.split_at(n);
                    rest = tail;
                    let mark = out.len();
                    if any {
                        out.push(b',');
                    }
                    if self.single(elem, raw, out, limit, max) {
                        any = true;
                    } else {
                        out.truncate(mark);
                    }
                }
                if any {
                    out.push(b']');
                    Outcome::Reply
                } else {
                    // Only notifications: nothing at all, never `[]`.
                    out.truncate(start);
                    Outcome::Nothing
                }
            }
            _ => {
                if self.single(nodes, raw, out, limit, max) {
                    Outcome::Reply
                } else {
                    Outcome::Nothing
                }
            }
        }
    }

    /// Answers one request object (or batch element); returns whether it wrote a reply.
    #[inline]
    fn single(
        &self,
        nodes: &[Node<'_>],
        raw: RawCtx<'_>,
        out: &mut Vec<u8>,
        limit: usize,
        max: usize,
    ) -> bool {
        match validate(nodes, raw) {
            Ok(req) => dispatch(&self.registry, req, out, limit, max),
            Err(invalid) => {
                write_error(
                    out,
                    invalid.id,
                    ErrorCode::InvalidRequest,
                    format_args!("{}", invalid.reason),
                );
                true
            }
        }
    }
}
