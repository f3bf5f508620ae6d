//! The plan of one run against one server: where (the target), the messages framed for
//! its transport, and the run's shape (connections, depth, duration or count, rate).

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::time::Duration;

use super::drivers::ws_header;
use super::verify::snippet;
use super::workload::{Call, Messages, Rand, ECHO_PARAMS, ID_BASE, ID_END};
use super::Args;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Transport {
    Tcp,
    Unix,
    Http,
    Ws,
}

impl Transport {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Transport::Tcp => "tcp",
            Transport::Unix => "unix",
            Transport::Http => "http",
            Transport::Ws => "ws",
        }
    }

    /// Newline-delimited JSON (TCP or a Unix socket).
    pub(crate) fn lines(self) -> bool {
        matches!(self, Transport::Tcp | Transport::Unix)
    }
}

/// Where a server is.
#[derive(Clone, Debug)]
pub(crate) enum Addr {
    Inet(SocketAddr),
    Unix(PathBuf),
}

impl std::fmt::Display for Addr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Addr::Inet(a) => write!(f, "{a}"),
            Addr::Unix(p) => write!(f, "{}", p.display()),
        }
    }
}

/// A server to load: its transport, address and (HTTP, WebSocket) path, as given.
#[derive(Clone, Debug)]
pub(crate) struct Target {
    /// A name for tables and charts (`NAME=URL`, or the URL).
    pub(crate) name: String,
    pub(crate) transport: Transport,
    pub(crate) addr: Addr,
    /// host:port as given (the HTTP `Host`).
    pub(crate) authority: String,
    pub(crate) path: String,
    /// As given on the command line.
    pub(crate) url: String,
}

impl Target {
    /// `tcp://host:port`, `unix:///path`, `http://host:port/path`, `ws://host:port/path`,
    /// optionally after `NAME=`.
    pub(crate) fn parse(spec: &str) -> Result<Target, String> {
        let (name, url) = match spec.split_once('=') {
            Some((n, u)) if !n.contains("://") && !n.is_empty() => (n.to_string(), u),
            _ => (spec.to_string(), spec),
        };
        let mut t = if let Some(path) = url.strip_prefix("unix://") {
            Target::unix(path)?
        } else if let Some(rest) = url.strip_prefix("tcp://") {
            Target::inet(Transport::Tcp, rest, String::new())?
        } else if url.starts_with("http://") {
            let (a, p) = parse_url(url, "http://")?;
            Target::inet(Transport::Http, &a, p)?
        } else if url.starts_with("ws://") {
            let (a, p) = parse_url(url, "ws://")?;
            Target::inet(Transport::Ws, &a, p)?
        } else {
            return Err(format!(
                "{url:?}: give tcp://HOST:PORT, unix:///PATH, http://HOST:PORT/PATH or ws://HOST:PORT/PATH"
            ));
        };
        t.name = name;
        t.url = url.to_string();
        Ok(t)
    }

    /// The target of `--tcp`, `--unix`, `--http` or `--ws`.
    pub(crate) fn of_args(args: &Args) -> Result<Target, String> {
        let t = match (&args.tcp, &args.unix, &args.http, &args.ws) {
            (Some(a), None, None, None) => Target::inet(Transport::Tcp, a, String::new())?,
            (None, Some(p), None, None) => Target::unix(&p.to_string_lossy())?,
            (None, None, Some(u), None) => {
                let (a, p) = parse_url(u, "http://")?;
                Target::inet(Transport::Http, &a, p)?
            }
            (None, None, None, Some(u)) => {
                let (a, p) = parse_url(u, "ws://")?;
                Target::inet(Transport::Ws, &a, p)?
            }
            _ => return Err(
                "give exactly one of --tcp ADDR, --unix PATH, --http URL, --ws URL (or --compare)"
                    .into(),
            ),
        };
        let url = [&args.tcp, &args.http, &args.ws]
            .into_iter()
            .flatten()
            .next()
            .cloned()
            .or_else(|| args.unix.as_ref().map(|p| p.to_string_lossy().into_owned()))
            .unwrap_or_default();
        Ok(Target {
            name: url.clone(),
            url,
            ..t
        })
    }

