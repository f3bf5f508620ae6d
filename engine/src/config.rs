//! Settings, in two types with documented defaults and chainable setters: [`Config`],
//! the engine's limits (what any embedder of the engine enforces), and
//! [`ServerConfig`], the server's own settings (connections, threads, HTTP).

use std::time::Duration;

/// The engine's limits: what every frame is held to, whoever feeds the engine. Every
/// field has a documented default; setters chain.
///
/// ```
/// let config = ringrpc::Config::default()
///     .max_request_bytes(64 * 1024)
///     .max_depth(32);
/// assert_eq!(config.request_limit(), 64 * 1024);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    pub(crate) max_request_bytes: usize,
    pub(crate) max_response_bytes: usize,
    pub(crate) max_depth: usize,
    pub(crate) max_batch_len: usize,
    pub(crate) request_timeout: Option<Duration>,
}

/// The server's settings: connections, timeouts, threads, HTTP. Given to
/// [`Server::with_config`](crate::server::Server::with_config); the engine's limits
/// stay in its [`Config`]. Every field has a documented default; setters chain.
///
/// ```
/// use std::time::Duration;
/// let settings = ringrpc::ServerConfig::default()
///     .workers(4)
///     .idle_timeout(Some(Duration::from_secs(60)))
///     .cors_origin("http://localhost:3000");
/// assert_eq!(settings.worker_count(), 4);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerConfig {
    pub(crate) max_connections: usize,
    pub(crate) idle_timeout: Option<Duration>,
    pub(crate) request_read_timeout: Option<Duration>,
    pub(crate) workers: usize,
    pub(crate) reactors: usize,
    pub(crate) batch_concurrency: usize,
    pub(crate) queue_capacity: usize,
    pub(crate) write_high_water: usize,
    pub(crate) http_path: String,
    pub(crate) max_head_bytes: usize,
    pub(crate) cors_origins: Vec<String>,
    pub(crate) subscriber_ping_interval: Option<Duration>,
}

/// The documented default of every setting.
pub mod defaults {
    use std::time::Duration;

    /// Default [`Config::max_request_bytes`](crate::Config::max_request_bytes): 1 MiB.
    pub const DEFAULT_MAX_REQUEST_BYTES: usize = 1024 * 1024;
    /// Default [`Config::max_response_bytes`](crate::Config::max_response_bytes): 8 MiB.
    pub const DEFAULT_MAX_RESPONSE_BYTES: usize = 8 * 1024 * 1024;
    /// Default [`Config::max_depth`](crate::Config::max_depth): 64 levels of
    /// arrays/objects.
    pub const DEFAULT_MAX_DEPTH: usize = 64;
    /// Default [`Config::max_batch_len`](crate::Config::max_batch_len): 1024 elements.
    pub const DEFAULT_MAX_BATCH_LEN: usize = 1024;
    /// Default [`Config::request_timeout`](crate::Config::request_timeout): 30 s.
    pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
    /// Default [`ServerConfig::max_connections`](crate::ServerConfig::max_connections):
    /// 10,000.
    pub const DEFAULT_MAX_CONNECTIONS: usize = 10_000;
    /// Default [`ServerConfig::idle_timeout`](crate::ServerConfig::idle_timeout): 300 s.
    pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(300);
    /// Default [`ServerConfig::request_read_timeout`](crate::ServerConfig::request_read_timeout):
    /// 30 s.
    pub const DEFAULT_REQUEST_READ_TIMEOUT: Duration = Duration::from_secs(30);
    /// Default [`ServerConfig::queue_capacity`](crate::ServerConfig::queue_capacity):
    /// 4096 calls waiting for a worker.
    pub const DEFAULT_QUEUE_CAPACITY: usize = 4096;
    /// Default [`ServerConfig::write_high_water`](crate::ServerConfig::write_high_water):
    /// 1 MiB of unsent output per connection.
    pub const DEFAULT_WRITE_HIGH_WATER: usize = 1024 * 1024;
    /// Default [`ServerConfig::max_head_bytes`](crate::ServerConfig::max_head_bytes):
    /// 8 KiB of HTTP request line and headers.
    pub const DEFAULT_MAX_HEAD_BYTES: usize = 8 * 1024;
    /// Default
    /// [`ServerConfig::subscriber_ping_interval`](crate::ServerConfig::subscriber_ping_interval):
    /// 30 s (geth's WebSocket ping interval).
    pub const DEFAULT_SUBSCRIBER_PING_INTERVAL: Duration = Duration::from_secs(30);
}

