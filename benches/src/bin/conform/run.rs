//! Running one case over the target's transport: what is sent, how the answers are
//! collected (a probe request after the case marks the end of its answers on a stream),
//! and the verdict.
//!
//! Every case gets a connection (a child process for stdio) of its own, so a server that
//! closes or dies on one case does not fail the next.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::cases::{Body, Case, Robust};
use crate::check::{self, Expect, IdWant, Is, Verdict, Want};
use crate::wire::{self, HttpNext, HttpResponse, Kind, Next, Op, Pipe, Target};

/// How long to wait for an answer.
pub struct Settings {
    /// After the last byte of a case is written.
    pub timeout: Duration,
}

/// A case's outcome with what was exchanged, for the report.
pub struct Outcome {
    /// The verdict.
    pub verdict: Verdict,
    /// What was sent (shortened for the report).
    pub sent: String,
    /// What was expected.
    pub expected: String,
    /// What came back.
    pub got: String,
}

/// The id of the probe request sent after a case: its answer marks the end of the case's.
const PROBE_ID: &str = "conform-probe";
const PROBE: &[u8] = br#"{"jsonrpc":"2.0","method":"conform.probe","id":"conform-probe"}"#;

fn is_probe_answer(msg: &[u8]) -> bool {
    serde_json::from_slice::<Value>(msg)
        .ok()
        .and_then(|v| v.get("id").cloned())
        == Some(Value::String(PROBE_ID.into()))
}

/// Why the probe went unanswered, and the messages before.
type Unanswered = (String, Vec<Vec<u8>>);

/// A message stream: newline-delimited JSON or WebSocket messages.
struct Stream {
    pipe: Pipe,
    ws: bool,
}

impl Stream {
    fn open(target: &Target, s: &Settings) -> Result<Stream, String> {
        let mut pipe = wire::open(target, s.timeout)?;
        let ws = match target {
            Target::Ws { addr, path } => {
                wire::ws_open(addr, path, &mut pipe, s.timeout)?;
                true
            }
            _ => false,
        };
        Ok(Stream { pipe, ws })
    }

    /// `msg` framed: a WebSocket text frame, or the line with its `\n`.
    fn frame(&self, msg: &[u8]) -> Vec<u8> {
        if self.ws {
            wire::ws_frame(ws_opcode(msg), msg)
        } else {
            let mut v = msg.to_vec();
            v.push(b'\n');
            v
        }
    }

    fn next(&mut self, deadline: Instant) -> Next {
        if self.ws {
            wire::next_ws(&mut self.pipe, deadline)
        } else {
            wire::next_line(&mut self.pipe, deadline)
        }
    }

    /// The messages before the probe's answer; `Err` says why the probe went unanswered.
    fn until_probe(&mut self, deadline: Instant) -> Result<Vec<Vec<u8>>, Unanswered> {
        self.until_probe_and(0, deadline)
    }

    /// The messages other than the probe's answer, read until that answer and at least
    /// `min` others came (or, the probe answered, until `deadline`): a server that answers
    /// concurrently (jsonrpsee over WebSocket) may answer the probe first.
    fn until_probe_and(
        &mut self,
        min: usize,
        deadline: Instant,
    ) -> Result<Vec<Vec<u8>>, Unanswered> {
        let mut msgs = Vec::new();
        let mut probed = false;
        loop {
            if probed && msgs.len() >= min {
                return Ok(msgs);
            }
            match self.next(deadline) {
                Next::Msg(m) if !probed && is_probe_answer(&m) => probed = true,
                Next::Msg(m) => msgs.push(m),
                Next::Closed(_) | Next::Timeout if probed => return Ok(msgs),
                Next::Closed(code) => {
                    let how = code
                        .map(|c| format!(" (close code {c})"))
                        .unwrap_or_default();
                    return Err((
                        format!(
                            "the connection closed{how}{} before a valid request sent after the case was answered",
                            self.io_error()
                        ),
                        msgs,
                    ));
                }
                Next::Timeout => {
                    return Err((
                        format!(
                            "a valid request sent after the case went unanswered (a hang?){}",
                            self.io_error()
                        ),
                        msgs,
                    ))
                }
            }
        }
    }

