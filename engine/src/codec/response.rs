//! The client's side of the envelope rules: a parsed reply → borrowed views of each
//! response (id, then result or error), checked in one pass over the object's members.

use simd_json::{Node, StaticNode};

use super::tape::{as_id, members, Id};

/// How the server broke the protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Violation {
    /// The response is not valid JSON.
    #[error("the response is not valid JSON")]
    BadJson,
    /// Not a response object (or, for a batch, an array of them).
    #[error("not a JSON-RPC response object")]
    NotAResponse,
    /// `jsonrpc` missing or not exactly `"2.0"`.
    #[error("`jsonrpc` is missing or not \"2.0\"")]
    WrongVersion,
    /// `id` missing, or not a string, number or null.
    #[error("`id` is missing or not a string, number or null")]
    BadId,
    /// An id this client never sent on the connection.
    #[error("a response with an id that was never sent")]
    UnknownId,
    /// Both `result` and `error`.
    #[error("both `result` and `error`")]
    BothResultAndError,
    /// Neither `result` nor `error`.
    #[error("neither `result` nor `error`")]
    NeitherResultNorError,
    /// A member appears twice.
    #[error("a member appears more than once")]
    DuplicateMember,
    /// `error` is not an object with an integer `code` (fitting 32 bits) and a string
    /// `message`.
    #[error("malformed `error` object")]
    BadErrorObject,
    /// A batch's reply lacks the response for one of its calls, or a call got no reply.
    #[error("no response for a call")]
    MissingResponse,
    /// An array came back for a single call, or responses of one frame belong to
    /// different requests.
    #[error("a reply that does not match its request")]
    Mismatched,
    /// A response larger than the client's `max_response_bytes`.
    #[error("response exceeds max_response_bytes")]
    TooLarge,
    /// The server broke the WebSocket protocol, refused the handshake, or closed the
    /// WebSocket.
    #[error("WebSocket: {0}")]
    WebSocket(&'static str),
    /// An HTTP status other than 200 or 204 (a 401 or 429 whose body holds JSON-RPC
    /// errors is reported as those errors instead).
    #[error("HTTP status {0}")]
    HttpStatus(u16),
    /// A malformed HTTP response (head, `Content-Length`, chunked framing).
    #[error("malformed HTTP response: {0}")]
    BadHttp(&'static str),
    /// A subscribe call answered the id of a subscription already open on the
    /// connection.
    #[error("a subscription id already in use on the connection")]
    SubscriptionInUse,
}

/// A response object that passed every envelope rule.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Response<'a> {
    pub(crate) id: Id<'a>,
    pub(crate) body: Body<'a>,
}

/// What a response carries: exactly one of a result and an error.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Body<'a> {
    /// The result value's nodes.
    Result(&'a [Node<'a>]),
    /// The error object's members.
    Error {
        code: i32,
        message: &'a str,
        data: Option<&'a [Node<'a>]>,
    },
}

