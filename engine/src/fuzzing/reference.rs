//! The reference: a small JSON reader on serde_json that reads numbers as the engine
//! documents them, and from it, what every frame must be answered with.

use std::ops::Range;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

use super::show;
use crate::codes;
use crate::config::Config;

// ---------------------------------------------------------------------------------------
// The reference JSON reader
// ---------------------------------------------------------------------------------------

/// A JSON value as the reference reads it: members in order, duplicates kept; numbers
/// as the engine reads them.
#[derive(Clone, Debug)]
pub(crate) enum Json {
    Null,
    Bool(bool),
    Num(Num),
    Str(String),
    Arr(Vec<Json>),
    Obj(Vec<(String, Json)>),
}

#[derive(Clone, Copy, Debug)]
pub(crate) enum Num {
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
    pub(crate) fn depth(&self) -> usize {
        match self {
            Json::Arr(a) => 1 + a.iter().map(Json::depth).max().unwrap_or(0),
            Json::Obj(m) => 1 + m.iter().map(|(_, v)| v.depth()).max().unwrap_or(0),
            _ => 0,
        }
    }

    pub(crate) fn get(&self, key: &str) -> Option<&Json> {
        match self {
            Json::Obj(m) => m.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }
}

/// What serde_json reads, numbers left as placeholders filled in from their text.
pub(crate) enum Tree {
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

pub(crate) struct TreeVisitor;

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
pub(crate) fn interpret(text: &[u8]) -> Option<Num> {
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
pub(crate) fn serde_misrounds(token: &[u8]) -> bool {
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
pub(crate) fn reference_parse(input: &[u8], max_depth: usize) -> Option<Json> {
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

pub(crate) fn resolve<'a>(tree: Tree, texts: &mut impl Iterator<Item = &'a [u8]>) -> Option<Json> {
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
pub(crate) enum Expect {
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
pub(crate) struct Elem {
    pub(crate) json: Json,
    /// `None`: a notification, never answered.
    pub(crate) answer: Option<Answer>,
    /// A valid request for a blocking method: the server path defers it.
    pub(crate) blocking: bool,
    /// How long running it sleeps, in ms.
    pub(crate) sleeps: u64,
}

#[derive(Debug)]
pub(crate) struct Answer {
    pub(crate) id: Json,
    pub(crate) what: What,
}

#[derive(Debug)]
pub(crate) enum What {
    Error(i32),
    Result(Json),
}

pub(crate) fn expect(frame: &[u8], config: &Config) -> Expect {
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

pub(crate) fn sleeps(e: &Expect) -> bool {
    match e {
        Expect::FrameError(_) => false,
        Expect::Single(el) => el.sleeps > 0,
        Expect::Batch(els) => els.iter().any(|el| el.sleeps > 0),
    }
}

pub(crate) fn is_id(v: &Json) -> bool {
    matches!(v, Json::Null | Json::Str(_) | Json::Num(_))
}

pub(crate) fn elem(json: Json) -> Elem {
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
        // A caller's budget of 0 ms has run out before the call runs: refused, not
        // deferred. (Larger budgets never run out within a fuzzed frame: nothing
        // answered inline sleeps.)
        Ok((_, params, id)) if budget(params) == Some(0) => {
            let answer = id.map(|id| Answer {
                id,
                what: What::Error(codes::REQUEST_TIMEOUT),
            });
            (answer, false, 0)
        }
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

/// `params._meta.timeoutMs` as the engine reads it: the first `_meta` member of object
/// params, its first `timeoutMs`, an integer in `0..=MAX_BUDGET_MS`.
fn budget(params: Option<&Json>) -> Option<u64> {
    let ms = as_u64(params?.get("_meta")?.get("timeoutMs")?)?;
    (ms <= u64::from(crate::codec::request::MAX_BUDGET_MS)).then_some(ms)
}

pub(crate) fn as_i64(v: &Json) -> Option<i64> {
    match v {
        Json::Num(Num::Int(i)) => i64::try_from(*i).ok(),
        _ => None,
    }
}

pub(crate) fn as_u64(v: &Json) -> Option<u64> {
    match v {
        Json::Num(Num::Int(i)) => u64::try_from(*i).ok(),
        _ => None,
    }
}

/// The fields of a serde-derived struct from params: positional (exactly one element
/// per field) or named (each field exactly once, other members ignored); absent params
/// are `{}`.
pub(crate) fn fields<'a>(params: Option<&'a Json>, names: &[&str]) -> Option<Vec<&'a Json>> {
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
pub(crate) fn demo(method: &str, params: Option<&Json>) -> (Result<Json, i32>, u64) {
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
