//! The client against a guarded, de-duplicating server over real sockets: tokens on
//! every transport (`rpc.auth` on TCP and Unix sockets, `Authorization: Bearer` over
//! HTTP), refusals as the server's `-32040`, re-authentication after the server drops
//! an idle connection, random first ids, `Idempotency-Key` over HTTP, and retries of a
//! de-duplicated call that outlives the client's timeout (`-32042` waited out, the
//! handler run once).
//!
//! Every client has a timeout, so a hang fails the test instead of stalling it.

#[path = "util/peer.rs"]
mod peer;
mod util;

use std::collections::HashMap;
use std::io::BufReader;
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use peer::{answer, read_request};
use ringrpc::client::{Client, Error, Options, Retry};
use ringrpc::dedup::{Dedup, DEFAULT_TTL};
use ringrpc::guard::Guard;
use ringrpc::{
    codes, demo, Answered, Config, Context, Engine, Hooks, Id, Params, RegistryBuilder, RpcError,
    ServerConfig,
};
use serde_json::{json, Value};
use util::server::Served;

const KEYS: &str = "[[key]]\nname = \"app\"\ntoken = \"t\"\nallow = [\"*\"]\n";

/// Options with a bounded timeout (and the token, if any).
fn options(token: Option<&str>) -> Options {
    let o = Options::default()
        .timeout(Duration::from_secs(10))
        .connect_timeout(Duration::from_secs(10));
    match token {
        Some(t) => o.token(t),
        None => o,
    }
}

/// The three URLs of a served engine.
fn urls(s: &Served) -> [String; 3] {
    [
        format!("tcp://{}", s.tcp),
        format!("unix://{}", s.unix.display()),
        format!("http://{}/", s.http),
    ]
}

/// The demo engine, guarded by [`KEYS`] and de-duplicating.
fn guarded(b: RegistryBuilder) -> Engine {
    Engine::new(b.freeze(), Config::default())
        .with_guard(Guard::new().with_keys_toml(KEYS).unwrap())
        .with_dedup(Dedup::memory(1 << 20, DEFAULT_TTL))
}

fn server_code(r: &Result<impl std::fmt::Debug, Error>) -> Option<i32> {
    match r {
        Err(Error::Server(e)) => Some(e.code),
        _ => None,
    }
}

#[test]
fn a_token_authenticates_on_every_transport() {
    let s = Served::start(guarded(demo::builder()), ServerConfig::default());
    for url in urls(&s) {
        let c = Client::connect_with(&url, options(Some("t"))).unwrap();
        let who: Value = c.call("whoami", ()).unwrap();
        assert_eq!(who["identity"], "app", "{url}: {who}");
        assert_eq!(c.call::<i64, _>("add", [2, 3]).unwrap(), 5, "{url}");
        // Batches and notifications go out authenticated too.
        c.notify("update", [1]).unwrap();
        let mut batch = c.batch();
        let k = batch.call("whoami", ()).unwrap();
        let mut replies = batch.send().unwrap();
        assert_eq!(replies.get::<Value>(k).unwrap()["identity"], "app", "{url}");
        // Without a token the server refuses: the client reports its `-32040`, over HTTP
        // too (a 401 whose body is the JSON-RPC error).
        let anon = Client::connect_with(&url, options(None)).unwrap();
        let r = anon.call::<Value, _>("whoami", ());
        assert_eq!(
            server_code(&r),
            Some(codes::UNAUTHENTICATED),
            "{url}: {r:?}"
        );
    }
    s.stop();
}

