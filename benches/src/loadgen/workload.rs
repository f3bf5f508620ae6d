//! The plan: the messages to send, serialized once, and what their answers must be.

use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;

use super::drivers::ws_header;
use super::Args;

/// Ids are 10-digit decimal numbers, so they are patched in place.
pub(crate) const ID_BASE: u64 = 1_000_000_000;
pub(crate) const ID_END: u64 = 10_000_000_000;
pub(crate) const ID_DIGITS: usize = 10;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Method {
    Subtract,
    Add,
    Sum,
    Ping,
    Echo,
    GetData,
    Sleep,
    Delay,
}

impl Method {
    fn parse(s: &str) -> Option<Method> {
        Some(match s {
            "subtract" => Method::Subtract,
            "add" => Method::Add,
            "sum" => Method::Sum,
            "ping" => Method::Ping,
            "echo" => Method::Echo,
            "get_data" => Method::GetData,
            "sleep" => Method::Sleep,
            "delay" => Method::Delay,
            _ => return None,
        })
    }
}

/// What a call's result must be.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Expect {
    Int(i64),
    Pong,
    GetData,
    Null,
    Echo,
}

/// The `echo` params: keys sorted and no whitespace, so a server that re-encodes them
/// through a map still answers the same bytes (other answers are compared as values);
/// flat, because serde_json allocates to skip over nested containers.
pub(crate) const ECHO_PARAMS: &str = r#"{"a":1,"b":"two","c":true,"d":null,"e":-5}"#;

/// One distinct message: its bytes (HTTP head included) and its calls.
pub(crate) struct Template {
    pub(crate) bytes: Vec<u8>,
    pub(crate) calls: Vec<Call>,
}

/// One call of a message.
pub(crate) struct Call {
    /// Offset of the id's digits in the message.
    pub(crate) at: usize,
    pub(crate) expect: Expect,
    /// The result as a compact encoder writes it (`19`, `"pong"`, the echo params...),
    /// for the fast path.
    pub(crate) canon: Box<[u8]>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Transport {
    Tcp,
    Http,
    Ws,
}

pub(crate) struct Plan {
    pub(crate) transport: Transport,
    pub(crate) addr: SocketAddr,
    /// The HTTP or WebSocket path.
    pub(crate) path: String,
    pub(crate) target: String,
    pub(crate) templates: Vec<Template>,
    /// Calls per message (1 for single requests).
    pub(crate) per: usize,
    pub(crate) depth: usize,
    pub(crate) verify: bool,
    pub(crate) echo_value: serde_json::Value,
    pub(crate) timeout: Duration,
    /// Measured messages per connection (count mode).
    pub(crate) quota: Option<Vec<u64>>,
    pub(crate) warmup: Duration,
    pub(crate) duration: Option<Duration>,
    pub(crate) max_message: usize,
    /// Open loop: messages per second, all connections together.
    pub(crate) rate: Option<f64>,
}

/// `method[:weight],...` → a cycle in which each method appears `weight` times, spread
/// evenly (smooth weighted round robin).
pub(crate) fn parse_mix(mix: &str) -> Result<Vec<Method>, String> {
    let mut entries = Vec::new();
    for part in mix.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (name, weight) = match part.split_once(':') {
            Some((n, w)) => (
                n.trim(),
                w.trim()
                    .parse::<u32>()
                    .map_err(|_| format!("bad weight in {part:?}"))?,
            ),
            None => (part, 1),
        };
        let m = Method::parse(name).ok_or_else(|| {
            format!(
                "unknown method {name:?} (subtract, add, sum, ping, echo, get_data, sleep, delay)"
            )
        })?;
        if weight > 0 {
            entries.push((m, weight as i64));
        }
    }
    let total: i64 = entries.iter().map(|e| e.1).sum();
    if total == 0 {
        return Err("the mix is empty".into());
    }
    if total > 10_000 {
        return Err("the mix's weights add up to more than 10000".into());
    }
    let mut current = vec![0i64; entries.len()];
    let mut cycle = Vec::with_capacity(total as usize);
    for _ in 0..total {
        for (c, e) in current.iter_mut().zip(&entries) {
            *c += e.1;
        }
        let best = (0..entries.len())
            .max_by_key(|&i| (current[i], std::cmp::Reverse(i)))
            .unwrap_or(0);
        current[best] -= total;
        cycle.push(entries[best].0);
    }
    Ok(cycle)
}

