//! A call over WebSocket allocates nothing in steady state, on any thread of the
//! process: the frame is unmasked in place and split off the read buffer, the answer
//! framed in place in the output (short answers, and answers of 126 bytes or more whose
//! payload moves up for the longer header), batches included.
//!
//! Counted over the whole process (the test's own client included: it reuses its
//! buffers), with the same bound as `proxy_alloc.rs`: one allocation per thousand calls,
//! for buffer pools that grow at a new high-water mark.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use ringrpc::server::Server;
use ringrpc::{demo, Config};

#[path = "util/counting.rs"]
mod counting;
use counting::allocs_all;

#[global_allocator]
static GLOBAL: counting::Counting = counting::Counting;

#[path = "util/ws.rs"]
mod ws;

/// Sends `message` as `count` frames per round, reading back that many answer frames
/// into a fixed buffer; the allocations of the whole process after `warm` rounds.
fn run(s: &mut TcpStream, message: &str, count: usize, warm: usize, rounds: usize) -> u64 {
    let chunk = ws::frame(true, 1, message.as_bytes()).repeat(count);
    let mut buf = vec![0u8; 4 << 20];
    let mut before = 0;
    for round in 0..warm + rounds {
        if round == warm {
            before = allocs_all();
        }
        s.write_all(&chunk).unwrap();
        let (mut have, mut answered) = (0, 0);
        while answered < count {
            let n = s.read(&mut buf[have..]).unwrap();
            assert!(n > 0, "closed");
            have += n;
            let mut at = 0;
            while let Some(((op, payload), used)) = ws::server_frame(&buf[at..have]) {
                assert_eq!(op, 1);
                let p = &buf[at..have][payload];
                assert!(!p.windows(8).any(|w| w == b"\"error\":"), "an error");
                at += used;
                answered += 1;
            }
            buf.copy_within(at..have, 0);
            have -= at;
        }
    }
    allocs_all() - before
}

#[test]
fn websocket_calls_allocate_nothing() {
    let mut server = Server::new(demo::engine(Config::default())).unwrap();
    let addr = server.listen_http("127.0.0.1:0").unwrap();
    let handle = server.handle();
    let thread = std::thread::spawn(move || server.run());

    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(ws::handshake("").as_bytes()).unwrap();
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(s.read(&mut b).unwrap(), 1, "closed during the handshake");
        head.push(b[0]);
    }
    assert!(
        head.starts_with(b"HTTP/1.1 101 "),
        "{}",
        String::from_utf8_lossy(&head)
    );

    let single = r#"{"jsonrpc":"2.0","method":"subtract","params":[42,23],"id":12345}"#;
    let singles = run(&mut s, single, 64, 200, 300);
    let long = format!(
        r#"{{"jsonrpc":"2.0","method":"echo","params":["{}"],"id":1}}"#,
        "x".repeat(300)
    );
    let longs = run(&mut s, &long, 64, 200, 100);
    let element =
        r#"{"jsonrpc":"2.0","method":"subtract","params":{"minuend":42,"subtrahend":23},"id":7}"#;
    let batch = format!("[{}]", vec![element; 16].join(","));
    let batches = run(&mut s, &batch, 32, 200, 200);

    eprintln!("allocations: {singles} singles, {longs} long answers, {batches} batches");
    handle.shutdown();
    drop(s);
    thread.join().unwrap().unwrap();
    assert!(
        singles * 1000 < 19_200 && longs * 1000 < 6_400 && batches * 1000 < 6_400 * 16,
        "{singles} allocations for 19,200 calls, {longs} for 6,400 long answers, \
         {batches} for 6,400 batches of 16"
    );
}
