//! The no-I/O entry point: one frame in, its reply (if any) appended to an output buffer.

use std::ops::Range;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

use bytes::BytesMut;
use simd_json::{Buffers, ErrorType, Node, Tape, INPUT_PADDING};

use crate::access_log::AccessLog;
use crate::codec::raw::RawCtx;
use crate::codec::request::validate;
use crate::codec::tape::elements;
use crate::codec::{Id, LineDecoder};
use crate::config::Config;
use crate::dedup::{Claim, Dedup, Digest, Ticket};
use crate::dispatch::context::{Context, Source};
use crate::dispatch::dispatch;
use crate::dispatch::hooks::{Answered, Hooks};
use crate::dispatch::registry::{Handler, Registry};
use crate::dispatch::responder::{Complete, Responder, Tag};
use crate::error::{ErrorCode, FrameError, Reason};
use crate::guard::rate::Limited;
use crate::guard::Guard;
use crate::metrics::{Event, Local, Metrics};
use crate::serializer::batch::BatchWriter;
use crate::serializer::response::write_error;
use crate::trace::{Sampler, Trace};

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
    /// Where deferred methods called through [`Engine::handle`] answer; made on first
    /// use.
    waiter: Option<Arc<Waiter>>,
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
            waiter: None,
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
        copy_padded(&mut self.input, frame);
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
pub struct Engine {
    registry: Registry,
    config: Config,
    hooks: Option<Arc<dyn Hooks>>,
    guard: Option<Arc<Guard>>,
    dedup: Option<Dedup>,
    /// `None` when turned off ([`Engine::without_metrics`]).
    metrics: Option<Metrics>,
    /// Which calls that came without a trace get one ([`Engine::with_trace_sampling`]).
    sampler: Sampler,
    /// One line per call, if set ([`Engine::with_access_log`]).
    access_log: Option<Arc<AccessLog>>,
    /// Neither hooks nor an access log: plain calls take the straight path (through
    /// the guard, if one is set).
    bare: bool,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("registry", &self.registry)
            .field("config", &self.config)
            .field("hooks", &self.hooks.is_some())
            .field("guard", &self.guard)
            .finish()
    }
}

impl Engine {
    /// An engine serving `registry` under `config`.
    pub fn new(registry: Registry, config: Config) -> Self {
        let metrics = Metrics::new(registry.names().to_vec());
        Self {
            registry,
            config,
            hooks: None,
            guard: None,
            dedup: None,
            metrics: Some(metrics),
            sampler: Sampler::default(),
            access_log: None,
            bare: true,
        }
    }

    /// The engine without metrics: nothing counted or timed (they cost ~3 ns per call
    /// answered from a read or batch, ~18 ns for a lone frame through
    /// [`Engine::handle`]; see docs/PERFORMANCE.md).
    pub fn without_metrics(mut self) -> Self {
        self.metrics = None;
        self
    }

    /// The engine with a fraction `rate` (0 to 1) of the frames that come without a
    /// trace given one ([`Trace::root`], sampled): their calls run in `tracing` spans and
    /// their contexts expose the trace id; an HTTP answer carries it as `traceparent`.
    /// Frames with the caller's trace (`traceparent`) follow the caller's decision.
    /// Default 0: nothing is traced unless the caller asks.
    pub fn with_trace_sampling(mut self, rate: f64) -> Self {
        self.sampler = Sampler::new(rate);
        self
    }

    /// The engine writing one line per call (each batch element) to `log` (see
    /// [`crate::access_log`]); replaces any log set before. Calls then leave the
    /// straight path (~240 ns each, the line's formatting; the writing is on the
    /// log's own thread).
    pub fn with_access_log(mut self, log: AccessLog) -> Self {
        if let Some(m) = &self.metrics {
            m.add_counter(
                "ringrpc_access_log_dropped_total",
                "Access log lines dropped because the log's queue was full.",
                log.dropped_counter(),
            );
        }
        self.access_log = Some(Arc::new(log));
        self.bare = false;
        self
    }

    /// The access log, if set.
    pub(crate) fn access_log(&self) -> Option<&Arc<AccessLog>> {
        self.access_log.as_ref()
    }

    /// A new sampled trace for a frame that came without one, at the configured rate.
    #[inline]
    pub(crate) fn sample_trace(&self) -> Option<Trace> {
        self.sampler.sample()
    }

    /// Whether frames that came without a trace may get one ([`Engine::sample_trace`]).
    #[inline]
    pub(crate) fn samples_traces(&self) -> bool {
        self.sampler.is_on()
    }

    /// The engine's metrics, to serve on an endpoint of the host's own
    /// ([`Metrics::render`]); `None` after [`Engine::without_metrics`]. The server
    /// serves them at `GET /metrics`.
    pub fn metrics(&self) -> Option<&Metrics> {
        self.metrics.as_ref()
    }

    /// The engine with `hooks` run around every call (see [`Hooks`]); replaces any set
    /// before.
    pub fn with_hooks(mut self, hooks: impl Hooks) -> Self {
        self.hooks = Some(Arc::new(hooks));
        self.bare = false;
        self
    }

    /// The engine with `guard` checking every call and batch element before it runs:
    /// authentication, allow-lists, rate limits (see [`Guard`]). Checked before the
    /// hooks' `before`.
    pub fn with_guard(mut self, guard: Guard) -> Self {
        self.guard = Some(Arc::new(guard));
        self
    }

    /// The engine with `dedup` keeping the answers of calls to methods marked for
    /// de-duplication ([`RegistryBuilder::dedup`]), so that retries replay them (see
    /// [`crate::dedup`]). Without it those methods run every time.
    ///
    /// [`RegistryBuilder::dedup`]: crate::RegistryBuilder::dedup
    pub fn with_dedup(mut self, dedup: Dedup) -> Self {
        self.dedup = Some(dedup);
        self
    }

    /// The guard in force, if any (say, to [`Guard::reload`] it on SIGHUP).
    pub fn guard(&self) -> Option<&Guard> {
        self.guard.as_deref()
    }

    /// The hooks in force.
    pub(crate) fn hooks(&self) -> Option<&Arc<dyn Hooks>> {
        self.hooks.as_ref()
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
            waiter: None,
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
        self.handle_from(frame, &Source::EMBEDDED, scratch, out)
    }

    /// As [`Engine::handle`], for a frame from `source`: the connection (transport, peer)
    /// and HTTP headers that context-aware handlers see in their [`Context`].
    ///
    /// Everything is answered before this returns: methods registered as blocking run
    /// here, and a deferred method's answer is waited for (at most `request_timeout`,
    /// then `-32001`), batch elements one after another.
    pub fn handle_from(
        &self,
        frame: &[u8],
        source: &Source<'_>,
        scratch: &mut Scratch,
        out: &mut Vec<u8>,
    ) -> Outcome {
        match &self.metrics {
            Some(m) => {
                m.with_local(|local| self.wait_for(frame, source, scratch, out, Some(local)))
            }
            None => self.wait_for(frame, source, scratch, out, None),
        }
    }

