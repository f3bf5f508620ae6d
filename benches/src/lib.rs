//! Baseline JSON-RPC implementations the benches compare ringrpc against, and the bench
//! inputs they share.
//!
//! Both baselines serve the same three methods as ringrpc's demo set — `subtract`
//! (`[a, b]` or `{"minuend", "subtrahend"}`), `add` (`[a, b]`) and `echo` (returns the
//! params) — with `i64` arithmetic and `-32602` on overflow, and answer single requests,
//! notifications and batches as JSON-RPC 2.0 requires. They expose the same shape of API
//! as [`ringrpc::Engine::handle`]: one frame in, its reply (if any) appended to `out`,
//! `true` when a reply was written.
//!
//! - [`serde_json_baseline`]: what a careful, ordinary serde_json server does — a borrowed
//!   envelope struct, typed params deserialized from the `&RawValue`, each response
//!   serialized into a fresh `Vec<u8>` and then appended to the output.
//! - [`jsonrpsee_baseline`]: jsonrpsee's own types (`jsonrpsee_types::Request`,
//!   `Params`, `Response`), with the request classification jsonrpsee's server does.

use serde::Deserialize;

/// Index of the first byte of `frame` that is not JSON whitespace.
fn first_byte(frame: &[u8]) -> Option<u8> {
    frame
        .iter()
        .copied()
        .find(|b| !matches!(b, b' ' | b'\t' | b'\n' | b'\r'))
}

/// Whether `frame` is one syntactically valid JSON text (used on error paths only, to
/// tell `-32700` from `-32600`).
fn is_json(frame: &[u8]) -> bool {
    serde_json::from_slice::<serde::de::IgnoredAny>(frame).is_ok()
}

/// `subtract`'s named form; serde_json also accepts a struct as a sequence, so this one
/// type takes both `[42, 23]` and `{"minuend": 42, "subtrahend": 23}`, like ringrpc.
#[derive(Deserialize)]
struct Subtract {
    minuend: i64,
    subtrahend: i64,
}

const OVERFLOW: &str = "the result overflows a 64-bit signed integer";

/// Answers a batch's elements with `single`, one array in `out`; writes nothing (and
/// returns false) when every element was a notification. Shared by both baselines.
fn batch_array(
    calls: &[&serde_json::value::RawValue],
    out: &mut Vec<u8>,
    single: fn(&[u8], &mut Vec<u8>) -> bool,
) -> bool {
    let start = out.len();
    out.push(b'[');
    let mut any = false;
    for call in calls {
        let mark = out.len();
        if any {
            out.push(b',');
        }
        if single(call.get().as_bytes(), out) {
            any = true;
        } else {
            out.truncate(mark);
        }
    }
    if any {
        out.push(b']');
    } else {
        out.truncate(start);
    }
    any
}

/// The serde_json baseline.
pub mod serde_json_baseline {
    use std::borrow::Cow;

    use serde::{Deserialize, Deserializer, Serialize};
    use serde_json::value::RawValue;

    use super::{first_byte, is_json, Subtract, OVERFLOW};

    const PARSE_ERROR: i32 = -32700;
    const INVALID_REQUEST: i32 = -32600;
    const METHOD_NOT_FOUND: i32 = -32601;
    const INVALID_PARAMS: i32 = -32602;

