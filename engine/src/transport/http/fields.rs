//! Header fields: what a request head's fields say ([`Fields`], gathered in one pass),
//! the rules for their values, and the CORS policy the `Origin` field is checked against.

use std::sync::Arc;

use super::HttpError;
use crate::dispatch::context::trim_ows;

/// The CORS policy: which origins' pages may call the server. Built once from
/// [`Config`](crate::Config)'s `cors_origin`s and shared by every connection.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Cors {
    /// `*` was configured: every origin is allowed.
    any: bool,
    /// The allowed origins, byte for byte.
    origins: Vec<Box<[u8]>>,
    /// Per origin, the header lines that echo it: `Access-Control-Allow-Origin: O` and
    /// `Vary: Origin` (the answer depends on the request's `Origin`).
    lines: Vec<Box<[u8]>>,
}

const ALLOW_ANY_ORIGIN: &[u8] = b"Access-Control-Allow-Origin: *\r\n";

impl Cors {
    /// The policy for `origins` (`"*"` allows any); `Ok(None)` when there are none.
    ///
    /// # Errors
    ///
    /// The first origin that is empty or holds anything but visible ASCII (it would
    /// break the header line it is echoed in).
    pub(crate) fn new(origins: &[String]) -> Result<Option<Arc<Self>>, String> {
        if origins.is_empty() {
            return Ok(None);
        }
        let mut cors = Self {
            any: false,
            origins: Vec::new(),
            lines: Vec::new(),
        };
        for o in origins {
            if o.is_empty() || !o.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(o.clone());
            }
            if o == "*" {
                cors.any = true;
                continue;
            }
            cors.origins.push(o.as_bytes().into());
            let line = format!("Access-Control-Allow-Origin: {o}\r\nVary: Origin\r\n");
            cors.lines.push(line.into_bytes().into_boxed_slice());
        }
        Ok(Some(Arc::new(cors)))
    }

    /// What a request with `Origin: value` is allowed.
    pub(super) fn check(&self, value: &[u8]) -> Origin {
        match self.origins.iter().position(|o| **o == *value) {
            Some(i) => Origin::Listed(u16::try_from(i).unwrap_or(u16::MAX)),
            None if self.any => Origin::Any,
            None => Origin::Refused,
        }
    }

    /// The header lines a response to `origin` carries (empty for none).
    pub(super) fn lines(&self, origin: Origin) -> &[u8] {
        match origin {
            Origin::None | Origin::Refused => b"",
            Origin::Any => ALLOW_ANY_ORIGIN,
            Origin::Listed(i) => self.lines.get(usize::from(i)).map_or(&[], |l| &l[..]),
        }
    }
}

/// What the CORS policy says of a request's `Origin`. Small and `Copy`: an index into
/// [`Cors`], so the request's bytes need not be kept until the answer is written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Origin {
    /// No `Origin` header, or CORS is off: no CORS headers in the answer.
    #[default]
    None,
    /// An origin the policy does not allow: no CORS headers (the browser then refuses
    /// the page the answer).
    Refused,
    /// Allowed by `*`: `Access-Control-Allow-Origin: *`.
    Any,
    /// The configured origin at this index: echoed, with `Vary: Origin`.
    Listed(u16),
}

impl Origin {
    /// CORS headers go out for this origin.
    pub(super) fn allowed(self) -> bool {
        matches!(self, Self::Any | Self::Listed(_))
    }
}

