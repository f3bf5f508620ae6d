//! Batches: calls and notifications sent as one JSON array; the answers are matched to
//! the calls by id, whatever order the server used.

use std::ops::Range;
use std::time::Instant;

use serde::de::DeserializeOwned;
use serde::Serialize;
use simd_json::Node;

use super::{encode, json_text, server_error, Client, Error, ServerError, Violation};
use crate::codec::de::TapeDe;
use crate::codec::response::{validate_response, Body};
use crate::codec::tape::elements;
use crate::codec::Id;
use crate::engine::Scratch;
use crate::serializer::json::write_id;
use crate::serializer::request::{extend_with_meta, write_request};

/// What every request written by `write_request` starts with; a call's id goes after it.
const PREFIX: &[u8] = br#"{"jsonrpc":"2.0","#;

/// Names a call in a [`Batch`], to find its result in the [`BatchReply`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BatchKey(usize);

/// Builds a batch; made by [`Client::batch`].
///
/// Elements are serialized as they are added; ids are given when the batch is sent.
/// Batches are not retried.
#[derive(Debug)]
pub struct Batch<'c> {
    client: &'c Client,
    /// Each element written without an id, one after another.
    parts: Vec<u8>,
    /// Per element: where it ends in `parts`, whether it is a call, and where its
    /// params object opens in it (for `_meta`; see [`Options::send_deadline`]).
    ///
    /// [`Options::send_deadline`]: super::Options::send_deadline
    elems: Vec<(usize, bool, Option<usize>)>,
    calls: usize,
}

impl<'c> Batch<'c> {
    pub(crate) fn new(client: &'c Client) -> Self {
        Self {
            client,
            parts: Vec::new(),
            elems: Vec::new(),
            calls: 0,
        }
    }

    fn push<P: Serialize>(&mut self, method: &str, params: P, call: bool) -> Result<(), Error> {
        let start = self.parts.len();
        let open = encode(write_request(&mut self.parts, None, method, &params))?;
        // Notifications carry no budget: nobody waits for them.
        let open = open.filter(|_| call).map(|at| at - start);
        self.elems.push((self.parts.len(), call, open));
        Ok(())
    }

    /// Adds a call; its result is read with the key returned.
    ///
    /// # Errors
    ///
    /// [`Error::Encode`] if `params` do not serialize to an array, an object or null.
    pub fn call<P: Serialize>(&mut self, method: &str, params: P) -> Result<BatchKey, Error> {
        self.push(method, params, true)?;
        self.calls += 1;
        Ok(BatchKey(self.calls - 1))
    }

    /// Adds a notification (no answer).
    ///
    /// # Errors
    ///
    /// As [`Batch::call`].
    pub fn notify<P: Serialize>(&mut self, method: &str, params: P) -> Result<(), Error> {
        self.push(method, params, false)
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        self.elems.len()
    }

    /// Whether nothing has been added.
    pub fn is_empty(&self) -> bool {
        self.elems.is_empty()
    }

    /// Sends the batch and waits (until the client's timeout) for the answers. A batch
    /// of only notifications returns as soon as it is written, with no answers.
    ///
    /// # Errors
    ///
    /// [`Error::Encode`] for an empty batch; transport errors; [`Error::Server`] when
    /// the server answers the whole batch with one error object; [`Error::Protocol`]
    /// when the answer is not an array of responses to these calls. Errors of single
    /// calls are returned by [`BatchReply::get`].
    pub fn send(self) -> Result<BatchReply, Error> {
        if self.elems.is_empty() {
            return Err(Error::Encode("a batch needs at least one element".into()));
        }
        let calls = self.calls as u64;
        let first = self.client.next_ids(calls);
        let deadline = Instant::now() + self.client.options.timeout;
        let mut write = |out: &mut Vec<u8>, meta: Option<u64>| {
            out.push(b'[');
            let (mut start, mut id) = (0, first);
            for (i, &(end, call, open)) in self.elems.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                let part = &self.parts[start..end];
                start = end;
                match (call, part.strip_prefix(PREFIX)) {
                    (true, Some(rest)) => {
                        out.extend_from_slice(PREFIX);
                        out.extend_from_slice(br#""id":"#);
                        write_id(out, Id::UInt(id));
                        out.push(b',');
                        match meta {
                            Some(ms) => {
                                let open = open.and_then(|at| at.checked_sub(PREFIX.len()));
                                extend_with_meta(out, rest, open, ms);
                            }
                            None => out.extend_from_slice(rest),
                        }
                        id += 1;
                    }
                    _ => out.extend_from_slice(part),
                }
            }
            out.push(b']');
            Ok(())
        };
        let carry = self.client.carry(deadline);
        let (conn, ticket) =
            self.client
                .send(first..first + calls, calls > 0, carry, deadline, &mut write)?;
        let mut reply = BatchReply {
            text: Vec::new(),
            results: vec![None; self.calls],
            scratch: Scratch::with_max_depth(self.client.options.max_depth),
        };
        let Some(ticket) = ticket else {
            return Ok(reply);
        };
        let mut outcome = Err(Error::Protocol(Violation::MissingResponse));
        conn.wait(ticket, deadline, &mut |raw| {
            outcome = reply.fill(raw, first);
        })?;
        outcome.map(|()| reply)
    }
}