    /// The request envelope, borrowed from the frame. `params` and `id` are kept as raw
    /// JSON; a member that is present (even as `null`) is `Some`, so `"id": null` (a
    /// request) is told apart from a missing id (a notification).
    #[derive(Deserialize)]
    pub struct Request<'a> {
        /// Must be `"2.0"`.
        #[serde(borrow)]
        pub jsonrpc: Cow<'a, str>,
        /// The method name.
        #[serde(borrow)]
        pub method: Cow<'a, str>,
        /// The params, as sent.
        #[serde(default, borrow, deserialize_with = "present")]
        pub params: Option<&'a RawValue>,
        /// The id, as sent; `None` for a notification.
        #[serde(default, borrow, deserialize_with = "present")]
        pub id: Option<&'a RawValue>,
    }

    /// Only the id, to answer an invalid request with it when it is readable.
    #[derive(Deserialize)]
    struct IdOnly<'a> {
        #[serde(default, borrow, deserialize_with = "present")]
        id: Option<&'a RawValue>,
    }

    fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
        <&RawValue>::deserialize(d).map(Some)
    }

    #[derive(Serialize)]
    struct Success<'a, T> {
        jsonrpc: &'static str,
        id: &'a RawValue,
        result: T,
    }

    #[derive(Serialize)]
    struct Failure<'a> {
        jsonrpc: &'static str,
        id: &'a RawValue,
        error: ErrorObject,
    }

    #[derive(Serialize)]
    struct ErrorObject {
        code: i32,
        message: String,
    }

    /// A method's failure: code and message.
    struct Error(i32, String);

    fn invalid_params(e: impl std::fmt::Display) -> Error {
        Error(INVALID_PARAMS, format!("Invalid params: {e}"))
    }

    /// Parses one request envelope from `frame` (the `parse_only` bench uses this).
    pub fn parse(frame: &[u8]) -> serde_json::Result<Request<'_>> {
        serde_json::from_slice(frame)
    }

    /// Handles one frame; appends the reply (if any) to `out` and returns whether one was
    /// written.
    pub fn handle(frame: &[u8], out: &mut Vec<u8>) -> bool {
        if first_byte(frame) == Some(b'[') {
            batch(frame, out)
        } else {
            single(frame, out)
        }
    }

    fn batch(frame: &[u8], out: &mut Vec<u8>) -> bool {
        let calls: Vec<&RawValue> = match serde_json::from_slice(frame) {
            Ok(calls) => calls,
            Err(e) => {
                write_error(out, None, PARSE_ERROR, format!("Parse error: {e}"));
                return true;
            }
        };
        if calls.is_empty() {
            write_error(
                out,
                None,
                INVALID_REQUEST,
                "Invalid Request: empty batch".into(),
            );
            return true;
        }
        super::batch_array(&calls, out, single)
    }

    fn single(frame: &[u8], out: &mut Vec<u8>) -> bool {
        let req: Request<'_> = match parse(frame) {
            Ok(req) => req,
            Err(e) => return not_a_request(frame, &e, out),
        };
        if let Some(id) = req.id {
            if !valid_id(id) {
                write_error(
                    out,
                    None,
                    INVALID_REQUEST,
                    "Invalid Request: `id` must be a string, a number or null".into(),
                );
                return true;
            }
        }
        if req.jsonrpc != "2.0" {
            let msg = "Invalid Request: `jsonrpc` must be exactly \"2.0\"";
            write_error(out, req.id, INVALID_REQUEST, msg.into());
            return true;
        }
        if let Some(p) = req.params {
            if !matches!(p.get().as_bytes().first(), Some(b'[' | b'{')) {
                let msg = "Invalid Request: `params` must be an array or an object";
                write_error(out, req.id, INVALID_REQUEST, msg.into());
                return true;
            }
        }
        match &*req.method {
            "subtract" => reply(req.id, subtract(req.params), out),
            "add" => reply(req.id, add(req.params), out),
            "echo" => reply(req.id, echo(req.params), out),
            other => match req.id {
                Some(id) => {
                    let msg = format!("Method not found: {other}");
                    write_error(out, Some(id), METHOD_NOT_FOUND, msg);
                    true
                }
                None => false,
            },
        }
    }

    /// `frame` did not deserialize as a request: `-32700` if it is not JSON at all,
    /// otherwise `-32600` with its id when that is readable.
    #[cold]
    fn not_a_request(frame: &[u8], e: &serde_json::Error, out: &mut Vec<u8>) -> bool {
        if e.is_syntax() || e.is_eof() || !is_json(frame) {
            write_error(out, None, PARSE_ERROR, format!("Parse error: {e}"));
            return true;
        }
        let id = serde_json::from_slice::<IdOnly<'_>>(frame)
            .ok()
            .and_then(|r| r.id)
            .filter(|id| valid_id(id));
        write_error(out, id, INVALID_REQUEST, format!("Invalid Request: {e}"));
        true
    }

    /// An id must be a string, a number or null.
    fn valid_id(id: &RawValue) -> bool {
        matches!(
            id.get().as_bytes().first(),
            Some(b'"' | b'-' | b'0'..=b'9' | b'n')
        )
    }

    fn params_str(params: Option<&RawValue>) -> &str {
        params.map_or("null", RawValue::get)
    }

    fn subtract(params: Option<&RawValue>) -> Result<i64, Error> {
        let s: Subtract = serde_json::from_str(params_str(params)).map_err(invalid_params)?;
        s.minuend
            .checked_sub(s.subtrahend)
            .ok_or_else(|| invalid_params(OVERFLOW))
    }

    fn add(params: Option<&RawValue>) -> Result<i64, Error> {
        let [a, b]: [i64; 2] = serde_json::from_str(params_str(params)).map_err(invalid_params)?;
        a.checked_add(b).ok_or_else(|| invalid_params(OVERFLOW))
    }

    fn echo(params: Option<&RawValue>) -> Result<serde_json::Value, Error> {
        serde_json::from_str(params_str(params)).map_err(invalid_params)
    }

    /// Serializes the response into a fresh buffer and appends it to `out`; nothing for a
    /// notification.
    fn reply<T: Serialize>(id: Option<&RawValue>, r: Result<T, Error>, out: &mut Vec<u8>) -> bool {
        let Some(id) = id else { return false };
        match r {
            Ok(result) => {
                let resp = Success {
                    jsonrpc: "2.0",
                    id,
                    result,
                };
                match serde_json::to_vec(&resp) {
                    Ok(bytes) => out.extend_from_slice(&bytes),
                    Err(e) => write_error(
                        out,
                        Some(id),
                        -32603,
                        format!("Internal error: result did not serialize: {e}"),
                    ),
                }
            }
            Err(Error(code, message)) => write_error(out, Some(id), code, message),
        }
        true
    }

    #[cold]
    fn write_error(out: &mut Vec<u8>, id: Option<&RawValue>, code: i32, message: String) {
        let resp = Failure {
            jsonrpc: "2.0",
            id: id.unwrap_or(RawValue::NULL),
            error: ErrorObject { code, message },
        };
        // A struct of a string, an integer and raw JSON always serializes.
        let bytes = serde_json::to_vec(&resp).unwrap_or_default();
        out.extend_from_slice(&bytes);
    }
}

