//! The messages: the built-in mix of demo methods (`--mix`, `--batch`) or a workload file
//! (`--workload`, NDJSON templates, see docs/LOADGEN.md), each distinct message
//! serialized once with room for its ids and random values, which are patched in place
//! when it is sent (fixed widths: the message's length never changes).

use serde::Deserialize;
use serde_json::value::RawValue;

use super::Args;

/// Ids are 10-digit decimal numbers, so they are patched in place.
pub(crate) const ID_BASE: u64 = 1_000_000_000;
pub(crate) const ID_END: u64 = 10_000_000_000;
pub(crate) const ID_DIGITS: usize = 10;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Method {
    Subtract,
    Add,
    Sum,
    Ping,
    Echo,
    GetData,
    Sleep,
    Delay,
    /// The demo's de-duplicated counter: `[1]` → the counter's new value.
    Incr,
}

impl Method {
    fn name(self) -> &'static str {
        match self {
            Method::Subtract => "subtract",
            Method::Add => "add",
            Method::Sum => "sum",
            Method::Ping => "ping",
            Method::Echo => "echo",
            Method::GetData => "get_data",
            Method::Sleep => "sleep",
            Method::Delay => "delay",
            Method::Incr => "incr",
        }
    }

    fn parse(s: &str) -> Option<Method> {
        Some(match s {
            "subtract" => Method::Subtract,
            "add" => Method::Add,
            "sum" => Method::Sum,
            "ping" => Method::Ping,
            "echo" => Method::Echo,
            "get_data" => Method::GetData,
            "sleep" => Method::Sleep,
            "delay" => Method::Delay,
            "incr" => Method::Incr,
            _ => return None,
        })
    }
}

/// What a call's result must be.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Expect {
    Int(i64),
    Pong,
    GetData,
    Null,
    Echo,
    /// Any integer (`incr`: the counter's value depends on every other call).
    AnyInt,
    /// Equal, as a JSON value, to `Messages::expected[i]` (a workload's `expect`).
    Value(u32),
    /// Anything (a workload line without `expect`): only the id is checked.
    Any,
}

/// The `echo` params: keys sorted and no whitespace, so a server that re-encodes them
/// through a map still answers the same bytes (other answers are compared as values);
/// flat, because serde_json allocates to skip over nested containers.
pub(crate) const ECHO_PARAMS: &str = r#"{"a":1,"b":"two","c":true,"d":null,"e":-5}"#;

/// One distinct message before framing: its JSON text and what goes where.
#[derive(Clone)]
pub(crate) struct Body {
    pub(crate) json: Vec<u8>,
    /// The calls that are answered (notifications have none).
    pub(crate) calls: Vec<Call>,
    /// Random values to write at each send.
    pub(crate) randoms: Vec<Rand>,
    /// Index in `Messages::labels`.
    pub(crate) label: usize,
}

/// One answered call of a message.
#[derive(Clone)]
pub(crate) struct Call {
    /// Offset of the id's digits in the message.
    pub(crate) at: usize,
    pub(crate) expect: Expect,
    /// The result as a compact encoder writes it (`19`, `"pong"`, the echo params...),
    /// for the fast path; empty when any result will do.
    pub(crate) canon: Box<[u8]>,
    /// Index in `Messages::labels` (the call's method).
    pub(crate) label: usize,
}

/// A random value written at each send, in a fixed width.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Rand {
    pub(crate) at: usize,
    pub(crate) kind: RandKind,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum RandKind {
    /// An integer in `lo..=hi`, right-aligned in `width` bytes: after spaces as a JSON
    /// number (`{{int}}` as a whole string), after zeros inside a string.
    Int {
        lo: i64,
        hi: i64,
        width: usize,
        in_string: bool,
    },
    /// `len` random letters and digits (inside a string).
    Str { len: usize },
}

