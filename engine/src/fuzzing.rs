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

use std::cell::RefCell;
use std::ops::Range;
use std::time::Instant;

use bytes::BytesMut;
use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

use crate::codec::Id;
use crate::config::Config;
use crate::dispatch::context::Source;
use crate::dispatch::responder::Responder;
use crate::engine::{Deferrals, OwnedId, Split};
use crate::transport::http::{
    Cors, HttpDecoder, HttpError, HttpEvent, HttpLimits, Origin, Reply, MAX_CHUNK_LINE,
};
use crate::{codes, Engine, Outcome, Scratch};

// ---------------------------------------------------------------------------------------
// Entry points
// ---------------------------------------------------------------------------------------

/// Fuzz target `engine`: `data` as one frame, under two configs with tight limits
/// (depth, batch length, request and response size). The reply must be nothing or
/// well-formed JSON-RPC matching what was sent (one answer per non-notification,
/// ids echoed), the same through the server's deferring path and [`Engine::handle`]; a
/// result may be replaced by `-32002` when the response limit is hit.
pub fn check_engine(data: &[u8]) {
    with_engine(Which::Tight, |h| check_frame(h, data, true));
    with_engine(Which::Mid, |h| check_frame(h, data, true));
}

/// Fuzz target `differential`: `data` as one frame under the default config; every
/// answer must be exactly the reference's (kind, error code, id, result value).
pub fn check_differential(data: &[u8]) {
    with_engine(Which::Default, |h| check_frame(h, data, false));
}

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

/// Fuzz target `http`: `data` is `[limits][n][n cut offsets][stream]` (see
/// [`split_input`]). The HTTP/1.1 request reader must give the same events (with the
/// same errors) fed whole, cut at the offsets and one byte at a time; hold no more than
/// its documented bound; emit nothing after an event that closes; and keep bodies within
/// `max_body_bytes`.
pub fn check_http(data: &[u8]) {
    let (sel, cuts, stream) = split_input(data);
    let limits = http_limits(sel);
    let whole = feed_http(&limits, [stream]);
    let split = feed_http(&limits, pieces(stream, &cuts));
    let bytes = feed_http(&limits, stream.chunks(1));
    assert_eq!(whole, split, "HTTP events depend on the split {cuts:?}");
    assert_eq!(whole, bytes, "HTTP events differ fed one byte at a time");
    let mut closed = false;
    let mut continued = false;
    for ev in &whole {
        assert!(!closed, "HTTP event after the connection closed: {whole:?}");
        match ev {
            Ev::Rpc(body, reply, _) => {
                assert!(
                    body.len() <= limits.max_body_bytes,
                    "body of {} bytes passes max_body_bytes",
                    body.len()
                );
                closed = !reply.keep_alive;
                continued = false;
            }
            Ev::Health(reply, _) | Ev::Preflight(reply) => {
                assert!(
                    limits.cors.is_some() || matches!(ev, Ev::Health(..)),
                    "a preflight answered without CORS configured"
                );
                closed = !reply.keep_alive;
            }
            Ev::Continue => {
                assert!(!continued, "two 100-continue for one request: {whole:?}");
                continued = true;
            }
            Ev::Reject(status, close, header, error, _, _) => {
                assert_eq!((*status, *header), (error.status(), error.header()));
                closed = *close;
                continued = false;
            }
        }
    }
}

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

// ---------------------------------------------------------------------------------------
// Engines
// ---------------------------------------------------------------------------------------

#[derive(Clone, Copy)]
enum Which {
    Default,
    Tight,
    Mid,
}

struct Harness {
    engine: Engine,
    scratch: Scratch,
}

thread_local! {
    /// Engines and their scratch, reused across inputs: stale parse state is part of
    /// what is tested.
    static ENGINES: RefCell<Vec<Harness>> = RefCell::new(
        [
            Config::default(),
            Config::default()
                .max_depth(6)
                .max_batch_len(3)
                .max_request_bytes(512)
                .max_response_bytes(96),
            Config::default()
                .max_depth(16)
                .max_batch_len(8)
                .max_request_bytes(2048)
                .max_response_bytes(1024),
        ]
        .into_iter()
        .map(|c| {
            let engine = Engine::new(crate::demo::core_builder().freeze(), c);
            let scratch = engine.scratch();
            Harness { engine, scratch }
        })
        .collect(),
    );
}

fn with_engine(which: Which, f: impl FnOnce(&mut Harness)) {
    ENGINES.with(|e| f(&mut e.borrow_mut()[which as usize]));
}

// ---------------------------------------------------------------------------------------
// The reference JSON reader
// ---------------------------------------------------------------------------------------

/// A JSON value as the reference reads it: members in order, duplicates kept; numbers
/// as the engine reads them.
#[derive(Clone, Debug)]
enum Json {
    Null,
    Bool(bool),
    Num(Num),
    Str(String),
    Arr(Vec<Json>),
    Obj(Vec<(String, Json)>),
}

#[derive(Clone, Copy, Debug)]
enum Num {
    /// An integer literal within `i64`/`u64`.
    Int(i128),
    /// Anything else, correctly rounded.
    Float(f64),
}

impl PartialEq for Json {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Json::Null, Json::Null) => true,
            (Json::Bool(a), Json::Bool(b)) => a == b,
            (Json::Num(Num::Int(a)), Json::Num(Num::Int(b))) => a == b,
            // Bitwise: the sign of zero is part of the value echoed.
            (Json::Num(Num::Float(a)), Json::Num(Num::Float(b))) => a.to_bits() == b.to_bits(),
            (Json::Str(a), Json::Str(b)) => a == b,
            (Json::Arr(a), Json::Arr(b)) => a == b,
            (Json::Obj(a), Json::Obj(b)) => a == b,
            _ => false,
        }
    }
}

impl Json {
    fn depth(&self) -> usize {
        match self {
            Json::Arr(a) => 1 + a.iter().map(Json::depth).max().unwrap_or(0),
            Json::Obj(m) => 1 + m.iter().map(|(_, v)| v.depth()).max().unwrap_or(0),
            _ => 0,
        }
    }