/// One call's JSON text, with `ID_DIGITS` zeros for the id; returns the id's offset.
pub(crate) fn call_json(m: Method, position: usize, sleep_ms: u64, out: &mut Vec<u8>) -> Call {
    let (method, params, expect) = match m {
        Method::Subtract => ("subtract", Some("[42,23]".to_string()), Expect::Int(19)),
        Method::Add => {
            let a = position as i64 + 1;
            ("add", Some(format!("[{a},{}]", 2 * a)), Expect::Int(3 * a))
        }
        Method::Sum => ("sum", Some("[1,2,3,4]".into()), Expect::Int(10)),
        Method::Ping => ("ping", None, Expect::Pong),
        Method::Echo => ("echo", Some(ECHO_PARAMS.into()), Expect::Echo),
        Method::GetData => ("get_data", None, Expect::GetData),
        Method::Sleep => (
            "sleep",
            Some(format!("{{\"ms\":{sleep_ms}}}")),
            Expect::Null,
        ),
        Method::Delay => ("delay", Some(format!("[{sleep_ms}]")), Expect::Null),
    };
    out.extend_from_slice(br#"{"jsonrpc":"2.0","method":""#);
    out.extend_from_slice(method.as_bytes());
    out.push(b'"');
    if let Some(p) = params {
        out.extend_from_slice(br#","params":"#);
        out.extend_from_slice(p.as_bytes());
    }
    out.extend_from_slice(br#","id":"#);
    let at = out.len();
    out.extend_from_slice(&[b'0'; ID_DIGITS]);
    out.push(b'}');
    let canon = match expect {
        Expect::Int(v) => v.to_string(),
        Expect::Pong => r#""pong""#.into(),
        Expect::GetData => r#"["hello",5]"#.into(),
        Expect::Null => "null".into(),
        Expect::Echo => ECHO_PARAMS.into(),
    };
    Call {
        at,
        expect,
        canon: canon.into_bytes().into_boxed_slice(),
    }
}

pub(crate) fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// `SCHEME://host:port/path` → (host:port, path).
pub(crate) fn parse_url(url: &str, scheme: &str) -> Result<(String, String), String> {
    let rest = url
        .strip_prefix(scheme)
        .ok_or_else(|| format!("{url:?}: only {scheme} URLs are supported"))?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    if authority.is_empty() {
        return Err(format!("{url:?}: no host"));
    }
    let authority = if authority
        .rsplit_once(':')
        .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
    {
        authority.to_string()
    } else {
        format!("{authority}:80")
    };
    Ok((authority, path.to_string()))
}

pub(crate) fn build_plan(args: &Args) -> Result<Plan, String> {
    if args.connections == 0 || args.depth == 0 || args.threads == 0 {
        return Err("--connections, --depth and --threads must be at least 1".into());
    }
    if args.batch > 100_000 {
        return Err("--batch is at most 100000".into());
    }
    let cycle = parse_mix(&args.mix)?;
    let (transport, authority, path) = match (&args.tcp, &args.http, &args.ws) {
        (Some(a), None, None) => (Transport::Tcp, a.clone(), String::new()),
        (None, Some(u), None) => {
            let (a, p) = parse_url(u, "http://")?;
            (Transport::Http, a, p)
        }
        (None, None, Some(u)) => {
            let (a, p) = parse_url(u, "ws://")?;
            (Transport::Ws, a, p)
        }
        _ => return Err("give exactly one of --tcp ADDR, --http URL and --ws URL".into()),
    };
    let addr = authority
        .to_socket_addrs()
        .map_err(|e| format!("{authority}: {e}"))?
        .next()
        .ok_or_else(|| format!("{authority}: no address"))?;

    let per = args.batch.max(1);
    let w = cycle.len();
    let messages = if args.batch == 0 { w } else { w / gcd(w, per) };
    let mut templates = Vec::with_capacity(messages);
    for k in 0..messages {
        let mut body = Vec::new();
        let mut calls = Vec::with_capacity(per);
        if args.batch > 0 {
            body.push(b'[');
        }
        for j in 0..per {
            if j > 0 {
                body.push(b',');
            }
            let pos = (k * per + j) % w;
            calls.push(call_json(cycle[pos], pos, args.sleep_ms, &mut body));
        }
        if args.batch > 0 {
            body.push(b']');
        }
        let mut bytes = match transport {
            Transport::Tcp => Vec::new(),
            Transport::Http => format!(
                "POST {path} HTTP/1.1\r\nHost: {authority}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
                body.len()
            )
            .into_bytes(),
            Transport::Ws => ws_header(body.len()),
        };
        let head = bytes.len();
        bytes.extend_from_slice(&body);
        if transport == Transport::Tcp {
            bytes.push(b'\n');
        }
        for c in &mut calls {
            c.at += head;
        }
        templates.push(Template { bytes, calls });
    }
    let max_message = templates.iter().map(|t| t.bytes.len()).max().unwrap_or(0);

    let secs = |s: f64, what: &str| {
        Duration::try_from_secs_f64(s).map_err(|_| format!("{what}: {s} is not a duration"))
    };
    let quota = args.count.map(|n| {
        let c = args.connections as u64;
        (0..c).map(|i| n / c + u64::from(i < n % c)).collect()
    });
    let duration = match (args.duration, args.count) {
        (Some(d), _) => Some(secs(d, "--duration")?),
        (None, None) => Some(Duration::from_secs(10)),
        (None, Some(_)) => None,
    };
    let rate = match args.rate {
        Some(r) if !(r.is_finite() && r > 0.0) => {
            return Err(format!(
                "--rate: {r} is not a positive number of messages per second"
            ))
        }
        r => r,
    };
    Ok(Plan {
        transport,
        addr,
        path,
        target: args
            .tcp
            .clone()
            .or_else(|| args.http.clone())
            .or_else(|| args.ws.clone())
            .unwrap_or_default(),
        templates,
        per,
        depth: args.depth,
        verify: !args.no_verify,
        echo_value: serde_json::from_str(ECHO_PARAMS).map_err(|e| e.to_string())?,
        timeout: secs(args.timeout, "--timeout")?,
        quota,
        warmup: secs(args.warmup, "--warmup")?,
        duration,
        max_message,
        rate,
    })
}