impl Rand {
    /// Writes a fresh value into `dst` (the message being sent), drawing from `rng`.
    pub(crate) fn write(&self, dst: &mut [u8], rng: &mut u64) {
        match self.kind {
            RandKind::Int {
                lo,
                hi,
                width,
                in_string,
            } => {
                let span = (i128::from(hi) - i128::from(lo) + 1) as u128;
                let v = i128::from(lo) + (u128::from(next(rng)) % span) as i128;
                let field = &mut dst[self.at..self.at + width];
                let mut n = v.unsigned_abs();
                let mut i = width;
                loop {
                    i -= 1;
                    field[i] = b'0' + (n % 10) as u8;
                    n /= 10;
                    if n == 0 || i == 0 {
                        break;
                    }
                }
                let fill = if in_string { b'0' } else { b' ' };
                if v < 0 {
                    if in_string {
                        field[..i].fill(b'0');
                        field[0] = b'-';
                    } else {
                        i -= 1;
                        field[i] = b'-';
                        field[..i].fill(fill);
                    }
                } else {
                    field[..i].fill(fill);
                }
            }
            RandKind::Str { len } => {
                const ALNUM: &[u8] =
                    b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
                for b in &mut dst[self.at..self.at + len] {
                    *b = ALNUM[(next(rng) % ALNUM.len() as u64) as usize];
                }
            }
        }
    }
}

/// splitmix64: a fast, well-spread generator for random values (not for secrets).
pub(crate) fn next(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Everything sent, whatever the transport.
pub(crate) struct Messages {
    pub(crate) bodies: Vec<Body>,
    /// Names the latency is reported under: methods, `batch`, workload lines' names.
    pub(crate) labels: Vec<String>,
    /// The values `Expect::Value` refers to.
    pub(crate) expected: Vec<serde_json::Value>,
    /// The most calls of one message (the calls each message slot has room for), ≥ 1.
    pub(crate) per: usize,
}

impl Messages {
    fn label(&mut self, name: &str) -> usize {
        match self.labels.iter().position(|l| l == name) {
            Some(i) => i,
            None => {
                self.labels.push(name.to_string());
                self.labels.len() - 1
            }
        }
    }
}

/// The messages of `args`: its workload file, or its mix.
pub(crate) fn messages(args: &Args) -> Result<Messages, String> {
    if args.batch > 100_000 {
        return Err("--batch is at most 100000".into());
    }
    let mut msgs = match &args.workload {
        Some(path) => {
            if args.batch > 0 {
                return Err("--batch does not apply to --workload: give a line `batch`".into());
            }
            let text = std::fs::read_to_string(path)
                .map_err(|e| format!("--workload {}: {e}", path.display()))?;
            parse_workload(&text).map_err(|e| format!("--workload {}: {e}", path.display()))?
        }
        None => mix_messages(args)?,
    };
    msgs.per = msgs
        .bodies
        .iter()
        .map(|b| b.calls.len())
        .max()
        .unwrap_or(0)
        .max(1);
    Ok(msgs)
}

/// The built-in mix: message k holds the cycle's calls `k * per ..`, the messages
/// repeating once every call of the cycle has had its place in every batch position.
fn mix_messages(args: &Args) -> Result<Messages, String> {
    let cycle = parse_mix(&args.mix)?;
    let mut msgs = Messages {
        bodies: Vec::new(),
        labels: Vec::new(),
        expected: Vec::new(),
        per: 1,
    };
    let per = args.batch.max(1);
    let w = cycle.len();
    let count = if args.batch == 0 { w } else { w / gcd(w, per) };
    for k in 0..count {
        let mut json = Vec::new();
        let mut calls = Vec::with_capacity(per);
        if args.batch > 0 {
            json.push(b'[');
        }
        for j in 0..per {
            if j > 0 {
                json.push(b',');
            }
            let pos = (k * per + j) % w;
            let label = msgs.label(cycle[pos].name());
            calls.push(call_json(cycle[pos], pos, args.sleep_ms, label, &mut json));
        }
        if args.batch > 0 {
            json.push(b']');
        }
        let label = if args.batch > 0 {
            msgs.label("batch")
        } else {
            calls[0].label
        };
        msgs.bodies.push(Body {
            json,
            calls,
            randoms: Vec::new(),
            label,
        });
    }
    Ok(msgs)
}

/// Smooth weighted round robin: a cycle in which entry `i` appears `weights[i]` times,
/// spread evenly.
fn weighted_cycle(weights: &[u32]) -> Result<Vec<usize>, String> {
    let total: i64 = weights.iter().map(|&w| i64::from(w)).sum();
    if total == 0 {
        return Err("the weights add up to 0".into());
    }
    if total > 10_000 {
        return Err("the weights add up to more than 10000".into());
    }
    let mut current = vec![0i64; weights.len()];
    let mut cycle = Vec::with_capacity(total as usize);
    for _ in 0..total {
        for (c, &w) in current.iter_mut().zip(weights) {
            *c += i64::from(w);
        }
        let best = (0..weights.len())
            .max_by_key(|&i| (current[i], std::cmp::Reverse(i)))
            .unwrap_or(0);
        current[best] -= total;
        cycle.push(best);
    }
    Ok(cycle)
}

/// `method[:weight],...` → a cycle in which each method appears `weight` times, spread
/// evenly (smooth weighted round robin).
fn parse_mix(mix: &str) -> Result<Vec<Method>, String> {
    let mut entries = Vec::new();
    for part in mix.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (name, weight) = match part.split_once(':') {
            Some((n, w)) => (
                n.trim(),
                w.trim()
                    .parse::<u32>()
                    .map_err(|_| format!("bad weight in {part:?}"))?,
            ),
            None => (part, 1),
        };
        let m = Method::parse(name).ok_or_else(|| {
            format!(
                "unknown method {name:?} (subtract, add, sum, ping, echo, get_data, sleep, delay, incr)"
            )
        })?;
        if weight > 0 {
            entries.push((m, weight));
        }
    }
    if entries.is_empty() {
        return Err("the mix is empty".into());
    }
    let weights: Vec<u32> = entries.iter().map(|e| e.1).collect();
    Ok(weighted_cycle(&weights)?
        .into_iter()
        .map(|i| entries[i].0)
        .collect())
}

