//! A real `redis-server` for the Redis store's tests: on a free loopback port, without
//! persistence, killed when dropped. A missing `redis-server` fails the test (naming the
//! Debian package): a skipped test would prove nothing.

use std::io::{BufRead, BufReader, ErrorKind, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a started server may take to answer.
const READY_TIMEOUT: Duration = Duration::from_secs(10);

/// Ports tried before giving up (another process may take a free port before us).
const ATTEMPTS: usize = 5;

/// A running `redis-server`; killed when dropped.
pub struct RedisServer {
    pub port: u16,
    child: Option<Child>,
}

impl RedisServer {
    /// Starts a server on a free port and waits until it answers.
    pub fn start() -> Self {
        let mut last = String::new();
        for _ in 0..ATTEMPTS {
            let port = free_port();
            match spawn(port) {
                Ok(child) => {
                    return Self {
                        port,
                        child: Some(child),
                    }
                }
                Err(why) => last = why,
            }
        }
        panic!("redis-server did not start in {ATTEMPTS} attempts: {last}");
    }

    /// `redis://127.0.0.1:PORT/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Kills the server (its data is gone: it keeps none on disk) and waits for it to
    /// exit, so its port refuses connections afterwards.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Kills the server if it runs, then starts a new, empty one on the same port.
    pub fn restart(&mut self) {
        self.kill();
        let mut last = String::new();
        // The same port: retried briefly, as the old listener's exit may lag.
        for _ in 0..ATTEMPTS {
            match spawn(self.port) {
                Ok(child) => {
                    self.child = Some(child);
                    return;
                }
                Err(why) => last = why,
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("redis-server did not restart on port {}: {last}", self.port);
    }

    /// Sends `command` (inline form) on a connection of its own: the reply to read.
    fn send(&self, command: &str) -> BufReader<TcpStream> {
        let addr = SocketAddr::from(([127, 0, 0, 1], self.port));
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))
            .unwrap_or_else(|e| panic!("cannot reach redis-server on {addr}: {e}"));
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        s.write_all(format!("{command}\r\n").as_bytes()).unwrap();
        BufReader::new(s)
    }

    /// Sends one command (inline form: words without spaces) and returns the first line
    /// of the reply, e.g. `:0` for `DBSIZE`.
    pub fn command(&self, command: &str) -> String {
        let mut line = String::new();
        self.send(command).read_line(&mut line).unwrap();
        line.trim_end().to_owned()
    }

    /// The keys matching `pattern` (`KEYS`), sorted.
    pub fn keys(&self, pattern: &str) -> Vec<String> {
        let mut r = self.send(&format!("KEYS {pattern}"));
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        let n: usize = line.trim_end().trim_start_matches('*').parse().unwrap();
        let mut keys = Vec::new();
        for _ in 0..n {
            // `$LEN`, then the key (these keys hold no line breaks).
            for _ in 0..2 {
                line.clear();
                r.read_line(&mut line).unwrap();
            }
            keys.push(line.trim_end().to_owned());
        }
        keys.sort();
        keys
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A TCP link to a Redis server that a test can cut and restore: a network partition
/// without losing what the server holds (killing it would: it keeps nothing on disk).
/// Cut, its connections are shut down and new ones closed as soon as accepted.
pub struct Link {
    pub port: u16,
    up: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    open: Arc<Mutex<Vec<TcpStream>>>,
}

impl Link {
    /// A link to the server on `target`'s port, up.
    pub fn to(target: &RedisServer) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("cannot bind a loopback port");
        let port = listener.local_addr().unwrap().port();
        let to = SocketAddr::from(([127, 0, 0, 1], target.port));
        let (up, stop) = (
            Arc::new(AtomicBool::new(true)),
            Arc::new(AtomicBool::new(false)),
        );
        let open = Arc::new(Mutex::new(Vec::new()));
        let (u, st, o) = (Arc::clone(&up), Arc::clone(&stop), Arc::clone(&open));
        std::thread::spawn(move || {
            for client in listener.incoming() {
                if st.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(client) = client else { continue };
                if !u.load(Ordering::SeqCst) {
                    continue; // dropped: closed at once
                }
                let Ok(server) = TcpStream::connect(to) else {
                    continue;
                };
                let mut open = o.lock().unwrap();
                // Cut meanwhile (`cut` empties `open` under this lock): not kept.
                if !u.load(Ordering::SeqCst) {
                    continue;
                }
                for (from, into) in [(&client, &server), (&server, &client)] {
                    let (mut from, mut into) =
                        (from.try_clone().unwrap(), into.try_clone().unwrap());
                    std::thread::spawn(move || {
                        let _ = std::io::copy(&mut from, &mut into);
                        let _ = into.shutdown(Shutdown::Both);
                        let _ = from.shutdown(Shutdown::Both);
                    });
                }
                open.extend([client, server]);
            }
        });
        Self {
            port,
            up,
            stop,
            open,
        }
    }

    /// `redis://127.0.0.1:PORT/` through the link.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Cuts the link: open connections are shut down, new ones closed.
    pub fn cut(&self) {
        self.up.store(false, Ordering::SeqCst);
        for s in self.open.lock().unwrap().drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    /// Restores the link.
    pub fn restore(&self) {
        self.up.store(true, Ordering::SeqCst);
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        self.cut();
        // Wakes the accepting thread so that it sees `stop`.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

/// A port nothing listens on now: bound, then released.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("cannot bind a loopback port")
        .port()
}

/// Starts `redis-server` on `port` and waits (bounded) until it answers; `Err` says why not,
/// with the child killed. Panics if `redis-server` is not installed.
fn spawn(port: u16) -> Result<Child, String> {
    let mut child = match Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
    {
        Ok(c) => c,
        Err(e) if e.kind() == ErrorKind::NotFound => panic!(
            "`redis-server` is not on the PATH: these tests need a real Redis. Install \
             Debian's `redis-server` package (apt-get install redis-server); .ci/run does."
        ),
        Err(e) => panic!("cannot run redis-server: {e}"),
    };
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!("redis-server on port {port} exited: {status}"));
        }
        if ready(port, child.id()) {
            return Ok(child);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!(
                "redis-server on port {port} did not answer within {READY_TIMEOUT:?}"
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether the server on `port` answers and is process `pid` (not another one that took
/// the port first).
fn ready(port: u16, pid: u32) -> bool {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_millis(200)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
    if s.write_all(b"INFO server\r\n").is_err() {
        return false;
    }
    let want = format!("process_id:{pid}");
    BufReader::new(s)
        .lines()
        .take(100)
        .map_while(Result::ok)
        .any(|line| line.trim_end() == want)
}
