//! Subscriptions from the client's side: a subscribe call, then the notifications the
//! server pushes for it, read off the same connection as answers.
//!
//! ```text
//!  leader (whichever caller reads) ── a notification {"method":…,"params":{"subscription":ID,…}}
//!        │  ID looked up among the connection's subscriptions: its result's JSON text
//!        ▼  copied into that subscription's queue (bounded: the oldest dropped, counted)
//!  Subscription::next ── takes the oldest; with nothing queued and no one reading, it
//!                        reads itself (it leads, as a waiting call does)
//! ```
//!
//! The subscribe call's answer is routed before any notification read after it, and the
//! subscription is registered when its answer is routed: a notification that follows
//! the answer in the same read is never lost. Notifications for no known subscription
//! (one dropped a moment ago, another client library's) are ignored.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;
use serde::{Serialize, Serializer};
use simd_json::{Node, StaticNode};

use super::conn::{Carry, Conn, NoteWait};
use super::{write_call, Client, Error};
use crate::codec::Id;

/// A subscription id as the server answered it: a string or a number (an integer
/// that is not negative is always `U64`, whichever way the parser stored it).
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum SubId {
    Str(String),
    U64(u64),
    /// Negative.
    I64(i64),
    F64(f64),
}

impl SubId {
    /// The id a subscribe call answered, if it is a string or a number.
    pub(crate) fn of(node: Option<&Node<'_>>) -> Option<Self> {
        Some(match node? {
            Node::String(s) => Self::Str((*s).to_owned()),
            Node::Static(StaticNode::U64(u)) => Self::U64(*u),
            Node::Static(StaticNode::I64(i)) => match u64::try_from(*i) {
                Ok(u) => Self::U64(u),
                Err(_) => Self::I64(*i),
            },
            Node::Static(StaticNode::F64(f)) => Self::F64(*f),
            _ => return None,
        })
    }

    /// Whether a notification's `subscription` names this one (compared as values:
    /// `"a"` and `"\u0061"` are one id).
    pub(crate) fn is(&self, node: &Node<'_>) -> bool {
        match (self, node) {
            (Self::Str(a), Node::String(b)) => a == b,
            (Self::U64(a), Node::Static(StaticNode::U64(b))) => a == b,
            (Self::U64(a), Node::Static(StaticNode::I64(b))) => u64::try_from(*b) == Ok(*a),
            (Self::I64(a), Node::Static(StaticNode::I64(b))) => a == b,
            (Self::F64(a), Node::Static(StaticNode::F64(b))) => a == b,
            _ => false,
        }
    }
}

impl Serialize for SubId {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Str(v) => s.serialize_str(v),
            Self::U64(v) => s.serialize_u64(*v),
            Self::I64(v) => s.serialize_i64(*v),
            Self::F64(v) => s.serialize_f64(*v),
        }
    }
}

impl fmt::Display for SubId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match serde_json::to_string(self) {
            Ok(text) => f.write_str(&text),
            Err(_) => Err(fmt::Error),
        }
    }
}

/// One notification of a [`Subscription`]: its `result`, owned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Notification {
    pub(crate) result: Vec<u8>,
    pub(crate) missed: u64,
}

impl Notification {
    /// Deserializes the result.
    ///
    /// # Errors
    ///
    /// [`Error::Decode`] with serde's account of what does not fit.
    pub fn parse<T: DeserializeOwned>(&self) -> Result<T, Error> {
        serde_json::from_slice(&self.result).map_err(|e| Error::Decode(e.to_string()))
    }

    /// The result as JSON text (the server's own bytes for an array or object).
    pub fn raw_json(&self) -> &[u8] {
        &self.result
    }

    /// How many notifications of this subscription were lost just before this one:
    /// dropped by the server for a client that read too slowly (its `lagged` count), or
    /// by this client when the subscription's queue was full
    /// ([`Options::subscription_queue`](super::Options::subscription_queue)). 0 when
    /// none was.
    pub fn missed_before(&self) -> u64 {
        self.missed
    }
}

/// A subscription opened by [`Client::subscribe`]: an iterator of its notifications,
/// in the order the server sent them. Dropping it unsubscribes (the unsubscribe call
/// is written, its answer not waited for); [`Subscription::unsubscribe`] waits for it.
///
/// Notifications are read off the client's one connection: while this subscription
/// waits in [`Subscription::next_timeout`] (or `next`) with no call in flight, it reads
/// the connection itself; while other callers wait, whichever reads queues this
/// subscription's notifications for it. Nothing reads while no one waits: the server
/// then holds the notifications back, and its own lag policy applies.
///
/// The subscription lives on the connection it was opened on: if that connection
/// fails, the iterator yields the error once and ends (the client's next call
/// reconnects; subscribe again there).
pub struct Subscription<'c> {
    client: &'c Client,
    conn: Arc<Conn>,
    token: u64,
    id: SubId,
    unsubscribe: String,
    /// The end has been yielded (or the subscription was given up): `next` is `None`.
    finished: bool,
}