    /// [`Engine::handle_from`], counting in `local`: each frame is timed on its own.
    #[inline(always)]
    fn wait_for(
        &self,
        frame: &[u8],
        source: &Source<'_>,
        scratch: &mut Scratch,
        out: &mut Vec<u8>,
        local: Option<&Local>,
    ) -> Outcome {
        if let Some(l) = local {
            l.start();
        }
        let outcome = self.wait_counted(frame, source, scratch, out, local);
        if let Some(l) = local {
            l.flush();
        }
        outcome
    }

    /// [`Engine::wait_for`] within a [`Local::start`] and [`Local::flush`] of the
    /// caller's.
    fn wait_counted(
        &self,
        frame: &[u8],
        source: &Source<'_>,
        scratch: &mut Scratch,
        out: &mut Vec<u8>,
        local: Option<&Local>,
    ) -> Outcome {
        let sampled;
        let source = match source.trace {
            None => match self.sample_trace() {
                Some(t) => {
                    sampled = t;
                    &source.with_trace(&sampled)
                }
                None => source,
            },
            Some(_) => source,
        };
        // Moved out and back (no reference count touched): most frames never use it.
        let mut wait = Wait {
            waiter: scratch.waiter.take(),
            config: &self.config,
            call: None,
            hooks: true,
            code: None,
            dedup: None,
            local,
            transport: source.conn.transport(),
            clock: Clock::Unread,
        };
        // `Wait::outcome` only counts for a frame handed in here (its code is for pool
        // jobs), so the straight path may count its calls itself.
        let split = self.parse_and(frame, source, scratch, out, &mut wait, Tally::Direct(local));
        scratch.waiter = wait.waiter;
        match split {
            Split::Done(outcome) => outcome,
            // `Wait` takes no call for later.
            Split::Single | Split::Batch(_) => Outcome::Nothing,
        }
    }

    /// Runs a call the server took for its worker pool: `frame` is one request, whose
    /// hooks the server runs itself, and `deadline` the deadline given it where it was
    /// read. Returns the answer's error code (`None`: a result).
    pub(crate) fn run_job(
        &self,
        frame: &[u8],
        source: &Source<'_>,
        scratch: &mut Scratch,
        out: &mut Vec<u8>,
        dedup: Option<Digest>,
        deadline: Option<Instant>,
    ) -> Option<i32> {
        // The server counts the call when its answer arrives; only events count here.
        let mut run = |local: Option<&Local>| {
            let mut wait = Wait {
                waiter: scratch.waiter.take(),
                config: &self.config,
                call: None,
                hooks: false,
                code: None,
                dedup,
                local,
                transport: source.conn.transport(),
                clock: Clock::Fixed(deadline),
            };
            let _ = self.parse_and(frame, source, scratch, out, &mut wait, Tally::Sink);
            scratch.waiter = wait.waiter;
            wait.code
        };
        match &self.metrics {
            Some(m) => m.with_local(|l| run(Some(l))),
            None => run(None),
        }
    }

    /// Parses `frame` on the scratch's padded copy and answers it.
    fn parse_and(
        &self,
        frame: &[u8],
        source: &Source<'_>,
        scratch: &mut Scratch,
        out: &mut Vec<u8>,
        defer: &mut dyn Deferrals,
        tally: Tally<'_>,
    ) -> Split {
        let len = frame.len();
        if len > self.config.max_request_bytes {
            let limit = self.config.max_request_bytes;
            defer.outcome(self.unknown(), Some(crate::error::INVALID_REQUEST));
            return Split::Done(self.write_frame_error(FrameError::TooLarge { limit }, out));
        }
        copy_padded(&mut scratch.input, frame);
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
                self.respond(raw, source, out, defer, tally)
            }
            Err(e) => {
                self.parse_error(&e, out);
                defer.outcome(self.unknown(), Some(crate::error::PARSE_ERROR));
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
                Reason::RequestTooLarge,
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
        self.handle_lines_from(buf, decoder, &Source::EMBEDDED, scratch, out)
    }

    /// As [`Engine::handle_lines`], for frames from `source` (see
    /// [`Engine::handle_from`]).
    pub fn handle_lines_from(
        &self,
        buf: &mut BytesMut,
        decoder: &mut LineDecoder,
        source: &Source<'_>,
        scratch: &mut Scratch,
        out: &mut Vec<u8>,
    ) -> usize {
        // Timed as the server times a read: the calls of one buffer leave together, in
        // one write of `out`, so each counts from here to the end (one clock read for
        // all of them, not two per frame).
        match &self.metrics {
            Some(m) => m.with_local(|l| {
                l.start();
                let replies = self.lines_counted(buf, decoder, source, scratch, out, Some(l));
                l.flush();
                replies
            }),
            None => self.lines_counted(buf, decoder, source, scratch, out, None),
        }
    }

    /// [`Engine::handle_lines_from`], counting in `local`.
    fn lines_counted(
        &self,
        buf: &mut BytesMut,
        decoder: &mut LineDecoder,
        source: &Source<'_>,
        scratch: &mut Scratch,
        out: &mut Vec<u8>,
        local: Option<&Local>,
    ) -> usize {
        let mut replies = 0;
        loop {
            let outcome = match decoder.decode(buf) {
                Ok(Some(frame)) => self.wait_counted(&frame, source, scratch, out, local),
                Ok(None) => return replies,
                Err(e) => {
                    if let Some(l) = local {
                        let code = Some(crate::error::INVALID_REQUEST);
                        l.call(self.unknown(), source.conn.transport(), code);
                    }
                    self.write_frame_error(e, out)
                }
            };
            if outcome == Outcome::Reply {
                out.push(b'\n');
                replies += 1;
            }
        }
    }

