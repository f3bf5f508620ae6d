//! Reading answers: the response shape rules every answer must follow, what "the same
//! id" means, and matching a reply against what a case expects.

use std::collections::BTreeMap;
use std::fmt;

use serde_json::value::RawValue;
use serde_json::Value;

/// A case's outcome.
#[derive(Debug)]
pub enum Verdict {
    /// As expected (with a note worth reading, sometimes).
    Pass(Option<String>),
    /// Not as expected: why.
    Fail(String),
    /// Could not be judged: why (the server lacks a method the case calls).
    Skip(String),
}

/// One response object, checked for shape.
#[derive(Debug)]
pub struct Response {
    /// The `id` member's JSON text, as sent.
    pub id: String,
    /// The result, if a success.
    pub result: Option<Value>,
    /// The error code, if an error.
    pub code: Option<i64>,
}

impl Response {
    /// Whether the id is `null`.
    pub fn id_is_null(&self) -> bool {
        self.id.trim() == "null"
    }
}

/// Checks `raw` against §5's shape rules: an object with `"jsonrpc": "2.0"`, an `id`
/// member (a string, a number or null), exactly one of `result` and `error`, and an
/// error object with an integer `code` and a string `message`.
pub fn response(raw: &RawValue) -> Result<Response, String> {
    let text = raw.get();
    let members: BTreeMap<String, &RawValue> = serde_json::from_str(text)
        .map_err(|_| format!("not a JSON object: {}", crate::show(text.as_bytes(), 120)))?;
    let value = |name: &str| -> Option<Value> {
        members
            .get(name)
            .and_then(|r| serde_json::from_str(r.get()).ok())
    };
    match value("jsonrpc") {
        Some(Value::String(s)) if s == "2.0" => {}
        Some(other) => return Err(format!("\"jsonrpc\" is {other}, not \"2.0\"")),
        None => return Err("no \"jsonrpc\" member".into()),
    }
    let id = match members.get("id") {
        Some(r) => r.get().trim().to_string(),
        None => return Err("no \"id\" member (§5: it is REQUIRED)".into()),
    };
    if !matches!(
        id.as_bytes().first(),
        Some(b'"' | b'-' | b'0'..=b'9' | b'n')
    ) {
        return Err(format!("the id {id} is not a string, a number or null"));
    }
    match (members.get("result"), members.get("error")) {
        (Some(_), Some(_)) => Err("both \"result\" and \"error\"".into()),
        (None, None) => Err("neither \"result\" nor \"error\"".into()),
        (Some(_), None) => Ok(Response {
            id,
            result: value("result"),
            code: None,
        }),
        (None, Some(e)) => {
            let err: BTreeMap<String, &RawValue> = serde_json::from_str(e.get())
                .map_err(|_| format!("\"error\" is not an object: {}", e.get()))?;
            let code = err
                .get("code")
                .ok_or("the error object has no \"code\"")?
                .get()
                .trim();
            let code: i64 = if code
                .bytes()
                .enumerate()
                .all(|(i, b)| b.is_ascii_digit() || (i == 0 && b == b'-' && code.len() > 1))
            {
                code.parse()
                    .map_err(|_| format!("error code {code} is out of range"))?
            } else {
                return Err(format!("error code {code} is not an integer"));
            };
            match err
                .get("message")
                .and_then(|m| serde_json::from_str::<Value>(m.get()).ok())
            {
                Some(Value::String(_)) => {}
                Some(other) => return Err(format!("error message {other} is not a string")),
                None => return Err("the error object has no \"message\"".into()),
            }
            Ok(Response {
                id,
                result: None,
                code: Some(code),
            })
        }
    }
}

