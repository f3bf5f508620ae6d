//! The client's HTTP/1.1: request heads, and responses decoded off the read buffer
//! (head parsed with httparse into stack storage; `Content-Length`, chunked, or
//! read-until-close bodies), resuming across reads. Chunked bodies go through the
//! server's de-chunker (`transport/http/chunked.rs`) with its lenient rules.

use bytes::{Buf, BytesMut};

use super::Violation;
use crate::transport::http::chunked::{ChunkError, ChunkLimits, Chunked, Strictness};

/// The longest response head accepted.
pub(crate) const MAX_HEAD_BYTES: usize = 16 * 1024;
/// Headers beyond this many make the head malformed for us.
const MAX_HEADERS: usize = 64;

/// The request's own header fields, beyond the fixed ones.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Extra<'a> {
    /// `Authorization: Bearer <token>` (checked to be visible ASCII at connect).
    pub(crate) bearer: Option<&'a str>,
    /// `Idempotency-Key: <prefix>-<id>`: the client's random hex prefix and the call's
    /// id, the same on every attempt of the call.
    pub(crate) idempotency_key: Option<(&'a [u8], u64)>,
    /// `RPC-Timeout-Ms: <ms>`: what is left of the call's time when it is written.
    pub(crate) timeout_ms: Option<u64>,
}

