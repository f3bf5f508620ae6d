//! Zero heap allocations per client call in steady state, counted by a global allocator
//! (per thread, so the server thread's own allocations do not count).

use ringrpc::client::Client;
use ringrpc::server::Server;
use ringrpc::{demo, Config};

#[path = "util/counting.rs"]
mod counting;
use counting::allocs;

#[global_allocator]
static GLOBAL: counting::Counting = counting::Counting;

/// Counts the allocations of `n` calls of `call` after a warm-up of 100.
fn count(n: usize, mut call: impl FnMut(i64)) -> u64 {
    for i in 0..100 {
        call(i);
    }
    let before = allocs();
    for i in 0..n as i64 {
        call(i);
    }
    allocs() - before
}

fn with_server(f: impl FnOnce(&str, &str)) {
    let mut server = Server::new(demo::engine(Config::default())).unwrap();
    let tcp = server.listen_tcp("127.0.0.1:0").unwrap();
    let http = server.listen_http("127.0.0.1:0").unwrap();
    let handle = server.handle();
    let t = std::thread::spawn(move || server.run());
    f(&format!("tcp://{tcp}"), &format!("http://{http}/"));
    handle.shutdown();
    t.join().unwrap().unwrap();
}

#[test]
fn zero_allocations_per_call() {
    with_server(|tcp, http| {
        for url in [tcp, http] {
            let c = Client::connect(url).unwrap();
            let n = count(10_000, |i| {
                assert_eq!(c.call::<i64, _>("add", [i, 1]).unwrap(), i + 1);
            });
            assert_eq!(n, 0, "allocations for 10,000 `add` calls on {url}");
            // Named params: the call's budget is added to them as `_meta` (TCP) or sent
            // as `RPC-Timeout-Ms` (HTTP), in the reused buffers.
            #[derive(serde::Serialize)]
            struct Named {
                minuend: i64,
                subtrahend: i64,
            }
            let n = count(1_000, |i| {
                let named = Named {
                    minuend: i,
                    subtrahend: 1,
                };
                assert_eq!(c.call::<i64, _>("subtract", &named).unwrap(), i - 1);
            });
            assert_eq!(
                n, 0,
                "allocations for 1,000 named `subtract` calls on {url}"
            );
            // A borrowed result: `&str` points into the response.
            let n = count(1_000, |_| {
                let len = c
                    .call_with("echo", ["borrowed"], |r| {
                        let [s]: [&str; 1] = r.parse()?;
                        Ok(s.len())
                    })
                    .unwrap();
                assert_eq!(len, 8);
            });
            assert_eq!(n, 0, "allocations for 1,000 borrowed `echo` calls on {url}");
            // Notifications and pipelined calls from one thread.
            let n = count(1_000, |i| {
                c.notify("update", [i]).unwrap();
                let a = c.start("add", [i, 2]).unwrap();
                let b = c.start("add", [i, 3]).unwrap();
                assert_eq!(b.wait::<i64>().unwrap(), i + 3);
                assert_eq!(a.wait::<i64>().unwrap(), i + 2);
            });
            assert_eq!(
                n, 0,
                "allocations for 1,000 notify + 2 pipelined calls on {url}"
            );
        }
    });
}

#[test]
fn the_counter_counts() {
    let before = allocs();
    let v = vec![1u8; 10];
    assert_eq!(allocs() - before, 1);
    drop(v);
}