    fn inet(transport: Transport, authority: &str, path: String) -> Result<Target, String> {
        let addr = authority
            .to_socket_addrs()
            .map_err(|e| format!("{authority}: {e}"))?
            .next()
            .ok_or_else(|| format!("{authority}: no address"))?;
        Ok(Target {
            name: String::new(),
            transport,
            addr: Addr::Inet(addr),
            authority: authority.to_string(),
            path,
            url: String::new(),
        })
    }

    fn unix(path: &str) -> Result<Target, String> {
        if path.is_empty() {
            return Err("unix://: no path".into());
        }
        Ok(Target {
            name: String::new(),
            transport: Transport::Unix,
            addr: Addr::Unix(PathBuf::from(path)),
            authority: String::new(),
            path: String::new(),
            url: String::new(),
        })
    }
}

/// One distinct message as sent: its bytes (HTTP head or WebSocket header included).
pub(crate) struct Template {
    pub(crate) bytes: Vec<u8>,
    pub(crate) calls: Vec<Call>,
    pub(crate) randoms: Vec<Rand>,
    /// Index in `Plan::labels`.
    pub(crate) label: usize,
}

pub(crate) struct Plan {
    pub(crate) transport: Transport,
    pub(crate) addr: Addr,
    /// The HTTP or WebSocket path.
    pub(crate) path: String,
    pub(crate) target: String,
    pub(crate) templates: Vec<Template>,
    /// Calls a message slot has room for (the most calls of one message).
    pub(crate) per: usize,
    pub(crate) depth: usize,
    pub(crate) verify: bool,
    pub(crate) echo_value: serde_json::Value,
    pub(crate) expected: Vec<serde_json::Value>,
    pub(crate) labels: Vec<String>,
    pub(crate) timeout: Duration,
    /// Measured messages per connection (count mode).
    pub(crate) quota: Option<Vec<u64>>,
    pub(crate) warmup: Duration,
    pub(crate) duration: Option<Duration>,
    pub(crate) max_message: usize,
    /// Open loop: messages per second, all connections together.
    pub(crate) rate: Option<f64>,
    /// `--busy-poll`: the poll never sleeps.
    pub(crate) busy_poll: bool,
    /// The `--header` lines, each `NAME: VALUE\r\n` (HTTP heads, WebSocket handshake).
    pub(crate) header_lines: String,
    /// The `--hello` request, framed, sent on each connection before the load.
    pub(crate) hello: Option<Hello>,
    /// Ids one generation of every message slot of the run takes: connection `i`'s
    /// call slot `s` of generation `g` is id `ID_BASE + g * stride + i * calls + s`
    /// (`calls` = depth × calls per message), so ids are unique across connections.
    pub(crate) stride: u64,
}

/// The request `--hello` sends on each connection before the load.
pub(crate) struct Hello {
    /// As written: compact JSON, framed for the transport.
    pub(crate) bytes: Vec<u8>,
    /// Its id, which the answer must carry.
    id: serde_json::Value,
}

impl Hello {
    /// `--hello`'s JSON text: a JSON-RPC 2.0 request with an id outside loadgen's range.
    pub(crate) fn parse(text: &str, transport: Transport) -> Result<Hello, String> {
        if transport == Transport::Http {
            return Err(
                "--hello is for TCP, Unix sockets and WebSocket: over HTTP send \
                 credentials with each request (--header 'Authorization: Bearer TOKEN')"
                    .into(),
            );
        }
        let v: serde_json::Value =
            serde_json::from_str(text).map_err(|e| format!("--hello: not JSON: {e}"))?;
        let ok = v.get("jsonrpc").and_then(|j| j.as_str()) == Some("2.0")
            && v.get("method").is_some_and(|m| m.is_string());
        if !ok {
            return Err(
                "--hello: give one JSON-RPC 2.0 request object (`jsonrpc`, `method`)".into(),
            );
        }
        let id = v
            .get("id")
            .cloned()
            .ok_or("--hello: the request needs an id (its answer is awaited)")?;
        if id.as_u64().is_some_and(|n| (ID_BASE..ID_END).contains(&n)) {
            return Err(format!(
                "--hello: id {id} is in the range of loadgen's own ids ({ID_BASE} to {}): give another",
                ID_END - 1
            ));
        }
        // Compact: one line on TCP and Unix sockets, whatever the text's spacing.
        let json = serde_json::to_vec(&v).map_err(|e| e.to_string())?;
        let mut bytes = match transport {
            Transport::Ws => ws_header(json.len()),
            _ => Vec::new(),
        };
        bytes.extend_from_slice(&json);
        if transport.lines() {
            bytes.push(b'\n');
        }
        Ok(Hello { bytes, id })
    }

