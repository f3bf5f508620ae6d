//! Completing a deferred call allocates nothing in steady state, on the completing
//! thread: the answer is written into a buffer the reactor gave back, and handed over
//! through a fixed-size queue. (Counted per thread by a global allocator.)

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ringrpc::server::Server;
use ringrpc::{demo, Config, Engine, Responder};

#[path = "util/counting.rs"]
mod counting;
use counting::allocs;

#[global_allocator]
static GLOBAL: counting::Counting = counting::Counting;

#[test]
fn completing_a_responder_allocates_nothing() {
    const WARM: usize = 2_000;
    const MEASURED: usize = 20_000;
    let (tx, rx) = mpsc::channel::<Responder>();
    let tx = Mutex::new(tx);
    let mut b = demo::builder();
    b.deferred_method("handoff", move |_ctx, _p, responder| {
        if let Ok(tx) = tx.lock() {
            let _ = tx.send(responder);
        }
    })
    .unwrap();
    let mut server = Server::new(Engine::new(b.freeze(), Config::default())).unwrap();
    let addr = server.listen_tcp("127.0.0.1:0").unwrap();
    let handle = server.handle();
    let thread = std::thread::spawn(move || server.run());

    // The completing thread counts its own allocations after the warm-up.
    let measured = Arc::new(Mutex::new(None));
    let m = Arc::clone(&measured);
    let completer = std::thread::spawn(move || {
        // First, the most answers that can ever be out at once (the client keeps 64 in
        // flight) are taken together, so that many answer buffers exist: later, however
        // the threads are scheduled, the spare buffers cover every completion. (Without
        // this a loaded machine could let the completer run further ahead than it ever
        // did in the warm-up, and take a buffer the reactor had not given back yet.)
        let first: Vec<Responder> = (0..64).map(|_| rx.recv().expect("a responder")).collect();
        for (i, r) in first.into_iter().enumerate() {
            r.respond(Ok(i as u64));
        }
        let mut before = 0;
        for i in 64..WARM + MEASURED {
            if i == WARM {
                before = allocs();
            }
            let r = rx.recv().expect("a responder");
            r.respond(Ok(i as u64));
        }
        *m.lock().unwrap() = Some(allocs() - before);
    });

    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut reader = BufReader::new(s.try_clone().unwrap());
    let mut writer = s;
    let mut line = String::new();
    // 64 in flight at a time, as a pipelining client would.
    for chunk in 0..(WARM + MEASURED) / 64 + 1 {
        let n = 64.min(WARM + MEASURED - (chunk * 64).min(WARM + MEASURED));
        if n == 0 {
            break;
        }
        let batch: String = (0..n)
            .map(|i| format!("{{\"jsonrpc\":\"2.0\",\"method\":\"handoff\",\"id\":{i}}}\n"))
            .collect();
        writer.write_all(batch.as_bytes()).unwrap();
        for _ in 0..n {
            line.clear();
            reader.read_line(&mut line).unwrap();
            assert!(line.contains("\"result\":"), "{line}");
        }
    }
    completer.join().unwrap();
    handle.shutdown();
    thread.join().unwrap().unwrap();
    let allocs = measured.lock().unwrap().expect("measured");
    assert_eq!(allocs, 0, "allocations completing {MEASURED} responders");
}