/// The jsonrpsee-types baseline.
///
/// Requests are classified the way jsonrpsee's server does it: try
/// `jsonrpsee_types::Request`, then `Notification`, then `InvalidRequest` (for the id).
/// One deliberate difference: jsonrpsee's `prepare_error` answers `-32700` to valid JSON
/// that is not a request object (`1`, `{"foo":"boo"}`); here that is `-32600`, as the
/// specification requires, and `-32700` is kept for text that is not JSON.
///
/// What jsonrpsee-types itself limits (kept as is): ids are `null`, a `u64` or a string
/// (a request with a negative or fractional id parses as a notification and gets no
/// answer); `"params": null` counts as absent; non-structured params (`"params": 3`) are
/// accepted and fail in the method with `-32602`.
pub mod jsonrpsee_baseline {
    use jsonrpsee_types::{
        ErrorCode, ErrorObject, ErrorObjectOwned, Id, InvalidRequest, Notification, Params,
        Request, Response, ResponsePayload,
    };
    use serde::Serialize;
    use serde_json::value::RawValue;

    use super::{first_byte, is_json, Subtract, OVERFLOW};

    fn invalid_params(e: impl std::fmt::Display) -> ErrorObjectOwned {
        ErrorObject::owned(
            ErrorCode::InvalidParams.code(),
            format!("Invalid params: {e}"),
            None::<()>,
        )
    }