/// One call's JSON text, with `ID_DIGITS` zeros for the id; returns the id's offset.
fn call_json(m: Method, position: usize, sleep_ms: u64, label: usize, out: &mut Vec<u8>) -> Call {
    let (method, params, expect) = match m {
        Method::Subtract => ("subtract", Some("[42,23]".to_string()), Expect::Int(19)),
        Method::Add => {
            let a = position as i64 + 1;
            ("add", Some(format!("[{a},{}]", 2 * a)), Expect::Int(3 * a))
        }
        Method::Sum => ("sum", Some("[1,2,3,4]".into()), Expect::Int(10)),
        Method::Ping => ("ping", None, Expect::Pong),
        Method::Echo => ("echo", Some(ECHO_PARAMS.into()), Expect::Echo),
        Method::GetData => ("get_data", None, Expect::GetData),
        Method::Sleep => (
            "sleep",
            Some(format!("{{\"ms\":{sleep_ms}}}")),
            Expect::Null,
        ),
        Method::Delay => ("delay", Some(format!("[{sleep_ms}]")), Expect::Null),
        Method::Incr => ("incr", Some("[1]".into()), Expect::AnyInt),
    };
    out.extend_from_slice(br#"{"jsonrpc":"2.0","method":""#);
    out.extend_from_slice(method.as_bytes());
    out.push(b'"');
    if let Some(p) = params {
        out.extend_from_slice(br#","params":"#);
        out.extend_from_slice(p.as_bytes());
    }
    out.extend_from_slice(br#","id":"#);
    let at = out.len();
    out.extend_from_slice(&[b'0'; ID_DIGITS]);
    out.push(b'}');
    let canon = match expect {
        Expect::Int(v) => v.to_string(),
        Expect::Pong => r#""pong""#.into(),
        Expect::GetData => r#"["hello",5]"#.into(),
        Expect::Null => "null".into(),
        Expect::Echo => ECHO_PARAMS.into(),
        Expect::Value(_) | Expect::Any | Expect::AnyInt => String::new(),
    };
    Call {
        at,
        expect,
        canon: canon.into_bytes().into_boxed_slice(),
        label,
    }
}

/// One line of a workload file in its long form.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Line<'a> {
    #[serde(borrow)]
    request: &'a RawValue,
    #[serde(default = "one")]
    weight: u32,
    #[serde(default)]
    batch: usize,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    expect: Option<serde_json::Value>,
}

fn one() -> u32 {
    1
}

/// What a request template must be: a JSON-RPC 2.0 request, `"id":"{{id}}"` or no id.
#[derive(Deserialize)]
struct Req<'a> {
    jsonrpc: &'a str,
    method: String,
    #[serde(borrow, default)]
    id: Option<&'a RawValue>,
}

/// Parses a workload file (docs/LOADGEN.md): one message template per line, weighted;
/// blank lines and lines starting with `#` skipped.
pub(crate) fn parse_workload(text: &str) -> Result<Messages, String> {
    let mut msgs = Messages {
        bodies: Vec::new(),
        labels: Vec::new(),
        expected: Vec::new(),
        per: 1,
    };
    let mut weights = Vec::new();
    let mut entries = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let at = |e: String| format!("line {}: {e}", n + 1);
        let (body, weight) = workload_line(line, &mut msgs).map_err(at)?;
        weights.push(weight);
        entries.push(body);
    }
    if entries.is_empty() {
        return Err("no message templates".into());
    }
    // Each template once per place it takes in the cycle: the send loop stays a walk.
    msgs.bodies = weighted_cycle(&weights)?
        .into_iter()
        .map(|i| entries[i].clone())
        .collect();
    Ok(msgs)
}