    fn get(&self, key: &str) -> Option<&Json> {
        match self {
            Json::Obj(m) => m.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }
}

/// What serde_json reads, numbers left as placeholders filled in from their text.
enum Tree {
    Null,
    Bool(bool),
    Num,
    Str(String),
    Arr(Vec<Tree>),
    Obj(Vec<(String, Tree)>),
}

impl<'de> Deserialize<'de> for Tree {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(TreeVisitor)
    }
}

struct TreeVisitor;

impl<'de> Visitor<'de> for TreeVisitor {
    type Value = Tree;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Tree, E> {
        Ok(Tree::Bool(v))
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Tree, E> {
        Ok(Tree::Num)
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Tree, E> {
        Ok(Tree::Num)
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Tree, E> {
        Ok(Tree::Num)
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Tree, E> {
        Ok(Tree::Str(v.to_owned()))
    }
    fn visit_unit<E: de::Error>(self) -> Result<Tree, E> {
        Ok(Tree::Null)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Tree, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Tree::Arr(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Tree, A::Error> {
        let mut members = Vec::new();
        while let Some(member) = map.next_entry::<String, Tree>()? {
            members.push(member);
        }
        Ok(Tree::Obj(members))
    }
}

/// The byte ranges of the number tokens of `input` (outside strings), in order. Exact
/// for valid JSON, which is all it is used on (also by engine/tests/properties.rs).
pub fn number_tokens(input: &[u8]) -> Vec<Range<usize>> {
    let mut tokens = Vec::new();
    let (mut i, mut in_string) = (0, false);
    while i < input.len() {
        let b = input[i];
        if in_string {
            match b {
                b'\\' => i += 1,
                b'"' => in_string = false,
                _ => {}
            }
            i += 1;
        } else if b == b'"' {
            in_string = true;
            i += 1;
        } else if b == b'-' || b.is_ascii_digit() {
            let start = i;
            while i < input.len()
                && matches!(input[i], b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E')
            {
                i += 1;
            }
            tokens.push(start..i);
        } else {
            i += 1;
        }
    }
    tokens
}

/// A number literal as the engine reads it; `None` if it rounds to infinity (a parse
/// error for the engine).
fn interpret(text: &[u8]) -> Option<Num> {
    let text = std::str::from_utf8(text).ok()?;
    if !text.contains(['.', 'e', 'E']) {
        if let Ok(i) = text.parse::<i128>() {
            if i >= i128::from(i64::MIN) && i <= i128::from(u64::MAX) {
                return Some(Num::Int(i));
            }
        }
    }
    let f = text.parse::<f64>().ok()?;
    f.is_finite().then_some(Num::Float(f))
}

/// Whether serde_json alone refuses `token` for its range although it is finite when
/// correctly rounded (divergence 2 of engine/tests/properties.rs).
fn serde_misrounds(token: &[u8]) -> bool {
    interpret(token).is_some()
        && serde_json::from_slice::<Tree>(token)
            .is_err_and(|e| e.to_string().contains("number out of range"))
}

/// The reference's reading of `input`: `None` where the engine must answer `-32700`.
///
/// serde_json decides the syntax. Each number's value comes from its text
/// ([`interpret`]): the k-th number serde_json visits is the k-th number token. Where
/// serde_json refuses a literal only because it mis-rounds it, that literal is replaced
/// by `0` for serde_json's benefit and read from its text all the same. Deeper than
/// `max_depth`, or a literal that rounds to infinity: `None`.
fn reference_parse(input: &[u8], max_depth: usize) -> Option<Json> {
    let tokens = number_tokens(input);
    let tree = match serde_json::from_slice::<Tree>(input) {
        Ok(tree) => tree,
        Err(e) if e.to_string().contains("number out of range") => {
            let mut fixed = Vec::with_capacity(input.len());
            let mut at = 0;
            for t in &tokens {
                if serde_misrounds(&input[t.clone()]) {
                    fixed.extend_from_slice(&input[at..t.start]);
                    fixed.push(b'0');
                    at = t.end;
                }
            }
            if at == 0 {
                return None;
            }
            fixed.extend_from_slice(&input[at..]);
            serde_json::from_slice::<Tree>(&fixed).ok()?
        }
        Err(_) => return None,
    };
    let mut texts = tokens.iter().map(|t| &input[t.clone()]);
    let json = resolve(tree, &mut texts)?;
    assert!(
        texts.next().is_none(),
        "fuzzing reference bug: more number tokens than numbers in {:?}",
        show(input)
    );
    (json.depth() <= max_depth).then_some(json)
}

fn resolve<'a>(tree: Tree, texts: &mut impl Iterator<Item = &'a [u8]>) -> Option<Json> {
    Some(match tree {
        Tree::Null => Json::Null,
        Tree::Bool(b) => Json::Bool(b),
        Tree::Num => {
            let text = texts
                .next()
                .expect("fuzzing reference bug: fewer number tokens than numbers");
            Json::Num(interpret(text)?)
        }
        Tree::Str(s) => Json::Str(s),
        Tree::Arr(items) => Json::Arr(
            items
                .into_iter()
                .map(|t| resolve(t, texts))
                .collect::<Option<_>>()?,
        ),
        Tree::Obj(members) => Json::Obj(
            members
                .into_iter()
                .map(|(k, t)| Some((k, resolve(t, texts)?)))
                .collect::<Option<_>>()?,
        ),
    })
}

// ---------------------------------------------------------------------------------------
// The reference engine: what each frame must be answered with
// ---------------------------------------------------------------------------------------

/// The expected reply to a frame.
#[derive(Debug)]
enum Expect {
    /// One error object with id `null`: parse error, empty or oversized batch, frame
    /// too large.
    FrameError(i32),
    /// A single value (request, notification or not a request).
    Single(Elem),
    /// A non-empty batch within `max_batch_len`.
    Batch(Vec<Elem>),
}

/// One request (or batch element) and what it must produce.
#[derive(Debug)]
struct Elem {
    json: Json,
    /// `None`: a notification, never answered.
    answer: Option<Answer>,
    /// A valid request for a blocking method: the server path defers it.
    blocking: bool,
    /// How long running it sleeps, in ms.
    sleeps: u64,
}

#[derive(Debug)]
struct Answer {
    id: Json,
    what: What,
}

#[derive(Debug)]
enum What {
    Error(i32),
    Result(Json),
}

fn expect(frame: &[u8], config: &Config) -> Expect {
    if frame.len() > config.request_limit() {
        return Expect::FrameError(codes::INVALID_REQUEST);
    }
    match reference_parse(frame, config.depth_limit()) {
        None => Expect::FrameError(codes::PARSE_ERROR),
        Some(Json::Arr(items)) if items.is_empty() || items.len() > config.batch_limit() => {
            Expect::FrameError(codes::INVALID_REQUEST)
        }
        Some(Json::Arr(items)) => Expect::Batch(items.into_iter().map(elem).collect()),
        Some(other) => Expect::Single(elem(other)),
    }
}

fn sleeps(e: &Expect) -> bool {
    match e {
        Expect::FrameError(_) => false,
        Expect::Single(el) => el.sleeps > 0,
        Expect::Batch(els) => els.iter().any(|el| el.sleeps > 0),
    }
}

fn is_id(v: &Json) -> bool {
    matches!(v, Json::Null | Json::Str(_) | Json::Num(_))
}

fn elem(json: Json) -> Elem {
    let invalid = |id| Answer {
        id,
        what: What::Error(codes::INVALID_REQUEST),
    };
    let Json::Obj(members) = &json else {
        return Elem {
            answer: Some(invalid(Json::Null)),
            json,
            blocking: false,
            sleeps: 0,
        };
    };
    // As the engine validates: the last of a repeated member is the one read; the id
    // is read first so that every other error is answered with it.
    let (mut version, mut method, mut params, mut id) = (None, None, None, None);
    let mut dup = false;
    for (k, v) in members {
        let slot = match k.as_str() {
            "jsonrpc" => &mut version,
            "method" => &mut method,
            "params" => &mut params,
            "id" => &mut id,
            _ => continue,
        };
        dup |= slot.replace(v).is_some();
    }
    let checked = (|| {
        let answer_id = match id {
            Some(v) if is_id(v) => v.clone(),
            Some(_) => return Err(Json::Null),
            None => Json::Null,
        };
        if dup || !matches!(version, Some(Json::Str(v)) if v == "2.0") {
            return Err(answer_id);
        }
        let Some(Json::Str(method)) = method else {
            return Err(answer_id);
        };
        if !matches!(params, None | Some(Json::Arr(_) | Json::Obj(_))) {
            return Err(answer_id);
        }
        Ok((method.as_str(), params, id.cloned()))
    })();
    let (answer, blocking, sleeps) = match checked {
        Err(id) => (Some(invalid(id)), false, 0),
        Ok((method, params, id)) => {
            let (result, sleeps) = demo(method, params);
            let answer = id.map(|id| Answer {
                id,
                what: match result {
                    Ok(v) => What::Result(v),
                    Err(code) => What::Error(code),
                },
            });
            (answer, method == "sleep", sleeps)
        }
    };
    Elem {
        json,
        answer,
        blocking,
        sleeps,
    }
}

fn as_i64(v: &Json) -> Option<i64> {
    match v {
        Json::Num(Num::Int(i)) => i64::try_from(*i).ok(),
        _ => None,
    }
}

fn as_u64(v: &Json) -> Option<u64> {
    match v {
        Json::Num(Num::Int(i)) => u64::try_from(*i).ok(),
        _ => None,
    }
}

/// The fields of a serde-derived struct from params: positional (exactly one element
/// per field) or named (each field exactly once, other members ignored); absent params
/// are `{}`.
fn fields<'a>(params: Option<&'a Json>, names: &[&str]) -> Option<Vec<&'a Json>> {
    match params {
        None => names.is_empty().then(Vec::new),
        Some(Json::Arr(items)) => (items.len() == names.len()).then(|| items.iter().collect()),
        Some(Json::Obj(members)) => names
            .iter()
            .map(|name| {
                let mut found = members.iter().filter(|(k, _)| k == name);
                match (found.next(), found.next()) {
                    (Some((_, v)), None) => Some(v),
                    _ => None,
                }
            })
            .collect(),
        _ => None,
    }
}

/// The demo methods (see [`crate::demo`]): the result or error code, and how long the
/// call sleeps.
fn demo(method: &str, params: Option<&Json>) -> (Result<Json, i32>, u64) {
    let bad = codes::INVALID_PARAMS;
    let int = |i: Option<i64>| i.map(|i| Json::Num(Num::Int(i.into()))).ok_or(bad);
    let two = |names: &[&str]| -> Option<(i64, i64)> {
        let f = fields(params, names)?;
        Some((as_i64(f[0])?, as_i64(f[1])?))
    };
    let r = match method {
        "subtract" => match two(&["minuend", "subtrahend"]) {
            Some((a, b)) => int(a.checked_sub(b)),
            None => Err(bad),
        },
        "add" => match params {
            Some(Json::Arr(items)) if items.len() == 2 => {
                match (as_i64(&items[0]), as_i64(&items[1])) {
                    (Some(a), Some(b)) => int(a.checked_add(b)),
                    _ => Err(bad),
                }
            }
            _ => Err(bad),
        },
        "sum" => match params {
            None => int(Some(0)),
            Some(Json::Arr(items)) => match items.iter().map(as_i64).collect::<Option<Vec<_>>>() {
                Some(v) => int(v.iter().try_fold(0i64, |acc, x| acc.checked_add(*x))),
                None => Err(bad),
            },
            _ => Err(bad),
        },
        "get_data" => Ok(Json::Arr(vec![
            Json::Str("hello".into()),
            Json::Num(Num::Int(5)),
        ])),
        "ping" => Ok(Json::Str("pong".into())),
        "echo" => Ok(params.cloned().unwrap_or(Json::Null)),
        "sleep" => {
            let ms = fields(params, &["ms"]).and_then(|f| as_u64(f[0]));
            return match ms {
                Some(ms) if ms <= crate::demo::MAX_SLEEP_MS => (Ok(Json::Null), ms),
                _ => (Err(bad), 0),
            };
        }
        "update" | "notify_hello" | "notify_sum" => Ok(Json::Null),
        _ => Err(codes::METHOD_NOT_FOUND),
    };
    (r, 0)
}

// ---------------------------------------------------------------------------------------
// Comparing the engine's replies with the reference
// ---------------------------------------------------------------------------------------

/// Bytes `out` starts with before the engine appends: it must append, never touch them.
const PREFIX: &[u8] = b"<prefix>";

/// Runs `frame` through the server's path (`handle_split`) and, when nothing was
/// deferred, through [`Engine::handle`] (which must agree byte for byte), and compares
/// the answers with the reference. `lenient`: a result may be a `-32002`.
fn check_frame(h: &mut Harness, frame: &[u8], lenient: bool) {
    let want = expect(frame, h.engine.config());
    let mut out = PREFIX.to_vec();
    let mut sink = Collect(Vec::new());
    let split = h.engine.handle_split(
        frame,
        &Source::default(),
        &mut h.scratch,
        &mut out,
        &mut sink,
    );
    let deferred = sink.0;
    assert!(
        out.starts_with(PREFIX),
        "the engine overwrote earlier output"
    );
    let out = &out[PREFIX.len()..];
    let ctx = || format!("input {:?}\nreply {:?}", show(frame), show(out));

    // What was deferred: exactly the valid calls of blocking methods, in order, each
    // with its own bytes and id.
    let blocking: Vec<&Elem> = match &want {
        Expect::FrameError(_) => vec![],
        Expect::Single(el) => vec![el].into_iter().filter(|e| e.blocking).collect(),
        Expect::Batch(els) => els.iter().filter(|e| e.blocking).collect(),
    };
    assert_eq!(
        deferred.len(),
        blocking.len(),
        "deferred {deferred:?}, reference blocking calls {blocking:?}; {}",
        ctx()
    );
    let mut late = Vec::new();
    for (d, el) in deferred.iter().zip(&blocking) {
        let text = frame
            .get(d.0.clone())
            .unwrap_or_else(|| panic!("deferred range {:?} out of the frame; {}", d.0, ctx()));
        let parsed = reference_parse(text, usize::MAX);
        assert!(
            parsed.as_ref() == Some(&el.json),
            "deferred bytes {:?} are not the request {:?}; {}",
            show(text),
            el.json,
            ctx()
        );
        let id = d.1.as_ref().map(owned_id);
        assert!(
            id.as_ref() == el.answer.as_ref().map(|a| &a.id),
            "deferred id {id:?}, reference {:?}; {}",
            el.answer,
            ctx()
        );
        // The pool answers a deferred call with `handle` on its bytes; run it unless
        // it would sleep.
        if el.sleeps == 0 {
            let mut answer = Vec::new();
            let outcome = h.engine.handle(text, &mut h.scratch, &mut answer);
            match &el.answer {
                None => assert!(
                    outcome == Outcome::Nothing && answer.is_empty(),
                    "deferred notification answered {:?}; {}",
                    show(&answer),
                    ctx()
                ),
                Some(a) => {
                    assert_eq!(outcome, Outcome::Reply, "{}", ctx());
                    let got = parse_reply(&answer, &ctx);
                    check_answer(&got, a, lenient, &ctx);
                }
            }
        }
        late.extend(el.answer.as_ref());
    }

    if deferred.is_empty() {
        let Split::Done(outcome) = split else {
            panic!("{split:?} without deferred calls; {}", ctx());
        };
        let mut again = Vec::new();
        let outcome2 = h.engine.handle(frame, &mut h.scratch, &mut again);
        assert!(
            outcome == outcome2 && again == out,
            "Engine::handle ({outcome2:?}, {:?}) differs from the server path ({outcome:?}); {}",
            show(&again),
            ctx()
        );
        assert_eq!(outcome == Outcome::Nothing, out.is_empty(), "{}", ctx());
    }

    match (&want, split) {
        (Expect::FrameError(code), Split::Done(Outcome::Reply)) => {
            let got = parse_reply(out, &ctx);
            let a = Answer {
                id: Json::Null,
                what: What::Error(*code),
            };
            check_answer(&got, &a, false, &ctx);
        }
        (Expect::Single(el), Split::Done(outcome)) => match &el.answer {
            None => assert_eq!(outcome, Outcome::Nothing, "{}", ctx()),
            Some(a) => {
                assert_eq!(outcome, Outcome::Reply, "{}", ctx());
                check_answer(&parse_reply(out, &ctx), a, lenient, &ctx);
            }
        },
        (Expect::Single(el), Split::Single) => {
            assert!(el.blocking && out.is_empty(), "{}", ctx());
        }
        (Expect::Batch(els), Split::Done(outcome)) => {
            let answers: Vec<&Answer> = els.iter().filter_map(|e| e.answer.as_ref()).collect();
            if answers.is_empty() {
                assert_eq!(
                    outcome,
                    Outcome::Nothing,
                    "a batch of notifications; {}",
                    ctx()
                );
            } else {
                let got = parse_reply(out, &ctx);
                let Json::Arr(got) = got else {
                    panic!("a batch answered with a non-array; {}", ctx());
                };
                check_answers(&got, &answers, lenient, &ctx);
            }
        }
        (Expect::Batch(els), Split::Batch(batch)) => {
            let wrote = batch.answers();
            // Inline answers follow `[`; the deferred ones are added by the server.
            let inline: Vec<&Answer> = els
                .iter()
                .filter(|e| !e.blocking)
                .filter_map(|e| e.answer.as_ref())
                .collect();
            assert_eq!(wrote, inline.len(), "{}", ctx());
            let mut text = out.to_vec();
            assert_eq!(text.first(), Some(&b'['), "{}", ctx());
            if wrote == 0 {
                assert_eq!(text.len(), 1, "{}", ctx());
            } else {
                text.push(b']');
                let Json::Arr(got) = parse_reply(&text, &ctx) else {
                    panic!("inline batch answers are not an array; {}", ctx());
                };
                check_answers(&got, &inline, lenient, &ctx);
            }
        }
        (want, split) => panic!("expected {want:?}, got {split:?}; {}", ctx()),
    }
}

/// The server's view of what the engine leaves for later, kept for checking: each
/// blocking call's byte range and id.
struct Collect(Vec<(Range<usize>, Option<OwnedId>)>);

impl Deferrals for Collect {
    fn blocking(&mut self, range: Range<usize>, id: Option<Id<'_>>, _method: &str) -> bool {
        self.0.push((range, id.map(OwnedId::from)));
        true
    }

    fn responder(&mut self, _id: Id<'_>, _method: &str) -> Responder {
        // The fuzzed engines register no deferred method.
        Responder::detached()
    }

    fn deadline(&mut self) -> Option<Instant> {
        None
    }

    fn answered(&mut self, _out: &mut Vec<u8>) -> Option<Option<i32>> {
        None
    }
}

fn owned_id(id: &OwnedId) -> Json {
    match id {
        OwnedId::Null => Json::Null,
        OwnedId::Str(s) => Json::Str(s.to_string()),
        OwnedId::Int(i) => Json::Num(Num::Int((*i).into())),
        OwnedId::UInt(u) => Json::Num(Num::Int((*u).into())),
        OwnedId::Float(f) => Json::Num(Num::Float(*f)),
    }
}

fn parse_reply(reply: &[u8], ctx: &dyn Fn() -> String) -> Json {
    reference_parse(reply, usize::MAX)
        .unwrap_or_else(|| panic!("the reply is not valid JSON; {}", ctx()))
}

fn check_answers(got: &[Json], want: &[&Answer], lenient: bool, ctx: &dyn Fn() -> String) {
    assert_eq!(
        got.len(),
        want.len(),
        "batch reply has {} answers, reference {}: {want:?}; {}",
        got.len(),
        want.len(),
        ctx()
    );
    for (g, w) in got.iter().zip(want) {
        check_answer(g, w, lenient, ctx);
    }
}

/// One response object: well-formed, with the expected id and outcome.
fn check_answer(got: &Json, want: &Answer, lenient: bool, ctx: &dyn Fn() -> String) {
    let Json::Obj(members) = got else {
        panic!("response is not an object: {got:?}; {}", ctx());
    };
    let mut names: Vec<&str> = members.iter().map(|(k, _)| k.as_str()).collect();
    names.sort_unstable();
    let result = match names.as_slice() {
        ["id", "jsonrpc", "result"] => true,
        ["error", "id", "jsonrpc"] => false,
        _ => panic!(
            "response members {names:?} (want jsonrpc, id and one of result/error); {}",
            ctx()
        ),
    };
    assert!(
        got.get("jsonrpc") == Some(&Json::Str("2.0".into())),
        "response jsonrpc is not \"2.0\"; {}",
        ctx()
    );
    assert!(
        got.get("id") == Some(&want.id),
        "response id {:?}, request id {:?}; {}",
        got.get("id"),
        want.id,
        ctx()
    );
    let code = (!result).then(|| {
        let Some(Json::Obj(e)) = got.get("error") else {
            panic!("error is not an object; {}", ctx());
        };
        let mut names: Vec<&str> = e.iter().map(|(k, _)| k.as_str()).collect();
        names.sort_unstable();
        assert!(
            matches!(
                names.as_slice(),
                ["code", "message"] | ["code", "data", "message"]
            ),
            "error members {names:?}; {}",
            ctx()
        );
        let error = got.get("error").unwrap_or(&Json::Null);
        assert!(
            matches!(error.get("message"), Some(Json::Str(_))),
            "error message is not a string; {}",
            ctx()
        );
        match error.get("code").and_then(as_i64) {
            Some(c) => c,
            None => panic!("error code is not an integer; {}", ctx()),
        }
    });
    match (&want.what, code) {
        (What::Error(w), Some(c)) if i64::from(*w) == c => {}
        (What::Result(w), None) => assert!(
            got.get("result") == Some(w),
            "result {:?}, reference {w:?}; {}",
            got.get("result"),
            ctx()
        ),
        (What::Result(_), Some(c)) if lenient && c == i64::from(codes::RESPONSE_TOO_LARGE) => {}
        (w, c) => panic!("answer {c:?} (None: a result), reference {w:?}; {}", ctx()),
    }
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

/// `input` cut at `cuts` (offsets taken modulo its length + 1).
fn pieces<'a>(input: &'a [u8], cuts: &[u16]) -> Vec<&'a [u8]> {
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

// ---------------------------------------------------------------------------------------
// HTTP
// ---------------------------------------------------------------------------------------

/// An [`HttpEvent`] with owned, comparable fields.
#[derive(Debug, PartialEq)]
enum Ev {
    Rpc(Vec<u8>, Reply, Option<String>),
    Health(Reply, bool),
    Preflight(Reply),
    Continue,
    Reject(
        u16,
        bool,
        Option<(&'static str, &'static str)>,
        HttpError,
        bool,
        Origin,
    ),
}

fn http_limits(sel: u8) -> HttpLimits {
    let limits =
        |path: &'static str, max_head_bytes, max_body_bytes, max_headers, cors: &[&str]| {
            let cors: Vec<String> = cors.iter().map(|o| (*o).to_owned()).collect();
            HttpLimits {
                path: path.into(),
                max_head_bytes,
                max_body_bytes,
                max_headers,
                cors: Cors::new(&cors).unwrap_or_default(),
            }
        };
    match sel % 4 {
        0 => HttpLimits::default(),
        1 => limits("/", 64, 16, 4, &[]),
        2 => limits("/rpc", 128, 64, 8, &["http://a.example"]),
        _ => limits("/", 96, 1 << 20, 2, &["*", "http://b.example:8080"]),
    }
}

fn feed_http<'p>(limits: &HttpLimits, pieces: impl IntoIterator<Item = &'p [u8]>) -> Vec<Ev> {
    // The module's security bound: body, plus a head or a chunk line and trailers.
    let bound = limits.max_body_bytes + 2 * limits.max_head_bytes.max(MAX_CHUNK_LINE);
    let mut dec = HttpDecoder::new(limits.clone());
    let mut buf = BytesMut::new();
    let mut events = Vec::new();
    for piece in pieces {
        buf.extend_from_slice(piece);
        while let Some(e) = dec.decode(&mut buf) {
            events.push(match e {
                HttpEvent::Rpc {
                    body,
                    reply,
                    trace_id,
                    ..
                } => Ev::Rpc(
                    body.to_vec(),
                    reply,
                    trace_id.map(|t| t.as_str().to_owned()),
                ),
                HttpEvent::Health { reply, head } => Ev::Health(reply, head),
                HttpEvent::Preflight { reply } => Ev::Preflight(reply),
                HttpEvent::Continue => Ev::Continue,
                HttpEvent::Reject {
                    status,
                    close,
                    header,
                    error,
                    head,
                    origin,
                } => Ev::Reject(status, close, header, error, head, origin),
            });
        }
        assert!(
            buf.len() <= bound + piece.len(),
            "the HTTP decoder holds {} bytes, bound {bound} + {}",
            buf.len(),
            piece.len()
        );
    }
    events
}

/// Bytes for a failure message (printed with `{:?}`): lossy UTF-8, cut at 400.
fn show(bytes: &[u8]) -> String {
    let s = String::from_utf8_lossy(&bytes[..bytes.len().min(400)]).into_owned();
    if bytes.len() > 400 {
        format!("{s}… ({} bytes)", bytes.len())
    } else {
        s
    }
}

/// `transport::io::read_into`, our own `unsafe` (a read into uninitialised spare
/// capacity, then `set_len`), over a pipe: its own test uses a Unix socket pair, which
/// Miri cannot write to, and this one runs under `cargo +nightly miri test` (see
/// docs/FUZZING.md). Here because only this module may add code to the crate for it.
#[cfg(test)]
mod miri_tests {
    use bytes::BytesMut;

    use crate::transport::io::read_into;

    fn pipe() -> (i32, i32) {
        let mut fds = [0; 2];
        // SAFETY: `fds` is two writable `c_int`s, as pipe(2) needs.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        (fds[0], fds[1])
    }

    fn write(fd: i32, bytes: &[u8]) {
        // SAFETY: `bytes` is readable for its length.
        let n = unsafe { libc::write(fd, bytes.as_ptr().cast(), bytes.len()) };
        assert_eq!(usize::try_from(n).ok(), Some(bytes.len()));
    }

    #[test]
    fn read_into_appends_exactly_what_arrived() {
        let (r, w) = pipe();
        let mut buf = BytesMut::from(&b"head:"[..]);
        write(w, b"hello");
        assert_eq!(read_into(r, &mut buf, 16).expect("read"), 5);
        assert_eq!(&buf[..], b"head:hello");
        // A read capped below what is waiting; the rest comes next time.
        write(w, &[7; 40]);
        assert_eq!(read_into(r, &mut buf, 32).expect("read"), 32);
        assert_eq!(read_into(r, &mut buf, 32).expect("read"), 8);
        assert_eq!(buf.len(), 50);
        assert!(buf[10..].iter().all(|&b| b == 7));
        // Every byte is initialised: reading them all is defined.
        assert_eq!(buf.iter().map(|&b| u32::from(b)).sum::<u32>(), 992 + 40 * 7);
        // SAFETY: `w` is an open descriptor this test owns.
        unsafe { libc::close(w) };
        assert_eq!(read_into(r, &mut buf, 16).expect("end of stream"), 0);
        // SAFETY: as above, for `r`.
        unsafe { libc::close(r) };
        assert!(read_into(-1, &mut buf, 16).is_err());
    }
}

// ---------------------------------------------------------------------------------------
// The client: HTTP responses and reply frames from a server
// ---------------------------------------------------------------------------------------

/// Fuzz target `client`: `data` is `[config][n][n cut offsets][stream]` (see
/// [`split_input`]), the stream being what a server sent. The client's HTTP/1.1 response
/// decoder must give the same replies (and the same error) fed whole, cut at the
/// offsets and one byte at a time, keep bodies within `max_response_bytes` and hold no
/// more than its bound. Every reply body, and every line of the stream taken as a
/// newline-delimited reply, must get the verdict a serde_json reference gives under the
/// response rules (docs/PROTOCOL.md): the same id, result or error object, or the same
/// [`Violation`](crate::client::Violation); the routing id (`frame_id`) must be the
/// reference's; a result's and an error's `data` JSON text as the client hands it out
/// must read back as the same value.
#[cfg(feature = "client")]
pub fn check_client(data: &[u8]) {
    let (sel, cuts, stream) = split_input(data);
    let max_body = match sel % 4 {
        0 => crate::config::defaults::DEFAULT_MAX_RESPONSE_BYTES,
        1 => 16,
        2 => 64,
        _ => 512,
    };
    let deep = sel & 4 == 0;
    for line in stream.split(|&b| b == b'\n') {
        if !line.trim_ascii().is_empty() {
            client::check_frame(line, deep);
        }
    }
    let whole = client::feed_http(max_body, [stream]);
    let split = client::feed_http(max_body, pieces(stream, &cuts));
    let bytes = client::feed_http(max_body, stream.chunks(1));
    assert_eq!(
        whole, split,
        "client HTTP replies depend on the split {cuts:?}"
    );
    assert_eq!(
        whole, bytes,
        "client HTTP replies differ fed one byte at a time"
    );
    for reply in whole.iter().flatten() {
        assert!(
            reply.1.len() <= max_body,
            "a reply body of {} bytes passes max_response_bytes {max_body}",
            reply.1.len()
        );
        if !reply.1.trim_ascii().is_empty() {
            client::check_frame(&reply.1, deep);
        }
    }
}

#[cfg(feature = "client")]
mod client {
    use std::cell::RefCell;

    use bytes::BytesMut;
    use simd_json::{Node, StaticNode};

    use super::{reference_parse, show, Json, Num};
    use crate::client::conn::frame_id;
    use crate::client::error::Failure;
    use crate::client::http::{max_chunked, Decoder, MAX_HEAD_BYTES};
    use crate::client::{Error, Reply, Violation};
    use crate::codec::raw::RawCtx;
    use crate::codec::response::{validate_response, Body};
    use crate::codec::Id;
    use crate::engine::Scratch;

    /// The nesting limits of the two client scratches.
    const DEPTHS: [usize; 2] = [64, 3];

    thread_local! {
        /// The client's parse state, reused across inputs as a connection reuses it.
        static SCRATCH: RefCell<[Scratch; 2]> = RefCell::new(DEPTHS.map(Scratch::with_max_depth));
    }

    /// One decoded HTTP reply (status, body, close), or the error that ended the
    /// connection.
    pub(super) type Event = Result<(u16, Vec<u8>, bool), Violation>;

    /// Feeds `pieces` to the client's HTTP decoder as reads, then the end of stream,
    /// as the connection does: replies until one closes or an error.
    pub(super) fn feed_http<'p>(
        max_body: usize,
        pieces: impl IntoIterator<Item = &'p [u8]>,
    ) -> Vec<Event> {
        let bound = MAX_HEAD_BYTES.max(max_chunked(max_body)).max(max_body);
        let mut dec = Decoder::default();
        let mut buf = BytesMut::new();
        let mut events = Vec::new();
        let mut drain = |buf: &mut BytesMut, eof: bool, events: &mut Vec<Event>| loop {
            match dec.decode(buf, max_body, eof) {
                Ok(Some(r)) => {
                    events.push(Ok((r.status, r.body.to_vec(), r.close)));
                    if r.close {
                        return false;
                    }
                }
                Ok(None) => return true,
                Err(v) => {
                    events.push(Err(v));
                    return false;
                }
            }
        };
        for piece in pieces {
            buf.extend_from_slice(piece);
            if !drain(&mut buf, false, &mut events) {
                return events;
            }
            assert!(
                buf.len() <= bound,
                "the client's HTTP decoder holds {} bytes, bound {bound}",
                buf.len()
            );
        }
        drain(&mut buf, true, &mut events);
        events
    }

    /// A response as the reference reads it.
    #[derive(Debug, PartialEq)]
    enum Resp {
        Result(Json),
        Error {
            code: i32,
            message: String,
            data: Option<Json>,
        },
    }

    /// Checks one reply frame (a line, or an HTTP body) against the reference.
    pub(super) fn check_frame(frame: &[u8], deep: bool) {
        let which = usize::from(!deep);
        let want = reference_parse(frame, DEPTHS[which]);
        SCRATCH.with(|s| {
            s.borrow_mut()[which].parse(frame, |raw| match (raw, want) {
                (Err(_), None) => {}
                (Err(e), Some(_)) => panic!("the client rejects {:?}: {e}", show(frame)),
                (Ok(_), None) => panic!("the client accepts invalid JSON {:?}", show(frame)),
                (Ok(raw), Some(json)) => check_parsed(raw, &json, frame),
            });
        });
    }

    fn check_parsed(raw: RawCtx<'_>, json: &Json, frame: &[u8]) {
        let ctx = || show(frame);
        assert_eq!(tape_json(raw.root).0, *json, "tape of {:?}", ctx());
        let mut verdicts = Vec::new();
        match json {
            Json::Arr(items) => {
                let mut rest = &raw.root[1..];
                for item in items {
                    let n = crate::codec::request::span(&rest[0]);
                    let (elem, tail) = rest.split_at(n);
                    rest = tail;
                    verdicts.push(check_response(raw, elem, item, frame));
                }
            }
            _ => verdicts.push(check_response(raw, raw.root, json, frame)),
        }
        // The id a reply is routed by.
        let want = match (json, verdicts.as_slice()) {
            (Json::Obj(_), [Ok(id)]) => match id {
                Json::Num(Num::Int(i)) if *i >= 0 => Ok(Some(*i as u64)),
                Json::Null => Ok(None),
                _ => Err(Violation::UnknownId),
            },
            (Json::Obj(_), [Err(v)]) => Err(*v),
            (Json::Arr(items), _) if !items.is_empty() => {
                let mut found = Ok(None);
                for v in verdicts.iter().flatten() {
                    match v {
                        Json::Num(Num::Int(i)) if *i >= 0 => {
                            found = Ok(Some(*i as u64));
                            break;
                        }
                        Json::Null => {}
                        _ => {
                            found = Err(Violation::UnknownId);
                            break;
                        }
                    }
                }
                found
            }
            _ => Err(Violation::NotAResponse),
        };
        let got = frame_id(raw.root).map_err(|f| match f {
            Failure::Protocol(v) => v,
            other => panic!("frame_id failed with {other:?} for {:?}", ctx()),
        });
        assert_eq!(got, want, "routing id of {:?}", ctx());
    }

    /// Checks `validate_response` on one value against the reference; returns the
    /// response's id (as the reference reads it) or the violation.
    fn check_response(
        raw: RawCtx<'_>,
        nodes: &[Node<'_>],
        json: &Json,
        frame: &[u8],
    ) -> Result<Json, Violation> {
        let want = reference_response(json);
        let got = validate_response(nodes).map(|r| {
            let id = match r.id {
                Id::Null => Json::Null,
                Id::Str(s) => Json::Str(s.to_owned()),
                Id::Int(i) => Json::Num(Num::Int(i.into())),
                Id::UInt(u) => Json::Num(Num::Int(u.into())),
                Id::Float(f) => Json::Num(Num::Float(f)),
            };
            let body = match r.body {
                Body::Result(nodes) => {
                    // What the caller gets: the text, and serde over the tape.
                    let reply = Reply { nodes, raw };
                    let text = reply.raw_json();
                    let result = tape_json(nodes).0;
                    assert_eq!(
                        reference_parse(&text, usize::MAX).as_ref(),
                        Some(&result),
                        "Reply::raw_json gave {:?} for {:?}",
                        show(&text),
                        show(frame)
                    );
                    let _ = reply.parse::<serde_json::Value>();
                    Resp::Result(result)
                }
                Body::Error {
                    code,
                    message,
                    data,
                } => {
                    let Error::Server(e) = crate::client::server_error(raw, code, message, data)
                    else {
                        panic!("server_error made no Error::Server");
                    };
                    assert_eq!((e.code, e.message.as_str()), (code, message));
                    let back = e
                        .data
                        .as_ref()
                        .map(|d| reference_parse(d.as_bytes(), usize::MAX));
                    let data = data.map(|d| tape_json(d).0);
                    assert_eq!(
                        back,
                        data.clone().map(Some),
                        "ServerError::data {:?} for {:?}",
                        e.data,
                        show(frame)
                    );
                    Resp::Error {
                        code,
                        message: message.to_owned(),
                        data,
                    }
                }
            };
            (id, body)
        });
        assert_eq!(got, want, "response verdict for {:?}", show(frame));
        got.map(|(id, _)| id)
    }

    /// The response rules, in the order the client checks them: members in order (a
    /// repeated `jsonrpc`, `id`, `result` or `error` is `DuplicateMember`), then the
    /// version, the id, exactly one of result and error, and the error object (its
    /// members in order: a bad `code` or `message` fails at once, a repeat is a
    /// duplicate, both must be there).
    fn reference_response(json: &Json) -> Result<(Json, Resp), Violation> {
        let Json::Obj(members) = json else {
            return Err(Violation::NotAResponse);
        };
        let mut seen: Vec<&str> = Vec::new();
        for (k, _) in members {
            if ["jsonrpc", "id", "result", "error"].contains(&k.as_str()) {
                if seen.contains(&k.as_str()) {
                    return Err(Violation::DuplicateMember);
                }
                seen.push(k);
            }
        }
        if json.get("jsonrpc") != Some(&Json::Str("2.0".into())) {
            return Err(Violation::WrongVersion);
        }
        let id = match json.get("id") {
            Some(id @ (Json::Null | Json::Str(_) | Json::Num(_))) => id.clone(),
            _ => return Err(Violation::BadId),
        };
        let body = match (json.get("result"), json.get("error")) {
            (Some(r), None) => Resp::Result(r.clone()),
            (None, Some(e)) => reference_error(e)?,
            (Some(_), Some(_)) => return Err(Violation::BothResultAndError),
            (None, None) => return Err(Violation::NeitherResultNorError),
        };
        Ok((id, body))
    }

    fn reference_error(e: &Json) -> Result<Resp, Violation> {
        let Json::Obj(members) = e else {
            return Err(Violation::BadErrorObject);
        };
        let (mut code, mut message, mut data) = (None, None, None);
        for (k, v) in members {
            let repeated = match (k.as_str(), v) {
                ("code", Json::Num(Num::Int(i))) => {
                    let c = i32::try_from(*i).map_err(|_| Violation::BadErrorObject)?;
                    code.replace(c).is_some()
                }
                ("code", _) => return Err(Violation::BadErrorObject),
                ("message", Json::Str(s)) => message.replace(s.clone()).is_some(),
                ("message", _) => return Err(Violation::BadErrorObject),
                ("data", v) => data.replace(v.clone()).is_some(),
                _ => false,
            };
            if repeated {
                return Err(Violation::DuplicateMember);
            }
        }
        match (code, message) {
            (Some(code), Some(message)) => Ok(Resp::Error {
                code,
                message,
                data,
            }),
            _ => Err(Violation::BadErrorObject),
        }
    }

    /// The value at the front of `nodes` and how many nodes it spans.
    fn tape_json(nodes: &[Node<'_>]) -> (Json, usize) {
        match nodes[0] {
            Node::String(s) => (Json::Str(s.to_owned()), 1),
            Node::Static(StaticNode::Null) => (Json::Null, 1),
            Node::Static(StaticNode::Bool(b)) => (Json::Bool(b), 1),
            Node::Static(StaticNode::I64(i)) => (Json::Num(Num::Int(i.into())), 1),
            Node::Static(StaticNode::U64(u)) => (Json::Num(Num::Int(u.into())), 1),
            Node::Static(StaticNode::F64(f)) => (Json::Num(Num::Float(f)), 1),
            Node::Array { len, .. } => {
                let (mut items, mut at) = (Vec::with_capacity(len), 1);
                for _ in 0..len {
                    let (v, n) = tape_json(&nodes[at..]);
                    items.push(v);
                    at += n;
                }
                (Json::Arr(items), at)
            }
            Node::Object { len, .. } => {
                let (mut members, mut at) = (Vec::with_capacity(len), 1);
                for _ in 0..len {
                    let Node::String(k) = nodes[at] else {
                        panic!("an object key that is not a string on the tape");
                    };
                    let (v, n) = tape_json(&nodes[at + 1..]);
                    members.push((k.to_owned(), v));
                    at += 1 + n;
                }
                (Json::Obj(members), at)
            }
        }
    }
}
