//! Error types, one per layer: wire error codes ([`ErrorCode`]), the stable reason every
//! engine-made error carries in `data.reason` ([`Reason`]), the error a handler returns
//! ([`RpcError`]), framing errors ([`FrameError`]) and registration errors
//! ([`RegisterError`]).
//!
//! Every code and reason the engine itself sends is defined here once; docs/PROTOCOL.md
//! lists them in one table, and `engine/tests/error_table.rs` triggers each row.

use std::borrow::Cow;
use std::fmt;

/// `-32700`: the bytes are not valid JSON.
pub const PARSE_ERROR: i32 = -32700;
/// `-32600`: valid JSON, but not a valid Request object (also: a frame over the size limit).
pub const INVALID_REQUEST: i32 = -32600;
/// `-32601`: no method of that name is registered.
pub const METHOD_NOT_FOUND: i32 = -32601;
/// `-32602`: the params do not fit the method.
pub const INVALID_PARAMS: i32 = -32602;
/// `-32603`: the server failed (a handler panicked, or its result could not be serialized).
pub const INTERNAL_ERROR: i32 = -32603;
/// `-32000`: the server is overloaded and did not run the call.
pub const SERVER_BUSY: i32 = -32000;
/// `-32001`: the call did not finish before its deadline.
pub const REQUEST_TIMEOUT: i32 = -32001;
/// `-32002`: the call's response would exceed `max_response_bytes`.
pub const RESPONSE_TOO_LARGE: i32 = -32002;
/// `-32005`: a rate limit was reached (EIP-1474's "limit exceeded"); `data` says
/// `{"reason":"rate_limited","retryAfterMs":N}`.
pub const LIMIT_EXCEEDED: i32 = -32005;
/// `-32040`: the caller is not authenticated (no token, an unknown or expired one).
pub const UNAUTHENTICATED: i32 = -32040;
/// `-32041`: the caller's identity may not call the method.
pub const PERMISSION_DENIED: i32 = -32041;
/// `-32042`: a retried call is still running under its first attempt; `data` carries
/// `retryAfterMs`.
pub const IN_PROGRESS: i32 = -32042;
/// `-32043`: a retried call's key was used before with another method or params.
pub const FINGERPRINT_MISMATCH: i32 = -32043;

/// The lowest code of the range the specification reserves (`-32768..=-32000`).
pub const RESERVED_MIN: i32 = -32768;
/// The highest code of the reserved range.
pub const RESERVED_MAX: i32 = -32000;

/// An application (business) error code: any `i32` outside the reserved range
/// `-32768..=-32000`.
///
/// Because handlers can only build application errors from an `AppCode`, a business
/// failure can never be sent with a protocol code (common mistake 8).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AppCode(i32);

impl AppCode {
    /// Makes an application code, for use in constants.
    ///
    /// # Panics
    ///
    /// If `code` is in the reserved range; in a `const` this is a compile-time error.
    pub const fn new(code: i32) -> Self {
        match Self::try_new(code) {
            Some(c) => c,
            None => panic!("application error codes must lie outside -32768..=-32000"),
        }
    }

    /// Makes an application code, or `None` if `code` is in the reserved range.
    pub const fn try_new(code: i32) -> Option<Self> {
        if code >= RESERVED_MIN && code <= RESERVED_MAX {
            None
        } else {
            Some(Self(code))
        }
    }

    /// The numeric code.
    pub const fn get(self) -> i32 {
        self.0
    }
}