use defaults::*;

fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

impl Default for Config {
    fn default() -> Self {
        Self {
            max_request_bytes: DEFAULT_MAX_REQUEST_BYTES,
            max_response_bytes: DEFAULT_MAX_RESPONSE_BYTES,
            max_depth: DEFAULT_MAX_DEPTH,
            max_batch_len: DEFAULT_MAX_BATCH_LEN,
            request_timeout: Some(DEFAULT_REQUEST_TIMEOUT),
        }
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            idle_timeout: Some(DEFAULT_IDLE_TIMEOUT),
            request_read_timeout: Some(DEFAULT_REQUEST_READ_TIMEOUT),
            workers: cores(),
            reactors: 1,
            batch_concurrency: cores(),
            queue_capacity: DEFAULT_QUEUE_CAPACITY,
            write_high_water: DEFAULT_WRITE_HIGH_WATER,
            http_path: "/".to_owned(),
            max_head_bytes: DEFAULT_MAX_HEAD_BYTES,
            cors_origins: Vec::new(),
            subscriber_ping_interval: Some(DEFAULT_SUBSCRIBER_PING_INTERVAL),
        }
    }
}

impl Config {
    /// The largest request frame accepted, in bytes, without its line terminator
    /// (default [`defaults::DEFAULT_MAX_REQUEST_BYTES`]). A longer frame is discarded without being
    /// buffered whole and answered with `-32600` naming the limit; this also bounds the
    /// memory a connection's read buffer holds.
    pub fn max_request_bytes(mut self, bytes: usize) -> Self {
        self.max_request_bytes = bytes.max(1);
        self
    }

    /// The largest reply written, in bytes (default [`defaults::DEFAULT_MAX_RESPONSE_BYTES`]). A
    /// call whose result would pass it gets a `-32002 Response too large` error instead.
    /// For a batch the bound applies to the whole reply array; the small error objects
    /// that replace oversized results are always written.
    pub fn max_response_bytes(mut self, bytes: usize) -> Self {
        self.max_response_bytes = bytes.max(1);
        self
    }

    /// The deepest nesting of arrays and objects accepted (default
    /// [`defaults::DEFAULT_MAX_DEPTH`]); deeper documents get `-32700` naming the limit. This bounds
    /// the parser's stack and every recursive walk of a parsed request.
    pub fn max_depth(mut self, depth: usize) -> Self {
        self.max_depth = depth.clamp(2, 1024);
        self
    }

    /// The most elements a batch may have (default [`defaults::DEFAULT_MAX_BATCH_LEN`]); a longer
    /// batch is answered with one `-32600` naming the limit, and none of it runs.
    pub fn max_batch_len(mut self, len: usize) -> Self {
        self.max_batch_len = len.max(1);
        self
    }

    /// The deadline of a call answered later — a blocking method's on the server's
    /// worker pool, a deferred method's through its responder (default
    /// [`defaults::DEFAULT_REQUEST_TIMEOUT`]; `None`: none). At the deadline the caller
    /// gets `-32001 Request timed out`; the late result is dropped.
    pub fn request_timeout(mut self, t: Option<Duration>) -> Self {
        self.request_timeout = t;
        self
    }

    /// The request size limit in force.
    pub fn request_limit(&self) -> usize {
        self.max_request_bytes
    }

    /// The response size limit in force.
    pub fn response_limit(&self) -> usize {
        self.max_response_bytes
    }

    /// The nesting depth limit in force.
    pub fn depth_limit(&self) -> usize {
        self.max_depth
    }

    /// The batch length limit in force.
    pub fn batch_limit(&self) -> usize {
        self.max_batch_len
    }
}

impl ServerConfig {
    /// The most connections open at once (default [`defaults::DEFAULT_MAX_CONNECTIONS`]).
    /// Past it, new connections are accepted and closed at once; the others are
    /// unaffected.
    pub fn max_connections(mut self, n: usize) -> Self {
        self.max_connections = n.max(1);
        self
    }

    /// Close a connection with nothing in flight after this long without
    /// traffic (default [`defaults::DEFAULT_IDLE_TIMEOUT`]; `None`: never). Also how
    /// long a peer may take none of the answers owed it (it stopped reading) before
    /// its connection is dropped.
    pub fn idle_timeout(mut self, t: Option<Duration>) -> Self {
        self.idle_timeout = t;
        self
    }

