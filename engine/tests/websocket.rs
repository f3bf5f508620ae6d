//! JSON-RPC over WebSocket on the HTTP listener: third-party clients (Python's
//! `websockets` and Node's `ws`: calls, batches, notifications, errors, a 1 MB message,
//! 50 connections at once, ping and close, a subscription), and a hand-written client
//! for what a library would not send: frames split byte by byte, oversized and
//! fragmented messages, protocol violations, bad handshakes, credentials on the
//! handshake.
//!
//! The Python test needs `python3` with `websockets` (`pip install websockets`), the Node
//! test `node` with `ws` (`npm install --prefix ~/.cache/ringrpc-node ws@8`); `.ci/run`
//! installs both. Every socket has timeouts, so a hang fails the test instead of
//! stalling it.

mod util;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use ringrpc::guard::Guard;
use ringrpc::{demo, Config, Engine, ServerConfig};
use serde_json::{json, Value};
use util::server::Served;
use util::ws::{frame, handshake, server_frame, KEY};

fn served(settings: ServerConfig) -> Served {
    Served::start(demo::engine(Config::default()), settings)
}

const PY_CLIENT: &str = r#"
import asyncio, json, sys, websockets

async def one(url, i):
    async with websockets.connect(url) as ws:
        await ws.send(json.dumps({"jsonrpc": "2.0", "method": "add", "params": [i, 1], "id": i}))
        return json.loads(await ws.recv())

async def main(url):
    out = {}
    async with websockets.connect(url, max_size=None) as ws:
        await ws.send('{"jsonrpc":"2.0","method":"subtract","params":[42,23],"id":1}')
        out["call"] = json.loads(await ws.recv())
        # A notification is never answered: the next answer is the call's after it.
        await ws.send('{"jsonrpc":"2.0","method":"notify_hello","params":[7]}')
        await ws.send('{"jsonrpc":"2.0","method":"nope","id":"e"}')
        out["error"] = json.loads(await ws.recv())
        await ws.send('[{"jsonrpc":"2.0","method":"sum","params":[1,2,4],"id":"1"},'
                      '{"jsonrpc":"2.0","method":"notify_hello","params":[7]},'
                      '{"jsonrpc":"2.0","method":"delay","params":[20],"id":"2"},{"foo":"boo"}]')
        out["batch"] = json.loads(await ws.recv())
        # Binary messages carry requests too.
        await ws.send(b'{"jsonrpc":"2.0","method":"ping","id":9}')
        out["binary"] = json.loads(await ws.recv())
        big = "x" * 1_000_000
        await ws.send(json.dumps({"jsonrpc": "2.0", "method": "echo", "params": [big], "id": 5}))
        answer = json.loads(await ws.recv())
        out["big"] = answer["result"] == [big]
        pong = await ws.ping(b"are you there")
        await asyncio.wait_for(pong, 10)
        out["pong"] = True
        await ws.send('{"jsonrpc":"2.0","method":"whoami","id":6}')
        out["whoami"] = json.loads(await ws.recv())
    out["close_code"] = ws.close_code
    answers = await asyncio.gather(*(one(url, i) for i in range(50)))
    out["fifty"] = [a["result"] for a in answers]
    print(json.dumps(out))

asyncio.run(asyncio.wait_for(main(sys.argv[1]), 60))
"#;

#[test]
fn python_websockets_client() {
    let server = served(ServerConfig::default());
    let got = util::python::run("websockets", PY_CLIENT, &format!("ws://{}/", server.http));
    assert_eq!(
        got["call"],
        json!({"jsonrpc": "2.0", "id": 1, "result": 19})
    );
    assert_eq!(got["error"]["id"], "e");
    assert_eq!(got["error"]["error"]["code"], -32601);
    let batch = got["batch"].as_array().unwrap();
    assert_eq!(batch.len(), 3, "{batch:?}");
    assert_eq!(batch[0], json!({"jsonrpc": "2.0", "id": "1", "result": 7}));
    assert_eq!(
        batch[1],
        json!({"jsonrpc": "2.0", "id": "2", "result": null})
    );
    assert_eq!(batch[2]["error"]["code"], -32600);
    assert_eq!(got["binary"]["result"], "pong");
    assert_eq!(got["big"], true);
    assert_eq!(got["pong"], true);
    assert_eq!(got["whoami"]["result"]["transport"], "ws");
    assert!(got["whoami"]["result"]["peer"]
        .as_str()
        .unwrap()
        .starts_with("127.0.0.1:"));
    assert_eq!(got["close_code"], 1000);
    let fifty: Vec<i64> = (1..=50).collect();
    assert_eq!(got["fifty"], json!(fifty));
    server.stop();
}

