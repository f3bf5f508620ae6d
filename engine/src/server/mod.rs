//! The server: transports on a mio event loop, blocking calls on a worker pool.
//!
//! ```no_run
//! use ringrpc::{demo, server::Server, Config};
//!
//! let mut server = Server::new(demo::engine(Config::default()))?;
//! let tcp = server.listen_tcp("127.0.0.1:7700")?;
//! let http = server.listen_http("127.0.0.1:7701")?;
//! println!("listening tcp {tcp}\nlistening http {http}");
//! server.shutdown_on_signals()?; // SIGINT / SIGTERM: stop accepting, finish, flush, exit
//! server.run()?;
//! # Ok::<(), std::io::Error>(())
//! ```
//!
//! One reactor thread reads, parses and answers cheap calls where they were read: a
//! hand-off to another thread costs a cross-CPU wake-up (~35 µs on this kind of
//! machine), far more than the call. Methods registered as blocking, alone or as batch
//! elements, go to the worker pool (`ServerConfig::workers`), under `Config::request_timeout`.
//! See docs/ARCHITECTURE.md.

pub(crate) mod attach;
mod conn;
mod pending;
mod pool;
mod reactor;
mod scrape;
mod stdio;

pub use stdio::serve_stdio;

use std::io;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use mio::net::{TcpListener, UnixListener};

use crate::config::ServerConfig;
use crate::engine::Engine;

/// A non-blocking TCP listener on `addr`; with `reuse_port`, further listeners can bind
/// the same address (one per reactor) and the kernel spreads connections over them.
pub(crate) fn bind_tcp(addr: SocketAddr, reuse_port: bool) -> io::Result<TcpListener> {
    use socket2::{Domain, Socket, Type};
    let s = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
    s.set_reuse_address(true)?;
    if reuse_port {
        s.set_reuse_port(true)?;
    }
    s.set_nonblocking(true)?;
    s.bind(&addr.into())?;
    s.listen(1024)?;
    Ok(TcpListener::from_std(s.into()))
}

/// The kind of a listener.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Proto {
    /// Newline-delimited JSON on a stream socket.
    Line,
    /// HTTP/1.1.
    Http,
    /// HTTP/1.1 serving only `GET /metrics` (and `/health`).
    Metrics,
}

/// A bound listening socket.
pub(crate) enum Listener {
    Tcp(TcpListener, Proto),
    Unix(UnixListener, PathBuf),
}

/// Stops a running [`Server`] from any thread: it stops accepting, finishes and flushes
/// every call in flight, then [`Server::run`] returns.
#[derive(Clone, Debug)]
pub struct ServerHandle {
    stop: Arc<AtomicBool>,
    waker: Arc<mio::Waker>,
}

impl ServerHandle {
    /// Asks the server to shut down gracefully. Returns at once.
    pub fn shutdown(&self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = self.waker.wake();
    }
}

/// A JSON-RPC server: listeners, a reactor and a worker pool around an [`Engine`].
pub struct Server {
    engine: Arc<Engine>,
    settings: Arc<ServerConfig>,
    poll: mio::Poll,
    listeners: Vec<Listener>,
    stop: Arc<AtomicBool>,
    waker: Arc<mio::Waker>,
    signals: Option<std::os::unix::net::UnixStream>,
    /// The thread reloading the guard's key file on SIGHUP, stopped when `run` returns.
    reload: Option<signal_hook::iterator::Handle>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("listeners", &self.listeners.len())
            .finish_non_exhaustive()
    }
}

impl Server {
    /// A server for `engine` with the default [`ServerConfig`], with no listeners yet.
    ///
    /// # Errors
    ///
    /// If the OS refuses an event queue.
    pub fn new(engine: Engine) -> io::Result<Self> {
        Self::with_config(engine, ServerConfig::default())
    }