    /// Handles one frame; appends the reply (if any) to `out` and returns whether one was
    /// written.
    pub fn handle(frame: &[u8], out: &mut Vec<u8>) -> bool {
        if first_byte(frame) == Some(b'[') {
            batch(frame, out)
        } else {
            single(frame, out)
        }
    }

    fn batch(frame: &[u8], out: &mut Vec<u8>) -> bool {
        let calls: Vec<&RawValue> = match serde_json::from_slice(frame) {
            Ok(calls) => calls,
            Err(_) => {
                write_error(out, Id::Null, ErrorCode::ParseError);
                return true;
            }
        };
        if calls.is_empty() {
            write_error(out, Id::Null, ErrorCode::InvalidRequest);
            return true;
        }
        super::batch_array(&calls, out, single)
    }

    fn single(frame: &[u8], out: &mut Vec<u8>) -> bool {
        if let Ok(req) = serde_json::from_slice::<Request<'_>>(frame) {
            let bytes = call(&req);
            out.extend_from_slice(&bytes);
            true
        } else if serde_json::from_slice::<Notification<'_, Option<&RawValue>>>(frame).is_ok() {
            // jsonrpsee's server does not run notifications; the demo methods are pure.
            false
        } else {
            let (id, code) = prepare_error(frame);
            write_error(out, id, code);
            true
        }
    }

    #[cold]
    fn prepare_error(frame: &[u8]) -> (Id<'_>, ErrorCode) {
        match serde_json::from_slice::<InvalidRequest<'_>>(frame) {
            Ok(InvalidRequest { id }) => (id, ErrorCode::InvalidRequest),
            Err(_) if is_json(frame) => (Id::Null, ErrorCode::InvalidRequest),
            Err(_) => (Id::Null, ErrorCode::ParseError),
        }
    }

    /// Runs the call and serializes its response into a fresh buffer.
    fn call(req: &Request<'_>) -> Vec<u8> {
        let params = req.params();
        let id = req.id();
        match req.method_name() {
            "subtract" => respond(id, subtract(&params)),
            "add" => respond(id, add(&params)),
            "echo" => respond(id, echo(&params)),
            _ => respond::<()>(id, Err(ErrorCode::MethodNotFound.into())),
        }
    }

    fn subtract(params: &Params<'_>) -> Result<i64, ErrorObjectOwned> {
        let s: Subtract = params.parse()?;
        s.minuend
            .checked_sub(s.subtrahend)
            .ok_or_else(|| invalid_params(OVERFLOW))
    }

    fn add(params: &Params<'_>) -> Result<i64, ErrorObjectOwned> {
        let [a, b]: [i64; 2] = params.parse()?;
        a.checked_add(b).ok_or_else(|| invalid_params(OVERFLOW))
    }

    fn echo(params: &Params<'_>) -> Result<serde_json::Value, ErrorObjectOwned> {
        params.parse()
    }

    fn respond<T: Serialize + Clone>(id: Id<'_>, r: Result<T, ErrorObjectOwned>) -> Vec<u8> {
        let payload = match r {
            Ok(v) => ResponsePayload::success(v),
            Err(e) => ResponsePayload::error(e),
        };
        match serde_json::to_vec(&Response::new(payload, id.clone())) {
            Ok(bytes) => bytes,
            Err(_) => serde_json::to_vec(&Response::<()>::new(
                ResponsePayload::error(ErrorCode::InternalError),
                id,
            ))
            .unwrap_or_default(),
        }
    }

    #[cold]
    fn write_error(out: &mut Vec<u8>, id: Id<'_>, code: ErrorCode) {
        let bytes = serde_json::to_vec(&Response::<()>::new(ResponsePayload::error(code), id))
            .unwrap_or_default();
        out.extend_from_slice(&bytes);
    }
}