    fn io_error(&self) -> String {
        self.pipe
            .error
            .as_ref()
            .map(|e| format!(" [{e}]"))
            .unwrap_or_default()
    }
}

/// A text frame, or a binary one for bytes that are not UTF-8: a text frame's payload
/// must be (RFC 6455 §8.1: the peer fails the connection, 1007).
fn ws_opcode(msg: &[u8]) -> u8 {
    if std::str::from_utf8(msg).is_ok() {
        0x1
    } else {
        0x2
    }
}

/// On a line-delimited transport a frame is one line: the newlines a case's text holds
/// between tokens (the specification's examples are pretty-printed) become spaces, which
/// JSON reads the same.
fn one_line(frame: &[u8]) -> Vec<u8> {
    frame
        .iter()
        .map(|&b| if b == b'\n' || b == b'\r' { b' ' } else { b })
        .collect()
}

/// One HTTP exchange on a fresh connection: `ops` write the request.
fn http_exchange(target: &Target, ops: Vec<Op>, s: &Settings, wait: Duration) -> HttpNext {
    let mut pipe = match wire::open(target, s.timeout) {
        Ok(p) => p,
        Err(e) => return HttpNext::Bad(e),
    };
    pipe.script(ops);
    wire::next_http(&mut pipe, Instant::now() + wait + s.timeout)
}

/// The answers an HTTP response carries: none for 204 or an empty body.
fn http_msgs(r: &HttpResponse) -> Vec<Vec<u8>> {
    if r.status == 204 || r.body.iter().all(u8::is_ascii_whitespace) {
        Vec::new()
    } else {
        vec![r.body.clone()]
    }
}

fn http_describe(r: &HttpNext) -> String {
    match r {
        HttpNext::Response(r) => format!("HTTP {}: {}", r.status, crate::show(&r.body, 300)),
        HttpNext::Closed => "the connection closed without a response".into(),
        HttpNext::Timeout => "no response (a hang?)".into(),
        HttpNext::Bad(e) => e.clone(),
    }
}

fn post(target: &Target, body: &[u8]) -> Vec<Op> {
    let (addr, path) = match target {
        Target::Http { addr, path } => (addr.as_str(), path.as_str()),
        _ => ("", "/"),
    };
    vec![Op::Write(wire::http_request(addr, path, body))]
}

/// Whether the server still answers: a valid request on a fresh connection.
fn alive(target: &Target, s: &Settings) -> Result<(), String> {
    if target.kind() == Kind::Http {
        match http_exchange(target, post(target, PROBE), s, Duration::ZERO) {
            HttpNext::Response(r) if is_probe_answer(&r.body) => Ok(()),
            other => Err(format!(
                "afterwards, a valid request on a new connection got {}",
                http_describe(&other)
            )),
        }
    } else {
        let mut st = Stream::open(target, s)?;
        let f = st.frame(PROBE);
        st.pipe.write(f);
        st.until_probe(Instant::now() + s.timeout)
            .map(|_| ())
            .map_err(|(e, _)| format!("afterwards, on a new connection: {e}"))
    }
}

fn show_msgs(msgs: &[Vec<u8>]) -> String {
    if msgs.is_empty() {
        return "nothing".into();
    }
    msgs.iter()
        .map(|m| crate::show(m, 300))
        .collect::<Vec<_>>()
        .join(" | ")
}

