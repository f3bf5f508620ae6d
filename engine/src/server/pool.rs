//! The worker pool: a fixed set of threads that run calls to blocking methods, fed by a
//! bounded crossbeam channel.
//!
//! A job carries its own bytes (a `Bytes` slice of the frame, shared, not copied) and is
//! answered by the engine on the worker's own scratch. A full queue refuses the job
//! ([`Pool::try_submit`]), so the caller answers `-32000 Server busy` instead of
//! losing the call. A handler that panics is caught by dispatch (`-32603`), so workers
//! never die of one.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use bytes::Bytes;
use crossbeam_channel::{bounded, Receiver, Sender};

use super::pending::ReplyTo;
use crate::dedup::Digest;
use crate::dispatch::context::{Connection, Source};
use crate::dispatch::responder::{Complete, Tag};
use crate::engine::Engine;
use crate::trace::Trace;

/// A call for a worker.
pub(crate) struct Job {
    /// The connection it came on, for context-aware handlers.
    pub(crate) conn: Connection,
    /// The request's own bytes: one request object (never a batch).
    pub(crate) frame: Bytes,
    /// Which connection, slot and element this answers (opaque to the pool).
    pub(crate) tag: Tag,
    pub(crate) reply_to: Arc<ReplyTo>,
    /// Past this the caller has been answered `-32001` already: the job is skipped.
    /// The call's own deadline (the earlier of `request_timeout` and the caller's
    /// budget), which its context shows.
    pub(crate) deadline: Option<Instant>,
    /// The call's de-duplication key, made where it was read; claimed here.
    pub(crate) dedup: Option<Digest>,
    /// The trace of the frame it came in.
    pub(crate) trace: Option<Trace>,
}

/// The pool's queue is full (or the pool is stopping).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct QueueFull;

/// The worker threads and the queue feeding them.
pub(crate) struct Pool {
    tx: Option<Sender<Job>>,
    threads: Vec<JoinHandle<()>>,
    /// Set at shutdown: queued jobs are dropped (every caller was answered or is gone).
    stopping: Arc<AtomicBool>,
}

impl Pool {
    /// Starts `workers` threads with a queue of `capacity` jobs.
    pub(crate) fn start(
        engine: Arc<Engine>,
        workers: usize,
        capacity: usize,
    ) -> std::io::Result<Self> {
        let (tx, rx) = bounded::<Job>(capacity);
        let stopping = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::with_capacity(workers);
        for i in 0..workers {
            let (engine, rx, stopping) = (Arc::clone(&engine), rx.clone(), Arc::clone(&stopping));
            let t = std::thread::Builder::new()
                .name(format!("ringrpc-worker-{i}"))
                .spawn(move || work(&engine, &rx, &stopping))?;
            threads.push(t);
        }
        Ok(Self {
            tx: Some(tx),
            threads,
            stopping,
        })
    }

    /// Queues `job`; `Err(QueueFull)` (the job dropped) when the queue is full or the
    /// pool is stopping.
    pub(crate) fn try_submit(&self, job: Job) -> Result<(), QueueFull> {
        match &self.tx {
            Some(tx) => tx.try_send(job).map_err(|_| QueueFull),
            None => Err(QueueFull),
        }
    }

    /// Jobs waiting for a worker.
    pub(crate) fn queued(&self) -> usize {
        self.tx.as_ref().map_or(0, Sender::len)
    }

    /// Drops the queued jobs, lets the running ones finish, and joins the workers.
    pub(crate) fn shutdown(mut self) {
        self.stopping.store(true, Ordering::SeqCst);
        self.tx = None;
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn work(engine: &Engine, rx: &Receiver<Job>, stopping: &AtomicBool) {
    let mut scratch = engine.scratch();
    while let Ok(job) = rx.recv() {
        if stopping.load(Ordering::Relaxed) || job.deadline.is_some_and(|d| Instant::now() >= d) {
            continue;
        }
        let mut reply = job.reply_to.buffer();
        let source = Source::new(&job.conn);
        let source = match &job.trace {
            Some(t) => source.with_trace(t),
            None => source,
        };
        let code = engine.run_job(
            &job.frame,
            &source,
            &mut scratch,
            &mut reply,
            job.dedup,
            job.deadline,
        );
        job.reply_to.complete(job.tag, reply, code);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{demo, Config};
    use std::sync::atomic::AtomicUsize;
    use std::time::{Duration, Instant};

    fn setup(
        workers: usize,
        capacity: usize,
    ) -> (
        Pool,
        Arc<ReplyTo>,
        Receiver<super::super::pending::Done>,
        mio::Poll,
    ) {
        // `meet` returns once `workers` calls are inside it at the same time (or after
        // 10 s, with `false`): it proves the calls ran in parallel without timing them.
        static INSIDE: AtomicUsize = AtomicUsize::new(0);
        let mut b = demo::builder();
        b.blocking_method("meet", move |_p| {
            INSIDE.fetch_add(1, Ordering::SeqCst);
            let t = Instant::now();
            while INSIDE.load(Ordering::SeqCst) < 2 {
                if t.elapsed() > Duration::from_secs(10) {
                    return Ok(false);
                }
                std::thread::yield_now();
            }
            Ok(true)
        })
        .unwrap()
        .method("boom", |_p| -> Result<(), crate::RpcError> {
            panic!("boom")
        })
        .unwrap();
        let engine = Arc::new(crate::Engine::new(b.freeze(), Config::default()));
        let pool = Pool::start(engine, workers, capacity).unwrap();
        let poll = mio::Poll::new().unwrap();
        let waker = Arc::new(mio::Waker::new(poll.registry(), mio::Token(0)).unwrap());
        let (reply_to, rx) = ReplyTo::new(waker);
        (pool, reply_to, rx, poll)
    }

    fn job(frame: &str, element: u32, reply_to: &Arc<ReplyTo>) -> Job {
        Job {
            conn: Connection::EMBEDDED,
            frame: Bytes::copy_from_slice(frame.as_bytes()),
            tag: Tag {
                conn: 1,
                generation: 1,
                slot: 1,
                element,
            },
            reply_to: Arc::clone(reply_to),
            deadline: None,
            dedup: None,
            trace: None,
        }
    }

    #[test]
    fn runs_in_parallel_and_survives_panics() {
        let (pool, reply_to, rx, _poll) = setup(2, 16);
        let boom = r#"{"jsonrpc":"2.0","method":"boom","id":9}"#;
        assert!(pool.try_submit(job(boom, 9, &reply_to)).is_ok());
        let d = rx.recv().unwrap();
        assert!(String::from_utf8_lossy(&d.reply).contains("-32603"));
        for i in 0..2 {
            let f = format!(r#"{{"jsonrpc":"2.0","method":"meet","id":{i}}}"#);
            assert!(pool.try_submit(job(&f, i, &reply_to)).is_ok());
        }
        for _ in 0..2 {
            let d = rx.recv().unwrap();
            let reply = String::from_utf8_lossy(&d.reply);
            assert!(reply.contains(r#""result":true"#), "{reply}");
        }
        pool.shutdown();
    }

    #[test]
    fn a_full_queue_hands_the_job_back() {
        let (pool, reply_to, rx, _poll) = setup(1, 1);
        let slow = r#"{"jsonrpc":"2.0","method":"sleep","params":{"ms":200},"id":1}"#;
        let mut handed_back = 0;
        for i in 0..4 {
            if pool.try_submit(job(slow, i, &reply_to)).is_err() {
                handed_back += 1;
            }
        }
        assert!(handed_back >= 2, "{handed_back}");
        drop(rx);
        pool.shutdown();
    }
}