/// Every error code ringrpc can put on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorCode {
    /// [`PARSE_ERROR`]
    ParseError,
    /// [`INVALID_REQUEST`]
    InvalidRequest,
    /// [`METHOD_NOT_FOUND`]
    MethodNotFound,
    /// [`INVALID_PARAMS`]
    InvalidParams,
    /// [`INTERNAL_ERROR`]
    InternalError,
    /// [`SERVER_BUSY`]
    ServerBusy,
    /// [`REQUEST_TIMEOUT`]
    RequestTimeout,
    /// [`RESPONSE_TOO_LARGE`]
    ResponseTooLarge,
    /// [`LIMIT_EXCEEDED`]
    LimitExceeded,
    /// [`UNAUTHENTICATED`]
    Unauthenticated,
    /// [`PERMISSION_DENIED`]
    PermissionDenied,
    /// [`IN_PROGRESS`]
    InProgress,
    /// [`FINGERPRINT_MISMATCH`]
    FingerprintMismatch,
    /// An application-defined code.
    Application(AppCode),
    /// Any other code, relayed as it came (from an upstream server: see
    /// [`RpcError::relay`]), reserved range included.
    Relayed(i32),
}

impl ErrorCode {
    /// The numeric code sent on the wire.
    pub const fn code(self) -> i32 {
        match self {
            Self::ParseError => PARSE_ERROR,
            Self::InvalidRequest => INVALID_REQUEST,
            Self::MethodNotFound => METHOD_NOT_FOUND,
            Self::InvalidParams => INVALID_PARAMS,
            Self::InternalError => INTERNAL_ERROR,
            Self::ServerBusy => SERVER_BUSY,
            Self::RequestTimeout => REQUEST_TIMEOUT,
            Self::ResponseTooLarge => RESPONSE_TOO_LARGE,
            Self::LimitExceeded => LIMIT_EXCEEDED,
            Self::Unauthenticated => UNAUTHENTICATED,
            Self::PermissionDenied => PERMISSION_DENIED,
            Self::InProgress => IN_PROGRESS,
            Self::FingerprintMismatch => FINGERPRINT_MISMATCH,
            Self::Application(c) => c.get(),
            Self::Relayed(c) => c,
        }
    }

    /// The standard short message for the code (applications supply their own).
    pub const fn message(self) -> &'static str {
        match self {
            Self::ParseError => "Parse error",
            Self::InvalidRequest => "Invalid Request",
            Self::MethodNotFound => "Method not found",
            Self::InvalidParams => "Invalid params",
            Self::InternalError => "Internal error",
            Self::ServerBusy => "Server busy",
            Self::RequestTimeout => "Request timed out",
            Self::ResponseTooLarge => "Response too large",
            Self::LimitExceeded => "Limit exceeded",
            Self::Unauthenticated => "Unauthenticated",
            Self::PermissionDenied => "Permission denied",
            Self::InProgress => "In progress",
            Self::FingerprintMismatch => "Fingerprint mismatch",
            Self::Application(_) => "Application error",
            Self::Relayed(_) => "Relayed error",
        }
    }
}