    /// Whether `answer` is this request's result; else what it was (the server's error).
    pub(crate) fn check(&self, answer: &[u8]) -> Result<(), String> {
        let v: serde_json::Value = serde_json::from_slice(answer).map_err(|e| {
            format!(
                "the answer to --hello is not JSON ({e}): {}",
                snippet(answer)
            )
        })?;
        if v.get("id") != Some(&self.id) || v.get("jsonrpc").and_then(|j| j.as_str()) != Some("2.0")
        {
            return Err(format!(
                "the answer to --hello is not a JSON-RPC 2.0 response with its id: {}",
                snippet(answer)
            ));
        }
        match (v.get("result"), v.get("error")) {
            (Some(_), None) => Ok(()),
            (None, Some(e)) => Err(format!("--hello was answered with an error: {e}")),
            _ => Err(format!(
                "the answer to --hello is not a JSON-RPC 2.0 response: {}",
                snippet(answer)
            )),
        }
    }
}

/// Header names loadgen writes itself (framing, the WebSocket handshake).
const OWN_HEADERS: [&str; 8] = [
    "host",
    "content-length",
    "content-type",
    "transfer-encoding",
    "connection",
    "upgrade",
    "sec-websocket-key",
    "sec-websocket-version",
];

/// `--header 'NAME: VALUE'` → the line `NAME: VALUE\r\n`. NAME must be an HTTP token
/// (RFC 9110), VALUE free of CR, LF and other control characters but tab. Error
/// messages name the header, never its value (it may be a secret).
pub(crate) fn header_line(spec: &str) -> Result<String, String> {
    let (name, value) = spec
        .split_once(':')
        .ok_or("--header: no `:` (give 'NAME: VALUE')")?;
    let tchar = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
    if name.is_empty() || !name.chars().all(tchar) {
        return Err(format!(
            "--header: the name {name:?} is not an HTTP token (letters, digits and !#$%&'*+-.^_`|~, no spaces)"
        ));
    }
    if OWN_HEADERS.contains(&name.to_ascii_lowercase().as_str()) {
        return Err(format!("--header: loadgen writes {name} itself"));
    }
    let value = value.trim_matches([' ', '\t']);
    if value.chars().any(|c| c.is_control() && c != '\t') {
        return Err(format!(
            "--header {name}: the value holds a CR, LF or another control character"
        ));
    }
    Ok(format!("{name}: {value}\r\n"))
}

