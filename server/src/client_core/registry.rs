//! A shard's reply registry: which connection waits for which client's reply, and which
//! clients' requests came from another shard (their replies go back over the mesh's reply
//! lane). It is the shard's [`ReplySink`]: every group pump on the shard delivers through it.
//!
//! Lockstep (client-plane.md §1): a connection has at most one request outstanding, so one
//! waiter per client id is enough. A reply for a client nobody waits for is dropped and counted
//! (`undeliverable`), never written unsolicited: the SDK would take it as the answer to its
//! next request.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::future::poll_fn;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::task::{Poll, Waker};

use consensus::Frame;

use super::Counters;
use crate::groups::ReplySink;

/// Remote clients a shard remembers at most (origins of forwarded requests whose reply has not
/// come back). Each connection has one request outstanding, so the live entries are bounded by
/// the node's connections; entries whose reply never came (a request lost in a view change)
/// are what the bound is for. Past it the map is emptied and those clients' requests end with
/// the client core's deadline answer (57), the SDK retries, and the client table answers.
pub const REMOTE_CLIENTS_MAX: usize = 1 << 16;

/// One outstanding request's reply slot.
#[derive(Default)]
pub struct Slot {
    frame: RefCell<Option<Frame>>,
    waker: Cell<Option<Waker>>,
}

impl Slot {
    fn fill(&self, frame: Frame) {
        *self.frame.borrow_mut() = Some(frame);
        if let Some(waker) = self.waker.take() {
            waker.wake();
        }
    }

    /// Waits until the reply is there.
    pub async fn wait(&self) -> Frame {
        poll_fn(|cx| {
            if let Some(frame) = self.frame.borrow_mut().take() {
                return Poll::Ready(frame);
            }
            self.waker.set(Some(cx.waker().clone()));
            Poll::Pending
        })
        .await
    }
}

/// Sends a reply to another shard's registry over the mesh's reply lane; false when the lane
/// refused it.
pub type ReplyLane = Box<dyn Fn(u16, u128, Frame) -> bool>;

/// The registry of one shard.
pub struct Registry {
    waiters: RefCell<HashMap<u128, (u64, Rc<Slot>)>>,
    remote: RefCell<HashMap<u128, u16>>,
    lane: RefCell<Option<ReplyLane>>,
    counters: std::sync::Arc<Counters>,
}

impl Registry {
    /// An empty registry counting into `counters`.
    pub fn new(counters: std::sync::Arc<Counters>) -> Registry {
        Registry {
            waiters: RefCell::default(),
            remote: RefCell::default(),
            lane: RefCell::new(None),
            counters,
        }
    }

    /// Installs the hook that carries replies to other shards.
    pub fn set_reply_lane(&self, lane: ReplyLane) {
        *self.lane.borrow_mut() = Some(lane);
    }

    /// Connection `conn` waits for `client`'s reply. `None` when another connection already
    /// waits for that client id (a second connection with the same id; it gets a transient
    /// refusal instead of stealing the first one's reply).
    pub fn wait_for(&self, client: u128, conn: u64) -> Option<Rc<Slot>> {
        let mut waiters = self.waiters.borrow_mut();
        if waiters.get(&client).is_some_and(|(c, _)| *c != conn) {
            return None;
        }
        let slot = Rc::new(Slot::default());
        waiters.insert(client, (conn, slot.clone()));
        Some(slot)
    }

    /// Connection `conn` stopped waiting for `client` (it answered, timed out, or closed).
    pub fn forget(&self, client: u128, conn: u64) {
        let mut waiters = self.waiters.borrow_mut();
        if waiters.get(&client).is_some_and(|(c, _)| *c == conn) {
            waiters.remove(&client);
        }
    }

    /// A request of `client` arrived from shard `origin`: its reply goes back there.
    pub fn remember_remote(&self, client: u128, origin: u16) {
        let mut remote = self.remote.borrow_mut();
        if remote.len() >= REMOTE_CLIENTS_MAX && !remote.contains_key(&client) {
            self.counters
                .remote_forgotten
                .fetch_add(remote.len() as u64, Ordering::Relaxed);
            remote.clear();
        }
        remote.insert(client, origin);
    }

    /// Delivers to a connection of this shard only (a reply that came over the mesh).
    pub fn deliver_local(&self, client: u128, frame: Frame) {
        let waiter = self.waiters.borrow_mut().remove(&client);
        match waiter {
            Some((_, slot)) => slot.fill(frame),
            None => {
                self.counters.undeliverable.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Clients waiting on this shard (tests, metrics).
    pub fn waiting(&self) -> usize {
        self.waiters.borrow().len()
    }
}

impl ReplySink for Registry {
    fn reply(&self, client: u128, frame: Frame) {
        if self.waiters.borrow().contains_key(&client) {
            self.deliver_local(client, frame);
            return;
        }
        let origin = self.remote.borrow_mut().remove(&client);
        match (origin, self.lane.borrow().as_ref()) {
            (Some(origin), Some(lane)) => {
                if !lane(origin, client, frame) {
                    self.counters.mesh_refused.fetch_add(1, Ordering::Relaxed);
                }
            }
            _ => {
                self.counters.undeliverable.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}
