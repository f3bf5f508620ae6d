//! The client's errors: one enum, a variant per thing a caller can act on.

use std::fmt;
use std::io;
use std::time::Duration;

/// How the server broke the protocol (defined with the response rules it names).
pub use crate::codec::response::Violation;

/// Why a call failed.
///
/// The variants separate what a caller does next: retry elsewhere or later
/// ([`ConnectTimeout`](Error::ConnectTimeout), [`Connect`](Error::Connect),
/// [`WriteTimeout`](Error::WriteTimeout), [`ReadTimeout`](Error::ReadTimeout),
/// [`Closed`](Error::Closed), [`Io`](Error::Io)), report a broken server
/// ([`Protocol`](Error::Protocol)), handle the method's own answer
/// ([`Server`](Error::Server)), or fix the caller's types
/// ([`Encode`](Error::Encode), [`Decode`](Error::Decode)).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The address is not `tcp://host:port`, `unix:///path` or `http://host[:port][/path]`.
    #[error("invalid address: {0}")]
    Address(String),
    /// No connection within the connect timeout.
    #[error("connect timed out")]
    ConnectTimeout,
    /// The connection could not be made (refused, unreachable, no such socket file).
    #[error("connect failed: {0}")]
    Connect(#[source] io::Error),
    /// The request could not be written within the call's timeout (the server stopped
    /// reading). The connection is dropped: part of the request may have been sent.
    #[error("write timed out")]
    WriteTimeout,
    /// The call's deadline passed before its response arrived. A late response is
    /// discarded when it comes.
    #[error("read timed out: no response before the call's deadline")]
    ReadTimeout,
    /// The connection closed (or was dropped after an earlier failure) before the
    /// response arrived.
    #[error("connection closed")]
    Closed,
    /// Another I/O error on the connection.
    #[error("I/O error: {0}")]
    Io(#[source] io::Error),
    /// The server broke the protocol: bad JSON, an unknown id, both or neither of
    /// `result` and `error`, a wrong `jsonrpc`, a bad HTTP response…
    #[error("protocol violation by the server: {0}")]
    Protocol(Violation),
    /// The server answered with a JSON-RPC error object (over HTTP also when it came
    /// with an error status, as `-32040` with 401 or `-32005` with 429; an error status
    /// without one is [`Violation::HttpStatus`]).
    #[error("{0}")]
    Server(ServerError),
    /// The params did not serialize, or not to an array or an object.
    #[error("params: {0}")]
    Encode(String),
    /// The result did not deserialize into the requested type.
    #[error("result: {0}")]
    Decode(String),
    /// The token set with [`Options::token`](super::Options::token) cannot be sent
    /// (over HTTP it is a header value: visible ASCII only).
    #[error("invalid token: {0}")]
    Token(&'static str),
    /// [`Client::subscribe`](super::Client::subscribe) over `http://`: a server cannot
    /// push on it (use `ws://`, `tcp://` or `unix://`).
    #[error("subscriptions need a connection the server can push on (ws://, tcp://, unix://), not http://")]
    PushUnsupported,
}

impl Error {
    /// Whether retrying an idempotent call may help: transport failures, timeouts, a
    /// `-32000 Server busy` answer and a `-32042 In progress` one (a de-duplicating
    /// server still runs the first attempt of a retried call).
    pub fn is_transient(&self) -> bool {
        match self {
            Self::ConnectTimeout
            | Self::Connect(_)
            | Self::WriteTimeout
            | Self::ReadTimeout
            | Self::Closed
            | Self::Io(_) => true,
            Self::Server(e) => {
                e.code == crate::codes::SERVER_BUSY || e.code == crate::codes::IN_PROGRESS
            }
            _ => false,
        }
    }

    /// Whether the error is about the transport (connecting, writing, reading, the
    /// connection itself), as opposed to the server's answer or the caller's types.
    pub fn is_transport(&self) -> bool {
        matches!(
            self,
            Self::Address(_)
                | Self::ConnectTimeout
                | Self::Connect(_)
                | Self::WriteTimeout
                | Self::ReadTimeout
                | Self::Closed
                | Self::Io(_)
        )
    }
}

/// A JSON-RPC error object exactly as the server sent it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerError {
    /// `error.code`.
    pub code: i32,
    /// `error.message`.
    pub message: String,
    /// `error.data` as JSON text (the server's own bytes for arrays and objects), if present.
    pub data: Option<String>,
}

impl ServerError {
    /// The wait the server asks for before trying again: `data.retryAfterMs` (sent by
    /// ringrpc with `-32042 In progress` and `-32005 Limit exceeded`), if `data` is an
    /// object holding a non-negative number there (one too large for a `Duration`
    /// saturates).
    pub fn retry_after(&self) -> Option<Duration> {
        let data: serde_json::Value = serde_json::from_str(self.data.as_deref()?).ok()?;
        let ms = data.as_object()?.get("retryAfterMs")?.as_f64()?;
        (ms >= 0.0).then(|| Duration::try_from_secs_f64(ms / 1000.0).unwrap_or(Duration::MAX))
    }

    /// Why the server refused or failed the call: `data.reason`, which ringrpc sends
    /// with every error it makes itself (`"rate_limited"`, `"deadline_exceeded"`…: see
    /// [`Reason`](crate::Reason) and docs/PROTOCOL.md) and which, unlike the code, means
    /// the same across servers. `None` if `data` is not an object with a string
    /// `reason` (a method's own error, or another server's), or if that string is
    /// written with escapes (no reason is). Parsed on each call; errors are rare.
    pub fn reason(&self) -> Option<&str> {
        #[derive(serde::Deserialize)]
        struct Data<'a> {
            #[serde(borrow, default)]
            reason: Option<&'a str>,
        }
        let data = self.data.as_deref()?;
        // A struct also reads from an array (`["x"]`); only an object has a reason.
        if !data.trim_start().starts_with('{') {
            return None;
        }
        serde_json::from_str::<Data<'_>>(data).ok()?.reason
    }
}

