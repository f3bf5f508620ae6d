//! The `client` fuzz target's checks (feature `fuzzing`): what a server sends, through
//! the client's HTTP response decoder and response reader, against a serde_json
//! reference of the response rules. Here, inside the client, so the client's internals
//! need not be visible to the rest of the crate.

use crate::fuzzing::{pieces, split_input};

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
            checks::check_frame(line, deep);
        }
    }
    let whole = checks::feed_http(max_body, [stream]);
    let split = checks::feed_http(max_body, pieces(stream, &cuts));
    let bytes = checks::feed_http(max_body, stream.chunks(1));
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
            checks::check_frame(&reply.1, deep);
        }
    }
}

mod checks {
    use std::cell::RefCell;

    use bytes::BytesMut;
    use simd_json::{Node, StaticNode};

    use crate::client::conn::frame_id;
    use crate::client::error::Failure;
    use crate::client::http::{max_chunked, Decoder, MAX_HEAD_BYTES};
    use crate::client::{Error, Reply, Violation};
    use crate::codec::raw::RawCtx;
    use crate::codec::response::{validate_response, Body};
    use crate::codec::Id;
    use crate::engine::Scratch;
    use crate::fuzzing::reference::{reference_parse, Json, Num};
    use crate::fuzzing::show;

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
                // The tape's array has `items.len()` elements: `tape_json` matched it.
                for (elem, item) in crate::codec::tape::elements(raw.root).zip(items) {
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
        check_notification(raw, json, frame);
    }

    /// A notification as the reference reads it: the subscription id and what it says.
    #[derive(Debug, PartialEq)]
    enum NoteRef {
        Result(Json),
        Lagged(u64),
        /// An error object (code, message, data) or a malformed one.
        Error(Option<(i32, String, Option<Json>)>),
        Closed,
    }

    /// Checks `conn::notification` (what the client takes for a server's notification,
    /// and what it says of a subscription) against the reference: an object with a
    /// string `method` before any `id` and no `id` at all is a notification; of a
    /// subscription when its (last) object `params` holds a scalar `subscription` and
    /// one of `result`, `lagged` (an integer ≥ 0), `error` or `closed: true`, the
    /// last of those counting.
    fn check_notification(raw: RawCtx<'_>, json: &Json, frame: &[u8]) {
        let got = crate::client::conn::notification(raw).map(|n| {
            n.map(|(sub, note)| {
                let note = match note {
                    crate::client::conn::Note::Result(v) => NoteRef::Result(tape_json(v).0),
                    crate::client::conn::Note::Lagged(n) => NoteRef::Lagged(n),
                    crate::client::conn::Note::Closed => NoteRef::Closed,
                    crate::client::conn::Note::Error(Error::Server(e)) => {
                        let data = e.data.as_ref().map(|d| {
                            reference_parse(d.as_bytes(), usize::MAX)
                                .unwrap_or_else(|| panic!("error data {d:?} is not JSON"))
                        });
                        NoteRef::Error(Some((e.code, e.message, data)))
                    }
                    crate::client::conn::Note::Error(_) => NoteRef::Error(None),
                };
                (tape_json(std::slice::from_ref(sub)).0, note)
            })
        });
        assert_eq!(
            got,
            reference_notification(json),
            "notification {:?}",
            show(frame)
        );
    }

    #[allow(clippy::option_option)]
    fn reference_notification(json: &Json) -> Option<Option<(Json, NoteRef)>> {
        let Json::Obj(members) = json else {
            return None;
        };
        let (mut method, mut params) = (false, None);
        for (k, v) in members {
            match (k.as_str(), v) {
                ("id", _) => return None,
                ("method", Json::Str(_)) => method = true,
                ("params", p @ Json::Obj(_)) => params = Some(p),
                _ => {}
            }
        }
        if !method {
            return None;
        }
        let Some(Json::Obj(members)) = params else {
            return Some(None);
        };
        let (mut sub, mut note) = (None, None);
        for (k, v) in members {
            match (k.as_str(), v) {
                ("subscription", Json::Arr(_) | Json::Obj(_)) => {}
                ("subscription", id) => sub = Some(id.clone()),
                ("result", v) => note = Some(NoteRef::Result(v.clone())),
                ("lagged", Json::Num(Num::Int(n))) if *n >= 0 => {
                    note = u64::try_from(*n).ok().map(NoteRef::Lagged).or(note);
                }
                ("error", e) => {
                    note = Some(NoteRef::Error(match reference_error(e) {
                        Ok(Resp::Error {
                            code,
                            message,
                            data,
                        }) => Some((code, message, data)),
                        _ => None,
                    }));
                }
                ("closed", Json::Bool(true)) => note = Some(NoteRef::Closed),
                _ => {}
            }
        }
        Some(sub.zip(note))
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