/// Sends `frame` and judges its answers against `expect`.
fn exchange(target: &Target, frame: &[u8], expect: &Expect, s: &Settings) -> (Verdict, String) {
    if target.kind() == Kind::Http {
        let r = http_exchange(target, post(target, frame), s, Duration::ZERO);
        match &r {
            HttpNext::Response(resp) => {
                let msgs = http_msgs(resp);
                let v = check::judge(expect, &msgs);
                let v = match v {
                    Verdict::Fail(e) if msgs.is_empty() => {
                        Verdict::Fail(format!("{e} (HTTP {}, empty body)", resp.status))
                    }
                    v => v,
                };
                (v, http_describe(&r))
            }
            _ => (Verdict::Fail(http_describe(&r)), http_describe(&r)),
        }
    } else {
        let mut st = match Stream::open(target, s) {
            Ok(st) => st,
            Err(e) => return (Verdict::Fail(e), "no connection".into()),
        };
        let msg = if st.ws {
            frame.to_vec()
        } else {
            one_line(frame)
        };
        let mut bytes = st.frame(&msg);
        bytes.extend(st.frame(PROBE));
        st.pipe.write(bytes);
        let min = usize::from(!matches!(expect, Expect::Nothing));
        match st.until_probe_and(min, Instant::now() + s.timeout) {
            Ok(msgs) => (check::judge(expect, &msgs), show_msgs(&msgs)),
            Err((e, msgs)) => {
                // The case's own answers may be right; the server still failed to go on.
                let got = show_msgs(&msgs);
                (Verdict::Fail(e), got)
            }
        }
    }
}

/// Runs one case.
pub fn run(case: &Case, target: &Target, s: &Settings) -> Outcome {
    match &case.body {
        Body::Exchange { frame, expect } => {
            let (verdict, got) = exchange(target, frame, expect, s);
            Outcome {
                verdict,
                sent: crate::show(frame, 200),
                expected: expect.to_string(),
                got,
            }
        }
        Body::Corpus(bytes) => corpus(case, bytes, target, s),
        Body::Robust(r) => robust(*r, case, target, s),
    }
}

/// Every answer in `msg`, each checked for shape: a response object, or a non-empty
/// array of them.
fn replies(msg: &[u8]) -> Result<Vec<check::Response>, String> {
    let raw: Box<serde_json::value::RawValue> =
        serde_json::from_slice(msg).map_err(|e| format!("the answer is not JSON ({e})"))?;
    if raw.get().trim_start().starts_with('[') {
        let items: Vec<Box<serde_json::value::RawValue>> =
            serde_json::from_str(raw.get()).map_err(|e| e.to_string())?;
        if items.is_empty() {
            return Err("an empty array (§6: MUST NOT)".into());
        }
        items.iter().map(|i| check::response(i)).collect()
    } else {
        Ok(vec![check::response(&raw)?])
    }
}

fn corpus(case: &Case, bytes: &[u8], target: &Target, s: &Settings) -> Outcome {
    let category = case
        .name
        .strip_prefix("corpus.")
        .and_then(|n| n.bytes().next())
        .unwrap_or(b'i');
    let kind = target.kind();
    // On a line-delimited transport a file holding a newline is several lines, and one of
    // only blanks is no line at all: the server is only asked to survive it.
    let lines_only = kind.ndjson()
        && (bytes.contains(&b'\n')
            || bytes.last() == Some(&b'\r')
            || bytes.iter().all(|b| matches!(b, b' ' | b'\t' | b'\r')));
    let expected = if lines_only {
        "not one line on this transport: well-formed answers (if any), and the server answers the next request".to_string()
    } else {
        case.what.clone()
    };
    let mut out = Outcome {
        verdict: Verdict::Pass(None),
        sent: crate::show(bytes, 200),
        expected,
        got: String::new(),
    };
    let msgs = if kind == Kind::Http {
        let r = http_exchange(target, post(target, bytes), s, Duration::ZERO);
        out.got = http_describe(&r);
        match r {
            HttpNext::Response(resp) => http_msgs(&resp),
            _ => {
                out.verdict = Verdict::Fail(out.got.clone());
                return out;
            }
        }
    } else {
        let mut st = match Stream::open(target, s) {
            Ok(st) => st,
            Err(e) => {
                out.verdict = Verdict::Fail(e);
                return out;
            }
        };
        let mut w = st.frame(bytes);
        w.extend(st.frame(PROBE));
        st.pipe.write(w);
        match st.until_probe_and(usize::from(!lines_only), Instant::now() + s.timeout) {
            Ok(msgs) => {
                out.got = show_msgs(&msgs);
                msgs
            }
            Err((e, msgs)) => {
                out.got = show_msgs(&msgs);
                out.verdict = Verdict::Fail(e);
                return out;
            }
        }
    };
    let verdict = if lines_only {
        match msgs.iter().find_map(|m| replies(m).err()) {
            Some(e) => Verdict::Fail(format!("malformed answer: {e}")),
            None => Verdict::Pass(Some(
                "several lines on this transport: survival checked".into(),
            )),
        }
    } else {
        match category {
            b'n' => check::judge(
                &Expect::One(Want {
                    id: IdWant::Null,
                    is: Is::Error(-32700),
                    needs: None,
                }),
                &msgs,
            ),
            _ => match msgs.as_slice() {
                [m] => match replies(m) {
                    Err(e) => Verdict::Fail(format!("malformed answer: {e}")),
                    Ok(rs) => {
                        let bad = rs.iter().find(|r| r.code != Some(-32600));
                        match (category, bad) {
                            (b'y', Some(r)) if r.code == Some(-32700) => {
                                Verdict::Fail("valid JSON answered -32700".into())
                            }
                            (b'y', Some(r)) => Verdict::Fail(format!(
                                "expected -32600 (JSON, not a Request object), got {}",
                                r.code
                                    .map_or("a result".to_string(), |c| format!("error {c}"))
                            )),
                            _ => Verdict::Pass(None),
                        }
                    }
                },
                [] => Verdict::Fail("no answer".into()),
                more => Verdict::Fail(format!("{} answers, expected one", more.len())),
            },
        }
    };
    out.verdict = verdict;
    // HTTP: the exchange had its own connection; is the server still there?
    if kind == Kind::Http && !matches!(out.verdict, Verdict::Fail(_)) {
        if let Err(e) = alive(target, s) {
            out.verdict = Verdict::Fail(e);
        }
    }
    out
}