    /// How a connection holding subscriptions is checked for a live peer (default
    /// [`defaults::DEFAULT_SUBSCRIBER_PING_INTERVAL`]; `None`: not checked). Such a
    /// connection is exempt from the idle timeout (it listens), so a peer that vanished
    /// (host down, network cut) without closing would otherwise hold it, and its
    /// subscriptions' producers, until a write to it failed — never, for a quiet
    /// subscription. A WebSocket that sent nothing for this long gets a Ping, and is
    /// closed if nothing (its Pong, or anything) comes back within as long again. TCP
    /// connections (WebSocket ones too) get the kernel's keepalive probes: the first
    /// after this long without traffic, then 3 more, a third of it apart (a Unix
    /// socket's peer cannot vanish without the kernel knowing). Checked once a second;
    /// at least 1 s.
    pub fn subscriber_ping_interval(mut self, t: Option<Duration>) -> Self {
        self.subscriber_ping_interval = t.map(|t| t.max(Duration::from_secs(1)));
        self
    }

    /// The longest a request may take to arrive once its first byte has
    /// (default [`defaults::DEFAULT_REQUEST_READ_TIMEOUT`]; `None`: no limit). A client
    /// that trickles a request slower than that is closed (HTTP: `408 Request Timeout`
    /// first), so slow clients cannot hold connections open indefinitely.
    pub fn request_read_timeout(mut self, t: Option<Duration>) -> Self {
        self.request_read_timeout = t;
        self
    }

    /// Event-loop threads (default 1). Each has its own TCP listening sockets
    /// on the same addresses (`SO_REUSEPORT`: the kernel spreads new connections over
    /// them); Unix sockets and signals stay on the first. One is right when the server
    /// has one core to itself; more when it has several.
    pub fn reactors(mut self, n: usize) -> Self {
        self.reactors = n.max(1);
        self
    }

    /// Worker threads for blocking methods and their batch elements (default:
    /// the number of cores).
    pub fn workers(mut self, n: usize) -> Self {
        self.workers = n.max(1);
        self
    }

    /// The most elements of one batch on the worker pool at once (default: the
    /// number of cores).
    pub fn batch_concurrency(mut self, n: usize) -> Self {
        self.batch_concurrency = n.max(1);
        self
    }

    /// Calls that may wait for a worker (default [`defaults::DEFAULT_QUEUE_CAPACITY`]).
    /// When the queue is full a call is answered `-32000 Server busy` at once.
    pub fn queue_capacity(mut self, n: usize) -> Self {
        self.queue_capacity = n.max(1);
        self
    }

    /// Unsent output a connection may hold before the server stops reading
    /// from it (default [`defaults::DEFAULT_WRITE_HIGH_WATER`]): a peer that does not read cannot
    /// make the server buffer without bound.
    pub fn write_high_water(mut self, bytes: usize) -> Self {
        self.write_high_water = bytes.max(1);
        self
    }

    /// The HTTP path JSON-RPC is served on (default `/`).
    pub fn http_path(mut self, path: impl Into<String>) -> Self {
        self.http_path = path.into();
        self
    }

    /// The largest HTTP request head (default [`defaults::DEFAULT_MAX_HEAD_BYTES`]);
    /// larger heads get `431`.
    pub fn max_head_bytes(mut self, bytes: usize) -> Self {
        self.max_head_bytes = bytes.max(64);
        self
    }

    /// Lets browser pages from `origin` call the HTTP transport (CORS; off by
    /// default). Repeatable; `"*"` allows every origin. An origin is matched byte for byte
    /// as browsers send it: `scheme://host[:port]`, no path, no trailing slash.
    ///
    /// With at least one origin set, the server answers `OPTIONS` preflights on the
    /// JSON-RPC path (`204` for an allowed origin, `403` otherwise) and adds
    /// `Access-Control-Allow-Origin` to every response to an allowed origin's request.
    /// [`Server::with_config`](crate::server::Server::with_config) refuses an origin holding anything but
    /// visible ASCII.
    pub fn cors_origin(mut self, origin: impl Into<String>) -> Self {
        self.cors_origins.push(origin.into());
        self
    }

    /// The worker threads in force.
    pub fn worker_count(&self) -> usize {
        self.workers
    }
}