/// The head's fields that matter, gathered in one pass.
#[derive(Default)]
pub(super) struct Fields<'h> {
    /// `Host` fields seen.
    pub(super) hosts: u8,
    /// The first `Host`.
    pub(super) host: Option<&'h [u8]>,
    /// The `Content-Length`, if any (every value seen was this one).
    pub(super) length: Option<u64>,
    /// A `Transfer-Encoding` was seen.
    pub(super) te: bool,
    /// How many times `chunked` was named.
    pub(super) te_chunked: u8,
    /// The last coding named was `chunked`.
    pub(super) te_chunked_last: bool,
    /// A coding other than `chunked` was named.
    pub(super) te_other: bool,
    /// `Connection: close`.
    pub(super) close: bool,
    /// `Connection: keep-alive`.
    pub(super) keep_alive: bool,
    /// A Content-Type other than the JSON ones was seen.
    pub(super) not_json: bool,
    /// A Content-Encoding other than `identity` was seen.
    pub(super) encoded: bool,
    /// `Expect: 100-continue`.
    pub(super) expect: bool,
    /// A `traceparent` field was seen (parsed where it is used: most requests have
    /// none, and a flag keeps the decoder's events small).
    pub(super) traced: bool,
    /// The first `RPC-Timeout-Ms`, if seen (`Some(None)`: seen, not a usable budget).
    pub(super) budget: Option<Option<u32>>,
    /// The first `Origin`.
    pub(super) origin: Option<&'h [u8]>,
    /// `Upgrade: websocket`.
    pub(super) websocket: bool,
    /// `Connection: upgrade`.
    pub(super) upgrade: bool,
    /// The first `Sec-WebSocket-Key`.
    pub(super) ws_key: Option<&'h [u8]>,
    /// The first `Sec-WebSocket-Version`.
    pub(super) ws_version: Option<&'h [u8]>,
    /// The first `Authorization` (read by the guard on every request).
    pub(super) authorization: Option<&'h [u8]>,
    /// The first `Idempotency-Key` (read by de-duplication on every call).
    pub(super) idempotency_key: Option<&'h [u8]>,
}

impl<'h> Fields<'h> {
    /// Takes in one field (its value trimmed).
    pub(super) fn add(&mut self, name: &[u8], value: &'h [u8]) -> Result<(), HttpError> {
        let is = |n: &[u8]| is_name(name, n);
        match name.len() {
            4 if is(b"host") => {
                self.hosts = self.hosts.saturating_add(1);
                self.host.get_or_insert(value);
            }
            6 if is(b"expect") => self.expect |= value.eq_ignore_ascii_case(b"100-continue"),
            6 if is(b"origin") => {
                self.origin.get_or_insert(value);
            }
            10 if is(b"connection") => {
                for token in list(value) {
                    self.close |= token.eq_ignore_ascii_case(b"close");
                    self.keep_alive |= token.eq_ignore_ascii_case(b"keep-alive");
                    self.upgrade |= token.eq_ignore_ascii_case(b"upgrade");
                }
            }
            7 if is(b"upgrade") => {
                self.websocket |= list(value).any(|p| p.eq_ignore_ascii_case(b"websocket"));
            }
            11 if is(b"traceparent") => self.traced = true,
            13 if is(b"authorization") => {
                self.authorization.get_or_insert(value);
            }
            15 if is(b"idempotency-key") => {
                self.idempotency_key.get_or_insert(value);
            }
            12 if is(b"content-type") => self.not_json |= !is_json(value),
            16 if is(b"content-encoding") => {
                self.encoded |= list(value).any(|c| !c.eq_ignore_ascii_case(b"identity"));
            }
            14 if is(b"rpc-timeout-ms") => {
                self.budget
                    .get_or_insert(crate::codec::request::budget_from_text(value));
            }
            14 if is(b"content-length") => {
                // RFC 9110 §8.6: a list of identical values may be accepted as one.
                for element in value.split(|&b| b == b',') {
                    let n = parse_length(trim_ows(element))?;
                    match self.length {
                        Some(m) if m != n => return Err(HttpError::ConflictingLengths),
                        _ => self.length = Some(n),
                    }
                }
            }
            17 if is(b"sec-websocket-key") => {
                self.ws_key.get_or_insert(value);
            }
            21 if is(b"sec-websocket-version") => {
                self.ws_version.get_or_insert(value);
            }
            17 if is(b"transfer-encoding") => {
                self.te = true;
                for coding in list(value) {
                    if coding.eq_ignore_ascii_case(b"chunked") {
                        self.te_chunked = self.te_chunked.saturating_add(1);
                        self.te_chunked_last = true;
                    } else {
                        self.te_other = true;
                        self.te_chunked_last = false;
                    }
                }
            }
            _ => {}
        }
        Ok(())
    }
}

/// The path part of a request target: the query string dropped, an absolute-form
/// target (`http://host/p`) reduced to its path.
pub(super) fn request_path(target: &str) -> &str {
    let scheme = |prefix: &str| {
        target
            .as_bytes()
            .get(..prefix.len())
            .is_some_and(|p| p.eq_ignore_ascii_case(prefix.as_bytes()))
    };
    let authority = if scheme("http://") {
        target.get(7..)
    } else if scheme("https://") {
        target.get(8..)
    } else {
        None
    };
    let target = match authority {
        Some(rest) => rest.find('/').map_or("/", |i| &rest[i..]),
        None => target,
    };
    target.split('?').next().unwrap_or(target)
}

