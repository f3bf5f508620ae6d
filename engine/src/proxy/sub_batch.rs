//! Client batches forwarded as batches: the elements of one client batch that go to
//! the same upstream connection are written there as one batch request (a
//! *sub-batch*), and the upstream thread is woken once, when the client batch has been
//! dispatched.
//!
//! The engine holds a [`Scope`] while it dispatches a batch's elements (each forwarded
//! element runs the fallback on that thread, inside the scope). The first element
//! forwarded numbers the batch; each lane it writes to opens a sub-batch owned by that
//! number, which later elements of the batch join (see `Queue::begin_element`). The
//! scope's end closes them and wakes the upstream thread. A sub-batch is also closed
//! early, and the batch's later elements start another, when anything else is written
//! to the lane (another client's call, a resend) or the upstream thread takes the
//! lane's bytes (which it does mid-batch only for something else waiting there: a
//! batch's own elements flag the lane for taking at the scope's end, see
//! `Lane::mark_out`). Splitting a batch changes nothing a client can see, since every
//! element is answered on its own and the server merges the answers in order.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::Shared;

/// Numbers client batches with an element forwarded (per process, so that batches
/// of different threads never share a number).
static NEXT: AtomicU64 = AtomicU64::new(1);

struct State {
    /// Scopes entered and not yet left.
    depth: u32,
    /// The current batch's number once an element of it was forwarded; 0 before.
    owner: u64,
    /// Lanes where the current batch opened sub-batches: (proxy, lane).
    open: Vec<(Arc<Shared>, usize)>,
}

thread_local! {
    static STATE: RefCell<State> = const {
        RefCell::new(State {
            depth: 0,
            owner: 0,
            open: Vec::new(),
        })
    };
}

/// A batch being dispatched on this thread; dropping it closes the sub-batches its
/// elements opened and wakes the upstream threads they were written for.
pub(crate) struct Scope {
    /// The enclosing batch's number (a handler may run the engine on a batch itself).
    outer: u64,
}

impl Scope {
    /// Enters a batch.
    pub(crate) fn enter() -> Self {
        STATE.with(|s| {
            let mut s = s.borrow_mut();
            s.depth += 1;
            Self {
                outer: std::mem::take(&mut s.owner),
            }
        })
    }
}

impl Drop for Scope {
    fn drop(&mut self) {
        STATE.with(|s| {
            let mut s = s.borrow_mut();
            let owner = s.owner;
            for (shared, i) in s.open.drain(..) {
                let lane = &shared.lanes[i];
                {
                    let mut q = lane.lock();
                    if q.is_open(owner) {
                        q.close();
                    }
                }
                lane.has_out.store(true, Ordering::SeqCst);
                shared.wake();
            }
            s.depth -= 1;
            s.owner = self.outer;
        });
    }
}

/// Inside a batch's scope, the batch's number (given at its first forwarded element);
/// `None` outside any.
pub(crate) fn owner() -> Option<u64> {
    STATE.with(|s| {
        let mut s = s.borrow_mut();
        if s.depth == 0 {
            return None;
        }
        if s.owner == 0 {
            s.owner = NEXT.fetch_add(1, Ordering::Relaxed);
        }
        Some(s.owner)
    })
}

/// Notes that the current batch wrote an element to lane `i` of `shared`: the
/// scope's end closes its sub-batch there and wakes the upstream thread.
pub(crate) fn wrote(shared: &Arc<Shared>, i: usize) {
    STATE.with(|s| {
        let mut s = s.borrow_mut();
        if !s
            .open
            .iter()
            .any(|(p, l)| *l == i && Arc::ptr_eq(p, shared))
        {
            s.open.push((Arc::clone(shared), i));
        }
    });
}