/// Writes a POST head for a JSON body of `len` bytes.
pub(crate) fn write_head(
    out: &mut Vec<u8>,
    path: &str,
    authority: &str,
    extra: Extra<'_>,
    len: usize,
) {
    out.extend_from_slice(b"POST ");
    out.extend_from_slice(path.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\nHost: ");
    out.extend_from_slice(authority.as_bytes());
    if let Some(token) = extra.bearer {
        out.extend_from_slice(b"\r\nAuthorization: Bearer ");
        out.extend_from_slice(token.as_bytes());
    }
    if let Some((prefix, id)) = extra.idempotency_key {
        out.extend_from_slice(b"\r\nIdempotency-Key: ");
        out.extend_from_slice(prefix);
        out.push(b'-');
        out.extend_from_slice(itoa::Buffer::new().format(id).as_bytes());
    }
    if let Some(ms) = extra.timeout_ms {
        out.extend_from_slice(b"\r\nRPC-Timeout-Ms: ");
        out.extend_from_slice(itoa::Buffer::new().format(ms).as_bytes());
    }
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

/// Decodes responses off the front of the read buffer, resuming where the last call
/// stopped: a head is parsed once, and a chunked body is de-chunked as its bytes
/// arrive, so a large response arriving in many reads costs time linear in its size
/// and no allocation.
#[derive(Default)]
pub(crate) struct Decoder {
    /// The response whose head has been taken off the buffer and whose body is not
    /// complete yet.
    partial: Option<Partial>,
}

struct Partial {
    status: u16,
    close: bool,
    body: Length,
}

/// How the body is delimited.
enum Length {
    Exact(usize),
    Chunked(Chunked),
    UntilClose,
}

/// What a complete head says.
enum Head {
    /// A 1xx interim response, skipped.
    Interim,
    Final(Partial),
}

impl Decoder {
    /// Takes the next complete response off the front of `buf`; `Ok(None)` means more
    /// bytes are needed (the progress made is kept). `eof`: the peer has closed, so a
    /// body delimited by the close is complete. 1xx interim responses are skipped.
    pub(crate) fn decode(
        &mut self,
        buf: &mut BytesMut,
        max_body: usize,
        eof: bool,
    ) -> Result<Option<Reply>, Violation> {
        let p = loop {
            if let Some(p) = self.partial.as_mut() {
                break p;
            }
            match head(buf, max_body)? {
                None => return Ok(None),
                Some(Head::Interim) => {}
                Some(Head::Final(p)) => self.partial = Some(p),
            }
        };
        let body = match &mut p.body {
            Length::Exact(n) if buf.len() < *n => return Ok(None),
            Length::Exact(n) => buf.split_to(*n),
            Length::Chunked(c) => {
                let limits = ChunkLimits {
                    max_body,
                    max_line: MAX_HEAD_BYTES,
                    max_trailers: MAX_HEAD_BYTES,
                    // Chunk extensions and trailers are not body: without this bound
                    // endless framing would be read without limit. The framing may cost
                    // as much again as the body.
                    max_wire: max_chunked(max_body),
                };
                match c.decode(buf, &limits).map_err(violation)? {
                    Some(body) => body,
                    None => return Ok(None),
                }
            }
            Length::UntilClose if buf.len() > max_body => return Err(Violation::TooLarge),
            Length::UntilClose if !eof => return Ok(None),
            Length::UntilClose => {
                p.close = true;
                buf.split()
            }
        };
        let Some(p) = self.partial.take() else {
            // Never: `p` borrowed it just above.
            return Err(Violation::MissingResponse);
        };
        Ok(Some(Reply {
            status: p.status,
            body,
            close: p.close,
        }))
    }
}

/// Parses a response head at the front of `buf` and takes it off; `Ok(None)` when it
/// is not complete yet (heads are small: re-parsing a partial one is cheap).
fn head(buf: &mut BytesMut, max_body: usize) -> Result<Option<Head>, Violation> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut resp = httparse::Response::new(&mut headers);
    // The bound applies to a complete head as to a partial one, so the verdict does
    // not depend on how the bytes were split into reads.
    let head = match resp.parse(buf) {
        Ok(httparse::Status::Complete(n)) if n <= MAX_HEAD_BYTES => n,
        Ok(httparse::Status::Partial) if buf.len() <= MAX_HEAD_BYTES => return Ok(None),
        Ok(_) => return Err(Violation::BadHttp("response head too large")),
        Err(_) => return Err(Violation::BadHttp("malformed response head")),
    };
    let status = resp.code.unwrap_or(0);
    let mut close = resp.version == Some(0);
    let mut exact = None;
    let mut chunked = false;
    for h in resp.headers.iter() {
        if h.name.eq_ignore_ascii_case("content-length") {
            let n = parse_len(h.value).ok_or(Violation::BadHttp("bad Content-Length"))?;
            if exact.is_some_and(|m| m != n) {
                return Err(Violation::BadHttp("conflicting Content-Length"));
            }
            if chunked {
                return Err(Violation::BadHttp("Content-Length and chunked"));
            }
            exact = Some(n);
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            let last = h.value.rsplit(|&b| b == b',').next().unwrap_or(b"");
            if !last.trim_ascii().eq_ignore_ascii_case(b"chunked") {
                return Err(Violation::BadHttp("unsupported transfer coding"));
            }
            if exact.is_some() {
                return Err(Violation::BadHttp("Content-Length and chunked"));
            }
            chunked = true;
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
    buf.advance(head);
    if (100..200).contains(&status) {
        return Ok(Some(Head::Interim));
    }
    let body = match (exact, chunked) {
        _ if status == 204 || status == 304 => Length::Exact(0),
        (Some(n), _) if n > max_body => return Err(Violation::TooLarge),
        (Some(n), _) => Length::Exact(n),
        (None, true) => Length::Chunked(Chunked::new(Strictness::Lenient)),
        (None, false) => Length::UntilClose,
    };
    Ok(Some(Head::Final(Partial {
        status,
        close,
        body,
    })))
}

/// What a chunked body's refusal is to the client.
fn violation(e: ChunkError) -> Violation {
    match e {
        ChunkError::Size => Violation::BadHttp("malformed chunk size"),
        ChunkError::DataEnd => Violation::BadHttp("chunk without CRLF"),
        ChunkError::TrailersTooLarge => Violation::BadHttp("trailers too large"),
        // Not reached: a lenient trailer line may hold any byte.
        ChunkError::Trailer => Violation::BadHttp("malformed trailer"),
        ChunkError::LineTooLong | ChunkError::BodyTooLarge | ChunkError::WireTooLarge => {
            Violation::TooLarge
        }
    }
}

/// The most bytes a chunked body may take on the wire, framing included.
pub(crate) fn max_chunked(max_body: usize) -> usize {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn all(input: &[u8], eof: bool) -> Result<Vec<(u16, Vec<u8>, bool)>, Violation> {
        let mut buf = BytesMut::from(input);
        let mut out = Vec::new();
        let mut d = Decoder::default();
        while let Some(r) = d.decode(&mut buf, 1 << 20, eof)? {
            out.push((r.status, r.body.to_vec(), r.close));
            if buf.is_empty() {
                break;
            }
        }
        Ok(out)
    }

    #[test]
    fn heads_carry_the_token_and_the_idempotency_key() {
        let mut out = Vec::new();
        write_head(&mut out, "/rpc", "h:1", Extra::default(), 7);
        assert_eq!(
            out,
            b"POST /rpc HTTP/1.1\r\nHost: h:1\r\nContent-Type: application/json\r\nAccept: application/json\r\nContent-Length: 7\r\n\r\n"
        );
        out.clear();
        let extra = Extra {
            bearer: Some("t0k"),
            idempotency_key: Some((b"00ff", 4294967296)),
            timeout_ms: Some(2500),
        };
        write_head(&mut out, "/", "h:1", extra, 2);
        let head = String::from_utf8(out).unwrap();
        assert!(
            head.starts_with("POST / HTTP/1.1\r\nHost: h:1\r\nAuthorization: Bearer t0k\r\nIdempotency-Key: 00ff-4294967296\r\nRPC-Timeout-Ms: 2500\r\nContent-Type"),
            "{head}"
        );
        assert!(head.ends_with("Content-Length: 2\r\n\r\n"), "{head}");
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
            let mut d = Decoder::default();
            assert!(d.decode(&mut buf, 100, false).unwrap().is_none(), "{cut}");
        }
        let mut buf = BytesMut::from(&full[..]);
        assert_eq!(
            &Decoder::default()
                .decode(&mut buf, 100, false)
                .unwrap()
                .unwrap()
                .body[..],
            b"hello"
        );
        assert!(buf.is_empty());
    }

    /// Feeds `input` in pieces of `step` bytes to one decoder, as reads would.
    fn fed(input: &[u8], cuts: &[usize]) -> Vec<(u16, Vec<u8>, bool)> {
        let mut d = Decoder::default();
        let mut buf = BytesMut::new();
        let mut out = Vec::new();
        let mut from = 0;
        for &to in cuts.iter().chain([&input.len()]) {
            buf.extend_from_slice(&input[from..to]);
            from = to;
            while let Some(r) = d.decode(&mut buf, 1 << 20, false).unwrap() {
                out.push((r.status, r.body.to_vec(), r.close));
            }
        }
        assert!(buf.is_empty());
        out
    }

    /// The decoder keeps its progress between reads: two pipelined responses (one
    /// chunked with an extension and trailers) split at every point, and fed a byte at
    /// a time, decode as when they arrive whole.
    #[test]
    fn decoding_resumes_at_every_split_point() {
        let input = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3;x=y\r\n[1,\r\n1\r\n2\r\nB\r\n,3,4,5,6,7]\r\n0\r\nT: v\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}";
        let whole = fed(input, &[]);
        assert_eq!(
            whole,
            vec![
                (200, b"[1,2,3,4,5,6,7]".to_vec(), false),
                (200, b"{}".to_vec(), false)
            ]
        );
        for cut in 0..input.len() {
            assert_eq!(fed(input, &[cut]), whole, "{cut}");
        }
        let bytes: Vec<usize> = (1..input.len()).collect();
        assert_eq!(fed(input, &bytes), whole);
    }

    /// A large chunked body in many reads: each wire byte is consumed once (the
    /// decoded prefix is never decoded again), and nothing is allocated beyond the
    /// read buffer.
    #[test]
    fn a_chunked_body_in_many_reads_is_decoded_once() {
        let mut input = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
        let mut body = Vec::new();
        for i in 0..4096u32 {
            let chunk = format!("{i:08}").repeat(16);
            input.extend_from_slice(format!("{:x}\r\n{chunk}\r\n", chunk.len()).as_bytes());
            body.extend_from_slice(chunk.as_bytes());
        }
        input.extend_from_slice(b"0\r\n\r\n");
        let mut d = Decoder::default();
        let mut buf = BytesMut::with_capacity(input.len());
        let mut got = None;
        for piece in input.chunks(1000) {
            buf.extend_from_slice(piece);
            if let Some(r) = d.decode(&mut buf, 1 << 20, false).unwrap() {
                got = Some(r.body);
            } else if let Some(Partial {
                body: Length::Chunked(c),
                ..
            }) = &d.partial
            {
                // All that has arrived is consumed: resuming starts at the new bytes.
                assert!(buf.len() - c.pos < 200, "{} {}", buf.len(), c.pos);
            }
        }
        assert_eq!(got.as_deref(), Some(&body[..]));
    }

    /// The head and chunk-framing bounds give the same verdict whether the bytes
    /// arrive in one read or many (found by reading the `client` fuzz target's
    /// split-invariance check against the bounds, which the fuzzer's 4 KiB inputs
    /// cannot reach).
    #[test]
    fn size_bounds_do_not_depend_on_the_reads() {
        let verdicts = |input: &[u8], max_body: usize| {
            [input.len(), 1000, 1].map(|step| {
                let mut d = Decoder::default();
                let mut buf = BytesMut::new();
                for piece in input.chunks(step) {
                    buf.extend_from_slice(piece);
                    match d.decode(&mut buf, max_body, false) {
                        Ok(None) => {}
                        other => return other.map(|r| r.map(|r| r.body.len())),
                    }
                }
                Ok(None)
            })
        };
        let mut big_head = b"HTTP/1.1 200 OK\r\nX: ".to_vec();
        big_head.resize(MAX_HEAD_BYTES + 10, b'a');
        big_head.extend_from_slice(b"\r\nContent-Length: 2\r\n\r\n{}");
        let bad_head = Err(Violation::BadHttp("response head too large"));
        assert_eq!(verdicts(&big_head, 100), [bad_head, bad_head, bad_head]);

        let chunked = |exts: &[usize]| {
            let mut input = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
            for &n in exts {
                input.extend_from_slice(b"1;");
                input.resize(input.len() + n, b'e');
                input.extend_from_slice(b"\r\nx\r\n");
            }
            input.extend_from_slice(b"0\r\n\r\n");
            input
        };
        let too_large = Err(Violation::TooLarge);
        // One chunk-size line over the bound.
        let long_line = chunked(&[MAX_HEAD_BYTES + 10]);
        assert_eq!(verdicts(&long_line, 100), [too_large; 3]);
        // Lines within it, but framing over `max_chunked` in all (16,584 bytes here).
        let framed = chunked(&[8000, 8000, 8000]);
        assert_eq!(verdicts(&framed, 100), [too_large; 3]);
        // Within both bounds, it is a reply in every case.
        let ok = chunked(&[8000, 8000]);
        assert_eq!(verdicts(&ok, 100), [Ok(Some(2)); 3]);
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
            Decoder::default().decode(&mut buf, 100, false).unwrap_err(),
            Violation::TooLarge
        );
        let big = b"HTTP/1.1 200 OK\r\nContent-Length: 101\r\n\r\n";
        let mut buf = BytesMut::from(&big[..]);
        assert_eq!(
            Decoder::default().decode(&mut buf, 100, false).unwrap_err(),
            Violation::TooLarge
        );
    }
}