/// A JSON number's exact value: sign, significant digits (no leading or trailing
/// zeros), and the power of ten of the last one. Zero is `(false, "", 0)`.
fn decimal(text: &str) -> Option<(bool, String, i64)> {
    let t = text.trim();
    let (neg, t) = match t.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, t),
    };
    let (mant, exp) = match t.find(['e', 'E']) {
        Some(i) => (&t[..i], t[i + 1..].parse::<i64>().ok()?),
        None => (t, 0),
    };
    let (int, frac) = mant.split_once('.').unwrap_or((mant, ""));
    if int.is_empty() || !int.bytes().chain(frac.bytes()).all(|b| b.is_ascii_digit()) {
        return None;
    }
    let mut digits: String = int.chars().chain(frac.chars()).collect();
    let mut exp = exp.checked_sub(frac.len() as i64)?;
    let lead = digits.len() - digits.trim_start_matches('0').len();
    digits.drain(..lead);
    while digits.ends_with('0') {
        digits.pop();
        exp = exp.checked_add(1)?;
    }
    if digits.is_empty() {
        return Some((false, String::new(), 0));
    }
    Some((neg, digits, exp))
}

/// Whether the exact value of `text` is an integer in `i64::MIN..=u64::MAX`.
fn is_64_bit_integer(text: &str) -> bool {
    match decimal(text) {
        Some((_, d, _)) if d.is_empty() => true,
        Some((neg, d, e)) if e >= 0 && d.len() as i64 + e <= 20 => {
            let whole = format!(
                "{}{d}{}",
                if neg { "-" } else { "" },
                "0".repeat(e as usize)
            );
            whole.parse::<i64>().is_ok() || whole.parse::<u64>().is_ok()
        }
        _ => false,
    }
}

/// Whether the echoed id `got` is the same JSON value as the id `sent` (both as JSON
/// text); `Err` says how they differ.
///
/// Strings compare after decoding (`"\u0041"` is `"A"`); `null` is `null`; numbers
/// compare by exact value, whatever their form (`1e3` is `1000`, `1.50` is `1.5`, `-0`
/// is `0`), with one allowance: a number whose value is not an integer of 64 bits
/// (`i64::MIN..=u64::MAX`) may come back as the nearest IEEE double, since RFC 8259 §6
/// promises no agreement beyond doubles and §4 of the specification discourages such
/// ids. A string is never the same as a number, even `"1"` and `1`.
pub fn same_id(sent: &str, got: &str) -> Result<(), String> {
    let kind = |t: &str| -> Result<Value, String> {
        serde_json::from_str::<Value>(t).map_err(|e| format!("{t} is not JSON ({e})"))
    };
    let (s, g) = (kind(sent)?, kind(got)?);
    let differ = || Err(format!("sent id {sent}, got {got}"));
    match (&s, &g) {
        (Value::Null, Value::Null) => Ok(()),
        (Value::String(a), Value::String(b)) if a == b => Ok(()),
        (Value::Number(_), Value::Number(_)) => {
            let (a, b) = (decimal(sent), decimal(got));
            if a.is_some() && a == b {
                return Ok(());
            }
            if !is_64_bit_integer(sent) {
                let (x, y) = (sent.trim().parse::<f64>(), got.trim().parse::<f64>());
                if let (Ok(x), Ok(y)) = (x, y) {
                    if x == y {
                        return Ok(());
                    }
                }
            }
            differ()
        }
        _ => differ(),
    }
}

/// JSON values equal, numbers compared by value (`19` equals `19.0`).
pub fn same_value(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => decimal(&x.to_string()) == decimal(&y.to_string()),
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| same_value(p, q))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| same_value(v, w)))
        }
        _ => a == b,
    }
}

/// The id a case expects back.
#[derive(Clone, Debug)]
pub enum IdWant {
    /// This id (JSON text), as [`same_id`] compares.
    Is(String),
    /// `null`.
    Null,
    /// This id or `null` (an invalid request whose id a server may or may not read).
    IsOrNull(String),
}

/// What a response must hold.
#[derive(Clone, Debug)]
pub enum Is {
    /// This result.
    Result(Value),
    /// An error with this code.
    Error(i64),
    /// Any answer but -32700 and -32600 (the request was valid): the id is what is
    /// checked.
    Answered,
}

/// One response a case expects.
#[derive(Clone, Debug)]
pub struct Want {
    /// Its id.
    pub id: IdWant,
    /// Its content.
    pub is: Is,
    /// The method the call needs: a -32601 answer skips the case instead of failing it.
    pub needs: Option<&'static str>,
}