    #[cold]
    fn parse_error(&self, e: &simd_json::Error, out: &mut Vec<u8>) {
        let reason = Reason::ParseError;
        if let ErrorType::DepthLimitExceeded = e.error() {
            return write_error(
                out,
                Id::Null,
                reason,
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
            reason,
            format_args!("Parse error: {what} (near byte {})", e.index()),
        );
    }

    /// Answers a parsed document: a single request or a batch. Calls `defer` takes are
    /// left for later (see [`Deferrals`]).
    fn respond(
        &self,
        raw: RawCtx<'_>,
        source: &Source<'_>,
        out: &mut Vec<u8>,
        defer: &mut dyn Deferrals,
        tally: Tally<'_>,
    ) -> Split {
        let nodes = raw.root;
        let max = self.config.max_response_bytes;
        // Read once per frame: it applies to every call of an HTTP request.
        let header = source.header_budget();
        match nodes.first() {
            Some(Node::Array { len: 0, .. }) => {
                defer.outcome(self.unknown(), Some(crate::error::INVALID_REQUEST));
                write_error(
                    out,
                    Id::Null,
                    Reason::InvalidRequest,
                    format_args!("Invalid Request: empty batch"),
                );
                Split::Done(Outcome::Reply)
            }
            Some(&Node::Array { len, .. }) if len > self.config.max_batch_len => {
                defer.batch(len);
                defer.outcome(self.unknown(), Some(crate::error::INVALID_REQUEST));
                write_error(
                    out,
                    Id::Null,
                    Reason::BatchTooLarge,
                    format_args!(
                        "Invalid Request: batch of {len} exceeds max_batch_len ({})",
                        self.config.max_batch_len
                    ),
                );
                Split::Done(Outcome::Reply)
            }
            Some(&Node::Array { len, .. }) => {
                defer.batch(len);
                // Forwarded elements going to one upstream connection are sent there
                // as one batch, closed when the scope ends. Not where each element's
                // answer is waited for in turn (`Engine::handle`): an element left in an
                // open sub-batch would wait for the scope's end, which never comes.
                #[cfg(feature = "proxy")]
                let _sub_batches = (!defer.may_block()).then(crate::proxy::sub_batch::Scope::enter);
                let mut batch = BatchWriter::begin(out, max);
                let mut later = 0;
                for (i, elem) in elements(nodes).enumerate() {
                    let mark = batch.element(out);
                    let at = Some(u32::try_from(i).unwrap_or(u32::MAX));
                    let limit = batch.limit();
                    match self.single(elem, raw, source, out, limit, defer, tally, at, header) {
                        Answer::Wrote => batch.kept(),
                        Answer::Nothing => batch.discard(out, mark),
                        Answer::Later => {
                            batch.discard(out, mark);
                            defer.placed(batch.offset(out));
                            later += 1;
                        }
                    }
                }
                if later > 0 {
                    Split::Batch(batch)
                } else {
                    Split::Done(batch.finish(out))
                }
            }
            _ => {
                let limit = out.len().saturating_add(max);
                match self.single(nodes, raw, source, out, limit, defer, tally, None, header) {
                    Answer::Wrote => Split::Done(Outcome::Reply),
                    Answer::Nothing => Split::Done(Outcome::Nothing),
                    Answer::Later => Split::Single,
                }
            }
        }
    }

    /// Answers one request object (or batch element number `element`); `header` is
    /// the frame's `RPC-Timeout-Ms` budget, if it came with one.
    #[inline]
    #[allow(clippy::too_many_arguments)]
    fn single(
        &self,
        nodes: &[Node<'_>],
        raw: RawCtx<'_>,
        source: &Source<'_>,
        out: &mut Vec<u8>,
        limit: usize,
        defer: &mut dyn Deferrals,
        tally: Tally<'_>,
        element: Option<u32>,
        header: Option<u32>,
    ) -> Answer {
        let max = self.config.max_response_bytes;
        let req = match validate(nodes, raw) {
            Ok(req) => req,
            Err(invalid) => {
                defer.outcome(self.unknown(), Some(crate::error::INVALID_REQUEST));
                write_error(
                    out,
                    invalid.id,
                    Reason::InvalidRequest,
                    format_args!("{}", invalid.reason),
                );
                return Answer::Wrote;
            }
        };
        // One lookup serves both the kind check and the call.
        let entry = self.registry.get(req.method);
        // The common case first, with nothing to set up: no hooks, a plain method (or
        // none) answered here.
        let plain = entry.is_none_or(crate::dispatch::registry::Entry::is_plain);
        if plain && self.bare && !source.sampled() {
            if let Some(g) = self.guard.as_deref() {
                // Checked, then answered with nothing else set up; a budget to read is
                // read after the check, where everything else is.
                if header.is_none() && !req.params.is_object() && defer.hooks() {
                    return self.single_guarded(g, req, entry, source, out, limit, defer);
                }
                return self.single_with(
                    req, entry, nodes, raw, source, out, limit, defer, element, header,
                );
            }
            // A budget can only be in a header or in object params: calls with neither
            // (the common case) pay two tests, no clock read and no scan.
            if header.is_some() || req.params.is_object() {
                // `_meta` (a budget, a trace) is read where everything else is.
                if req.params.meta().is_some() {
                    return self.single_with(
                        req, entry, nodes, raw, source, out, limit, defer, element, header,
                    );
                }
                if let Some(ms) = header {
                    if let Some(refused) = self.ran_out(&req, entry, ms, out, defer) {
                        return refused;
                    }
                }
            }
            let d = crate::dispatch::dispatch_plain(entry, req, out, limit, max);
            match tally {
                Tally::Direct(Some(l)) => {
                    l.call(self.metric(entry), source.conn.transport(), d.code)
                }
                Tally::Direct(None) => {}
                Tally::Sink => defer.outcome(self.metric(entry), d.code),
            }
            return if d.wrote {
                Answer::Wrote
            } else {
                Answer::Nothing
            };
        }
        self.single_with(
            req, entry, nodes, raw, source, out, limit, defer, element, header,
        )
    }

    /// [`Engine::single`] for a plain call with neither a budget nor a trace to read,
    /// on an engine whose only check is its guard: the guard's verdict, then the call.
    #[inline(never)]
    #[allow(clippy::too_many_arguments)]
    fn single_guarded(
        &self,
        g: &Guard,
        req: crate::codec::request::Request<'_>,
        entry: Option<&crate::dispatch::registry::Entry>,
        source: &Source<'_>,
        out: &mut Vec<u8>,
        limit: usize,
        defer: &mut dyn Deferrals,
    ) -> Answer {
        let metric = self.metric(entry);
        if let Err((denied, _)) = self.guard_call(g, &req, metric, source, out, defer) {
            return denied;
        }
        let max = self.config.max_response_bytes;
        // Not `dispatch_plain`: a second caller would take it out of the straight path.
        let d = dispatch(entry, req, None, source, out, limit, max);
        // Through the sink, whatever the tally: the server answers HTTP 429 when every
        // call of a request was limited, so it counts those let through as well.
        defer.outcome(metric, d.code);
        if d.wrote {
            Answer::Wrote
        } else {
            Answer::Nothing
        }
    }

    /// [`Engine::single`] for the rest: hooks, context-aware handlers, calls answered
    /// later.
    #[allow(clippy::too_many_arguments)]
    #[inline(never)]
    fn single_with(
        &self,
        req: crate::codec::request::Request<'_>,
        entry: Option<&crate::dispatch::registry::Entry>,
        nodes: &[Node<'_>],
        raw: RawCtx<'_>,
        source: &Source<'_>,
        out: &mut Vec<u8>,
        limit: usize,
        defer: &mut dyn Deferrals,
        element: Option<u32>,
        header: Option<u32>,
    ) -> Answer {
        let max = self.config.max_response_bytes;
        // A trace sent in `params._meta.traceparent` (any transport) is this call's.
        let own;
        let (source, own_trace) = match req
            .params
            .meta_traceparent()
            .and_then(|t| Trace::from_traceparent(t.as_bytes()))
        {
            Some(t) => {
                own = t;
                (&source.with_trace(&own), Some(t.trace_id()))
            }
            None => (source, None),
        };
        // A sampled call runs in a span, for the host's subscriber.
        let span = source
            .trace
            .filter(|t| t.is_sampled())
            .map(|t| call_span(t, &req, source));
        let _entered = span.as_ref().map(tracing::Span::enter);
        // The server's pool jobs were checked where they were read.
        let checks = defer.hooks();
        let metric = self.metric(entry);
        // The access log: the call's bytes in, and where its answer starts.
        let log = self.access_log.as_deref().filter(|_| checks);
        let begin = out.len();
        let bytes_in = match log {
            Some(_) => raw.container_range(nodes).map_or(0, |r| r.len()),
            None => 0,
        };
        if let (Some(g), true) = (&self.guard, checks) {
            if let Err((denied, code)) = self.guard_call(g, &req, metric, source, out, defer) {
                if let Some(l) = log {
                    let bytes_out = out.len() - begin;
                    self.log_call(l, source, &req, code, None, bytes_in, bytes_out);
                }
                return denied;
            }
        }
        let hooks = self.hooks.as_deref().filter(|_| checks);
        // A pool job's deadline was set where it was read (the sink's, given back by
        // `defer.deadline`): its budget is not read again.
        let budget = if checks {
            budget(header, &req.params)
        } else {
            None
        };
        if let Some(ms) = budget.filter(|&ms| defer.passed(ms)) {
            let answer = self.expired(&req, metric, ms, hooks, out, defer);
            if let Some(l) = log {
                let code = Some(ErrorCode::RequestTimeout.code());
                self.log_call(l, source, &req, code, None, bytes_in, out.len() - begin);
            }
            return answer;
        }
        // De-duplication: the key is made where the call was read (it needs the session
        // and the headers), the claim where the call runs.
        let (dedup, key) = match (&self.dedup, entry, req.id) {
            (Some(d), Some(e), Some(id)) if e.dedup => {
                let key = if checks {
                    self.dedup_key(d, source, id, element)
                } else {
                    defer.dedup_key()
                };
                (Some(d), key)
            }
            _ => (None, None),
        };
        // A store that may block (Redis) is only talked to from the pool.
        let offload = key.is_some() && dedup.is_some_and(Dedup::remote) && !defer.may_block();
        let kind = entry.map(|e| (e.blocking || offload, &e.handler));
        let later = matches!(kind, Some((true, _) | (_, Handler::Deferred(_))));
        // The clock is read only for calls answered later and calls with a budget.
        let deadline = if later || budget.is_some() {
            defer.deadline(budget)
        } else {
            None
        };
        // A context is built only for hooks and for handlers that read it.
        let ctx = (hooks.is_some() || later || matches!(kind, Some((_, Handler::CallCtx(_)))))
            .then(|| Context::new(*source, req.method, req.id, deadline));
        let started = (hooks.is_some() || log.is_some()).then(Instant::now);
        if let (Some(h), Some(ctx)) = (hooks, &ctx) {
            if let Err(e) = h.before(ctx, &req.params) {
                let code = Some(e.code());
                if let Some(id) = req.id {
                    crate::serializer::response::write_rpc_error(out, id, &e);
                }
                defer.outcome(metric, code);
                self.after(h, req.method, code, req.id.is_none(), started);
                if let Some(l) = log {
                    let bytes_out = out.len() - begin;
                    self.log_call(l, source, &req, code, started, bytes_in, bytes_out);
                }
                return if req.id.is_some() {
                    Answer::Wrote
                } else {
                    Answer::Nothing
                };
            }
        }
        if let Some((true, _)) = kind {
            if let Some(range) = raw.container_range(nodes) {
                if own_trace.is_some() {
                    defer.call_trace(own_trace);
                }
                if defer.blocking(range, req.id, req.method, metric, key, deadline) {
                    return Answer::Later;
                }
            }
        }
        // Claimed here, where it runs: replays and refusals are answered now.
        let ticket = match (dedup, key, req.id) {
            (Some(d), Some(key), Some(id)) => {
                let named = entry.and_then(|e| e.dedup_name);
                let fp = d.fingerprint(req.method, named, &req.params);
                let at = out.len();
                match d.store.claim(&key, &fp, id, out) {
                    Claim::Run(slot) => Some((d, key, fp, slot)),
                    Claim::Bypass => None,
                    claim => {
                        let code = match claim {
                            Claim::Replayed(code) => {
                                defer.event(Event::DedupReplay);
                                // (A stored answer is written whole: past a batch's
                                // budget, it is told too large as any answer is.)
                                if out.len() > limit {
                                    over_budget(out, at, id, max)
                                } else {
                                    code
                                }
                            }
                            refused => Some(crate::dedup::write_refusal(out, id, refused)),
                        };
                        defer.outcome(metric, code);
                        if let Some(h) = hooks {
                            self.after(h, req.method, code, false, started);
                        }
                        if let Some(l) = log {
                            let bytes_out = out.len() - begin;
                            self.log_call(l, source, &req, code, started, bytes_in, bytes_out);
                        }
                        return Answer::Wrote;
                    }
                }
            }
            _ => None,
        };
        if let Some((_, Handler::Deferred(f))) = kind {
            let responder = match (req.id, hooks) {
                (Some(id), _) => {
                    let bytes = raw.container_range(nodes).map_or(0, |r| r.len());
                    // A deferred subscribe answers by its deadline itself (see
                    // `Subscribing`): the server does not time it out.
                    let timed = deadline.filter(|_| !entry.is_some_and(|e| e.untimed));
                    if own_trace.is_some() {
                        defer.call_trace(own_trace);
                    }
                    let mut r = defer.responder(id, req.method, metric, bytes, timed);
                    if let Some((d, key, fp, slot)) = ticket {
                        r.set_ticket(Ticket {
                            store: Arc::clone(&d.store),
                            key,
                            fp,
                            slot,
                        });
                    }
                    r
                }
                (None, None) => Responder::detached(),
                // A notification's answer goes nowhere, but its outcome goes to
                // the after hook, whenever the responder answers.
                (None, Some(_)) => match (&self.hooks, started) {
                    (Some(h), Some(at)) => Responder::hooked(Arc::clone(h), req.method, at),
                    _ => Responder::detached(),
                },
            };
            let ctx = ctx.unwrap_or_else(|| Context::new(*source, req.method, req.id, None));
            // A panic drops the responder while unwinding, which answers -32603:
            // caught here so the thread lives on.
            let ran = catch_unwind(AssertUnwindSafe(|| f(&ctx, req.params, responder)));
            // (A panic dropped the responder, which answered -32603.)
            let _ = ran;
            return match req.id {
                None => {
                    // Its handler's outcome is not known here: counted as run.
                    defer.outcome(metric, None);
                    if let Some(l) = log {
                        self.log_call(l, source, &req, None, started, bytes_in, 0);
                    }
                    Answer::Nothing
                }
                Some(id) => match (out.len(), defer.answered(out)) {
                    (at, Some(mut code)) => {
                        // Within the batch's budget, as an inline answer is (the
                        // responder stored its real answer for a de-duplicated call).
                        if out.len() > limit {
                            code = over_budget(out, at, id, max);
                        }
                        defer.outcome(metric, code);
                        if let Some(h) = hooks {
                            self.after(h, req.method, code, false, started);
                        }
                        if let Some(l) = log {
                            let bytes_out = out.len() - begin;
                            self.log_call(l, source, &req, code, started, bytes_in, bytes_out);
                        }
                        Answer::Wrote
                    }
                    (_, None) => Answer::Later,
                },
            };
        }
        let mark = out.len();
        // A de-duplicated call is answered within its own budget, not what is left of
        // its batch's: its real answer is what a retry must get, where a batch's
        // budget would have written -32002 in its place (and stored that). Past the
        // batch's budget, the batch then gets -32002 for it, as for a pool call's.
        let own = match ticket {
            Some(_) => limit.max(mark.saturating_add(max)),
            None => limit,
        };
        let mut d = dispatch(entry, req, ctx.as_ref(), source, out, own, max);
        if let Some((dd, key, fp, slot)) = ticket {
            // The answer after its id, where dispatch wrote it (not found again).
            let answer = out.get(d.tail..).filter(|_| d.wrote);
            debug_assert_eq!(answer, crate::dedup::tail(&out[mark..]));
            crate::dedup::settle(&dd.store, &key, &fp, slot, answer, d.code);
            if let (true, Some(id)) = (out.len() > limit, req.id) {
                d.code = over_budget(out, mark, id, max);
            }
        }
        defer.outcome(metric, d.code);
        if let Some(h) = hooks {
            self.after(h, req.method, d.code, req.id.is_none(), started);
        }
        if let Some(l) = log {
            let bytes_out = out.len() - begin;
            self.log_call(l, source, &req, d.code, started, bytes_in, bytes_out);
        }
        if d.wrote {
            Answer::Wrote
        } else {
            Answer::Nothing
        }
    }

    /// The metric index of calls to no registered method.
    #[inline(always)]
    pub(crate) fn unknown(&self) -> u32 {
        Metrics::unknown(self.registry.len())
    }

    /// The metric index of calls to `entry` (`None`: not found).
    #[inline(always)]
    fn metric(&self, entry: Option<&crate::dispatch::registry::Entry>) -> u32 {
        match entry {
            Some(e) => e.metric,
            None => self.unknown(),
        }
    }

    /// At a server's graceful shutdown, once every call is answered: a Redis
    /// de-duplication store makes the answers still waiting to be stored, for up to two
    /// seconds (other threads may still hold the engine, so its drop may come only at
    /// the process's exit, too late). The store goes on retrying later failures.
    pub(crate) fn flush_dedup(&self) {
        if let Some(d) = &self.dedup {
            d.flush();
        }
    }

    /// Fetches ahead, without waiting, the de-duplication store's line that the call in
    /// `next` (the raw frame after the one about to be answered, whole or not) will
    /// claim, so that the fetch overlaps the work on the frame before it: in a server,
    /// where the socket work between two calls evicts the store from the CPU's caches,
    /// that line is otherwise a wait of its own in every de-duplicated call. A hint
    /// only: the id is guessed, or peeked at, not parsed ([`crate::codec::peek`]); a
    /// wrong one fetches a line no call needs. Only a flag read for a connection whose
    /// last call was not de-duplicated by its identity and id, or whose engine has no
    /// memory store large enough to miss the caches ([`Dedup::fetch_ahead`]). `len` is
    /// the length of the frame before it, the likely length of `next`'s. See [`ahead`]
    /// for what is fetched when.
    #[inline(always)]
    pub(crate) fn prefetch_frame(&self, next: &[u8], len: usize, session: &crate::guard::Session) {
        match ahead(session.take_keyed(), next.is_empty()) {
            Ahead::Nothing => {}
            Ahead::Guess(id) => self.prefetch_keyed(next, len, Some(id), session),
            Ahead::Peek => self.prefetch_keyed(next, len, None, session),
        }
    }

    /// [`Engine::prefetch_frame`]'s work, once it is worth it: the line of the id
    /// `guess`, or else of the id peeked at in `next`.
    #[inline(never)]
    fn prefetch_keyed(
        &self,
        next: &[u8],
        len: usize,
        guess: Option<u64>,
        session: &crate::guard::Session,
    ) {
        let Some(crate::dedup::Backend::Memory(store)) = self.dedup.as_ref().map(|d| &*d.store)
        else {
            return;
        };
        session.with_identity(|who| {
            let Some(who) = who else {
                return;
            };
            let id = match guess {
                Some(u) => Some(Id::UInt(u)),
                None => crate::codec::peek::id(next, len),
            };
            if let Some(id) = id {
                store.prefetch(&crate::dedup::Store::id_digest(store, &who, id));
            }
        });
    }

    /// The de-duplication key of a call with `id` (batch element `element`) from
    /// `source`: by its `Idempotency-Key` header, or its authenticated identity.
    fn dedup_key(
        &self,
        d: &Dedup,
        source: &Source<'_>,
        id: Id<'_>,
        element: Option<u32>,
    ) -> Option<Digest> {
        // An empty key is no key: anonymous clients sending one would share it.
        let idem = source
            .headers
            .and_then(|h| h.idempotency_key())
            .filter(|k| !k.is_empty());
        match source.session {
            Some(s) => {
                let key = s.with_identity(|who| d.key(who, idem, id, element));
                if d.fetch_ahead && idem.is_none() && key.is_some() {
                    s.set_keyed(id);
                }
                key
            }
            None => d.key(None, idem, id, element),
        }
    }

    /// The guard's checks for one call: `Err` holds the answer when it was refused (or
    /// was `rpc.auth`, answered here).
    #[inline]
    fn guard_call(
        &self,
        g: &Guard,
        req: &crate::codec::request::Request<'_>,
        metric: u32,
        source: &Source<'_>,
        out: &mut Vec<u8>,
        defer: &mut dyn Deferrals,
    ) -> Result<(), (Answer, Option<i32>)> {
        let verdict = if req.method == "rpc.auth" {
            let id = req.id.unwrap_or(Id::Null);
            let mark = out.len();
            match g.rpc_auth(source, &req.params, id, out) {
                Ok(()) => {
                    defer.outcome(metric, None);
                    if req.id.is_none() {
                        out.truncate(mark);
                        return Err((Answer::Nothing, None));
                    }
                    return Err((Answer::Wrote, None));
                }
                Err(denied) => Err(denied),
            }
        } else {
            g.admit(source, req.method)
        };
        let Err(denied) = verdict else {
            return Ok(());
        };
        let code = denied.code().code();
        match denied {
            crate::guard::Denied::Limited(l) | crate::guard::Denied::AuthThrottled(l) => {
                defer.limited(l);
                defer.event(Event::RateLimited);
            }
            crate::guard::Denied::Unauthenticated(_) => defer.event(Event::AuthFailure),
            _ => {}
        }
        defer.outcome(metric, Some(code));
        if let Some(h) = self.hooks.as_deref() {
            self.after(h, req.method, Some(code), req.id.is_none(), None);
        }
        match req.id {
            Some(id) => {
                let who = source.session.and_then(crate::guard::Session::identity);
                denied.write(out, id, req.method, who.as_deref());
                Err((Answer::Wrote, Some(code)))
            }
            None => Err((Answer::Nothing, Some(code))),
        }
    }

    /// Writes the access log's line for a call answered here.
    #[cold]
    #[allow(clippy::too_many_arguments)]
    fn log_call(
        &self,
        log: &AccessLog,
        source: &Source<'_>,
        req: &crate::codec::request::Request<'_>,
        code: Option<i32>,
        started: Option<Instant>,
        bytes_in: usize,
        bytes_out: usize,
    ) {
        let identity = source.session.and_then(crate::guard::Session::identity);
        log.log(&crate::access_log::Entry {
            conn: source.conn,
            identity: identity.as_deref(),
            method: req.method,
            id: req.id,
            code,
            took: started.map(|t| t.elapsed()).unwrap_or_default(),
            bytes_in,
            bytes_out,
            trace: source.trace.map(Trace::trace_id),
        });
    }

    /// [`Engine::single`]'s check of a call that came with a budget of `ms`, out of
    /// line (it reads the clock): the refusal if the budget has run out.
    #[inline(never)]
    fn ran_out(
        &self,
        req: &crate::codec::request::Request<'_>,
        entry: Option<&crate::dispatch::registry::Entry>,
        ms: u32,
        out: &mut Vec<u8>,
        defer: &mut dyn Deferrals,
    ) -> Option<Answer> {
        defer
            .passed(ms)
            .then(|| self.expired(req, self.metric(entry), ms, None, out, defer))
    }

    /// Refuses a call whose caller's budget of `ms` ran out before it ran: `-32001`
    /// with `data.reason` `"deadline_exceeded"`, counted and reported like the other
    /// refusals; nothing runs.
    #[cold]
    #[inline(never)]
    fn expired(
        &self,
        req: &crate::codec::request::Request<'_>,
        metric: u32,
        ms: u32,
        hooks: Option<&dyn Hooks>,
        out: &mut Vec<u8>,
        defer: &mut dyn Deferrals,
    ) -> Answer {
        let code = ErrorCode::RequestTimeout.code();
        defer.event(Event::DeadlineExceeded);
        defer.outcome(metric, Some(code));
        if let Some(h) = hooks {
            self.after(h, req.method, Some(code), req.id.is_none(), None);
        }
        let Some(id) = req.id else {
            return Answer::Nothing;
        };
        crate::serializer::response::write_prefix(out, id);
        crate::serializer::response::write_error_tail(
            out,
            code,
            format_args!(
                "Deadline exceeded: the caller's budget of {ms} ms ran out before the call ran"
            ),
            Some(r#"{"reason":"deadline_exceeded"}"#),
        );
        Answer::Wrote
    }

    /// Runs the after hook for a call answered here.
    #[cold]
    fn after(
        &self,
        hooks: &dyn Hooks,
        method: &str,
        code: Option<i32>,
        notification: bool,
        started: Option<Instant>,
    ) {
        hooks.after(&Answered {
            method,
            code,
            elapsed: started.map(|t| t.elapsed()).unwrap_or_default(),
            notification,
        });
    }

    /// Like [`Engine::handle_from`], but the calls `defer` takes are left for later:
    /// blocking methods' (to run on the pool) and deferred methods' (answered through
    /// their responders). For a batch with calls left, `out` holds its array so far,
    /// unclosed, and [`Split::Batch`] the writer to finish it with.
    // The server calls `handle_split_counted`; the fuzz targets call this.
    #[cfg_attr(not(feature = "fuzzing"), allow(dead_code))]
    pub(crate) fn handle_split(
        &self,
        frame: &[u8],
        source: &Source<'_>,
        scratch: &mut Scratch,
        out: &mut Vec<u8>,
        defer: &mut dyn Deferrals,
    ) -> Split {
        self.parse_and(frame, source, scratch, out, defer, Tally::Sink)
    }

    /// [`Engine::handle_split`] for a sink whose [`Deferrals::outcome`] only counts
    /// calls in `local` (and rate limits, for which a guarded engine's calls all go
    /// through the sink): the straight path counts its calls there itself, without it.
    pub(crate) fn handle_split_counted(
        &self,
        frame: &[u8],
        source: &Source<'_>,
        scratch: &mut Scratch,
        out: &mut Vec<u8>,
        defer: &mut dyn Deferrals,
        local: Option<&Local>,
    ) -> Split {
        self.parse_and(frame, source, scratch, out, defer, Tally::Direct(local))
    }
}

/// `frame`, then simd-json's padding (spaces), in `buf`: the padding as one fixed-size
/// copy (`Vec::resize` calls `memset` for it).
#[inline]
fn copy_padded(buf: &mut Vec<u8>, frame: &[u8]) {
    const PAD: [u8; INPUT_PADDING] = [b' '; INPUT_PADDING];
    buf.clear();
    buf.reserve(frame.len() + INPUT_PADDING);
    buf.extend_from_slice(frame);
    buf.extend_from_slice(&PAD);
}

/// The span of a sampled call.
#[cold]
fn call_span(
    trace: &Trace,
    req: &crate::codec::request::Request<'_>,
    source: &Source<'_>,
) -> tracing::Span {
    let identity = source.session.and_then(crate::guard::Session::identity);
    tracing::info_span!(
        "rpc.call",
        method = req.method,
        id = ?req.id,
        transport = source.conn.transport().as_str(),
        peer = ?source.conn.peer(),
        identity = identity.as_deref(),
        trace_id = %trace.trace_id(),
        span_id = %trace.span_id(),
    )
}

/// The caller's budget for a call, in milliseconds: the smaller of the frame's
/// `RPC-Timeout-Ms` (`header`) and the call's `params._meta.timeoutMs`.
#[inline]
fn budget(header: Option<u32>, params: &crate::codec::Params<'_>) -> Option<u32> {
    match (header, params.budget_ms()) {
        (Some(h), Some(m)) => Some(h.min(m)),
        (h, m) => h.or(m),
    }
}

/// `at + ms`; `None` past what an `Instant` holds (a budget that far off is none).
fn after_ms(at: Instant, ms: u32) -> Option<Instant> {
    at.checked_add(std::time::Duration::from_millis(u64::from(ms)))
}

/// The deadline of a call taken up at `at`: the earlier of `at + timeout` and
/// `at + budget`.
pub(crate) fn deadline_of(
    at: Instant,
    timeout: Option<std::time::Duration>,
    budget: Option<u32>,
) -> Option<Instant> {
    earlier(
        timeout.and_then(|t| at.checked_add(t)),
        budget.and_then(|ms| after_ms(at, ms)),
    )
}

/// The earlier of two deadlines, either of which may be none.
fn earlier(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// How the calls on [`Engine::single`]'s straight path (plain methods, no hooks, no
/// guard) are counted. Set once per frame: a dynamic call to the sink per call cost
/// ~25 instructions.
#[derive(Clone, Copy)]
enum Tally<'l> {
    /// Straight into this metrics shard (`None`: metrics are off); the sink is not told.
    Direct(Option<&'l Local>),
    /// Through [`Deferrals::outcome`] (a pool job's sink keeps the code).
    Sink,
}

/// What is left to do for a frame after [`Engine::handle_split`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Split {
    /// Nothing: the frame is answered (or needs no answer).
    Done(Outcome),
    /// The frame is one call whose answer comes later.
    Single,
    /// A batch with answers still to come; its array so far is in the output.
    Batch(BatchWriter),
}

/// Where the engine reports the calls it does not answer at once (a small sink, so the
/// engine neither knows nor allocates the server's bookkeeping).
pub(crate) trait Deferrals {
    /// A call to `method`, a blocking method, at `range` in the frame: return true to
    /// take it (the engine writes nothing for it), false to have it run here.
    /// `dedup` is its de-duplication key, to claim where it runs; `deadline` is what
    /// [`Deferrals::deadline`] gave it.
    fn blocking(
        &mut self,
        range: Range<usize>,
        id: Option<Id<'_>>,
        method: &str,
        metric: u32,
        dedup: Option<Digest>,
        deadline: Option<Instant>,
    ) -> bool;
    /// Whether calls may block here (the caller's own thread, a pool worker) rather than
    /// on a reactor.
    fn may_block(&self) -> bool {
        false
    }
    /// The de-duplication key of the call being run, made where it was read (a pool
    /// job's).
    fn dedup_key(&self) -> Option<Digest> {
        None
    }
    /// A responder for a call (not a notification) to `method` (metric index
    /// `metric`), a deferred method `bytes` long in the frame, answered `-32001` if not
    /// answered by `deadline`.
    fn responder(
        &mut self,
        id: Id<'_>,
        method: &str,
        metric: u32,
        bytes: usize,
        deadline: Option<Instant>,
    ) -> Responder;
    /// When the frame was taken up: the clock is read on the first call, then the same
    /// instant is given back for the frame's every call (budgets count from it).
    fn taken_at(&mut self) -> Instant;
    /// The trace of the call about to be handed to [`Deferrals::blocking`] or
    /// [`Deferrals::responder`], when it has its own (`params._meta.traceparent`): what
    /// its access-log line names, where others name the frame's.
    fn call_trace(&mut self, _trace: Option<crate::trace::TraceId>) {}
    /// Whether a caller's budget of `ms` milliseconds has run out.
    fn passed(&mut self, ms: u32) -> bool {
        after_ms(self.taken_at(), ms).is_some_and(|d| d <= Instant::now())
    }
    /// The deadline of a call answered later, or of one that came with a caller's
    /// `budget`: the earlier of `request_timeout` and the budget, from
    /// [`Deferrals::taken_at`].
    fn deadline(&mut self, budget: Option<u32>) -> Option<Instant>;
    /// After a deferred method's handler returned: `Some(error code)` if its answer
    /// has been written into `out` now (the no-I/O path waits for it), `None` if it
    /// comes later.
    fn answered(&mut self, out: &mut Vec<u8>) -> Option<Option<i32>>;
    /// Whether the engine runs the hooks (the server runs them itself for the calls it
    /// hands to its pool).
    fn hooks(&self) -> bool {
        true
    }
    /// The error code (`None`: a result) of a call to the method of metric index
    /// `metric` the engine answered itself (every call, batch element, and frame
    /// answered with an error as a whole).
    fn outcome(&mut self, metric: u32, code: Option<i32>);

    /// The batch element just left for later (through `blocking` or `responder`; a
    /// notification's too) belongs at offset `at` of the batch's array, so its answer
    /// can be put in its place. Only where answers are assembled later (the server).
    fn placed(&mut self, _at: usize) {}
    /// Where this frame's batches and events are counted, if metrics are on.
    fn local(&self) -> Option<&Local>;
    /// A batch of `len` elements.
    fn batch(&mut self, len: usize) {
        if let Some(l) = self.local() {
            l.batch(len);
        }
    }
    /// An event to count.
    fn event(&mut self, e: Event) {
        if let Some(l) = self.local() {
            l.event(e);
        }
    }
    /// A call refused by a rate limit (which says when it would pass).
    fn limited(&mut self, limited: Limited) {
        let _ = limited;
    }
}

/// [`Engine::handle`]'s deferrals: blocking methods run inline, deferred methods'
/// answers are waited for.
struct Wait<'e> {
    /// Made on first use, then kept in the [`Scratch`].
    waiter: Option<Arc<Waiter>>,
    config: &'e Config,
    /// The call being waited for: its sequence number, id and deadline.
    call: Option<(u64, OwnedId, Option<Instant>)>,
    /// Run the hooks (not for the server's pool jobs).
    hooks: bool,
    /// The error code of the last call answered here.
    code: Option<i32>,
    /// A pool job's de-duplication key.
    dedup: Option<Digest>,
    /// Where to count, if metrics are on.
    local: Option<&'e Local>,
    transport: crate::dispatch::context::Transport,
    /// When the frame was taken up, or a pool job's deadline.
    clock: Clock,
}

/// [`Wait`]'s time: one field, so that setting it up is one store.
#[derive(Clone, Copy)]
enum Clock {
    /// Not read yet.
    Unread,
    /// When the frame was taken up (read on first need).
    TakenAt(Instant),
    /// A pool job's deadline, set where it was read: its calls' deadline, whatever the
    /// frame holds.
    Fixed(Option<Instant>),
}

impl Deferrals for Wait<'_> {
    fn blocking(
        &mut self,
        _range: Range<usize>,
        _id: Option<Id<'_>>,
        _method: &str,
        _metric: u32,
        _dedup: Option<Digest>,
        _deadline: Option<Instant>,
    ) -> bool {
        false
    }

    fn may_block(&self) -> bool {
        true
    }

    fn dedup_key(&self) -> Option<Digest> {
        self.dedup
    }

    fn hooks(&self) -> bool {
        self.hooks
    }

    #[inline]
    fn outcome(&mut self, metric: u32, code: Option<i32>) {
        self.code = code;
        // A pool job's call is counted by the server when its answer arrives.
        if let (Some(l), true) = (self.local, self.hooks) {
            l.call(metric, self.transport, code);
        }
    }

    fn local(&self) -> Option<&Local> {
        self.local
    }

    fn responder(
        &mut self,
        id: Id<'_>,
        _method: &str,
        _metric: u32,
        _bytes: usize,
        deadline: Option<Instant>,
    ) -> Responder {
        let waiter = Arc::clone(self.waiter.get_or_insert_with(Default::default));
        let seq = waiter.expect_next();
        self.call = Some((seq, OwnedId::from(id), deadline));
        let tag = Tag {
            conn: 0,
            generation: 0,
            slot: seq,
            element: 0,
        };
        Responder::new(
            waiter,
            tag,
            OwnedId::from(id),
            self.config.max_response_bytes,
        )
    }

    fn taken_at(&mut self) -> Instant {
        match self.clock {
            Clock::TakenAt(at) => at,
            Clock::Unread => {
                let now = Instant::now();
                self.clock = Clock::TakenAt(now);
                now
            }
            // Not asked for: a pool job's budget is not read again.
            Clock::Fixed(_) => Instant::now(),
        }
    }

    fn deadline(&mut self, budget: Option<u32>) -> Option<Instant> {
        if let Clock::Fixed(deadline) = self.clock {
            return deadline;
        }
        // Here calls are waited for one after another, each for up to request_timeout
        // of its own; a budget counts from when the frame was taken up.
        let by_timeout = self
            .config
            .request_timeout
            .and_then(|t| Instant::now().checked_add(t));
        earlier(
            by_timeout,
            budget.and_then(|ms| after_ms(self.taken_at(), ms)),
        )
    }

    fn answered(&mut self, out: &mut Vec<u8>) -> Option<Option<i32>> {
        let (Some((seq, id, deadline)), Some(waiter)) = (self.call.take(), &self.waiter) else {
            return None;
        };
        match waiter.wait(seq, deadline, out) {
            Some(code) => Some(code),
            None => {
                self.event(Event::DeadlineExceeded);
                write_error(
                    out,
                    id.as_id(),
                    Reason::DeadlineExceeded,
                    format_args!(
                        "Request timed out: no result {}",
                        crate::dispatch::Within(self.config.request_timeout)
                    ),
                );
                Some(Some(ErrorCode::RequestTimeout.code()))
            }
        }
    }
}

/// Where deferred methods called through [`Engine::handle`] answer: the caller waits
/// on it for the answer it expects (answers to calls it stopped waiting for are
/// dropped). One per [`Scratch`], reused.
#[derive(Default)]
struct Waiter {
    state: Mutex<WaitState>,
    ready: Condvar,
}

#[derive(Default)]
struct WaitState {
    /// The sequence number of the call waited for.
    expected: u64,
    /// Its answer and the answer's error code.
    answer: Option<(Vec<u8>, Option<i32>)>,
    /// A buffer given back, for the next answer.
    spare: Vec<u8>,
}

impl Waiter {
    fn lock(&self) -> std::sync::MutexGuard<'_, WaitState> {
        // A panic while holding this lock leaves plain data behind: still usable.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Starts waiting for a new call: its sequence number.
    fn expect_next(&self) -> u64 {
        let mut s = self.lock();
        s.expected += 1;
        if let Some((old, _)) = s.answer.take() {
            s.spare = old;
        }
        s.expected
    }

    /// Waits for call `seq`'s answer until `deadline`; appends it to `out` and returns
    /// its error code. `None` if the deadline passed first.
    fn wait(&self, seq: u64, deadline: Option<Instant>, out: &mut Vec<u8>) -> Option<Option<i32>> {
        let mut s = self.lock();
        loop {
            if s.expected == seq {
                if let Some((answer, code)) = s.answer.take() {
                    out.extend_from_slice(&answer);
                    s.spare = answer;
                    return Some(code);
                }
            }
            s = match deadline {
                None => self
                    .ready
                    .wait(s)
                    .unwrap_or_else(std::sync::PoisonError::into_inner),
                Some(at) => {
                    let left = at.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        // Late answers to this call are dropped from now on.
                        s.expected += 1;
                        return None;
                    }
                    self.ready
                        .wait_timeout(s, left)
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .0
                }
            };
        }
    }
}

impl Complete for Waiter {
    fn buffer(&self) -> Vec<u8> {
        let mut b = std::mem::take(&mut self.lock().spare);
        b.clear();
        b
    }

