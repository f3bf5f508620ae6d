//! Named inputs for the fuzz checks (`ringrpc::fuzzing`): every crash the fuzzers find
//! becomes a test here, named for what it was (none so far; the client's HTTP bounds,
//! found while writing a target, are here too: see docs/FUZZING.md), and
//! the inputs where the checks' reference has to be careful are pinned, so a change to
//! the engine or to the reference that breaks them is caught by name rather than by a
//! corpus file.

#[cfg(feature = "client")]
use ringrpc::fuzzing::check_client;
use ringrpc::fuzzing::{check_differential, check_engine, check_http, check_lines};

/// The differential and engine checks on one frame.
fn frame(input: &[u8]) {
    check_differential(input);
    check_engine(input);
}

/// A `lines`/`http` input: selector, no cuts, then the stream; and the same stream
/// cut at three places.
fn stream(check: fn(&[u8]), sel: u8, bytes: &[u8]) {
    let mut whole = vec![sel, 0];
    whole.extend_from_slice(bytes);
    check(&whole);
    let mut cut = vec![sel, 3, 1, 0, 7, 0, 30, 0];
    cut.extend_from_slice(bytes);
    check(&cut);
}

#[test]
fn section_7_batch_with_deferred_sleep_calls() {
    // `sleep` is deferred on the server path; the inline answers come first.
    frame(
        br#"[{"jsonrpc":"2.0","method":"sum","params":[1,2,4],"id":"1"},
            {"jsonrpc":"2.0","method":"notify_hello","params":[7]},
            {"jsonrpc":"2.0","method":"sleep","params":{"ms":0},"id":"s"},
            {"jsonrpc":"2.0","method":"sleep","params":[5]},
            {"jsonrpc":"2.0","method":"subtract","params":[42,23],"id":"2"},
            {"foo":"boo"},
            {"jsonrpc":"2.0","method":"foo.get","params":{"name":"myself"},"id":"5"},
            {"jsonrpc":"2.0","method":"get_data","id":"9"}]"#,
    );
    frame(br#"{"jsonrpc":"2.0","method":"sleep","params":{"ms":60001},"id":1}"#);
    frame(br#"{"jsonrpc":"2.0","method":"sleep","id":1}"#);
}

#[test]
fn minus_zero_is_the_integer_zero() {
    // serde_json reads `-0` as the float -0.0; the engine as the integer 0.
    frame(br#"{"jsonrpc":"2.0","method":"subtract","params":[-0,1],"id":-0}"#);
    frame(br#"{"jsonrpc":"2.0","method":"echo","params":[-0,-0.0],"id":-0.0}"#);
}

#[test]
fn literals_serde_json_rounds_wrongly() {
    // Rounds to f64::MAX (serde_json refuses it): accepted, echoed verbatim.
    frame(br#"{"jsonrpc":"2.0","method":"echo","params":[1.7976931348623158e308],"id":1.7976931348623158e308}"#);
    // Rounds to infinity (serde_json reads f64::MAX): a parse error.
    frame(br#"{"jsonrpc":"2.0","method":"echo","params":[1.79769313486231581e308],"id":1}"#);
    // Refused by serde_json for its range, and invalid JSON after it anyway.
    frame(br#"[1.7976931348623158e308,}"#);
}

#[test]
fn integers_at_and_beyond_64_bits() {
    frame(br#"{"jsonrpc":"2.0","method":"add","params":[9223372036854775807,1],"id":18446744073709551615}"#);
    frame(br#"{"jsonrpc":"2.0","method":"sum","params":[9223372036854775808],"id":18446744073709551616}"#);
    frame(br#"{"jsonrpc":"2.0","method":"subtract","params":{"minuend":-9223372036854775808,"subtrahend":1},"id":-9223372036854775809}"#);
}

#[test]
fn repeated_members_and_fields() {
    frame(br#"{"jsonrpc":"2.0","method":"ping","id":{},"id":7}"#);
    frame(br#"{"jsonrpc":"2.0","method":"ping","id":7,"id":{}}"#);
    frame(br#"{"jsonrpc":"2.0","method":"subtract","params":{"minuend":1,"minuend":2,"subtrahend":0},"id":1}"#);
    frame(br#"{"jsonrpc":"2.0","method":"echo","params":{"a":1,"a":2},"id":1}"#);
}

#[test]
fn limits_of_the_tight_configs() {
    // Depth 6 and 7 (the tight config's limit is 6), a batch of 4 (its limit is 3).
    frame(br#"{"jsonrpc":"2.0","method":"echo","params":[[[[[1]]]]],"id":1}"#);
    frame(br#"{"jsonrpc":"2.0","method":"echo","params":[[[[[[1]]]]]],"id":1}"#);
    frame(br#"[{"jsonrpc":"2.0","method":"ping","id":1},{"jsonrpc":"2.0","method":"ping","id":2},{"jsonrpc":"2.0","method":"ping","id":3},{"jsonrpc":"2.0","method":"ping","id":4}]"#);
    // A result past max_response_bytes (96 in the tight config).
    frame(br#"{"jsonrpc":"2.0","method":"echo","params":["0123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123456789"],"id":1}"#);
}

#[test]
fn line_framing_edges() {
    // With max_request_bytes 8 (selector 1): exactly 8 bytes plus `\r`, 9 bytes, a
    // blank line of spaces longer than the limit, and a partial line at the end.
    stream(
        check_lines,
        1,
        b"[1,2,33]\r\n[1,2,333]\n          \n\t\r\n[1,2,33]\r",
    );
    stream(
        check_lines,
        0,
        b"{\"jsonrpc\":\"2.0\",\"method\":\"ping\",\"id\":1}\r\n\n[]\n{\"jsonrpc\"",
    );
}

#[test]
fn http_pipelined_chunked_and_refused() {
    let body = br#"{"jsonrpc":"2.0","method":"ping","id":1}"#;
    let mut s = format!(
        "POST / HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nTransfer-Encoding: chunked\r\n\r\n5;x=y\r\n{}\r\n{:x}\r\n{}\r\n0\r\nT: 1\r\n\r\n",
        std::str::from_utf8(&body[..5]).unwrap_or_default(),
        body.len() - 5,
        std::str::from_utf8(&body[5..]).unwrap_or_default()
    )
    .into_bytes();
    s.extend_from_slice(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\nPOST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc");
    s.extend_from_slice(b"POST / HTTP/1.0\r\nContent-Length: 2\r\n\r\n[]");
    for sel in 0..4 {
        stream(check_http, sel, &s);
    }
}

/// A `client` input: selector (0: the default 8 MiB `max_response_bytes`), one cut at
/// `cut`, then the stream.
#[cfg(feature = "client")]
fn client_cut(stream: &[u8], cut: u16) {
    let mut input = vec![0, 1];
    input.extend_from_slice(&cut.to_le_bytes());
    input.extend_from_slice(stream);
    check_client(&input);
}

/// Found while writing the `client` target (its inputs are too short to reach it): a
/// response head over the client's 16 KiB bound was refused when a read ended inside
/// it and accepted when it arrived whole.
#[cfg(feature = "client")]
#[test]
fn client_http_head_over_the_bound_in_one_read_or_two() {
    let mut stream = b"HTTP/1.1 200 OK\r\nX-Pad: ".to_vec();
    stream.resize(17_000, b'a');
    stream.extend_from_slice(b"\r\nContent-Length: 2\r\n\r\n{}");
    client_cut(&stream, 16_500);
}

/// The same for one chunk-size line over 16 KiB, and for chunked framing over its bound
/// (twice the body plus 16 KiB; here the body is 3 bytes in three chunks, each with a
/// 7,000-byte extension), with a small `max_response_bytes` (selector 2: 64 bytes).
#[cfg(feature = "client")]
#[test]
fn client_http_chunk_bounds_in_one_read_or_two() {
    let chunked = |exts: &[usize]| {
        let mut s = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
        for &n in exts {
            s.extend_from_slice(b"1;");
            s.resize(s.len() + n, b'e');
            s.extend_from_slice(b"\r\n1\r\n");
        }
        s.extend_from_slice(b"0\r\n\r\n");
        s
    };
    client_cut(&chunked(&[17_000]), 16_600);
    let framed = chunked(&[7_000, 7_000, 7_000]);
    for sel in [0, 2] {
        let mut input = vec![sel, 1];
        input.extend_from_slice(&20_000u16.to_le_bytes());
        input.extend_from_slice(&framed);
        check_client(&input);
    }
}