impl fmt::Debug for Subscription<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Subscription")
            .field("id", &self.id)
            .field("unsubscribe", &self.unsubscribe)
            .finish_non_exhaustive()
    }
}

/// How long `Iterator::next` waits at a time (it then waits again): a bound on the
/// socket's read timeout, not on the wait.
const FOREVER_STEP: Duration = Duration::from_secs(3600);

impl<'c> Subscription<'c> {
    pub(crate) fn new(
        client: &'c Client,
        conn: Arc<Conn>,
        token: u64,
        id: SubId,
        unsubscribe: &str,
    ) -> Self {
        Self {
            client,
            conn,
            token,
            id,
            unsubscribe: unsubscribe.to_owned(),
            finished: false,
        }
    }

    /// The subscription id the server answered, as JSON text (`7`, `"0x9ce5"`).
    pub fn id(&self) -> String {
        self.id.to_string()
    }

    /// Waits up to `timeout` for the next notification. `None` once the subscription
    /// has ended (after its end was yielded); `Some(Err(Error::ReadTimeout))` if none
    /// came in time (the subscription goes on). The end is yielded once, as
    /// `Some(Err(_))`: [`Error::Server`] when the server ended it with an error (for
    /// one, reason `lagged`: the client read too slowly), or the connection's failure.
    /// A server that closes a subscription without an error (ringrpc's
    /// `Sink::close`) ends it with `None` at once.
    pub fn next_timeout(&mut self, timeout: Duration) -> Option<Result<Notification, Error>> {
        self.next_until(Instant::now() + timeout)
    }

    fn next_until(&mut self, deadline: Instant) -> Option<Result<Notification, Error>> {
        if self.finished {
            return None;
        }
        match self.conn.next_note(self.token, deadline) {
            NoteWait::Item(n) => Some(Ok(n)),
            NoteWait::TimedOut => Some(Err(Error::ReadTimeout)),
            NoteWait::Ended(e) => {
                self.finished = true;
                self.conn.forget(self.token);
                e.map(|e| Err(Error::Server(e)))
            }
            NoteWait::Failed(e) => {
                self.finished = true;
                self.conn.forget(self.token);
                Some(Err(e))
            }
        }
    }

    /// Unsubscribes and waits for the server's answer: `true` if the server still
    /// held the subscription. Notifications already queued are dropped; none follows.
    ///
    /// # Errors
    ///
    /// As [`Client::call`] (over the subscription's own connection; a failed
    /// connection is [`Error::Closed`], and the subscription is gone with it).
    pub fn unsubscribe(mut self) -> Result<bool, Error> {
        self.finished = true;
        self.conn.forget(self.token);
        if self.conn.is_dead() {
            return Err(Error::Closed);
        }
        let deadline = Instant::now() + self.client.options.timeout;
        let Some((ticket, id)) = self.send_unsubscribe(deadline)? else {
            return Err(Error::Protocol(super::Violation::MissingResponse));
        };
        let mut f = Some(|r: super::Reply<'_>| r.parse::<bool>());
        super::wait_single(&self.conn, ticket, id, deadline, &mut f)
    }

    /// Writes the unsubscribe call on this subscription's connection.
    fn send_unsubscribe(
        &self,
        deadline: Instant,
    ) -> Result<Option<(super::conn::Ticket, u64)>, Error> {
        let id = self.client.next_ids(1);
        let params = [&self.id];
        let method = self.unsubscribe.as_str();
        let mut write = |buf: &mut Vec<u8>, _: Option<u64>| {
            write_call(buf, Some(Id::UInt(id)), method, &params, None)
        };
        match self
            .conn
            .send(id..id + 1, true, Carry::default(), deadline, &mut write)
        {
            Ok(t) => Ok(t.map(|t| (t, id))),
            Err(super::conn::SendError::Dead(e) | super::conn::SendError::Failed(e)) => Err(e),
        }
    }
}

impl Iterator for Subscription<'_> {
    type Item = Result<Notification, Error>;

    /// Waits for the next notification, without a deadline; see
    /// [`Subscription::next_timeout`] for what ends it.
    fn next(&mut self) -> Option<Self::Item> {
        loop {
            match self.next_until(Instant::now() + FOREVER_STEP) {
                Some(Err(Error::ReadTimeout)) => continue,
                other => return other,
            }
        }
    }
}

impl Drop for Subscription<'_> {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        self.conn.forget(self.token);
        if self.conn.is_dead() {
            return;
        }
        // Written, not waited for: its answer is discarded when it comes (the id was
        // issued, so it is no stranger's), and nothing of this subscription that
        // arrives meanwhile is kept.
        let deadline = Instant::now() + self.client.options.timeout;
        if let Ok(Some((ticket, _))) = self.send_unsubscribe(deadline) {
            self.conn.release(ticket);
        }
    }
}