#[test]
fn a_refused_token_is_the_servers_32040_on_every_transport_and_never_shown() {
    let s = Served::start(guarded(demo::builder()), ServerConfig::default());
    let secret = "wr0ng-s3cret-t0ken";
    for url in urls(&s) {
        let opts = options(Some(secret));
        assert!(!format!("{opts:?}").contains(secret), "{opts:?}");
        // TCP and Unix sockets authenticate when connecting; HTTP sends the token with
        // the call. Either way the caller gets the server's refusal.
        let r = Client::connect_with(&url, opts).and_then(|c| {
            assert!(!format!("{c:?}").contains(secret));
            c.call::<Value, _>("whoami", ())
        });
        assert_eq!(
            server_code(&r),
            Some(codes::UNAUTHENTICATED),
            "{url}: {r:?}"
        );
        let Err(e) = r else { unreachable!() };
        assert!(!e.is_transient(), "{url}: a refused token is not retried");
        assert!(!format!("{e:?} {e}").contains(secret), "{e:?}");
    }
    // A token that cannot be a header value is refused before anything is sent.
    let r = Client::connect_with(&urls(&s)[2], options(Some("two\r\nX-Injected: 1")));
    assert!(matches!(r, Err(Error::Token(_))), "{r:?}");
    // A server without keys does not know `rpc.auth`: a token is a mistake, said so.
    let open = Served::start(demo::engine(Config::default()), ServerConfig::default());
    let r = Client::connect_with(&urls(&open)[0], options(Some("t")));
    assert_eq!(server_code(&r), Some(codes::METHOD_NOT_FOUND), "{r:?}");
    open.stop();
    s.stop();
}

#[test]
fn after_the_server_drops_an_idle_connection_the_next_call_authenticates_again() {
    let settings = ServerConfig::default().idle_timeout(Some(Duration::from_millis(200)));
    let s = Served::start(guarded(demo::builder()), settings);
    for url in &urls(&s)[..2] {
        let c = Client::connect_with(url, options(Some("t"))).unwrap();
        let before: Value = c.call("whoami", ()).unwrap();
        assert_eq!(before["identity"], "app", "{url}");
        // The server looks for idle connections once a second.
        std::thread::sleep(Duration::from_millis(1500));
        // A plain call: the closed connection is found before writing, replaced and
        // authenticated again (else the call would be answered -32040).
        let after: Value = c.call("whoami", ()).unwrap();
        assert_eq!(after["identity"], "app", "{url}: {after}");
        if url.starts_with("tcp") {
            // The client's port changed: it really is another connection.
            assert_ne!(after["peer"], before["peer"], "{url}");
        }
    }
    s.stop();
}

/// `my_id` answers the request's id, `my_key` the `Idempotency-Key` header (or null).
fn introspective() -> RegistryBuilder {
    let mut b = demo::builder();
    b.method_with_ctx("my_id", |ctx: &Context<'_>, _p: Params<'_>| {
        match ctx.id() {
            Some(Id::UInt(u)) => Ok(u),
            other => Err(RpcError::invalid_params(format!("id {other:?}"))),
        }
    })
    .unwrap()
    .method_with_ctx("my_key", |ctx: &Context<'_>, _p: Params<'_>| {
        Ok(ctx
            .headers()
            .and_then(|h| h.get("idempotency-key"))
            .map(|v| String::from_utf8_lossy(v).into_owned()))
    })
    .unwrap();
    b
}

#[test]
fn clients_start_at_different_random_ids_exact_in_a_double() {
    let s = Served::start(guarded(introspective()), ServerConfig::default());
    let url = &urls(&s)[0];
    let (a, b) = (
        Client::connect_with(url, options(Some("t"))).unwrap(),
        Client::connect_with(url, options(Some("t"))).unwrap(),
    );
    let (a1, b1) = (
        a.call::<u64, _>("my_id", ()).unwrap(),
        b.call::<u64, _>("my_id", ()).unwrap(),
    );
    assert_ne!(a1, b1);
    for id in [a1, b1] {
        // Above what counting from 1 reaches, below 2⁵³ with room to spare.
        assert!((1 << 32..(1 << 52) + 16).contains(&id), "{id}");
    }
    // Then one more per call.
    assert_eq!(a.call::<u64, _>("my_id", ()).unwrap(), a1 + 1);
    s.stop();
}