    fn complete(&self, tag: Tag, answer: Vec<u8>, code: Option<i32>) {
        let mut s = self.lock();
        if tag.slot == s.expected && s.answer.is_none() {
            s.answer = Some((answer, code));
            self.ready.notify_all();
        }
    }

    /// `Engine::handle` waits on the thread that called it.
    #[cfg(feature = "proxy")]
    fn waits_here(&self) -> bool {
        true
    }
}

/// Replaces the answer written from `at` by the `-32002` error (an answer past a
/// batch's budget); its code.
#[cold]
fn over_budget(out: &mut Vec<u8>, at: usize, id: Id<'_>, max: usize) -> Option<i32> {
    out.truncate(at);
    crate::serializer::response::write_rpc_error(out, id, &crate::dispatch::too_large(max));
    Some(crate::error::ErrorCode::ResponseTooLarge.code())
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
    /// The answer comes later.
    Later,
}

/// What [`Engine::prefetch_frame`] fetches ahead for the next frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ahead {
    /// Nothing: no call of the connection was keyed since the last look, the next
    /// call's line is the current call's, or no next frame has begun to arrive.
    Nothing,
    /// The line of this id, guessed.
    Guess(u64),
    /// The line of the id peeked at in the next frame.
    Peek,
}

/// What to fetch ahead, from what the session says of the calls keyed since the last
/// look (`Session::take_keyed`) and whether a next frame has arrived (`no_next`: none).
///
/// A client counting its calls (its last two keyed ids one apart, up or down) most
/// likely sends ids that go on counting. The session's last keyed id `x` is the call
/// before the current one (`x ± 1`), and the next call is most likely `x ± 2`: when
/// that is in the current call's group of four, its index line is the one the current
/// claim reads first (see `dedup::memory::grouped`), and nothing is fetched, three
/// calls in four; when it starts the next group, that id's line is fetched, guessed
/// rather than peeked at (docs/PERFORMANCE.md, stop 38), once the next frame has begun
/// to arrive (a fetch for a frame still to be read is pushed out by the socket work
/// before it). When the ids jump (a client's move to another range), the first two
/// calls after the jump go without their hint (each skipped or guessed on the old
/// count; a wrong guess also fetches a line no call needs); the third is peeked at,
/// and so on until the ids count again.
fn ahead(keyed: Option<Option<(u64, u64)>>, no_next: bool) -> Ahead {
    match keyed {
        None => Ahead::Nothing,
        Some(Some((current, after))) if crate::dedup::same_group(current, after) => Ahead::Nothing,
        _ if no_next => Ahead::Nothing,
        Some(Some((_, after))) => Ahead::Guess(after),
        Some(None) => Ahead::Peek,
    }
}