/// What a case expects back for its frame.
#[derive(Clone, Debug)]
pub enum Expect {
    /// No answer at all (streams: none before the probe's; HTTP: 204 or an empty body).
    Nothing,
    /// One response object (not an array).
    One(Want),
    /// An array holding exactly these responses, in any order.
    Batch(Vec<Want>),
}

impl fmt::Display for IdWant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IdWant::Is(id) => write!(f, "id {id}"),
            IdWant::Null => write!(f, "id null"),
            IdWant::IsOrNull(id) => write!(f, "id {id} or null"),
        }
    }
}

impl fmt::Display for Want {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.is {
            Is::Result(v) => write!(f, "result {v}, {}", self.id),
            Is::Error(c) => write!(f, "error {c}, {}", self.id),
            Is::Answered => write!(
                f,
                "a result or an error other than -32700/-32600, {}",
                self.id
            ),
        }
    }
}

impl fmt::Display for Expect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Expect::Nothing => write!(f, "no answer"),
            Expect::One(w) => write!(f, "{w}"),
            Expect::Batch(ws) => {
                write!(f, "an array of {} (any order): ", ws.len())?;
                for (i, w) in ws.iter().enumerate() {
                    if i > 0 {
                        write!(f, "; ")?;
                    }
                    write!(f, "{w}")?;
                }
                Ok(())
            }
        }
    }
}

/// Whether `r` is what `w` asks for, `id` aside.
fn content(w: &Want, r: &Response) -> Result<(), String> {
    match (&w.is, &r.result, r.code) {
        (Is::Result(want), Some(got), _) if same_value(want, got) => Ok(()),
        (Is::Result(want), Some(got), _) => Err(format!("result {got}, expected {want}")),
        (Is::Result(want), None, Some(c)) => Err(format!("error {c}, expected result {want}")),
        (Is::Error(want), None, Some(c)) if c == *want => Ok(()),
        (Is::Error(want), None, Some(c)) => Err(format!("error {c}, expected error {want}")),
        (Is::Error(want), Some(got), _) => Err(format!("result {got}, expected error {want}")),
        (Is::Answered, _, Some(c @ (-32700 | -32600))) => {
            Err(format!("error {c}: a valid request was refused"))
        }
        (Is::Answered, _, _) => Ok(()),
        _ => Err("neither result nor error".into()),
    }
}

/// Whether `r` answers a call of `w.needs` with -32601.
fn lacks(w: &Want, r: &Response) -> Option<String> {
    let m = w.needs?;
    (r.code == Some(-32601) && !matches!(w.is, Is::Error(-32601)))
        .then(|| format!("the server has no `{m}` (-32601)"))
}

fn id_ok(w: &IdWant, r: &Response) -> Result<(), String> {
    match w {
        IdWant::Is(id) => same_id(id, &r.id),
        IdWant::Null if r.id_is_null() => Ok(()),
        IdWant::Null => Err(format!("id {}, expected null", r.id)),
        IdWant::IsOrNull(_) if r.id_is_null() => Ok(()),
        IdWant::IsOrNull(id) => same_id(id, &r.id),
    }
}

/// Judges the messages answering a frame against `expect` (the transport already
/// judged: `msgs` are the answers, none when there were none).
pub fn judge(expect: &Expect, msgs: &[Vec<u8>]) -> Verdict {
    match expect {
        Expect::Nothing => match msgs.len() {
            0 => Verdict::Pass(None),
            n => Verdict::Fail(format!("{n} answer(s) where none is due")),
        },
        Expect::One(w) => {
            let raw = match one_message(msgs) {
                Ok(raw) => raw,
                Err(e) => return Verdict::Fail(e),
            };
            if raw.get().trim_start().starts_with('[') {
                return Verdict::Fail("an array, expected a single response object".into());
            }
            let r = match response(&raw) {
                Ok(r) => r,
                Err(e) => return Verdict::Fail(format!("malformed response: {e}")),
            };
            if let Some(note) = lacks(w, &r) {
                return Verdict::Skip(note);
            }
            match content(w, &r).and_then(|()| id_ok(&w.id, &r)) {
                Ok(()) => Verdict::Pass(None),
                Err(e) => Verdict::Fail(e),
            }
        }
        Expect::Batch(wants) => {
            let raw = match one_message(msgs) {
                Ok(raw) => raw,
                Err(e) => return Verdict::Fail(e),
            };
            let items: Vec<Box<RawValue>> = match serde_json::from_str(raw.get()) {
                Ok(items) => items,
                Err(_) => return Verdict::Fail("not an array, expected a batch reply".into()),
            };
            let mut got = Vec::new();
            for item in &items {
                match response(item) {
                    Ok(r) => got.push(r),
                    Err(e) => {
                        return Verdict::Fail(format!("malformed response in the array: {e}"))
                    }
                }
            }
            match_batch(wants, got)
        }
    }
}