/// One line → its message and weight.
fn workload_line(line: &str, msgs: &mut Messages) -> Result<(Body, u32), String> {
    let raw: &RawValue = serde_json::from_str(line).map_err(|e| e.to_string())?;
    // A bare request, or the long form.
    let is_request = serde_json::from_str::<Req<'_>>(raw.get()).is_ok()
        && serde_json::from_str::<Line<'_>>(raw.get()).is_err();
    let (request, weight, batch, name, expect) = if is_request {
        (raw, 1, 0, None, None)
    } else {
        let l: Line<'_> = serde_json::from_str(raw.get()).map_err(|e| e.to_string())?;
        (l.request, l.weight, l.batch, l.name, l.expect)
    };
    if batch > 100_000 {
        return Err("batch is at most 100000".into());
    }
    let elements: Vec<&RawValue> = match request.get().trim_start().as_bytes().first() {
        Some(b'[') => {
            if batch > 0 {
                return Err("`batch` repeats one request: give an object, not an array".into());
            }
            let v: Vec<&RawValue> =
                serde_json::from_str(request.get()).map_err(|e| e.to_string())?;
            if v.is_empty() {
                return Err("an empty batch".into());
            }
            v
        }
        _ => vec![request; batch.max(1)],
    };
    let explicit_batch = elements.len() > 1 || batch > 0 || request.get().starts_with('[');
    let mut methods = Vec::new();
    for e in &elements {
        let r: Req<'_> = serde_json::from_str(e.get())
            .map_err(|err| format!("not a JSON-RPC request ({err}): {}", e.get()))?;
        if r.jsonrpc != "2.0" {
            return Err(format!("`jsonrpc` must be \"2.0\": {}", e.get()));
        }
        if r.id.is_some_and(|id| id.get() != "\"{{id}}\"") {
            return Err(format!(
                "a request's id must be \"{{{{id}}}}\" (loadgen numbers them), or absent for a notification: {}",
                e.get()
            ));
        }
        methods.push((r.method, r.id.is_some()));
    }
    let label_name = match &name {
        Some(n) => n.clone(),
        None if batch > 0 => format!("{} x{batch}", methods[0].0),
        None if explicit_batch => "batch".to_string(),
        None => methods[0].0.clone(),
    };
    let label = msgs.label(&label_name);
    let expect = match expect {
        Some(v) => {
            if explicit_batch || !methods[0].1 {
                return Err("`expect` is for a single request with an id".into());
            }
            let canon = serde_json::to_vec(&v).map_err(|e| e.to_string())?;
            msgs.expected.push(v);
            Some((Expect::Value((msgs.expected.len() - 1) as u32), canon))
        }
        None => None,
    };
    let mut json = Vec::new();
    let mut calls = Vec::new();
    let mut randoms = Vec::new();
    if explicit_batch {
        json.push(b'[');
    }
    for (k, e) in elements.iter().enumerate() {
        if k > 0 {
            json.push(b',');
        }
        let id_at = render(e.get(), &mut json, &mut randoms)?;
        if let Some(at) = id_at {
            let (expect, canon) = match &expect {
                Some((x, c)) => (*x, c.clone().into_boxed_slice()),
                None => (Expect::Any, Box::default()),
            };
            calls.push(Call {
                at,
                expect,
                canon,
                label,
            });
        }
    }
    if explicit_batch {
        json.push(b']');
    }
    Ok((
        Body {
            json,
            calls,
            randoms,
            label,
        },
        weight,
    ))
}