#[cfg(test)]
mod tests {
    use super::{ahead, Ahead};
    use crate::codec::Id;
    use crate::guard::Session;

    /// The fetch-ahead's choice for a session that saw `ids` keyed, in order.
    fn after(ids: &[u64], no_next: bool) -> Ahead {
        let s = Session::new();
        for &id in ids {
            s.set_keyed(Id::UInt(id));
        }
        ahead(s.take_keyed(), no_next)
    }

    #[test]
    fn the_fetch_ahead_skips_a_group_guesses_the_next_and_peeks_otherwise() {
        // Counting up: after 0, 1 the current call is 2 and the next 3, one group.
        assert_eq!(after(&[0, 1], false), Ahead::Nothing);
        // After 1, 2: the current call is 3, the next 4 starts the next group.
        assert_eq!(after(&[1, 2], false), Ahead::Guess(4));
        // Counting down: after 7, 6 the current call is 5, the next 4, one group.
        assert_eq!(after(&[7, 6], false), Ahead::Nothing);
        // After 6, 5: the current call is 4, the next 3 ends the group before.
        assert_eq!(after(&[6, 5], false), Ahead::Guess(3));
        // Not counting: peeked at.
        assert_eq!(after(&[5, 9], false), Ahead::Peek);
        assert_eq!(after(&[9], false), Ahead::Peek);
        // No next frame yet: nothing.
        assert_eq!(after(&[1, 2], true), Ahead::Nothing);
        assert_eq!(after(&[5, 9], true), Ahead::Nothing);
        // Nothing keyed since the last look.
        assert_eq!(ahead(None, false), Ahead::Nothing);
        // Counting down to the bottom: no successor to guess, peeked at.
        assert_eq!(after(&[2, 1], false), Ahead::Peek);
    }
}
