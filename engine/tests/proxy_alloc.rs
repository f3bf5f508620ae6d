//! A forwarded call allocates nothing in steady state, on any thread of the process:
//! the proxy's reactor (reading the client, forwarding), its upstream thread (writing,
//! reading and relaying answers), and the upstream server itself.
//!
//! Counted over the whole process, the figure is not always exactly 0: buffer pools
//! (answer buffers handed between threads, read buffers) grow when thread scheduling
//! sets a new high-water mark of calls in flight, which can happen during the measured
//! rounds as well as before (the smaller of two measured runs is counted). So the bound
//! is one allocation per thousand calls: a
//! single allocation per call (or per hundred) fails it by orders of magnitude.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use ringrpc::proxy::Proxy;
use ringrpc::server::Server;
use ringrpc::{demo, Config, Engine, Registry};

#[path = "util/counting.rs"]
mod counting;
use counting::allocs_all;

#[global_allocator]
static GLOBAL: counting::Counting = counting::Counting;

/// Sends `message` (one line, answered by one line) `rounds` times `lines` times, that
/// many in flight, reading answers into a fixed buffer; returns the allocations of the
/// whole process over the rounds after the first `warm` ones. (Calls in flight stay
/// within the 1,024 answer buffers a reactor keeps.)
fn run(addr: std::net::SocketAddr, message: &str, lines: usize, warm: usize, rounds: usize) -> u64 {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let chunk = message.repeat(lines).into_bytes();
    let mut buf = vec![0u8; 1 << 20];
    let mut before = 0;
    for round in 0..warm + rounds {
        if round == warm {
            before = allocs_all();
        }
        s.write_all(&chunk).unwrap();
        let mut answered = 0;
        while answered < lines {
            let n = s.read(&mut buf).unwrap();
            assert!(n > 0, "closed");
            assert!(!buf[..n].windows(8).any(|w| w == b"\"error\":"), "an error");
            answered += buf[..n].iter().filter(|&&b| b == b'\n').count();
        }
    }
    allocs_all() - before
}

#[test]
fn forwarding_allocates_nothing() {
    let mut upstream = Server::new(demo::engine(Config::default())).unwrap();
    let up = upstream.listen_tcp("127.0.0.1:0").unwrap();
    let up_handle = upstream.handle();
    let up_thread = std::thread::spawn(move || upstream.run());

    let proxy = Proxy::builder()
        .upstream("default", &format!("tcp://{up}"))
        .start()
        .unwrap();
    let mut methods = Registry::builder();
    proxy.install(&mut methods).unwrap();
    let mut front = Server::new(Engine::new(methods.freeze(), Config::default())).unwrap();
    let addr = front.listen_tcp("127.0.0.1:0").unwrap();
    let handle = front.handle();
    let thread = std::thread::spawn(move || front.run());

    let single = "{\"jsonrpc\":\"2.0\",\"method\":\"subtract\",\"params\":[42,23],\"id\":12345}\n";
    // Two measured runs each, the smaller counted: a pool that grew during the first
    // (a new high-water mark of calls in flight under a loaded machine) is steady in
    // the second, while an allocation per call shows in both.
    let singles = run(addr, single, 64, 200, 300).min(run(addr, single, 64, 200, 300));
    let element =
        r#"{"jsonrpc":"2.0","method":"subtract","params":{"minuend":42,"subtrahend":23},"id":7}"#;
    let batch = format!("[{}]\n", vec![element; 16].join(","));
    let batches = run(addr, &batch, 32, 200, 200).min(run(addr, &batch, 32, 200, 200));

    handle.shutdown();
    thread.join().unwrap().unwrap();
    drop(proxy);
    up_handle.shutdown();
    up_thread.join().unwrap().unwrap();
    assert!(
        singles * 1000 < 19_200 && batches * 1000 < 6_400 * 16,
        "{singles} allocations for 19,200 forwarded calls, {batches} for 6,400 batches of 16"
    );
}