/// Writes request template `raw` into `out`, placeholders replaced by room for their
/// values; returns where the id's digits go (`None`: a notification).
fn render(raw: &str, out: &mut Vec<u8>, randoms: &mut Vec<Rand>) -> Result<Option<usize>, String> {
    let mut id_at = None;
    let mut rest = raw;
    while let Some(i) = rest.find("{{") {
        let j = rest[i..]
            .find("}}")
            .map(|j| i + j)
            .ok_or_else(|| format!("an unclosed {{{{ in {raw}"))?;
        let inner: Vec<&str> = rest[i + 2..j].split_whitespace().collect();
        let whole = rest[..i].ends_with('"') && rest[j + 2..].starts_with('"');
        let bad = || format!("unknown placeholder {{{{{}}}}} in {raw}", &rest[i + 2..j]);
        match inner.as_slice() {
            ["id"] => {
                if !whole || id_at.is_some() {
                    return Err(format!(
                        "\"{{{{id}}}}\" is the id's whole value, once: {raw}"
                    ));
                }
                out.extend_from_slice(&rest.as_bytes()[..i - 1]);
                id_at = Some(out.len());
                out.extend_from_slice(&[b'0'; ID_DIGITS]);
                rest = &rest[j + 3..];
            }
            ["int", lo, hi] => {
                let lo: i64 = lo.parse().map_err(|_| bad())?;
                let hi: i64 = hi.parse().map_err(|_| bad())?;
                if lo > hi {
                    return Err(format!(
                        "{{{{int {lo} {hi}}}}}: the low bound is above the high one"
                    ));
                }
                let width = lo.to_string().len().max(hi.to_string().len());
                let (keep, skip) = if whole { (i - 1, j + 3) } else { (i, j + 2) };
                out.extend_from_slice(&rest.as_bytes()[..keep]);
                randoms.push(Rand {
                    at: out.len(),
                    kind: RandKind::Int {
                        lo,
                        hi,
                        width,
                        in_string: !whole,
                    },
                });
                out.extend(std::iter::repeat_n(b'0', width));
                rest = &rest[skip..];
            }
            ["str", len] => {
                let len: usize = len.parse().map_err(|_| bad())?;
                if len > 1 << 20 {
                    return Err(format!("{{{{str {len}}}}}: at most 1 MiB"));
                }
                out.extend_from_slice(&rest.as_bytes()[..i]);
                randoms.push(Rand {
                    at: out.len(),
                    kind: RandKind::Str { len },
                });
                out.extend(std::iter::repeat_n(b'a', len));
                rest = &rest[j + 2..];
            }
            _ => return Err(bad()),
        }
    }
    out.extend_from_slice(rest.as_bytes());
    Ok(id_at)
}