pub(crate) fn build_plan(args: &Args, target: &Target, msgs: &Messages) -> Result<Plan, String> {
    if args.connections == 0 || args.depth == 0 || args.threads == 0 {
        return Err("--connections, --depth and --threads must be at least 1".into());
    }
    let transport = target.transport;
    let header_lines = args
        .headers
        .iter()
        .map(|h| header_line(h))
        .collect::<Result<String, _>>()?;
    if !header_lines.is_empty() && transport.lines() {
        return Err(format!(
            "--header is for HTTP and WebSocket, not {} (authenticate there with --hello)",
            transport.name()
        ));
    }
    let hello = match &args.hello {
        Some(text) => Some(Hello::parse(text, transport)?),
        None => None,
    };
    // Every call slot of every connection, one generation; at least two generations fit.
    let stride = (args.connections as u64)
        .saturating_mul(args.depth as u64)
        .saturating_mul(msgs.per as u64);
    if stride > (ID_END - ID_BASE) / 2 {
        return Err(format!(
            "--connections x --depth x calls per message is {stride}: loadgen's 10-digit ids \
             allow at most {}",
            (ID_END - ID_BASE) / 2
        ));
    }
    let mut templates = Vec::with_capacity(msgs.bodies.len());
    for b in &msgs.bodies {
        let body = &b.json;
        let mut bytes = match transport {
            Transport::Tcp | Transport::Unix => Vec::new(),
            Transport::Http => format!(
                "POST {} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{header_lines}\r\n",
                target.path,
                target.authority,
                body.len()
            )
            .into_bytes(),
            Transport::Ws => ws_header(body.len()),
        };
        let head = bytes.len();
        bytes.extend_from_slice(body);
        if transport.lines() {
            bytes.push(b'\n');
        }
        let mut calls = b.calls.clone();
        for c in &mut calls {
            c.at += head;
        }
        let mut randoms = b.randoms.clone();
        for r in &mut randoms {
            r.at += head;
        }
        templates.push(Template {
            bytes,
            calls,
            randoms,
            label: b.label,
        });
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
        addr: target.addr.clone(),
        path: target.path.clone(),
        target: target.url.clone(),
        templates,
        per: msgs.per,
        depth: args.depth,
        verify: !args.no_verify,
        busy_poll: args.busy_poll,
        echo_value: serde_json::from_str(ECHO_PARAMS).map_err(|e| e.to_string())?,
        expected: msgs.expected.clone(),
        labels: msgs.labels.clone(),
        timeout: secs(args.timeout, "--timeout")?,
        quota,
        warmup: secs(args.warmup, "--warmup")?,
        duration,
        max_message,
        rate,
        header_lines,
        hello,
        stride,
    })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_lines_are_checked() {
        assert_eq!(
            header_line("Authorization:  Bearer t0k\t").unwrap(),
            "Authorization: Bearer t0k\r\n"
        );
        assert_eq!(header_line("X-Empty:").unwrap(), "X-Empty: \r\n");
        for (spec, why) in [
            ("Authorization Bearer secret", "no `:`"),
            (": v", "not an HTTP token"),
            ("X A: v", "not an HTTP token"),
            ("X-A : v", "not an HTTP token"),
            ("X-A: a\r\nX-B: b", "control character"),
            ("X-A: a\nb", "control character"),
            ("X-A: a\0", "control character"),
            ("host: x", "itself"),
        ] {
            let e = header_line(spec).unwrap_err();
            assert!(e.contains(why), "{spec:?}: {e}");
            assert!(!e.contains("secret"), "a value in {e}");
        }
    }

    #[test]
    fn hello_is_one_line_and_its_answer_is_checked() {
        let text = "{\"jsonrpc\": \"2.0\",\n \"method\": \"rpc.auth\", \"params\": {\"token\": \"t\"}, \"id\": 0}";
        let h = Hello::parse(text, Transport::Tcp).unwrap();
        assert_eq!(h.bytes.iter().filter(|&&b| b == b'\n').count(), 1);
        assert_eq!(h.bytes.last(), Some(&b'\n'));
        assert!(h
            .check(br#"{"jsonrpc":"2.0","id":0,"result":{"identity":"x"}}"#)
            .is_ok());
        let e = h
            .check(br#"{"jsonrpc":"2.0","id":0,"error":{"code":-32040,"message":"no"}}"#)
            .unwrap_err();
        assert!(e.contains("-32040"), "{e}");
        assert!(h.check(br#"{"jsonrpc":"2.0","id":1,"result":1}"#).is_err());
        assert!(h.check(b"nope").is_err());
        let ws = Hello::parse(text, Transport::Ws).unwrap();
        assert_eq!(ws.bytes[0], 0x81, "a text frame");
        assert!(Hello::parse(text, Transport::Http).is_err());
        assert!(Hello::parse("[]", Transport::Tcp).is_err());
    }
}