impl fmt::Display for ServerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "server error {}: {}", self.code, self.message)?;
        if let Some(d) = &self.data {
            write!(f, " (data: {d})")?;
        }
        Ok(())
    }
}

impl std::error::Error for ServerError {}

/// What ended a connection, kept so every pending call gets the same error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Failure {
    Closed,
    WriteTimeout,
    Io(io::ErrorKind),
    Protocol(Violation),
}

impl Failure {
    pub(crate) fn error(self) -> Error {
        match self {
            Self::Closed => Error::Closed,
            Self::WriteTimeout => Error::WriteTimeout,
            Self::Io(kind) => Error::Io(kind.into()),
            Self::Protocol(v) => Error::Protocol(v),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_reads_the_hint_in_data() {
        let e = |data: Option<&str>| ServerError {
            code: -32042,
            message: "In progress".into(),
            data: data.map(str::to_owned),
        };
        let hint = |data| e(data).retry_after();
        assert_eq!(
            hint(Some(r#"{"reason":"in_progress","retryAfterMs":100}"#)),
            Some(Duration::from_millis(100))
        );
        assert_eq!(
            hint(Some(r#"{"retryAfterMs":2.5}"#)),
            Some(Duration::from_micros(2500))
        );
        for none in [
            None,
            Some("null"),
            Some("[100]"),
            Some(r#"{"reason":"in_progress"}"#),
            Some(r#"{"retryAfterMs":-1}"#),
            Some(r#"{"retryAfterMs":"100"}"#),
        ] {
            assert_eq!(hint(none), None, "{none:?}");
        }
        assert_eq!(hint(Some(r#"{"retryAfterMs":1e300}"#)), Some(Duration::MAX));
        assert!(Error::Server(e(None)).is_transient());
    }

    #[test]
    fn reason_reads_data_reason() {
        let reason = |data: Option<&str>| {
            ServerError {
                code: -32005,
                message: "Limit exceeded".into(),
                data: data.map(str::to_owned),
            }
            .reason()
            .map(str::to_owned)
        };
        assert_eq!(
            reason(Some(r#"{"reason":"rate_limited","retryAfterMs":5}"#)).as_deref(),
            Some("rate_limited")
        );
        assert_eq!(
            reason(Some(
                r#" {"retryAfterMs":5, "reason" : "in_progress", "x":[1]}"#
            ))
            .as_deref(),
            Some("in_progress")
        );
        for none in [
            None,
            Some("null"),
            Some(r#""rate_limited""#),
            Some(r#"["rate_limited"]"#),
            Some(r#"{"retryAfterMs":5}"#),
            Some(r#"{"reason":7}"#),
            Some(r#"{"reason":null}"#),
            Some(r#"{"reason":"a\u0062"}"#),
            Some("{not json"),
        ] {
            assert_eq!(reason(none), None, "{none:?}");
        }
        // Every reason the engine sends reads back as itself.
        for r in crate::Reason::ALL {
            let data = format!(r#"{{"reason":"{r}"}}"#);
            assert_eq!(reason(Some(&data)).as_deref(), Some(r.as_str()));
        }
    }
}