pub(crate) fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every draw of every random value leaves the message valid JSON, in range.
    #[test]
    fn random_values_keep_the_message_json() {
        let line = r#"{"jsonrpc":"2.0","method":"m","params":["{{int -50 50}}","k-{{int -9 9}}","{{str 5}}"],"id":"{{id}}"}"#;
        let msgs = parse_workload(line).unwrap();
        let body = &msgs.bodies[0];
        let id = body.calls[0].at;
        assert_eq!(body.calls.len(), 1);
        assert_eq!(body.randoms.len(), 3);
        let mut rng = 7;
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..2000 {
            let mut m = body.json.clone();
            m[id..id + ID_DIGITS].copy_from_slice(b"1000000007");
            for r in &body.randoms {
                r.write(&mut m, &mut rng);
            }
            let v: serde_json::Value = serde_json::from_slice(&m)
                .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&m)));
            let n = v["params"][0].as_i64().unwrap();
            assert!((-50..=50).contains(&n), "{v}");
            seen.insert(n);
            let s = v["params"][1].as_str().unwrap();
            assert!(s.starts_with("k-") && s.len() == 4, "{v}");
            let k: i64 = s[2..].parse().unwrap();
            assert!((-9..=9).contains(&k), "{v}");
            let s = v["params"][2].as_str().unwrap();
            assert!(
                s.len() == 5 && s.bytes().all(|b| b.is_ascii_alphanumeric()),
                "{v}"
            );
            assert_eq!(v["id"], 1_000_000_007, "{v}");
        }
        assert_eq!(seen.len(), 101, "every value drawn");
    }

    #[test]
    fn weights_batches_and_notifications() {
        let text = r#"
# comment
{"request":{"jsonrpc":"2.0","method":"a","id":"{{id}}"},"weight":3,"expect":1}
{"request":{"jsonrpc":"2.0","method":"b","id":"{{id}}"},"batch":4}
{"jsonrpc":"2.0","method":"c"}
"#;
        let m = parse_workload(text).unwrap();
        assert_eq!(m.bodies.len(), 5);
        let calls: Vec<usize> = m.bodies.iter().map(|b| b.calls.len()).collect();
        assert_eq!(calls.iter().filter(|&&c| c == 1).count(), 3);
        assert!(calls.contains(&4) && calls.contains(&0));
        assert_eq!(m.labels, ["a", "b x4", "c"]);
        assert_eq!(m.expected, [serde_json::json!(1)]);
    }

    #[test]
    fn bad_lines_are_refused() {
        for (line, why) in [
            (r#"{"jsonrpc":"2.0","method":"a","id":1}"#, "id must be"),
            (
                r#"{"jsonrpc":"2.0","method":"a","params":["{{nope}}"],"id":"{{id}}"}"#,
                "unknown placeholder",
            ),
            (
                r#"{"jsonrpc":"2.0","method":"a","params":["{{int 5 1}}"],"id":"{{id}}"}"#,
                "low bound",
            ),
            (
                r#"{"request":{"jsonrpc":"2.0","method":"a"},"expect":1}"#,
                "expect",
            ),
            (r#"{"request":[],"weight":1}"#, "empty batch"),
            (r#"{"jsonrpc":"1.0","method":"a"}"#, "2.0"),
            ("not json", "line 1"),
        ] {
            let e = parse_workload(line).err().unwrap_or_default();
            assert!(e.contains(why), "{line}: {e}");
        }
    }
}