/// A hand-written WebSocket client.
struct Ws {
    s: TcpStream,
    /// Bytes read past the last frame taken.
    rest: Vec<u8>,
}

/// Sends `request` (an HTTP head) and reads the response head: (status, head).
fn http_head(s: &mut TcpStream, request: &str) -> (u16, String, Vec<u8>) {
    s.write_all(request.as_bytes()).unwrap();
    let mut got = Vec::new();
    let mut b = [0u8; 4096];
    let end = loop {
        if let Some(i) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = s.read(&mut b).unwrap();
        assert!(n > 0, "closed before the response head: {got:?}");
        got.extend_from_slice(&b[..n]);
    };
    let head = String::from_utf8_lossy(&got[..end]).into_owned();
    let status = head[9..12].parse().unwrap();
    (status, head, got[end..].to_vec())
}

impl Ws {
    fn connect(addr: SocketAddr, extra: &str) -> Self {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let (status, head, rest) = http_head(&mut s, &handshake(extra));
        assert_eq!(status, 101, "{head}");
        assert!(
            head.contains("Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n"),
            "{head}"
        );
        Self { s, rest }
    }

    fn send(&mut self, bytes: &[u8]) {
        self.s.write_all(bytes).unwrap();
    }

    fn text(&mut self, text: &str) {
        self.send(&frame(true, 1, text.as_bytes()));
    }

    /// The next frame from the server: (opcode, payload). Server frames are unmasked
    /// and, from this server, never fragmented.
    fn next(&mut self) -> (u8, Vec<u8>) {
        loop {
            if let Some(((op, payload), used)) = server_frame(&self.rest) {
                let payload = self.rest[payload].to_vec();
                self.rest.drain(..used);
                return (op, payload);
            }
            let mut b = [0u8; 65536];
            let n = self.s.read(&mut b).unwrap();
            assert!(n > 0, "closed while waiting for a frame");
            self.rest.extend_from_slice(&b[..n]);
        }
    }