/// The answers to a batch's calls, by [`BatchKey`].
#[derive(Debug)]
pub struct BatchReply {
    /// Each call's result as JSON text, one after another.
    text: Vec<u8>,
    /// Per call: its result's range in `text`, or its error; `None`: no answer.
    results: Vec<Option<Result<Range<usize>, ServerError>>>,
    scratch: Scratch,
}

impl BatchReply {
    /// Files each response of the answer under its call.
    fn fill(&mut self, raw: crate::codec::raw::RawCtx<'_>, first: u64) -> Result<(), Error> {
        let root = raw.root;
        match root.first() {
            Some(Node::Array { .. }) => {}
            Some(Node::Object { .. }) => {
                // One error object for the whole batch (e.g. it was too long).
                let r = validate_response(root).map_err(Error::Protocol)?;
                return Err(match r.body {
                    Body::Error {
                        code,
                        message,
                        data,
                    } => server_error(raw, code, message, data),
                    Body::Result(_) => Error::Protocol(Violation::Mismatched),
                });
            }
            _ => return Err(Error::Protocol(Violation::NotAResponse)),
        }
        for elem in elements(root) {
            let r = validate_response(elem).map_err(Error::Protocol)?;
            let slot = match r.id {
                Id::UInt(u) if u >= first && u - first < self.results.len() as u64 => {
                    &mut self.results[(u - first) as usize]
                }
                // An element the server could not read: its call stays unanswered.
                Id::Null => continue,
                _ => return Err(Error::Protocol(Violation::UnknownId)),
            };
            *slot = Some(match r.body {
                Body::Result(nodes) => {
                    let start = self.text.len();
                    self.text.extend_from_slice(&json_text(raw, nodes));
                    Ok(start..self.text.len())
                }
                Body::Error {
                    code,
                    message,
                    data,
                } => match server_error(raw, code, message, data) {
                    Error::Server(e) => Err(e),
                    _ => continue,
                },
            });
        }
        Ok(())
    }

    /// The number of calls in the batch.
    pub fn len(&self) -> usize {
        self.results.len()
    }

    /// Whether the batch had no calls (only notifications).
    pub fn is_empty(&self) -> bool {
        self.results.is_empty()
    }

    /// Deserializes the result of the call `key` (each call's result can be read any
    /// number of times, as any type).
    ///
    /// # Errors
    ///
    /// [`Error::Server`] with that call's error object; [`Error::Protocol`]
    /// (`MissingResponse`) if the server sent no answer for it; [`Error::Decode`].
    pub fn get<R: DeserializeOwned>(&mut self, key: BatchKey) -> Result<R, Error> {
        match self.results.get(key.0) {
            Some(Some(Ok(range))) => {
                let text = &self.text[range.clone()];
                self.scratch.parse(text, |raw| match raw {
                    Ok(raw) => R::deserialize(TapeDe::new(raw.root))
                        .map_err(|e| Error::Decode(e.to_string())),
                    // The text was cut from a document that parsed.
                    Err(_) => Err(Error::Protocol(Violation::BadJson)),
                })
            }
            Some(Some(Err(e))) => Err(Error::Server(e.clone())),
            Some(None) | None => Err(Error::Protocol(Violation::MissingResponse)),
        }
    }
}
