//! A shard's reply registry: which connection waits for which client's reply, and which
//! clients' requests came from another shard (their replies go back over the mesh's reply
//! lane). It is the shard's [`ReplySink`]: every group pump on the shard delivers through it.
//!
//! Lockstep (client-plane.md §1): a connection has at most one request outstanding, so one
//! waiter per client id is enough. A reply for a client nobody waits for is dropped and counted
//! (`undeliverable`), never written unsolicited: the SDK would take it as the answer to its
//! next request. A waiter also names the request number it waits for: a Reply whose header
//! carries another number (a request answered 57 at the deadline that committed later, while
//! the client already waits for its next request) is dropped and counted (`stale`), and the
//! waiter keeps waiting (decision 250). An Eviction carries no request number and is
//! delivered to whatever the client waits for.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::future::poll_fn;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::task::{Poll, Waker};

use consensus::Frame;
use wire::Command;
use wire::header::{Layout, ReplyHeader};

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

/// A connection waiting for one request's reply.
struct Waiter {
    conn: u64,
    /// The awaited request number.
    request: u64,
    slot: Rc<Slot>,
}

/// The registry of one shard.
pub struct Registry {
    waiters: RefCell<HashMap<u128, Waiter>>,
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

    /// Connection `conn` waits for the reply to `client`'s request number `request`. `None`
    /// when another connection already waits for that client id (a second connection with the
    /// same id; it gets a transient refusal instead of stealing the first one's reply).
    pub fn wait_for(&self, client: u128, conn: u64, request: u64) -> Option<Rc<Slot>> {
        let mut waiters = self.waiters.borrow_mut();
        if waiters.get(&client).is_some_and(|w| w.conn != conn) {
            return None;
        }
        let slot = Rc::new(Slot::default());
        waiters.insert(
            client,
            Waiter {
                conn,
                request,
                slot: slot.clone(),
            },
        );
        Some(slot)
    }

    /// Connection `conn` stopped waiting for `client` (it answered, timed out, or closed).
    pub fn forget(&self, client: u128, conn: u64) {
        let mut waiters = self.waiters.borrow_mut();
        if waiters.get(&client).is_some_and(|w| w.conn == conn) {
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

    /// Delivers to a connection of this shard only (a reply that came over the mesh). A Reply
    /// for another request number than the awaited one is dropped and counted (`stale`).
    pub fn deliver_local(&self, client: u128, frame: Frame) {
        let mut waiters = self.waiters.borrow_mut();
        let Some(awaited) = waiters.get(&client).map(|w| w.request) else {
            drop(waiters);
            self.counters.undeliverable.fetch_add(1, Ordering::Relaxed);
            return;
        };
        if let Some(request) = reply_request(&frame)
            && request != awaited
        {
            drop(waiters);
            self.counters.stale.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(
                client,
                request,
                "a reply for a request this client no longer waits for; dropped"
            );
            return;
        }
        let waiter = waiters.remove(&client).expect("looked up above");
        drop(waiters);
        waiter.slot.fill(frame);
    }

    /// Clients waiting on this shard (tests, metrics).
    pub fn waiting(&self) -> usize {
        self.waiters.borrow().len()
    }
}

/// The request number of a Reply; `None` for any other frame (an Eviction answers whatever
/// the client waits for).
fn reply_request(frame: &Frame) -> Option<u64> {
    if frame.command() != Some(Command::Reply) {
        return None;
    }
    let header = ReplyHeader::view(frame.header_bytes()?)?;
    Some(header.request.get())
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::task::{Context, Poll, Waker};

    use wire::header::{Layout, RequestHeader};

    use super::*;
    use crate::client_core::frames;

    fn reply_to(client: u128, request: u64) -> Frame {
        let mut header = RequestHeader::zeroed();
        header.client.set(client);
        header.request.set(request);
        header.operation = wire::Operation::SendMessages.byte();
        frames::reply(&header, 0, &[])
    }

    fn ready(slot: &Slot) -> Option<Frame> {
        let mut wait = std::pin::pin!(slot.wait());
        match wait.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(frame) => Some(frame),
            Poll::Pending => None,
        }
    }

    /// A request answered at the deadline that commits later must not answer the client's next
    /// request: its Reply is dropped and counted, and the next request's own Reply arrives.
    #[test]
    fn a_late_reply_to_an_earlier_request_is_dropped_not_delivered_to_the_next() {
        let counters = Arc::new(Counters::default());
        let registry = Registry::new(counters.clone());
        let client = 7;
        // Request 1 waited, hit the deadline, and the connection forgot it.
        let first = registry.wait_for(client, 1, 1).unwrap();
        registry.forget(client, 1);
        drop(first);
        // Request 2 waits; request 1 commits now and its Reply comes back.
        let second = registry.wait_for(client, 1, 2).unwrap();
        registry.reply(client, reply_to(client, 1));
        assert!(
            ready(&second).is_none(),
            "request 1's reply answered request 2"
        );
        assert_eq!(counters.stale.load(Ordering::Relaxed), 1);
        assert_eq!(registry.waiting(), 1);
        // Its own reply is delivered.
        registry.reply(client, reply_to(client, 2));
        let frame = ready(&second).expect("request 2's reply");
        let header = ReplyHeader::view(frame.header_bytes().unwrap()).unwrap();
        assert_eq!(header.request.get(), 2);
        assert_eq!(registry.waiting(), 0);
        assert_eq!(counters.undeliverable.load(Ordering::Relaxed), 0);
    }

    /// An Eviction has no request number: it reaches whatever the client waits for.
    #[test]
    fn an_eviction_reaches_the_waiting_request() {
        let counters = Arc::new(Counters::default());
        let registry = Registry::new(counters.clone());
        let slot = registry.wait_for(9, 1, 4).unwrap();
        registry.deliver_local(
            9,
            frames::eviction(9, wire::decode::EvictionReason::SessionTooLow, None),
        );
        assert_eq!(ready(&slot).unwrap().command(), Some(Command::Eviction));
        assert_eq!(counters.stale.load(Ordering::Relaxed), 0);
    }
}