/// Why the engine itself refused or failed a call: sent as `data.reason` with every
/// error the engine writes, so clients can tell the cases apart without relying on
/// numeric codes, which collide across implementations (-32000…-32099 mean different
/// things in geth, jsonrpsee and EIP-1474).
///
/// One reason per meaning, and more than one per code only where a client would act
/// differently (`-32600`: fix the request, split the batch, or send less; `-32000`: back
/// off, or the de-duplication store is down). The strings are stable: a reason may be
/// added, never renamed. Errors a method returns keep their own `data` (a method's
/// [`RpcError::invalid_params`] is the exception: it is sent with reason
/// `invalid_params` unless the method attaches data).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Reason {
    /// `-32700`: not valid JSON, or nested deeper than `max_depth`.
    ParseError,
    /// `-32600`: valid JSON but not a valid Request object, or an empty batch.
    InvalidRequest,
    /// `-32600`: a frame (line, or HTTP body) over `max_request_bytes`.
    RequestTooLarge,
    /// `-32600`: a batch longer than `max_batch_len`; none of it ran.
    BatchTooLarge,
    /// `-32601`: no method of that name.
    MethodNotFound,
    /// `-32602`: the params do not fit the method.
    InvalidParams,
    /// `-32603`: the method panicked, its result did not serialize, or it never answered.
    InternalError,
    /// `-32000`: the worker queue was full; the call did not run.
    ServerBusy,
    /// `-32000`: the de-duplication store cannot be reached (`--dedup-fail closed`).
    DedupUnavailable,
    /// `-32001`: no answer within `request_timeout`.
    DeadlineExceeded,
    /// `-32002`: the reply would pass `max_response_bytes`.
    ResponseTooLarge,
    /// `-32005`: a rate limit refused the call; `data.retryAfterMs` says when to retry.
    RateLimited,
    /// `-32040`: no identity, or an unknown or expired token.
    Unauthenticated,
    /// `-32041`: the identity may not call the method.
    PermissionDenied,
    /// `-32042`: a retried call still runs under its first attempt; `data.retryAfterMs`
    /// says when to retry.
    InProgress,
    /// `-32043`: a de-duplication key was used before with another method or params.
    FingerprintMismatch,
    /// `-32000`: a proxy could not reach an upstream for the call, or lost the
    /// connection before the answer came (see docs/PROXY.md for what is retried).
    UpstreamUnavailable,
    /// `-32001`: a proxy's upstream did not answer within the proxy's upstream timeout.
    UpstreamTimeout,
    /// `-32601`: a subscription method called over a transport that cannot push
    /// notifications (HTTP, the no-I/O API).
    PushUnsupported,
    /// `-32005`: the connection holds as many subscriptions of that method as it may.
    SubscriptionLimit,
}