fn request(id: &str) -> Vec<u8> {
    format!(r#"{{"jsonrpc":"2.0","method":"subtract","params":[42,23],"id":{id}}}"#).into_bytes()
}

fn answered(id: &str) -> Expect {
    Expect::One(Want {
        id: IdWant::Is(id.into()),
        is: Is::Answered,
        needs: None,
    })
}

/// Writes `ops` (the whole exchange, framing included) and judges the one answer.
fn scripted_one(
    target: &Target,
    ops: Vec<Op>,
    wait: Duration,
    id: &str,
    s: &Settings,
) -> (Verdict, String) {
    let expect = answered(id);
    if target.kind() == Kind::Http {
        let r = http_exchange(target, ops, s, wait);
        let v = match &r {
            HttpNext::Response(resp) => check::judge(&expect, &http_msgs(resp)),
            _ => Verdict::Fail(http_describe(&r)),
        };
        return (v, http_describe(&r));
    }
    let mut st = match Stream::open(target, s) {
        Ok(st) => st,
        Err(e) => return (Verdict::Fail(e), String::new()),
    };
    st.pipe.script(ops);
    match st.next(Instant::now() + wait + s.timeout) {
        Next::Msg(m) => (
            check::judge(&expect, std::slice::from_ref(&m)),
            crate::show(&m, 300),
        ),
        Next::Closed(_) => (
            Verdict::Fail(format!("the connection closed{}", st.io_error())),
            String::new(),
        ),
        Next::Timeout => (Verdict::Fail("no answer (a hang?)".into()), String::new()),
    }
}

/// The bytes that carry `msg` on the target's transport.
fn framed(target: &Target, msg: &[u8], line_end: &[u8]) -> Vec<u8> {
    match target {
        Target::Http { .. } => post(target, msg)
            .into_iter()
            .flat_map(|op| match op {
                Op::Write(b) => b,
                Op::Pause(_) => Vec::new(),
            })
            .collect(),
        Target::Ws { .. } => wire::ws_frame(ws_opcode(msg), msg),
        _ => {
            let mut v = msg.to_vec();
            v.extend_from_slice(line_end);
            v
        }
    }
}

fn robust(r: Robust, case: &Case, target: &Target, s: &Settings) -> Outcome {
    let mut out = Outcome {
        verdict: Verdict::Pass(None),
        sent: String::new(),
        expected: case.what.clone(),
        got: String::new(),
    };
    let (verdict, got) = match r {
        Robust::ByteByByte => {
            let id = r#""byte-by-byte""#;
            let bytes = framed(target, &request(id), b"\n");
            out.sent = format!(
                "{} one byte per write, 1 ms apart",
                crate::show(&request(id), 200)
            );
            let wait = Duration::from_millis(bytes.len() as u64 * 2);
            let mut ops = Vec::new();
            for b in bytes {
                ops.push(Op::Write(vec![b]));
                ops.push(Op::Pause(Duration::from_millis(1)));
            }
            scripted_one(target, ops, wait, id, s)
        }
        Robust::SlowSender => {
            let id = r#""slow""#;
            let bytes = framed(target, &request(id), b"\n");
            out.sent = format!(
                "{} in 10 pieces, 100 ms apart",
                crate::show(&request(id), 200)
            );
            let mut ops = Vec::new();
            let piece = bytes.len().div_ceil(10);
            for c in bytes.chunks(piece) {
                ops.push(Op::Write(c.to_vec()));
                ops.push(Op::Pause(Duration::from_millis(100)));
            }
            scripted_one(target, ops, Duration::from_millis(1100), id, s)
        }
        Robust::CrLf => {
            let id = r#""crlf""#;
            out.sent = format!("{}\\r\\n", crate::show(&request(id), 200));
            let ops = vec![Op::Write(framed(target, &request(id), b"\r\n"))];
            scripted_one(target, ops, Duration::ZERO, id, s)
        }
        Robust::KeepAlive => keep_alive(target, s, &mut out),
        Robust::Pipelined => pipelined(target, s, &mut out),
        Robust::Oversized => oversized(target, s, &mut out),
    };
    out.verdict = verdict;
    out.got = got;
    out
}

fn keep_alive(target: &Target, s: &Settings, out: &mut Outcome) -> (Verdict, String) {
    out.sent = "two POSTs, the second after the first's response, on one connection".into();
    let mut pipe = match wire::open(target, s.timeout) {
        Ok(p) => p,
        Err(e) => return (Verdict::Fail(e), String::new()),
    };
    let mut got = Vec::new();
    for id in ["1", "2"] {
        pipe.script(post(target, &request(id)));
        let r = wire::next_http(&mut pipe, Instant::now() + s.timeout);
        got.push(http_describe(&r));
        let v = match &r {
            HttpNext::Response(resp) => check::judge(&answered(id), &http_msgs(resp)),
            _ => Verdict::Fail(format!("request {id}: {}", http_describe(&r))),
        };
        if let HttpNext::Response(resp) = &r {
            if resp.close && id == "1" {
                return (
                    Verdict::Pass(Some(
                        "the server closes after each response (Connection: close)".into(),
                    )),
                    got.join(" | "),
                );
            }
        }
        if let Verdict::Fail(e) = v {
            return (Verdict::Fail(format!("request {id}: {e}")), got.join(" | "));
        }
    }
    (Verdict::Pass(None), got.join(" | "))
}

fn pipelined(target: &Target, s: &Settings, out: &mut Outcome) -> (Verdict, String) {
    let n = if target.kind() == Kind::Http { 10 } else { 20 };
    out.sent = format!("{n} subtract requests (ids 1…{n}) in one write");
    let mut all = Vec::new();
    for i in 1..=n {
        all.extend(framed(target, &request(&i.to_string()), b"\n"));
    }
    let mut pipe = match Stream::open(target, s) {
        Ok(p) => p,
        Err(e) => return (Verdict::Fail(e), String::new()),
    };
    pipe.pipe.write(all);
    let deadline = Instant::now() + s.timeout;
    if target.kind() == Kind::Http {
        let mut got = Vec::new();
        for i in 1..=n {
            let r = wire::next_http(&mut pipe.pipe, deadline);
            got.push(http_describe(&r));
            match &r {
                HttpNext::Response(resp) => {
                    if let Verdict::Fail(e) =
                        check::judge(&answered(&i.to_string()), &http_msgs(resp))
                    {
                        return (
                            Verdict::Fail(format!("response {i} of {n} (in order): {e}")),
                            got.join(" | "),
                        );
                    }
                    if resp.close && i < n {
                        return (
                            Verdict::Pass(Some(format!(
                                "answered {i} in order, then closed (Connection: close)"
                            ))),
                            got.join(" | "),
                        );
                    }
                }
                _ => {
                    return (
                        Verdict::Fail(format!("response {i} of {n}: {}", http_describe(&r))),
                        got.join(" | "),
                    )
                }
            }
        }
        return (Verdict::Pass(None), format!("{n} responses in order"));
    }
    let mut msgs = Vec::new();
    while msgs.len() < n {
        match pipe.next(deadline) {
            Next::Msg(m) => msgs.push(m),
            Next::Closed(_) => {
                return (
                    Verdict::Fail(format!(
                        "the connection closed after {} answers",
                        msgs.len()
                    )),
                    show_msgs(&msgs),
                )
            }
            Next::Timeout => {
                return (
                    Verdict::Fail(format!("{} answers of {n} (a hang?)", msgs.len())),
                    show_msgs(&msgs),
                )
            }
        }
    }
    // Answers may come in any order: an array of them is judged like a batch reply.
    let mut joined = b"[".to_vec();
    for (i, m) in msgs.iter().enumerate() {
        if i > 0 {
            joined.push(b',');
        }
        joined.extend_from_slice(m);
    }
    joined.push(b']');
    let wants = (1..=n)
        .map(|i| Want {
            id: IdWant::Is(i.to_string()),
            is: Is::Answered,
            needs: None,
        })
        .collect();
    let v = match check::judge(&Expect::Batch(wants), &[joined]) {
        Verdict::Fail(e) => Verdict::Fail(format!("{e} (answers shown as an array)")),
        v => v,
    };
    (v, format!("{n} answers"))
}

fn oversized(target: &Target, s: &Settings, out: &mut Outcome) -> (Verdict, String) {
    const SIZE: usize = 2 << 20;
    let mut req = br#"{"jsonrpc":"2.0","method":"sum","params":[0"#.to_vec();
    while req.len() < SIZE {
        req.extend_from_slice(b",1");
    }
    req.extend_from_slice(br#"],"id":"big"}"#);
    out.sent = format!("a sum call of {} bytes (params [0,1,1,…])", req.len());
    let wait = Duration::from_secs(2);
    if target.kind() == Kind::Http {
        let r = http_exchange(target, post(target, &req), s, wait);
        let got = http_describe(&r);
        let v = match &r {
            HttpNext::Response(resp) => match http_msgs(resp).first().map(|m| replies(m)) {
                Some(Err(e)) if (200..300).contains(&resp.status) => {
                    Verdict::Fail(format!("malformed answer: {e}"))
                }
                _ => Verdict::Pass(None),
            },
            HttpNext::Closed => Verdict::Pass(Some("refused by closing the connection".into())),
            _ => Verdict::Fail(got.clone()),
        };
        if matches!(v, Verdict::Fail(_)) {
            return (v, got);
        }
        return match alive(target, s) {
            Ok(()) => (v, got),
            Err(e) => (Verdict::Fail(e), got),
        };
    }
    let mut st = match Stream::open(target, s) {
        Ok(st) => st,
        Err(e) => return (Verdict::Fail(e), String::new()),
    };
    let mut w = st.frame(&req);
    w.extend(st.frame(PROBE));
    st.pipe.write(w);
    let v = match st.until_probe(Instant::now() + wait + s.timeout) {
        Ok(msgs) => match msgs.iter().find_map(|m| replies(m).err()) {
            Some(e) => (
                Verdict::Fail(format!("malformed answer: {e}")),
                show_msgs(&msgs),
            ),
            None => (Verdict::Pass(None), show_msgs(&msgs)),
        },
        Err((e, msgs)) if st.pipe.eof => (
            Verdict::Pass(Some(format!("refused by closing the connection ({e})"))),
            show_msgs(&msgs),
        ),
        Err((e, msgs)) => (Verdict::Fail(e), show_msgs(&msgs)),
    };
    if matches!(v.0, Verdict::Fail(_)) {
        return v;
    }
    match alive(target, s) {
        Ok(()) => v,
        Err(e) => (Verdict::Fail(e), v.1),
    }
}