fn one_message(msgs: &[Vec<u8>]) -> Result<Box<RawValue>, String> {
    match msgs {
        [] => Err("no answer".into()),
        [m] => serde_json::from_slice::<Box<RawValue>>(m)
            .map_err(|e| format!("the answer is not JSON ({e})")),
        more => Err(format!("{} answers, expected one", more.len())),
    }
}

/// Matches a batch reply's responses to the wanted ones: by id first, then the
/// responses with id `null`; every response must be wanted and every wanted one there.
fn match_batch(wants: &[Want], mut got: Vec<Response>) -> Verdict {
    let mut pairs: Vec<(&Want, Response)> = Vec::new();
    let mut missing = Vec::new();
    // Ids first (exact wants, then those that may also be null), nulls last.
    let rank = |w: &Want| match w.id {
        IdWant::Is(_) => 0,
        IdWant::IsOrNull(_) => 1,
        IdWant::Null => 2,
    };
    let mut order: Vec<&Want> = wants.iter().collect();
    order.sort_by_key(|w| rank(w));
    for w in order {
        let found = match &w.id {
            IdWant::Is(id) => got
                .iter()
                .position(|r| !r.id_is_null() && same_id(id, &r.id).is_ok()),
            IdWant::IsOrNull(id) => got
                .iter()
                .position(|r| !r.id_is_null() && same_id(id, &r.id).is_ok())
                .or_else(|| {
                    got.iter()
                        .position(|r| r.id_is_null() && content(w, r).is_ok())
                }),
            IdWant::Null => got
                .iter()
                .position(|r| r.id_is_null() && content(w, r).is_ok())
                .or_else(|| got.iter().position(|r| r.id_is_null())),
        };
        match found {
            Some(i) => pairs.push((w, got.remove(i))),
            None => missing.push(w),
        }
    }
    if let Some(note) = pairs.iter().find_map(|(w, r)| lacks(w, r)) {
        return Verdict::Skip(note);
    }
    let mut problems = Vec::new();
    for (w, r) in &pairs {
        if let Err(e) = content(w, r) {
            problems.push(format!("{}: {e}", w.id));
        }
    }
    for w in missing {
        problems.push(format!("no response for {}", w.id));
    }
    for r in &got {
        problems.push(format!("unexpected response with id {}", r.id));
    }
    if problems.is_empty() {
        Verdict::Pass(None)
    } else {
        Verdict::Fail(problems.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids() {
        for (a, b) in [
            ("1", "1"),
            ("1e3", "1000"),
            ("1.50", "1.5"),
            ("-0", "0"),
            ("\"\\u0041\"", "\"A\""),
            ("18446744073709551617", "1.8446744073709552e19"),
            ("9007199254740993", "9007199254740993"),
            ("null", "null"),
        ] {
            assert!(same_id(a, b).is_ok(), "{a} {b}");
        }
        for (a, b) in [
            ("\"1\"", "1"),
            ("1", "\"1\""),
            ("9007199254740993", "9007199254740992"),
            ("9007199254740993", "9.007199254740992e15"),
            ("18446744073709551615", "1.8446744073709552e19"),
            ("1", "2"),
            ("null", "0"),
        ] {
            assert!(same_id(a, b).is_err(), "{a} {b}");
        }
    }
}