impl Reason {
    /// Every reason, in the order of docs/PROTOCOL.md's table.
    pub const ALL: &'static [Reason] = &[
        Self::ParseError,
        Self::InvalidRequest,
        Self::RequestTooLarge,
        Self::BatchTooLarge,
        Self::MethodNotFound,
        Self::InvalidParams,
        Self::InternalError,
        Self::ServerBusy,
        Self::DedupUnavailable,
        Self::DeadlineExceeded,
        Self::ResponseTooLarge,
        Self::RateLimited,
        Self::Unauthenticated,
        Self::PermissionDenied,
        Self::InProgress,
        Self::FingerprintMismatch,
        Self::UpstreamUnavailable,
        Self::UpstreamTimeout,
        Self::PushUnsupported,
        Self::SubscriptionLimit,
    ];

    /// The snake_case string sent as `data.reason`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::ParseError => "parse_error",
            Self::InvalidRequest => "invalid_request",
            Self::RequestTooLarge => "request_too_large",
            Self::BatchTooLarge => "batch_too_large",
            Self::MethodNotFound => "method_not_found",
            Self::InvalidParams => "invalid_params",
            Self::InternalError => "internal_error",
            Self::ServerBusy => "server_busy",
            Self::DedupUnavailable => "dedup_unavailable",
            Self::DeadlineExceeded => "deadline_exceeded",
            Self::ResponseTooLarge => "response_too_large",
            Self::RateLimited => "rate_limited",
            Self::Unauthenticated => "unauthenticated",
            Self::PermissionDenied => "permission_denied",
            Self::InProgress => "in_progress",
            Self::FingerprintMismatch => "fingerprint_mismatch",
            Self::UpstreamUnavailable => "upstream_unavailable",
            Self::UpstreamTimeout => "upstream_timeout",
            Self::PushUnsupported => "push_unsupported",
            Self::SubscriptionLimit => "subscription_limit",
        }
    }

    /// The reason named `s` (what a client reads from `data.reason`), if it is one.
    pub fn from_name(s: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|r| r.as_str() == s)
    }

    /// The code sent with this reason.
    pub const fn code(self) -> ErrorCode {
        match self {
            Self::ParseError => ErrorCode::ParseError,
            Self::InvalidRequest | Self::RequestTooLarge | Self::BatchTooLarge => {
                ErrorCode::InvalidRequest
            }
            Self::MethodNotFound | Self::PushUnsupported => ErrorCode::MethodNotFound,
            Self::InvalidParams => ErrorCode::InvalidParams,
            Self::InternalError => ErrorCode::InternalError,
            Self::ServerBusy | Self::DedupUnavailable | Self::UpstreamUnavailable => {
                ErrorCode::ServerBusy
            }
            Self::DeadlineExceeded | Self::UpstreamTimeout => ErrorCode::RequestTimeout,
            Self::ResponseTooLarge => ErrorCode::ResponseTooLarge,
            Self::RateLimited | Self::SubscriptionLimit => ErrorCode::LimitExceeded,
            Self::Unauthenticated => ErrorCode::Unauthenticated,
            Self::PermissionDenied => ErrorCode::PermissionDenied,
            Self::InProgress => ErrorCode::InProgress,
            Self::FingerprintMismatch => ErrorCode::FingerprintMismatch,
        }
    }

    /// Whether `data` carries `retryAfterMs` with this reason.
    pub const fn has_retry_after(self) -> bool {
        matches!(self, Self::RateLimited | Self::InProgress)
    }

    /// `{"reason":"…"}`, as static text: written without formatting or allocating.
    pub(crate) const fn data_json(self) -> &'static str {
        match self {
            Self::ParseError => r#"{"reason":"parse_error"}"#,
            Self::InvalidRequest => r#"{"reason":"invalid_request"}"#,
            Self::RequestTooLarge => r#"{"reason":"request_too_large"}"#,
            Self::BatchTooLarge => r#"{"reason":"batch_too_large"}"#,
            Self::MethodNotFound => r#"{"reason":"method_not_found"}"#,
            Self::InvalidParams => r#"{"reason":"invalid_params"}"#,
            Self::InternalError => r#"{"reason":"internal_error"}"#,
            Self::ServerBusy => r#"{"reason":"server_busy"}"#,
            Self::DedupUnavailable => r#"{"reason":"dedup_unavailable"}"#,
            Self::DeadlineExceeded => r#"{"reason":"deadline_exceeded"}"#,
            Self::ResponseTooLarge => r#"{"reason":"response_too_large"}"#,
            Self::RateLimited => r#"{"reason":"rate_limited"}"#,
            Self::Unauthenticated => r#"{"reason":"unauthenticated"}"#,
            Self::PermissionDenied => r#"{"reason":"permission_denied"}"#,
            Self::InProgress => r#"{"reason":"in_progress"}"#,
            Self::FingerprintMismatch => r#"{"reason":"fingerprint_mismatch"}"#,
            Self::UpstreamUnavailable => r#"{"reason":"upstream_unavailable"}"#,
            Self::UpstreamTimeout => r#"{"reason":"upstream_timeout"}"#,
            Self::PushUnsupported => r#"{"reason":"push_unsupported"}"#,
            Self::SubscriptionLimit => r#"{"reason":"subscription_limit"}"#,
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A JSON-RPC error object as a handler returns it: code, message and optional `data`.
///
/// Handlers can produce [`RpcError::invalid_params`] and [`RpcError::application`]
/// errors; the protocol codes are produced by the engine alone.
#[derive(Clone, Debug, PartialEq)]
pub struct RpcError {
    code: ErrorCode,
    message: Cow<'static, str>,
    /// Serialized JSON text of `data`, if any.
    data: Option<Box<str>>,
    /// The engine's reason, sent as `data` (static text) when no `data` is attached.
    reason: Option<Reason>,
}

impl RpcError {
    /// An error the engine makes, with `reason`'s code.
    pub(crate) fn new(reason: Reason, message: impl Into<Cow<'static, str>>) -> Self {
        Self {
            code: reason.code(),
            message: message.into(),
            data: None,
            reason: Some(reason),
        }
    }

    /// `-32602 Invalid params` with a message saying what is wrong; sent with
    /// `"data":{"reason":"invalid_params"}` unless data is attached.
    #[cold]
    pub fn invalid_params(message: impl fmt::Display) -> Self {
        Self::new(Reason::InvalidParams, format!("Invalid params: {message}"))
    }

    /// An application (business) error with its own code.
    ///
    /// ```
    /// use ringrpc::{AppCode, RpcError};
    /// const USER_NOT_FOUND: AppCode = AppCode::new(1001);
    /// let e = RpcError::application(USER_NOT_FOUND, "User not found");
    /// assert_eq!(e.code(), 1001);
    /// ```
    #[cold]
    pub fn application(code: AppCode, message: impl Into<Cow<'static, str>>) -> Self {
        Self {
            code: ErrorCode::Application(code),
            message: message.into(),
            data: None,
            reason: None,
        }
    }

    /// An error object relayed as another server sent it (what a proxy needs): any
    /// `code`, the reserved range included (the protocol codes map to their own
    /// [`ErrorCode`]s), the message, and `data` as raw JSON text passed through
    /// unchanged. The caller vouches that `data` is one valid JSON value.
    ///
    /// ```
    /// use ringrpc::RpcError;
    /// let e = RpcError::relay(-32601, "Method not found", Some(r#"{"upstream":"a"}"#));
    /// assert_eq!((e.code(), e.data()), (-32601, Some(r#"{"upstream":"a"}"#)));
    /// assert_eq!(RpcError::relay(-32050, "Upstream specific", None).code(), -32050);
    /// ```
    #[cold]
    pub fn relay(code: i32, message: impl Into<Cow<'static, str>>, data: Option<&str>) -> Self {
        let known = [
            ErrorCode::ParseError,
            ErrorCode::InvalidRequest,
            ErrorCode::MethodNotFound,
            ErrorCode::InvalidParams,
            ErrorCode::InternalError,
            ErrorCode::ServerBusy,
            ErrorCode::RequestTimeout,
            ErrorCode::ResponseTooLarge,
            ErrorCode::LimitExceeded,
            ErrorCode::Unauthenticated,
            ErrorCode::PermissionDenied,
            ErrorCode::InProgress,
            ErrorCode::FingerprintMismatch,
        ];
        let code = match known.into_iter().find(|k| k.code() == code) {
            Some(k) => k,
            None => match AppCode::try_new(code) {
                Some(app) => ErrorCode::Application(app),
                None => ErrorCode::Relayed(code),
            },
        };
        Self {
            code,
            message: message.into(),
            data: data.map(Into::into),
            reason: None,
        }
    }

    /// Attaches `data`, serialized now; it is sent in place of an engine reason. If
    /// `data` cannot be serialized the error keeps no data (a handler's error path must
    /// not fail).
    #[cold]
    pub fn with_data<T: serde::Serialize + ?Sized>(mut self, data: &T) -> Self {
        self.data = serde_json::to_string(data).ok().map(String::into_boxed_str);
        self
    }

    /// The numeric code.
    pub fn code(&self) -> i32 {
        self.code.code()
    }

    /// The code as an [`ErrorCode`].
    pub fn error_code(&self) -> ErrorCode {
        self.code
    }

    /// The message.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The JSON text of `data` as it is sent: attached data, else the engine's
    /// `{"reason":"…"}`, else none.
    pub fn data(&self) -> Option<&str> {
        self.data
            .as_deref()
            .or_else(|| self.reason.map(Reason::data_json))
    }

    /// The engine's reason for this error (`None` for application and relayed errors).
    /// Attached `data`, if any, is sent in its place.
    pub fn reason(&self) -> Option<Reason> {
        self.reason
    }
}

impl fmt::Display for RpcError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.message, self.code())
    }
}