/// Validates the value spanning `nodes` as a Response object.
pub(crate) fn validate_response<'a>(nodes: &'a [Node<'a>]) -> Result<Response<'a>, Violation> {
    let Some(Node::Object { .. }) = nodes.first() else {
        return Err(Violation::NotAResponse);
    };
    let mut version = None;
    let mut id = None;
    let mut result = None;
    let mut error = None;
    for m in members(nodes) {
        let Ok((key, value @ [_, ..])) = m else {
            return Err(Violation::NotAResponse);
        };
        let taken = match key {
            "jsonrpc" => version
                .replace(matches!(value.first(), Some(Node::String("2.0"))))
                .is_some(),
            "id" => id.replace(value.first().and_then(as_id)).is_some(),
            "result" => result.replace(value).is_some(),
            "error" => error.replace(value).is_some(),
            _ => false,
        };
        if taken {
            return Err(Violation::DuplicateMember);
        }
    }
    if version != Some(true) {
        return Err(Violation::WrongVersion);
    }
    let id = id.flatten().ok_or(Violation::BadId)?;
    let body = match (result, error) {
        (Some(r), None) => Body::Result(r),
        (None, Some(e)) => error_object(e)?,
        (Some(_), Some(_)) => return Err(Violation::BothResultAndError),
        (None, None) => return Err(Violation::NeitherResultNorError),
    };
    Ok(Response { id, body })
}

/// Reads `{"code": int, "message": string, "data"?: any}`.
pub(crate) fn error_object<'a>(nodes: &'a [Node<'a>]) -> Result<Body<'a>, Violation> {
    let Some(Node::Object { .. }) = nodes.first() else {
        return Err(Violation::BadErrorObject);
    };
    let (mut code, mut message, mut data) = (None, None, None);
    for m in members(nodes) {
        let Ok((key, value @ [_, ..])) = m else {
            return Err(Violation::NotAResponse);
        };
        let taken = match key {
            "code" => {
                let c = match value.first() {
                    Some(&Node::Static(StaticNode::I64(i))) => i32::try_from(i).ok(),
                    Some(&Node::Static(StaticNode::U64(u))) => i32::try_from(u).ok(),
                    _ => None,
                };
                code.replace(c.ok_or(Violation::BadErrorObject)?).is_some()
            }
            "message" => match value.first() {
                Some(Node::String(s)) => message.replace(*s).is_some(),
                _ => return Err(Violation::BadErrorObject),
            },
            "data" => data.replace(value).is_some(),
            _ => false,
        };
        if taken {
            return Err(Violation::DuplicateMember);
        }
    }
    match (code, message) {
        (Some(code), Some(message)) => Ok(Body::Error {
            code,
            message,
            data,
        }),
        _ => Err(Violation::BadErrorObject),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use simd_json::{Buffers, Tape};

    fn check(json: &str) -> Result<String, Violation> {
        let mut bytes = json.as_bytes().to_vec();
        let mut tape = Tape(Vec::new());
        simd_json::fill_tape(&mut bytes, &mut Buffers::default(), &mut tape).unwrap();
        validate_response(&tape.0).map(|r| match r.body {
            Body::Result(n) => format!("{:?} result {}", r.id, n.len()),
            Body::Error {
                code,
                message,
                data,
            } => format!("{:?} error {code} {message} {}", r.id, data.is_some()),
        })
    }

    #[test]
    fn envelope_rules_for_responses() {
        let ok = |j: &str| check(j).unwrap_or_else(|e| panic!("{j}: {e:?}"));
        assert_eq!(
            ok(r#"{"jsonrpc":"2.0","id":1,"result":19}"#),
            "UInt(1) result 1"
        );
        assert_eq!(
            ok(r#"{"result":[1,[2]],"id":"a","jsonrpc":"2.0","x":{}}"#),
            "Str(\"a\") result 4"
        );
        assert_eq!(
            ok(r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"P"}}"#),
            "Null error -32700 P false"
        );
        assert_eq!(
            ok(r#"{"jsonrpc":"2.0","id":2,"error":{"code":7,"message":"m","data":{"a":1}}}"#),
            "UInt(2) error 7 m true"
        );
        let bad = |j: &str| check(j).expect_err(j);
        use Violation::*;
        for (j, want) in [
            (r#"[1]"#, NotAResponse),
            (r#"{"id":1,"result":1}"#, WrongVersion),
            (r#"{"jsonrpc":"1.0","id":1,"result":1}"#, WrongVersion),
            (r#"{"jsonrpc":"2.0","result":1}"#, BadId),
            (r#"{"jsonrpc":"2.0","id":[1],"result":1}"#, BadId),
            (r#"{"jsonrpc":"2.0","id":1}"#, NeitherResultNorError),
            (
                r#"{"jsonrpc":"2.0","id":1,"result":1,"error":{"code":1,"message":""}}"#,
                BothResultAndError,
            ),
            (
                r#"{"jsonrpc":"2.0","id":1,"id":2,"result":1}"#,
                DuplicateMember,
            ),
            (
                r#"{"jsonrpc":"2.0","id":1,"error":{"code":"x","message":""}}"#,
                BadErrorObject,
            ),
            (
                r#"{"jsonrpc":"2.0","id":1,"error":{"code":1.5,"message":""}}"#,
                BadErrorObject,
            ),
            (
                r#"{"jsonrpc":"2.0","id":1,"error":{"code":1}}"#,
                BadErrorObject,
            ),
            (
                r#"{"jsonrpc":"2.0","id":1,"error":{"code":1e10,"message":""}}"#,
                BadErrorObject,
            ),
            (r#"{"jsonrpc":"2.0","id":1,"error":"x"}"#, BadErrorObject),
        ] {
            assert_eq!(bad(j), want, "{j}");
        }
    }
}
