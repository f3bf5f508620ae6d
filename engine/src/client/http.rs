//! The client's HTTP/1.1: request heads, and responses decoded off the read buffer
//! (head parsed with httparse into stack storage; `Content-Length`, chunked, or
//! read-until-close bodies).

use bytes::{Buf, BytesMut};

use super::Violation;

/// The longest response head accepted.
const MAX_HEAD_BYTES: usize = 16 * 1024;
/// Headers beyond this many make the head malformed for us.
const MAX_HEADERS: usize = 64;

/// Writes a POST head for a JSON body of `len` bytes.
pub(crate) fn write_head(out: &mut Vec<u8>, path: &str, authority: &str, len: usize) {
    out.extend_from_slice(b"POST ");
    out.extend_from_slice(path.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\nHost: ");
    out.extend_from_slice(authority.as_bytes());
    out.extend_from_slice(
        b"\r\nContent-Type: application/json\r\nAccept: application/json\r\nContent-Length: ",
    );
    out.extend_from_slice(itoa::Buffer::new().format(len).as_bytes());
    out.extend_from_slice(b"\r\n\r\n");
}

/// One complete HTTP response.
#[derive(Debug)]
pub(crate) struct Reply {
    pub(crate) status: u16,
    /// The body (split off the read buffer without a copy unless it was chunked).
    pub(crate) body: BytesMut,
    /// The server will close the connection after this response.
    pub(crate) close: bool,
}

/// How the body is delimited.
enum Length {
    None,
    Exact(usize),
    Chunked,
    UntilClose,
}

/// Takes the next complete response off the front of `buf`; `Ok(None)` means more
/// bytes are needed. `eof`: the peer has closed, so a body delimited by the close is
/// complete. 1xx interim responses are skipped.
///
/// The head is re-parsed on each call until the body is complete: heads are small, and
/// keeping no state makes a partial response impossible to misread.
pub(crate) fn decode(
    buf: &mut BytesMut,
    max_body: usize,
    eof: bool,
) -> Result<Option<Reply>, Violation> {
    loop {
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut resp = httparse::Response::new(&mut headers);
        let head = match resp.parse(buf) {
            Ok(httparse::Status::Complete(n)) => n,
            Ok(httparse::Status::Partial) if buf.len() > MAX_HEAD_BYTES => {
                return Err(Violation::BadHttp("response head too large"))
            }
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(_) => return Err(Violation::BadHttp("malformed response head")),
        };
        let status = resp.code.unwrap_or(0);
        let mut close = resp.version == Some(0);
        let mut length = Length::UntilClose;
        for h in resp.headers.iter() {
            if h.name.eq_ignore_ascii_case("content-length") {
                let n = parse_len(h.value).ok_or(Violation::BadHttp("bad Content-Length"))?;
                match length {
                    Length::Exact(m) if m != n => {
                        return Err(Violation::BadHttp("conflicting Content-Length"))
                    }
                    Length::Chunked => {
                        return Err(Violation::BadHttp("Content-Length and chunked"))
                    }
                    _ => length = Length::Exact(n),
                }
            } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
                let last = h.value.rsplit(|&b| b == b',').next().unwrap_or(b"");
                if !last.trim_ascii().eq_ignore_ascii_case(b"chunked") {
                    return Err(Violation::BadHttp("unsupported transfer coding"));
                }
                if matches!(length, Length::Exact(_)) {
                    return Err(Violation::BadHttp("Content-Length and chunked"));
                }
                length = Length::Chunked;
            } else if h.name.eq_ignore_ascii_case("connection") {
                for token in h.value.split(|&b| b == b',') {
                    let token = token.trim_ascii();
                    if token.eq_ignore_ascii_case(b"close") {
                        close = true;
                    } else if token.eq_ignore_ascii_case(b"keep-alive") {
                        close = false;
                    }
                }
            }
        }
        if (100..200).contains(&status) {
            buf.advance(head);
            continue;
        }
        if status == 204 || status == 304 {
            length = Length::None;
        }
        let body = match length {
            Length::None => {
                buf.advance(head);
                BytesMut::new()
            }
            Length::Exact(n) if n > max_body => return Err(Violation::TooLarge),
            Length::Exact(n) if buf.len() - head < n => return Ok(None),
            Length::Exact(n) => {
                buf.advance(head);
                buf.split_to(n)
            }
            Length::Chunked => match dechunk(&buf[head..], max_body)? {
                // Chunk extensions and trailers are not body: without this bound an
                // endless chunk-size line or endless trailers would grow the buffer
                // without limit. The framing may cost as much again as the body.
                None if buf.len() - head > max_chunked(max_body) => {
                    return Err(Violation::TooLarge)
                }
                None => return Ok(None),
                Some((body, used)) => {
                    buf.advance(head + used);
                    body
                }
            },
            Length::UntilClose if buf.len() - head > max_body => return Err(Violation::TooLarge),
            Length::UntilClose if !eof => return Ok(None),
            Length::UntilClose => {
                buf.advance(head);
                close = true;
                buf.split()
            }
        };
        return Ok(Some(Reply {
            status,
            body,
            close,
        }));
    }
}