    /// A `ping` call is answered.
    fn pings(&mut self) {
        self.text(r#"{"jsonrpc":"2.0","method":"ping","id":1}"#);
        assert_eq!(self.answer()["result"], "pong");
    }

    fn answer(&mut self) -> Value {
        let (op, payload) = self.next();
        assert_eq!(op, 1, "a text message: {payload:?}");
        serde_json::from_slice(&payload).unwrap()
    }

    /// Expects a Close with `code`, then the end of the connection.
    fn closed_with(&mut self, code: u16) {
        let (op, payload) = self.next();
        assert_eq!(op, 8, "{payload:?}");
        assert_eq!(
            payload[..2],
            code.to_be_bytes(),
            "{}",
            String::from_utf8_lossy(&payload)
        );
        let mut b = [0u8; 64];
        assert_eq!(
            self.s.read(&mut b).unwrap_or(0),
            0,
            "the server closes after its Close"
        );
    }
}

#[test]
fn frames_split_fragmented_pipelined_and_controls_between() {
    let server = served(ServerConfig::default());
    let mut ws = Ws::connect(server.http, "");
    // Two messages, the first fragmented with a ping inside, sent one byte at a time.
    let mut bytes = frame(false, 1, br#"{"jsonrpc":"2.0","method":"#);
    bytes.extend(frame(true, 9, b"between"));
    bytes.extend(frame(true, 0, br#""subtract","params":[5,3],"id":1}"#));
    bytes.extend(frame(
        true,
        1,
        br#"{"jsonrpc":"2.0","method":"ping","id":2}"#,
    ));
    for b in &bytes {
        ws.send(&[*b]);
    }
    assert_eq!(
        ws.next(),
        (10, b"between".to_vec()),
        "the pong, with the ping's payload"
    );
    assert_eq!(ws.answer(), json!({"jsonrpc": "2.0", "id": 1, "result": 2}));
    assert_eq!(
        ws.answer(),
        json!({"jsonrpc": "2.0", "id": 2, "result": "pong"})
    );
    // Pipelined: answers in request order, the slow one first; answers of every size.
    let mut bytes = Vec::new();
    bytes.extend(frame(
        true,
        1,
        br#"{"jsonrpc":"2.0","method":"delay","params":[50],"id":"slow"}"#,
    ));
    for (i, n) in [100usize, 200, 70_000].iter().enumerate() {
        let text = json!({"jsonrpc": "2.0", "method": "echo", "params": ["y".repeat(*n)], "id": i});
        bytes.extend(frame(true, 1, text.to_string().as_bytes()));
    }
    ws.send(&bytes);
    assert_eq!(ws.answer()["id"], "slow");
    for (i, n) in [100usize, 200, 70_000].iter().enumerate() {
        let a = ws.answer();
        assert_eq!(a["id"], i);
        assert_eq!(a["result"][0].as_str().unwrap().len(), *n);
    }
    // A Close is echoed after the answers owed.
    ws.text(r#"{"jsonrpc":"2.0","method":"delay","params":[30],"id":"last"}"#);
    ws.send(&frame(true, 8, &1000u16.to_be_bytes()));
    assert_eq!(ws.answer()["id"], "last");
    ws.closed_with(1000);
    server.stop();
}

#[test]
fn oversized_messages_are_answered_and_skipped() {
    let engine = demo::engine(Config::default().max_request_bytes(1000));
    let server = Served::start(engine, ServerConfig::default());
    let mut ws = Ws::connect(server.http, "");
    ws.send(&frame(true, 1, &[b' '; 5000]));
    // Over the limit in three fragments of 400.
    ws.send(&frame(false, 1, &[b' '; 400]));
    ws.send(&frame(false, 0, &[b' '; 400]));
    ws.send(&frame(true, 0, &[b' '; 400]));
    ws.text(r#"{"jsonrpc":"2.0","method":"ping","id":1}"#);
    for _ in 0..2 {
        let a = ws.answer();
        assert_eq!(a["error"]["code"], -32600, "{a}");
        assert_eq!(a["id"], Value::Null);
        let message = a["error"]["message"].as_str().unwrap();
        assert!(message.contains("max_request_bytes (1000"), "{message}");
    }
    assert_eq!(ws.answer()["result"], "pong");
    server.stop();
}

#[test]
fn protocol_violations_close_with_a_reason() {
    let server = served(ServerConfig::default());
    let cases: Vec<(Vec<u8>, u16)> = vec![
        // Unmasked.
        (vec![0x81, 0x02, b'[', b']'], 1002),
        // An unknown opcode.
        (frame(true, 3, b"x"), 1002),
        // A continuation with no message begun.
        (frame(true, 0, b"x"), 1002),
        // Text that is not UTF-8.
        (frame(true, 1, &[0xc3, 0x28]), 1007),
    ];
    for (bytes, code) in cases {
        let mut ws = Ws::connect(server.http, "");
        ws.send(&bytes);
        ws.closed_with(code);
    }
    // The server lives: another connection is served.
    Ws::connect(server.http, "").pings();
    server.stop();
}

#[test]
fn bad_handshakes_are_refused_with_a_status() {
    let settings = ServerConfig::default().cors_origin("https://good.example");
    let server = served(settings);
    let cases = [
        (
            handshake("").replace("Sec-WebSocket-Version: 13", "Sec-WebSocket-Version: 8"),
            426,
        ),
        (handshake("").replace(KEY, "short"), 400),
        (
            handshake("").replace("Connection: Upgrade", "Connection: keep-alive"),
            400,
        ),
        (handshake("").replace("HTTP/1.1", "HTTP/1.0"), 400),
        (handshake("Origin: https://evil.example\r\n"), 403),
        (handshake("").replace("GET / ", "GET /elsewhere "), 404),
    ];
    for (request, status) in cases {
        let mut s = TcpStream::connect(server.http).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let (got, head, _) = http_head(&mut s, &request);
        assert_eq!(got, status, "{request}\n{head}");
        if status == 426 {
            assert!(head.contains("Sec-WebSocket-Version: 13\r\n"), "{head}");
        }
    }
    // An allowed origin's page may connect.
    Ws::connect(server.http, "Origin: https://good.example\r\n").pings();
    server.stop();
}

#[test]
fn credentials_on_the_handshake_or_rpc_auth() {
    let guard = Guard::new()
        .with_keys_toml("[[key]]\nname = \"ops\"\ntoken = \"s3cret\"\nallow = [\"*\"]\n")
        .unwrap();
    let engine = Arc::new(demo::engine(Config::default()).with_guard(guard));
    let server = Served::start(Arc::clone(&engine) as Arc<Engine>, ServerConfig::default());
    // A bad token: refused before the switch.
    let mut s = TcpStream::connect(server.http).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let (status, head, _) = http_head(&mut s, &handshake("Authorization: Bearer wrong\r\n"));
    assert_eq!(status, 401, "{head}");
    assert!(head.contains("invalid_token"), "{head}");
    // A good one: the connection is that identity's.
    let mut ws = Ws::connect(server.http, "Authorization: Bearer s3cret\r\n");
    ws.text(r#"{"jsonrpc":"2.0","method":"whoami","id":1}"#);
    assert_eq!(ws.answer()["result"]["transport"], "ws");
    // None: calls need rpc.auth first, as on TCP.
    let mut ws = Ws::connect(server.http, "");
    ws.text(r#"{"jsonrpc":"2.0","method":"ping","id":1}"#);
    assert_eq!(ws.answer()["error"]["code"], -32040);
    ws.text(r#"{"jsonrpc":"2.0","method":"rpc.auth","params":{"token":"s3cret"},"id":2}"#);
    assert_eq!(ws.answer()["result"]["identity"], "ops");
    ws.text(r#"{"jsonrpc":"2.0","method":"ping","id":3}"#);
    assert_eq!(ws.answer()["result"], "pong");
    server.stop();
}

/// At shutdown an open WebSocket gets the answers it is owed, then a Close (1001).
#[test]
fn shutdown_answers_then_closes_going_away() {
    let server = served(ServerConfig::default());
    let mut ws = Ws::connect(server.http, "");
    ws.text(r#"{"jsonrpc":"2.0","method":"delay","params":[1000],"id":"owed"}"#);
    // The call is read before the shutdown begins.
    ws.text(r#"{"jsonrpc":"2.0","method":"ping","id":0}"#);
    let _ = ws.s.set_read_timeout(Some(Duration::from_secs(10)));
    let reader = std::thread::spawn(move || {
        let owed = ws.answer();
        let pong = ws.answer();
        ws.closed_with(1001);
        (owed, pong)
    });
    // (Ample on a loaded machine: a frame not read when the shutdown begins is never
    // read. The call is still owed then.)
    std::thread::sleep(Duration::from_millis(300));
    server.handle.shutdown();
    let (owed, pong) = reader.join().unwrap();
    assert_eq!(
        owed,
        json!({"jsonrpc": "2.0", "id": "owed", "result": null})
    );
    assert_eq!(pong["result"], "pong");
    server.stop();
}

/// Node's `ws` package, installed by `.ci/run` under `~/.cache/ringrpc-node` (or where
/// `RINGRPC_NODE_MODULES` says).
const NODE_CLIENT: &str = r#"
const WebSocket = require('ws');
const url = process.argv[process.argv.length - 1];
const out = {};
// Every message is queued as it comes (several can arrive in one read: a `once`
// listener set after each would miss the ones between).
function open() {
  return new Promise((ok, fail) => {
    const ws = new WebSocket(url, { maxPayload: 0 });
    ws.inbox = [];
    ws.waiting = null;
    ws.on('message', (m) => {
      const v = JSON.parse(m.toString());
      if (ws.waiting) { const w = ws.waiting; ws.waiting = null; w(v); } else { ws.inbox.push(v); }
    });
    ws.on('open', () => ok(ws));
    ws.on('error', fail);
  });
}
function next(ws) {
  if (ws.inbox.length > 0) return Promise.resolve(ws.inbox.shift());
  return new Promise((ok) => { ws.waiting = ok; });
}
(async () => {
  const ws = await open();
  ws.send('{"jsonrpc":"2.0","method":"subtract","params":[42,23],"id":1}');
  out.call = await next(ws);
  ws.send('{"jsonrpc":"2.0","method":"notify_hello","params":[7]}');
  ws.send('{"jsonrpc":"2.0","method":"nope","id":"e"}');
  out.error = await next(ws);
  ws.send('[{"jsonrpc":"2.0","method":"sum","params":[1,2,4],"id":"1"},{"jsonrpc":"2.0","method":"notify_hello","params":[7]},{"foo":"boo"}]');
  out.batch = await next(ws);
  const big = 'x'.repeat(1000000);
  ws.send(JSON.stringify({jsonrpc: '2.0', method: 'echo', params: [big], id: 5}));
  out.big = (await next(ws)).result[0] === big;
  out.pong = await new Promise((ok) => { ws.once('pong', (p) => ok(p.toString())); ws.ping('are you there'); });
  ws.send('{"jsonrpc":"2.0","method":"subscribe_ticks","params":[1],"id":6}');
  const sub = (await next(ws)).result;
  const ticks = [];
  for (let i = 0; i < 100; i++) ticks.push((await next(ws)).params.result);
  out.ticks = ticks;
  ws.send(JSON.stringify({jsonrpc: '2.0', method: 'unsubscribe_ticks', params: [sub], id: 7}));
  for (;;) { const m = await next(ws); if (m.id === 7) { out.unsub = m.result; break; } }
  out.close = await new Promise((ok) => { ws.once('close', (code) => ok(code)); ws.close(1000); });
  const fifty = await Promise.all([...Array(50).keys()].map(async (i) => {
    const c = await open();
    c.send(JSON.stringify({jsonrpc: '2.0', method: 'add', params: [i, 1], id: i}));
    const a = await next(c);
    c.close();
    return a.result;
  }));
  out.fifty = fifty;
  console.log(JSON.stringify(out));
})().catch((e) => { console.error(e); process.exit(1); });
"#;

#[test]
fn node_ws_client() {
    let modules = std::env::var("RINGRPC_NODE_MODULES").unwrap_or_else(|_| {
        format!(
            "{}/.cache/ringrpc-node/node_modules",
            std::env::var("HOME").unwrap_or_default()
        )
    });
    assert!(
        std::path::Path::new(&modules).join("ws").is_dir(),
        "this test needs Node's `ws` package in {modules} \
         (npm install --prefix ~/.cache/ringrpc-node ws@8; .ci/run does it)"
    );
    let server = served(ServerConfig::default());
    let out = std::process::Command::new("node")
        .args(["-e", NODE_CLIENT, "--"])
        .arg(format!("ws://{}/", server.http))
        .env("NODE_PATH", &modules)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "node client failed: {stderr}");
    let got: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        got["call"],
        json!({"jsonrpc": "2.0", "id": 1, "result": 19})
    );
    assert_eq!(got["error"]["error"]["code"], -32601);
    assert_eq!(
        got["batch"][0],
        json!({"jsonrpc": "2.0", "id": "1", "result": 7})
    );
    assert_eq!(got["batch"][1]["error"]["code"], -32600);
    assert_eq!(got["big"], true);
    assert_eq!(got["pong"], "are you there");
    let ticks: Vec<u64> = (0..100).collect();
    assert_eq!(got["ticks"], json!(ticks));
    assert_eq!(got["unsub"], true);
    assert_eq!(got["close"], 1000);
    let fifty: Vec<i64> = (1..=50).collect();
    assert_eq!(got["fifty"], json!(fifty));
    server.stop();
}

/// A subscriber's WebSocket that goes quiet is pinged; answering keeps it, silence
/// closes it (a vanished peer would otherwise hold its subscriptions for good). A
/// WebSocket without subscriptions is left to the idle timeout: no pings.
#[test]
fn silent_subscribers_are_pinged_and_closed_when_they_stop_answering() {
    let settings = ServerConfig::default().subscriber_ping_interval(Some(Duration::from_secs(1)));
    let server = served(settings);
    let mut quiet = Ws::connect(server.http, "");
    let mut ws = Ws::connect(server.http, "");
    // A tick a minute: nothing flows.
    ws.text(r#"{"jsonrpc":"2.0","method":"subscribe_ticks","params":[60000],"id":1}"#);
    assert!(ws.answer()["result"].is_u64());
    for _ in 0..3 {
        let (op, payload) = ws.next();
        assert_eq!(op, 9, "a ping: {payload:?}");
        ws.send(&frame(true, 10, &payload));
    }
    // Still served.
    ws.pings();
    // Now it answers nothing: a ping, then (no pong within the interval) a Close 1001
    // and the end of the connection.
    let (op, _) = ws.next();
    assert_eq!(op, 9);
    ws.closed_with(1001);
    // The one with no subscription got nothing at all meanwhile.
    quiet
        .s
        .set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let mut b = [0u8; 16];
    assert!(
        matches!(quiet.s.read(&mut b), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "a connection without subscriptions is not pinged"
    );
    quiet
        .s
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    quiet.pings();
    server.stop();
}
