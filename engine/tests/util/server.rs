//! A server on a thread for the socket tests: TCP, HTTP and a Unix socket, each on a
//! free address, stopped with a bounded wait.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ringrpc::server::{Server, ServerHandle};
use ringrpc::{Engine, ServerConfig};

/// A running server; shut down when dropped.
pub struct Served {
    pub tcp: SocketAddr,
    pub http: SocketAddr,
    pub unix: PathBuf,
    pub handle: ServerHandle,
    thread: Option<JoinHandle<std::io::Result<()>>>,
}

impl Served {
    /// Serves `engine` with `settings` on newline TCP, HTTP and a Unix socket.
    pub fn start(engine: impl Into<std::sync::Arc<Engine>>, settings: ServerConfig) -> Self {
        static SOCKETS: AtomicUsize = AtomicUsize::new(0);
        let mut server = Server::with_config(engine, settings).unwrap();
        let tcp = server.listen_tcp("127.0.0.1:0").unwrap();
        let http = server.listen_http("127.0.0.1:0").unwrap();
        let unix = std::env::temp_dir().join(format!(
            "ringrpc-test-{}-{}.sock",
            std::process::id(),
            SOCKETS.fetch_add(1, Ordering::Relaxed)
        ));
        server.listen_unix(&unix).unwrap();
        let handle = server.handle();
        let thread = Some(std::thread::spawn(move || server.run()));
        Self {
            tcp,
            http,
            unix,
            handle,
            thread,
        }
    }

    /// Shuts down and waits (at most 10 s) for `run()` to return `Ok`.
    pub fn stop(mut self) {
        self.handle.shutdown();
        let t = self.thread.take().expect("stopped twice");
        let deadline = Instant::now() + Duration::from_secs(10);
        while !t.is_finished() {
            assert!(
                Instant::now() < deadline,
                "run() did not return within 10 s of shutdown"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        t.join().unwrap().unwrap();
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        self.handle.shutdown();
    }
}
