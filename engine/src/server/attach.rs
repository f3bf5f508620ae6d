//! Work run inside each reactor's own event loop (crate-private): the proxy's upstream
//! connections, so that a forwarded call is read, sent upstream, answered and written
//! back on the one reactor thread, with no hand-off to another thread and back.
//!
//! ```text
//!  Registry ── attachments ──▶ reactor start: Attach::attach(registry, base)
//!                                  │ registers sockets under tokens base..base + SPAN
//!                                  ▼
//!  each turn: poll ─▶ events (client sockets; Attached::event for its tokens)
//!             ─▶ completions, pushes, timers ─▶ Attached::turn_end (write what the
//!             turn queued: one write per socket per turn)
//!  poll timeout ≤ Attached::next_wake; dropped when the reactor stops
//! ```

use std::time::Duration;

/// Tokens each attachment may use, from its `base`.
pub(crate) const SPAN: usize = 4096;

/// Something a registry asks every reactor to run in its loop (see the module docs).
pub(crate) trait Attach: Send + Sync {
    /// Called on a reactor's thread as its loop starts: registers what it serves in
    /// `registry` under tokens `base..base + SPAN`; `None` when it serves nothing
    /// there.
    fn attach(&self, registry: &mio::Registry, base: usize) -> Option<Box<dyn Attached>>;
}

/// An attachment's part on one reactor, driven by that reactor's thread only.
pub(crate) trait Attached {
    /// An event for token `base + token`.
    fn event(&mut self, token: usize, event: &mio::event::Event);
    /// The turn's end, after the clients' frames were answered: what the turn queued
    /// goes out.
    fn turn_end(&mut self);
    /// The longest the loop may sleep without events (timeouts to check).
    fn next_wake(&self) -> Option<Duration>;
}