/// The most bytes a chunked body may take on the wire, framing included.
fn max_chunked(max_body: usize) -> usize {
    max_body.saturating_mul(2).saturating_add(MAX_HEAD_BYTES)
}

/// A `Content-Length` value: decimal digits only.
fn parse_len(v: &[u8]) -> Option<usize> {
    let v = v.trim_ascii();
    if v.is_empty() || v.len() > 19 || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(v).ok()?.parse().ok()
}

/// De-chunks a complete chunked body at the front of `b` into a new buffer; returns it
/// and the bytes consumed (trailers included), or `None` if the body is incomplete.
fn dechunk(mut b: &[u8], max_body: usize) -> Result<Option<(BytesMut, usize)>, Violation> {
    let total = b.len();
    let mut body = BytesMut::new();
    loop {
        let (used, size) = match httparse::parse_chunk_size(b) {
            Ok(httparse::Status::Complete(c)) => c,
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(_) => return Err(Violation::BadHttp("malformed chunk size")),
        };
        b = &b[used..];
        if size == 0 {
            break;
        }
        let size = usize::try_from(size).map_err(|_| Violation::TooLarge)?;
        if body.len().saturating_add(size) > max_body {
            return Err(Violation::TooLarge);
        }
        if b.len() < size + 2 {
            return Ok(None);
        }
        if &b[size..size + 2] != b"\r\n" {
            return Err(Violation::BadHttp("chunk without CRLF"));
        }
        body.extend_from_slice(&b[..size]);
        b = &b[size + 2..];
    }
    // Trailer lines, up to an empty line.
    loop {
        let Some(nl) = memchr::memchr(b'\n', b) else {
            if b.len() > MAX_HEAD_BYTES {
                return Err(Violation::BadHttp("trailers too large"));
            }
            return Ok(None);
        };
        let line = &b[..nl];
        b = &b[nl + 1..];
        if line.is_empty() || line == b"\r" {
            return Ok(Some((body, total - b.len())));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(input: &[u8], eof: bool) -> Result<Vec<(u16, Vec<u8>, bool)>, Violation> {
        let mut buf = BytesMut::from(input);
        let mut out = Vec::new();
        while let Some(r) = decode(&mut buf, 1 << 20, eof)? {
            out.push((r.status, r.body.to_vec(), r.close));
            if buf.is_empty() {
                break;
            }
        }
        Ok(out)
    }

    #[test]
    fn content_length_chunked_interim_and_close() {
        let two = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}HTTP/1.1 204 No Content\r\n\r\n";
        assert_eq!(
            all(two, false).unwrap(),
            vec![(200, b"{}".to_vec(), false), (204, vec![], false)]
        );
        let chunked = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n3;x=y\r\n[1,\r\n2\r\n2]\r\n0\r\nT: v\r\n\r\n";
        assert_eq!(
            all(chunked, false).unwrap(),
            vec![(200, b"[1,2]".to_vec(), true)]
        );
        let until_close = b"HTTP/1.0 200 OK\r\n\r\n[1]";
        assert_eq!(all(until_close, false).unwrap(), vec![]);
        assert_eq!(
            all(until_close, true).unwrap(),
            vec![(200, b"[1]".to_vec(), true)]
        );
    }

    #[test]
    fn partial_input_waits_for_more_bytes() {
        let full = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n";
        for cut in 0..full.len() {
            let mut buf = BytesMut::from(&full[..cut]);
            assert!(decode(&mut buf, 100, false).unwrap().is_none(), "{cut}");
        }
        let mut buf = BytesMut::from(&full[..]);
        assert_eq!(
            &decode(&mut buf, 100, false).unwrap().unwrap().body[..],
            b"hello"
        );
        assert!(buf.is_empty());
    }

    #[test]
    fn malformed_responses_are_violations() {
        for bad in [
            &b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n"[..],
            b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nab\r\n",
            b"NOT HTTP\r\n\r\n",
        ] {
            assert!(all(bad, false).is_err(), "{}", String::from_utf8_lossy(bad));
        }
        // Framing that never ends is refused too.
        let mut endless = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1;".to_vec();
        endless.resize(endless.len() + max_chunked(100) + 1, b'a');
        let mut buf = BytesMut::from(&endless[..]);
        assert_eq!(
            decode(&mut buf, 100, false).unwrap_err(),
            Violation::TooLarge
        );
        let big = b"HTTP/1.1 200 OK\r\nContent-Length: 101\r\n\r\n";
        let mut buf = BytesMut::from(&big[..]);
        assert_eq!(
            decode(&mut buf, 100, false).unwrap_err(),
            Violation::TooLarge
        );
    }
}
