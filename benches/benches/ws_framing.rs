//! WebSocket framing per message: the engine's own (what the reactor runs) against
//! tungstenite's protocol layer, the crate issue 15 suggested, both as a server.
//!
//! ```text
//! taskset -c 0 cargo bench -p benches --bench ws_framing -- --warm-up-time 1 --measurement-time 4
//! ```
//!
//! 1,000 masked text frames of a typical request (one `subtract` call, 60 bytes) sit in
//! memory; each is read as a message and answered with a 40-byte text message, written
//! to memory. No sockets, no JSON: only the framing.
//!
//! - `ws_framing/ringrpc`: the reactor's path (`WsDecoder` unmasking in place and
//!   splitting each message off the read buffer; the answer framed in place in the
//!   output, its header written after it).
//! - `ws_framing/tungstenite`: `WebSocket::from_raw_socket` over the same bytes,
//!   `read` then `write` of a static answer (no allocation for the answer's text: the
//!   best case for it), one `flush` at the end.

use std::hint::black_box;
use std::io::{self, Cursor, Read, Write};

use bytes::BytesMut;
use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use tungstenite::protocol::{Message, Role, WebSocket};
use tungstenite::Utf8Bytes;

const REQUEST: &[u8] = br#"{"jsonrpc":"2.0","method":"subtract","params":[42,23],"id":1}"#;
const ANSWER: &str = r#"{"jsonrpc":"2.0","result":19,"id":1}    "#;
const MESSAGES: usize = 1000;

/// `n` masked client text frames holding `payload`.
fn frames(payload: &[u8], n: usize) -> Vec<u8> {
    let mask = [0x37, 0xfa, 0x21, 0x3d];
    let mut f = Vec::new();
    for _ in 0..n {
        f.push(0x81);
        assert!(payload.len() < 126);
        f.push(0x80 | payload.len() as u8);
        f.extend_from_slice(&mask);
        f.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    }
    f
}

/// A socket in memory: reads what is queued, writes into a buffer.
struct Mem {
    input: Cursor<Vec<u8>>,
    output: Vec<u8>,
}

impl Read for Mem {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self.input.read(buf)? {
            0 => Err(io::ErrorKind::WouldBlock.into()),
            n => Ok(n),
        }
    }
}

impl Write for Mem {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.output.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn framing(c: &mut Criterion) {
    let input = frames(REQUEST, MESSAGES);
    let mut g = c.benchmark_group("ws_framing");
    g.throughput(Throughput::Elements(MESSAGES as u64));

    let mut out = Vec::with_capacity(64 * 1024);
    let n = ringrpc::fuzzing::ws_frame_all(
        &mut BytesMut::from(&input[..]),
        &mut out,
        ANSWER.as_bytes(),
    );
    assert_eq!(n, MESSAGES);
    g.bench_function("ringrpc", |b| {
        b.iter_batched_ref(
            || BytesMut::from(&input[..]),
            |buf| {
                out.clear();
                let n = ringrpc::fuzzing::ws_frame_all(buf, &mut out, ANSWER.as_bytes());
                black_box((n, out.len()))
            },
            BatchSize::SmallInput,
        );
    });

    let answer = Utf8Bytes::from_static(ANSWER);
    let run = |ws: &mut WebSocket<Mem>| {
        let mut n = 0;
        loop {
            match ws.read() {
                Ok(Message::Text(t)) => {
                    black_box(&t);
                    // Queued in tungstenite's write buffer; written out by `flush`.
                    if ws.write(Message::Text(answer.clone())).is_err() {
                        break;
                    }
                    n += 1;
                }
                Ok(_) => {}
                Err(_) => break, // WouldBlock: all read
            }
        }
        let _ = ws.flush();
        n
    };
    let socket = || {
        WebSocket::from_raw_socket(
            Mem {
                input: Cursor::new(input.clone()),
                output: Vec::with_capacity(64 * 1024),
            },
            Role::Server,
            None,
        )
    };
    let mut ws = socket();
    assert_eq!(run(&mut ws), MESSAGES);
    assert_eq!(
        ws.get_ref().output.len(),
        out.len(),
        "the same answers, framed alike"
    );
    g.bench_function("tungstenite", |b| {
        b.iter_batched_ref(socket, |ws| black_box(run(ws)), BatchSize::SmallInput);
    });
    g.finish();
}

criterion_group!(benches, framing);
criterion_main!(benches);