#[test]
fn http_idempotent_calls_carry_a_per_client_key_naming_the_call() {
    let s = Served::start(
        Engine::new(introspective().freeze(), Config::default()),
        ServerConfig::default(),
    );
    let url = &urls(&s)[2];
    let key = |c: &Client| {
        let k: String = c.call_idempotent("my_key", ()).unwrap();
        let (prefix, id) = k.split_once('-').unwrap();
        assert!(
            prefix.len() == 16 && prefix.bytes().all(|b| b.is_ascii_hexdigit()),
            "{k}"
        );
        (prefix.to_owned(), id.parse::<u64>().unwrap())
    };
    let a = Client::connect_with(url, options(None)).unwrap();
    let (p1, id1) = key(&a);
    let (p2, id2) = key(&a);
    assert_eq!(p1, p2);
    assert_eq!(id2, id1 + 1);
    let (p3, _) = key(&Client::connect_with(url, options(None)).unwrap());
    assert_ne!(p1, p3, "another client, another prefix");
    // Plain calls carry none.
    assert_eq!(a.call::<Option<String>, _>("my_key", ()).unwrap(), None);
    s.stop();
}

/// Counts the `-32042` answers the server sent.
#[derive(Clone, Default)]
struct InProgress(Arc<AtomicUsize>);

impl Hooks for InProgress {
    fn after(&self, answered: &Answered<'_>) {
        if answered.error_code() == Some(codes::IN_PROGRESS) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// The demo methods plus `slow_incr` (blocking, 600 ms, de-duplicated): it counts its
/// runs in `runs` and answers the count.
fn slow(runs: &Arc<AtomicUsize>) -> RegistryBuilder {
    let runs = Arc::clone(runs);
    let mut b = demo::builder();
    b.blocking_method(
        "slow_incr",
        move |_p: Params<'_>| -> Result<usize, RpcError> {
            std::thread::sleep(Duration::from_millis(600));
            Ok(runs.fetch_add(1, Ordering::SeqCst) + 1)
        },
    )
    .unwrap()
    .dedup("slow_incr")
    .unwrap();
    b
}

/// The case: the client's timeout (100 ms) is shorter than the handler
/// (600 ms). `call_idempotent` times out and resends the same id (or key) on the same
/// connection; the server answers each resend `-32042` but, answering a connection in
/// order, only after the first attempt's answer, which the waiting resend takes: the
/// call gets the real result, and the handler runs once per call. (`-32042` reaching
/// the client is `an_in_progress_answer_is_waited_out_as_told_within_max_elapsed`.)
fn dedup_under_a_short_client_timeout(url: &str, token: Option<&str>, runs: &AtomicUsize) {
    let opts = options(token).timeout(Duration::from_millis(100)).retry(
        Retry::default()
            .max_attempts(50)
            .max_elapsed(Duration::from_secs(3)),
    );
    let c = Client::connect_with(url, opts).unwrap();
    for n in 1..=2 {
        let start = Instant::now();
        let r: usize = c.call_idempotent("slow_incr", [1]).unwrap();
        assert_eq!(r, n, "{url}");
        assert!(start.elapsed() >= Duration::from_millis(550), "{url}");
        // Long enough for any stray second run to have finished.
        std::thread::sleep(Duration::from_millis(700));
        assert_eq!(
            runs.load(Ordering::SeqCst),
            n,
            "{url}: the handler ran again"
        );
    }
    // A call that is not retried just times out: at the client, or (over HTTP, where
    // its budget goes as `RPC-Timeout-Ms`) at the server at the same moment, -32001.
    let r = c.call::<usize, _>("slow_incr", [1]);
    assert!(
        matches!(r, Err(Error::ReadTimeout)) || server_code(&r) == Some(-32001),
        "{url}: {r:?}"
    );
}

#[test]
fn dedup_over_tcp_with_a_token_under_a_client_timeout_shorter_than_the_handler() {
    let runs = Arc::new(AtomicUsize::new(0));
    let seen = InProgress::default();
    let engine = guarded(slow(&runs)).with_hooks(seen.clone());
    let s = Served::start(engine, ServerConfig::default());
    dedup_under_a_short_client_timeout(&urls(&s)[0], Some("t"), &runs);
    // The resends did reach the server while the first attempt ran.
    assert!(seen.0.load(Ordering::SeqCst) >= 1);
    s.stop();
}

#[test]
fn dedup_over_http_by_idempotency_key_under_a_client_timeout_shorter_than_the_handler() {
    let runs = Arc::new(AtomicUsize::new(0));
    // No guard: anonymous calls are de-duplicated by their `Idempotency-Key` alone.
    let engine = Engine::new(slow(&runs).freeze(), Config::default())
        .with_dedup(Dedup::memory(1 << 20, DEFAULT_TTL));
    let s = Served::start(engine, ServerConfig::default());
    dedup_under_a_short_client_timeout(&urls(&s)[2], None, &runs);
    s.stop();
}

/// When each request id was seen, in order.
type Sightings = Arc<Mutex<Vec<(u64, Instant)>>>;

/// A hand-played de-duplicating server on TCP: `rpc.auth` succeeds; a call
/// `m [retry_after_ms, busy]` is answered `-32042` with that `retryAfterMs` the first
/// `busy` times its id is seen, then with how many times it was seen.
fn in_progress_peer() -> (SocketAddr, Sightings) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let seen = Sightings::default();
    let log = Arc::clone(&seen);
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(s) = s else { return };
            let log = Arc::clone(&log);
            std::thread::spawn(move || {
                let mut r = BufReader::new(s);
                let mut times = HashMap::new();
                while let Some(req) = read_request(&mut r) {
                    let id = &req["id"];
                    if req["method"] == "rpc.auth" {
                        answer(
                            &mut r,
                            &json!({"jsonrpc":"2.0","id":id,"result":{"identity":"app"}}),
                        );
                        continue;
                    }
                    let n = id.as_u64().unwrap();
                    log.lock().unwrap().push((n, Instant::now()));
                    let seen: &mut u64 = times.entry(n).or_default();
                    *seen += 1;
                    let (after, busy) = (&req["params"][0], req["params"][1].as_u64().unwrap());
                    let reply = if *seen <= busy {
                        json!({"jsonrpc":"2.0","id":id,"error":{"code":-32042,"message":"In progress",
                            "data":{"reason":"in_progress","retryAfterMs":after}}})
                    } else {
                        json!({"jsonrpc":"2.0","id":id,"result":*seen})
                    };
                    answer(&mut r, &reply);
                }
            });
        }
    });
    (addr, seen)
}

