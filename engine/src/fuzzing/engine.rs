//! The `engine` and `differential` targets: one frame through the engine, checked
//! against the reference.

use std::cell::RefCell;
use std::ops::Range;
use std::time::Instant;

use super::reference::{as_i64, expect, reference_parse, Answer, Elem, Expect, Json, Num, What};
use super::show;
use crate::codec::Id;
use crate::config::Config;
use crate::dispatch::context::Source;
use crate::dispatch::responder::Responder;
use crate::engine::{Deferrals, OwnedId, Split};
use crate::{codes, Engine, Outcome, Scratch};

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
    fn blocking(
        &mut self,
        range: Range<usize>,
        id: Option<Id<'_>>,
        _method: &str,
        _metric: u32,
        _dedup: Option<crate::dedup::Digest>,
        _deadline: Option<Instant>,
    ) -> bool {
        self.0.push((range, id.map(OwnedId::from)));
        true
    }

    fn responder(
        &mut self,
        _id: Id<'_>,
        _method: &str,
        _metric: u32,
        _bytes: usize,
        _deadline: Option<Instant>,
    ) -> Responder {
        // The fuzzed engines register no deferred method.
        Responder::detached()
    }

    fn taken_at(&mut self) -> Instant {
        Instant::now()
    }

    fn deadline(&mut self, _budget: Option<u32>) -> Option<Instant> {
        None
    }

    fn answered(&mut self, _out: &mut Vec<u8>) -> Option<Option<i32>> {
        None
    }

    fn outcome(&mut self, _metric: u32, _code: Option<i32>) {}

    fn local(&self) -> Option<&crate::metrics::Local> {
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
        // Every error here is the engine's own (the demo methods only fail with
        // `RpcError::invalid_params`): each carries its reason, which names its code.
        assert!(
            names.as_slice() == ["code", "data", "message"],
            "error members {names:?}; {}",
            ctx()
        );
        let error = got.get("error").unwrap_or(&Json::Null);
        let reason = match error.get("data").and_then(|d| d.get("reason")) {
            Some(Json::Str(r)) => crate::Reason::from_name(r),
            _ => None,
        };
        assert!(
            reason.map(|r| i64::from(r.code().code())) == error.get("code").and_then(as_i64),
            "error data.reason {reason:?} does not name its code; {}",
            ctx()
        );
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