/// `application/json`, `application/json-rpc` or `application/jsonrequest`, any case,
/// with any parameters.
fn is_json(value: &[u8]) -> bool {
    let media_type = value.split(|&b| b == b';').next().unwrap_or_default();
    let t = trim_ows(media_type);
    [
        &b"application/json"[..],
        b"application/json-rpc",
        b"application/jsonrequest",
    ]
    .iter()
    .any(|json| t.eq_ignore_ascii_case(json))
}

/// `1*DIGIT` as a u64, or [`HttpError::ContentLength`].
fn parse_length(digits: &[u8]) -> Result<u64, HttpError> {
    if digits.is_empty() {
        return Err(HttpError::ContentLength);
    }
    digits.iter().try_fold(0u64, |n, &b| {
        if !b.is_ascii_digit() {
            return Err(HttpError::ContentLength);
        }
        n.checked_mul(10)
            .and_then(|n| n.checked_add(u64::from(b - b'0')))
            .ok_or(HttpError::ContentLength)
    })
}

/// The non-empty, trimmed elements of a comma-separated field value.
fn list(value: &[u8]) -> impl Iterator<Item = &[u8]> {
    value
        .split(|&b| b == b',')
        .map(trim_ows)
        .filter(|t| !t.is_empty())
}

/// Whether a field's `name` (as httparse accepted it: a token) is `lower`, a name in
/// lower case of letters and `-`, in any case: eight bytes at a time, each byte's
/// `0x20` bit set (which lowers a letter and leaves `-` as it is), where
/// `eq_ignore_ascii_case` folds a byte at a time (~15 instructions a byte, paid for
/// every field of every request). Exact for tokens: only a letter or `-` itself
/// becomes a lowercase letter or `-` so (the other byte that would, CR, is no token
/// character).
#[inline]
fn is_name(name: &[u8], lower: &[u8]) -> bool {
    debug_assert!(lower.iter().all(|b| b.is_ascii_lowercase() || *b == b'-'));
    if name.len() != lower.len() {
        return false;
    }
    let (mut a, mut b) = (name, lower);
    while let (Some((x, rest_a)), Some((y, rest_b))) =
        (a.split_first_chunk::<8>(), b.split_first_chunk::<8>())
    {
        if u64::from_le_bytes(*x) | 0x2020_2020_2020_2020 != u64::from_le_bytes(*y) {
            return false;
        }
        (a, b) = (rest_a, rest_b);
    }
    a.iter().zip(b).all(|(x, y)| x | 0x20 == *y)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The word-wise name test against `eq_ignore_ascii_case` for every name matched
    /// above, each byte replaced by every token character (RFC 9110 `tchar`), and in
    /// every case.
    #[test]
    fn names_compare_as_eq_ignore_ascii_case_on_tokens() {
        let names: [&[u8]; 15] = [
            b"host",
            b"expect",
            b"origin",
            b"connection",
            b"upgrade",
            b"traceparent",
            b"authorization",
            b"idempotency-key",
            b"content-type",
            b"content-encoding",
            b"rpc-timeout-ms",
            b"content-length",
            b"sec-websocket-key",
            b"sec-websocket-version",
            b"transfer-encoding",
        ];
        let tchars: Vec<u8> = (0u8..=127)
            .filter(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(b))
            .collect();
        for lower in names {
            let upper = lower.to_ascii_uppercase();
            assert!(is_name(lower, lower) && is_name(&upper, lower));
            assert!(!is_name(&lower[1..], lower));
            for at in 0..lower.len() {
                for &t in &tchars {
                    for base in [lower.to_vec(), upper.clone()] {
                        let mut name = base;
                        name[at] = t;
                        assert_eq!(
                            is_name(&name, lower),
                            name.eq_ignore_ascii_case(lower),
                            "{:?} as {:?}",
                            String::from_utf8_lossy(&name),
                            String::from_utf8_lossy(lower)
                        );
                    }
                }
            }
        }
    }
}