/// `-32042` on the wire (as when a retry reaches the server on a new connection while
/// the first attempt runs): `call_idempotent` resends the same id after `retryAfterMs`,
/// without spending attempts, until the answer comes or `max_elapsed` is up; `call`
/// does not retry it.
#[test]
fn an_in_progress_answer_is_waited_out_as_told_within_max_elapsed() {
    let (addr, seen) = in_progress_peer();
    let url = format!("tcp://{addr}");
    let take = || std::mem::take(&mut *seen.lock().unwrap());

    // Two attempts allowed, three in-progress answers: they are not attempts.
    let opts = options(Some("t")).retry(
        Retry::default()
            .max_attempts(2)
            .max_elapsed(Duration::from_secs(5)),
    );
    let c = Client::connect_with(&url, opts).unwrap();
    assert_eq!(c.call_idempotent::<u64, _>("m", (100, 3)).unwrap(), 4);
    let tries = take();
    assert_eq!(tries.len(), 4, "{tries:?}");
    for w in tries.windows(2) {
        assert_eq!(w[0].0, w[1].0, "the same id every time");
        let gap = w[1].1 - w[0].1;
        assert!(gap >= Duration::from_millis(95), "resent after {gap:?}");
    }
    // A plain call reports it at once.
    let r = c.call::<u64, _>("m", (100, 1));
    assert_eq!(server_code(&r), Some(codes::IN_PROGRESS), "{r:?}");
    assert_eq!(take().len(), 1);

    // A hint longer than the time left is cut to it; then the call gives up.
    let opts = options(Some("t")).retry(Retry::default().max_elapsed(Duration::from_millis(300)));
    let c = Client::connect_with(&url, opts).unwrap();
    let start = Instant::now();
    let r = c.call_idempotent::<u64, _>("m", (60_000, 1000));
    let took = start.elapsed();
    assert_eq!(server_code(&r), Some(codes::IN_PROGRESS), "{r:?}");
    assert!(
        (Duration::from_millis(290)..Duration::from_secs(2)).contains(&took),
        "{took:?}"
    );
    assert_eq!(
        take().len(),
        2,
        "the first attempt and one resend at max_elapsed"
    );
}