/// The bench inputs, shared by the benches, the agreement tests and `gen_requests`.
pub mod inputs {
    /// The key file of the guard benches (`guard`, `protect_cost`): `reader` (`r3ader`)
    /// allowed `ping`, `incr` and more, without a rate limit; `metered` (`m3tered`)
    /// with a rate limit it never reaches.
    pub const KEYS: &str = r#"
[[key]]
name  = "reader"
token = "r3ader"
allow = ["get_*", "sum", "ping", "whoami", "incr"]

[[key]]
name  = "metered"
token = "m3tered"
allow = ["get_*", "sum", "ping", "whoami"]
rate  = 1e9
burst = 1000000000
"#;

    /// The specification's subtract call (61 bytes).
    pub const SUBTRACT: &str = r#"{"jsonrpc":"2.0","method":"subtract","params":[42,23],"id":1}"#;

    /// An `echo` of about 1 KB: a nested object with escaped strings (`\n`, `\"`,
    /// `\u00e9`), integers, floats, negative numbers, booleans, null and arrays.
    pub const ECHO_1K: &str = concat!(
        r#"{"jsonrpc":"2.0","method":"echo","params":{"user":{"id":123456789,"#,
        r#""name":"Zo\u00eb \"Z\" M\u00fcller","handle":"zoe_m","#,
        r#""bio":"Line one\nLine two\tTabbed\nCaf\u00e9 owner, \"quoted\" text, back\\slash","#,
        r#""verified":true,"banned":false,"manager":null,"score":98.625,"balance":-1234.5,"#,
        r#""delta":-42,"ratio":0.3333333333333333,"big":9007199254740991,"tiny":1.5e-7},"#,
        r#""tags":["alpha","beta","gamma \u00e9t\u00e9","d\"elta"],"#,
        r#""matrix":[[1,2,3],[-4,-5,-6],[7.5,8.25,-9.125]],"flags":[true,false,null,true],"#,
        r#""history":[{"ts":1700000000,"event":"login","ok":true,"#,
        r#""meta":{"ip":"192.168.0.1","agent":"Mozilla/5.0 (X11; Linux x86_64)\nGecko"}},"#,
        r#"{"ts":1700000060,"event":"purchase","ok":true,"#,
        r#""meta":{"sku":"A-1001","qty":3,"price":19.99,"discount":-2.5}},"#,
        r#"{"ts":1700000120,"event":"logout","ok":false,"#,
        r#""meta":{"reason":"timeout \"idle\"","code":-1}}],"#,
        r#""settings":{"theme":"dark","lang":"fr-FR","#,
        r#""notifications":{"email":true,"sms":false,"push":null},"limits":[10,100,1000,-1]},"#,
        r#""note":"Unicode: \u00e9\u00e8\u00ea \u4e2d\u6587; a \"quoted\" word\nand a new line.","#,
        r#""empty":{"list":[],"object":{},"string":""}},"id":42}"#
    );

    /// Number of calls in [`batch_add`]'s default batch.
    pub const BATCH_LEN: u64 = 16;

    /// A batch of `n` `add` calls with ids `first..first + n`: `{"params":[i, 2i]}`.
    pub fn batch_add(first: u64, n: u64) -> String {
        let calls: Vec<String> = (first..first + n)
            .map(|i| {
                format!(
                    r#"{{"jsonrpc":"2.0","method":"add","params":[{i},{}],"id":{i}}}"#,
                    2 * i
                )
            })
            .collect();
        format!("[{}]", calls.join(","))
    }

    /// The batch bench input: 16 `add` calls, ids 1..=16.
    pub fn batch16() -> String {
        batch_add(1, BATCH_LEN)
    }
}