impl std::error::Error for RpcError {}

/// A framing error: the peer sent something the framer will not buffer.
///
/// The framer recovers by itself; the caller answers the error (see
/// [`Engine::write_frame_error`](crate::Engine::write_frame_error)) and goes on decoding.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FrameError {
    /// A frame was longer than `limit` bytes; it is being discarded up to its end.
    #[error("request exceeds max_request_bytes ({limit} bytes)")]
    TooLarge {
        /// The limit in force.
        limit: usize,
    },
}

/// Why a method could not be registered.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RegisterError {
    /// The name is already registered.
    #[error("method `{0}` is already registered")]
    Duplicate(String),
    /// Names beginning with `rpc.` are reserved by the specification.
    #[error("method `{0}` uses the reserved `rpc.` prefix")]
    Reserved(String),
    /// A setting for a method that is not registered.
    #[error("method `{0}` is not registered")]
    Unknown(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn app_codes_exclude_the_reserved_range() {
        for c in [RESERVED_MIN, -32603, -32600, RESERVED_MAX] {
            assert!(AppCode::try_new(c).is_none(), "{c}");
        }
        for c in [
            RESERVED_MIN - 1,
            RESERVED_MAX + 1,
            0,
            1001,
            i32::MIN,
            i32::MAX,
        ] {
            assert_eq!(AppCode::try_new(c).map(AppCode::get), Some(c));
        }
    }

    #[test]
    fn codes_and_messages() {
        assert_eq!(ErrorCode::ParseError.code(), -32700);
        assert_eq!(ErrorCode::InvalidRequest.message(), "Invalid Request");
        let e = RpcError::invalid_params("missing field `a`");
        assert_eq!(e.code(), INVALID_PARAMS);
        assert_eq!(e.message(), "Invalid params: missing field `a`");
    }

    /// `ALL` holds every reason once (the match fails to compile when one is added, so
    /// whoever adds it also places it), and each reason's strings agree.
    #[test]
    fn the_reason_table_is_whole_and_consistent() {
        let position = |r: Reason| match r {
            Reason::ParseError => 0,
            Reason::InvalidRequest => 1,
            Reason::RequestTooLarge => 2,
            Reason::BatchTooLarge => 3,
            Reason::MethodNotFound => 4,
            Reason::InvalidParams => 5,
            Reason::InternalError => 6,
            Reason::ServerBusy => 7,
            Reason::DedupUnavailable => 8,
            Reason::DeadlineExceeded => 9,
            Reason::ResponseTooLarge => 10,
            Reason::RateLimited => 11,
            Reason::Unauthenticated => 12,
            Reason::PermissionDenied => 13,
            Reason::InProgress => 14,
            Reason::FingerprintMismatch => 15,
            Reason::UpstreamUnavailable => 16,
            Reason::UpstreamTimeout => 17,
            Reason::PushUnsupported => 18,
            Reason::SubscriptionLimit => 19,
        };
        assert_eq!(Reason::ALL.len(), 20);
        let mut names = std::collections::HashSet::new();
        for (i, &r) in Reason::ALL.iter().enumerate() {
            assert_eq!(position(r), i, "{r:?}");
            let name = r.as_str();
            assert!(names.insert(name), "{name} twice");
            assert!(
                name.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'),
                "{name} is not snake_case"
            );
            assert_eq!(r.data_json(), format!(r#"{{"reason":"{name}"}}"#));
            assert_eq!(Reason::from_name(name), Some(r));
            assert_eq!(r.to_string(), name);
            let code = r.code().code();
            assert!((RESERVED_MIN..=RESERVED_MAX).contains(&code), "{r:?}");
        }
        assert_eq!(Reason::from_name("timeout"), None);
    }

    #[test]
    fn engine_errors_carry_their_reason_as_data() {
        let e = RpcError::invalid_params("x");
        assert_eq!(e.reason(), Some(Reason::InvalidParams));
        assert_eq!(e.data(), Some(r#"{"reason":"invalid_params"}"#));
        // A method's own data is sent instead.
        let e = RpcError::invalid_params("x").with_data(&[1, 2]);
        assert_eq!(e.data(), Some("[1,2]"));
        // Application and relayed errors get no reason.
        let app = RpcError::application(AppCode::new(7), "m");
        assert_eq!((app.reason(), app.data()), (None, None));
        let relayed = RpcError::relay(-32601, "Method not found", None);
        assert_eq!((relayed.reason(), relayed.data()), (None, None));
    }
}