    /// A server for `engine` with `settings`, with no listeners yet.
    ///
    /// # Errors
    ///
    /// If the OS refuses an event queue; `InvalidInput` for a CORS origin holding
    /// anything but visible ASCII.
    /// The engine may be shared (an `Arc<Engine>`): the caller keeps a reference to it
    /// while the server runs (to reload its guard, say).
    pub fn with_config(engine: impl Into<Arc<Engine>>, settings: ServerConfig) -> io::Result<Self> {
        crate::transport::http::Cors::new(&settings.cors_origins).map_err(|o| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("bad CORS origin {o:?}"),
            )
        })?;
        let poll = mio::Poll::new()?;
        let waker = Arc::new(mio::Waker::new(poll.registry(), reactor::WAKER)?);
        Ok(Self {
            engine: engine.into(),
            settings: Arc::new(settings),
            poll,
            listeners: Vec::new(),
            stop: Arc::new(AtomicBool::new(false)),
            waker,
            signals: None,
            reload: None,
        })
    }

    fn bind(&self, addr: impl ToSocketAddrs) -> io::Result<TcpListener> {
        let reuse_port = self.settings.reactors > 1;
        let mut last = None;
        for a in addr.to_socket_addrs()? {
            match bind_tcp(a, reuse_port) {
                Ok(l) => return Ok(l),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no address")))
    }

    /// Serves newline-delimited JSON-RPC on a TCP address; returns the bound address
    /// (useful with port 0).
    ///
    /// # Errors
    ///
    /// If the address cannot be bound.
    pub fn listen_tcp(&mut self, addr: impl ToSocketAddrs) -> io::Result<SocketAddr> {
        let l = self.bind(addr)?;
        let a = l.local_addr()?;
        self.listeners.push(Listener::Tcp(l, Proto::Line));
        Ok(a)
    }

    /// Serves JSON-RPC over HTTP/1.1 on a TCP address; returns the bound address.
    ///
    /// # Errors
    ///
    /// If the address cannot be bound.
    pub fn listen_http(&mut self, addr: impl ToSocketAddrs) -> io::Result<SocketAddr> {
        let l = self.bind(addr)?;
        let a = l.local_addr()?;
        self.listeners.push(Listener::Tcp(l, Proto::Http));
        Ok(a)
    }

    /// Serves the engine's metrics (`GET /metrics`, Prometheus text format) and the
    /// health check over HTTP on a TCP address of their own, without JSON-RPC: for
    /// scraping when HTTP is off or faces elsewhere. The HTTP listeners serve
    /// `GET /metrics` too. Returns the bound address.
    ///
    /// # Errors
    ///
    /// If the address cannot be bound, or the engine's metrics are off
    /// ([`Engine::without_metrics`](crate::Engine::without_metrics)).
    pub fn listen_metrics(&mut self, addr: impl ToSocketAddrs) -> io::Result<SocketAddr> {
        if self.engine.metrics().is_none() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the engine's metrics are off",
            ));
        }
        let l = self.bind(addr)?;
        let a = l.local_addr()?;
        self.listeners.push(Listener::Tcp(l, Proto::Metrics));
        Ok(a)
    }

    /// Serves newline-delimited JSON-RPC on a Unix domain socket at `path` (a stale
    /// socket file there is replaced; it is removed again at shutdown).
    ///
    /// # Errors
    ///
    /// If the path cannot be bound.
    pub fn listen_unix(&mut self, path: impl AsRef<Path>) -> io::Result<()> {
        let path = path.as_ref();
        if std::fs::symlink_metadata(path).is_ok_and(|m| {
            use std::os::unix::fs::FileTypeExt;
            m.file_type().is_socket()
        }) {
            std::fs::remove_file(path)?;
        }
        let l = UnixListener::bind(path)?;
        self.listeners.push(Listener::Unix(l, path.to_owned()));
        Ok(())
    }

    /// A handle that shuts the server down from another thread.
    pub fn handle(&self) -> ServerHandle {
        ServerHandle {
            stop: Arc::clone(&self.stop),
            waker: Arc::clone(&self.waker),
        }
    }

    /// Shuts down gracefully on SIGINT or SIGTERM.
    ///
    /// # Errors
    ///
    /// If the signal handlers cannot be installed.
    pub fn shutdown_on_signals(&mut self) -> io::Result<()> {
        let (read, write) = std::os::unix::net::UnixStream::pair()?;
        read.set_nonblocking(true)?;
        write.set_nonblocking(true)?;
        for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
            signal_hook::low_level::pipe::register(sig, write.try_clone()?)?;
        }
        self.signals = Some(read);
        Ok(())
    }

    /// Reloads the engine's [`Guard`](crate::guard::Guard) key file on SIGHUP (see
    /// [`Guard::reload`](crate::guard::Guard::reload)), on a thread of its own so the
    /// reactors never read files. Connections stay open. A reload that fails (a syntax
    /// error in the new file, say) keeps the old keys and prints why on stderr.
    ///
    /// # Errors
    ///
    /// If the signal handler cannot be installed.
    pub fn reload_on_sighup(&mut self) -> io::Result<()> {
        let mut signals = signal_hook::iterator::Signals::new([signal_hook::consts::SIGHUP])?;
        self.reload = Some(signals.handle());
        let engine = Arc::clone(&self.engine);
        std::thread::Builder::new()
            .name("ringrpc-sighup".into())
            .spawn(move || {
                for _ in signals.forever() {
                    let Some(guard) = engine.guard() else {
                        continue;
                    };
                    match guard.reload() {
                        Ok(()) => eprintln!("ringrpc: SIGHUP: key file reloaded"),
                        Err(e) => eprintln!("ringrpc: SIGHUP: {e}; the old keys stay in force"),
                    }
                }
            })?;
        Ok(())
    }

    /// The engine served.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// Runs until shut down (by a [`ServerHandle`] or a signal): accepts connections,
    /// answers requests, and on shutdown stops accepting, answers every request already
    /// received, flushes, and returns. Before it returns, a Redis de-duplication store
    /// makes the answers it could not store yet (Redis unreachable when their calls
    /// ended), for up to two seconds.
    ///
    /// # Errors
    ///
    /// If the event loop or the worker threads cannot be started.
    pub fn run(mut self) -> io::Result<()> {
        let reload = self.reload.take();
        let engine = Arc::clone(&self.engine);
        let r = reactor::run(self);
        if let Some(h) = reload {
            h.close();
        }
        engine.flush_dedup();
        r
    }
}
