//! One shard's endpoint of the replica plane.
//!
//! Connections are identified by `(peer, lane)` and live on the shard that owns their lane
//! (`lane mod shards`). Outbound, each shard dials the lanes it owns towards every higher-id
//! peer, so a dialled connection never changes shard. Inbound, whichever shard runs the accept
//! loop completes the handshake (TLS included), reads the lane from hello byte 224, and hands
//! the connection to the owning shard through the runtime's [`Handoff`] hook when it is not its
//! own. Each installed connection runs one reader task (framer, receive checks, [`Sink`]) and
//! one writer task (bounded queue drained in vectored batches of up to `max_batch` frames).

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet, VecDeque};
use std::future::{Future, poll_fn};
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use futures_lite::future::or;
use glommio::net::{TcpListener, TcpStream};
use glommio::timer::Timer;
use wire::framer::Framer;
use wire::{GroupId, Message};

use super::config::{MAX_HANDSHAKES_IN_FLIGHT, NetConfig};
use super::counters::{Closed, Counters, Handshake, SendDrop};
use super::handshake::{self, Established};
use super::io::{Detached, ReadHalf, Stream, WriteHalf};
use crate::mapping::lane as lane_of;

/// The shard serving `lane` (the one placement rule, [`crate::mapping::shard_of_lane`]).
fn shard_of_lane(lane: u8, shards: usize) -> usize {
    let shards = u16::try_from(shards).expect("shard count fits u16");
    usize::from(crate::mapping::shard_of_lane(lane, shards))
}
use super::receive::{Refusal, closed_for, screen};

/// How often [`Plane::drain`] looks at the queues.
const DRAIN_POLL: Duration = Duration::from_millis(5);

/// Pause after a failed `accept` (descriptor exhaustion, for instance) so the loop cannot spin.
const ACCEPT_RETRY: Duration = Duration::from_millis(10);

/// Where an inbound frame came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Origin {
    /// The peer's replica id as established by the handshake.
    pub peer: u8,
    /// The connection's lane.
    pub lane: u8,
}

/// Receives every frame that passed the receive checks, on the shard that read it. Called
/// synchronously from the reader task: it must not block (push into an inbox with `try_send`).
pub trait Sink {
    /// One accepted frame: its typed view and its bytes (borrowed from the reader's buffer).
    fn frame(&self, origin: Origin, message: &Message<'_>, frame: &[u8]);

    /// One accepted frame that was read straight into a buffer of its own (a large frame,
    /// decision 365): a sink that keeps the bytes takes a reference instead of a copy. By
    /// default, handled as [`Sink::frame`].
    fn frame_owned(&self, origin: Origin, message: &Message<'_>, frame: &Bytes) {
        self.frame(origin, message, frame);
    }

    /// A connection to `origin.peer` on `origin.lane` is established on this shard (for the
    /// pump's per-peer connection reports).
    fn connected(&self, origin: Origin) {
        let _ = origin;
    }

    /// That connection closed; sends on its lane fail until the next one is established.
    fn disconnected(&self, origin: Origin) {
        let _ = origin;
    }
}

/// Frames of at least this many bytes that are still arriving when the framer's buffer is
/// drained are read into a buffer of their own (decision 365); smaller ones are sliced out of
/// the framer's buffer and copied by a sink that keeps them.
pub const DIRECT_READ_MIN: usize = wire::framer::READ_CHUNK;

/// Bytes a connection's reader takes in before it lets its shard's rings turn (decision 502).
pub const READ_TURN_BYTES: usize = 1 << 20;

/// Why a frame was not queued for a peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SendError {
    /// The lane belongs to another shard: forward the frame there (not counted here).
    #[error("lane owned by shard {0}")]
    OtherShard(usize),
    /// No established connection on that lane (counted).
    #[error("peer not connected on this lane")]
    NotConnected,
    /// The per-peer queue is full (counted).
    #[error("peer queue full")]
    QueueFull,
}

/// State every shard of one node shares: the node-wide cap on inbound handshakes in flight.
#[derive(Debug, Clone, Default)]
pub struct NodeShared {
    handshakes: Arc<AtomicUsize>,
}

impl NodeShared {
    /// Inbound handshakes in flight right now.
    pub fn handshakes_in_flight(&self) -> usize {
        self.handshakes.load(Ordering::Relaxed)
    }
}

/// Releases a handshake slot however the handshake task ends (done, failed, or dropped).
struct HandshakeSlot(Arc<AtomicUsize>);

impl Drop for HandshakeSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// An accepted, handshaken connection on its way to the shard that owns its lane. `Send`.
#[derive(Debug)]
pub struct Handed {
    /// Socket and TLS session.
    pub detached: Detached,
    /// Peer replica id.
    pub peer: u8,
    /// Lane from the hello.
    pub lane: u8,
}

/// The runtime's hook that moves a connection to shard `target` without blocking (a `try_send`
/// into that shard's inbox); it returns the connection when it cannot, which then closes.
pub type Handoff = Box<dyn Fn(usize, Handed) -> Result<(), Handed>>;

/// A one-shot local stop signal.
#[derive(Default)]
struct Stop {
    stopped: Cell<bool>,
    wakers: RefCell<Vec<Waker>>,
}

impl Stop {
    fn fire(&self) {
        self.stopped.set(true);
        for waker in self.wakers.borrow_mut().drain(..) {
            waker.wake();
        }
    }

    fn wait(&self) -> impl Future<Output = ()> + '_ {
        poll_fn(|cx| {
            if self.stopped.get() {
                return Poll::Ready(());
            }
            let mut wakers = self.wakers.borrow_mut();
            if !wakers.iter().any(|w| w.will_wake(cx.waker())) {
                wakers.push(cx.waker().clone());
            }
            Poll::Pending
        })
    }
}

/// One established connection's shared state: its queue, and whether it closed.
struct Conn {
    id: u64,
    origin: Origin,
    queue: RefCell<VecDeque<Bytes>>,
    capacity: usize,
    waker: Cell<Option<Waker>>,
    closed: Cell<Option<Closed>>,
    flush: Cell<bool>,
    /// Frames of the batch the writer is writing now.
    writing: Cell<usize>,
}

impl Conn {
    fn wake(&self) {
        if let Some(waker) = self.waker.take() {
            waker.wake();
        }
    }

    fn has_work(&self) -> bool {
        self.closed.get().is_some() || self.flush.get() || !self.queue.borrow().is_empty()
    }

    fn work(&self) -> impl Future<Output = ()> + '_ {
        poll_fn(|cx| {
            if self.has_work() {
                Poll::Ready(())
            } else {
                self.waker.set(Some(cx.waker().clone()));
                Poll::Pending
            }
        })
    }
}

/// One shard's replica plane.
pub struct Plane {
    config: Arc<NetConfig>,
    shard: usize,
    shards: usize,
    counters: Arc<Counters>,
    node: NodeShared,
    sink: Rc<dyn Sink>,
    handoff: RefCell<Option<Handoff>>,
    conns: RefCell<HashMap<(u8, u8), Rc<Conn>>>,
    dialing: RefCell<HashSet<(u8, u8)>>,
    next_id: Cell<u64>,
    stop: Stop,
}

impl Plane {
    /// The plane of shard `shard` of `shards`. `config` must have passed
    /// [`NetConfig::validate`] for `shards`.
    pub fn new(
        config: Arc<NetConfig>,
        shard: usize,
        shards: usize,
        node: NodeShared,
        sink: Rc<dyn Sink>,
    ) -> Rc<Plane> {
        assert!(shard < shards, "shard {shard} of {shards}");
        Rc::new(Plane {
            config,
            shard,
            shards,
            counters: Arc::new(Counters::default()),
            node,
            sink,
            handoff: RefCell::new(None),
            conns: RefCell::new(HashMap::new()),
            dialing: RefCell::new(HashSet::new()),
            next_id: Cell::new(0),
            stop: Stop::default(),
        })
    }

    /// This shard's counters (readable from any thread).
    pub fn counters(&self) -> &Arc<Counters> {
        &self.counters
    }

    /// Installs the hook that moves accepted connections to the shard owning their lane.
    pub fn set_handoff(&self, handoff: Handoff) {
        *self.handoff.borrow_mut() = Some(handoff);
    }

    /// The lanes this shard owns.
    pub fn own_lanes(&self) -> impl Iterator<Item = u8> + '_ {
        (0..self.config.lanes)
            .map(|lane| u8::try_from(lane).expect("validated: lanes <= 256"))
            .filter(|&lane| shard_of_lane(lane, self.shards) == self.shard)
    }

    /// Whether an established connection to `peer` on `lane` is registered here.
    pub fn is_connected(&self, peer: u8, lane: u8) -> bool {
        self.conns.borrow().contains_key(&(peer, lane))
    }

    /// Every registered `(peer, lane)`.
    pub fn connections(&self) -> Vec<(u8, u8)> {
        let mut keys: Vec<_> = self.conns.borrow().keys().copied().collect();
        keys.sort_unstable();
        keys
    }

    /// Frames waiting in the queue of `peer` on `lane`.
    pub fn queue_depth(&self, peer: u8, lane: u8) -> usize {
        self.conns
            .borrow()
            .get(&(peer, lane))
            .map_or(0, |conn| conn.queue.borrow().len())
    }

    /// Queues `frame` for `peer` on the lane of `group`. Never suspends.
    pub fn send(&self, peer: u8, group: GroupId, frame: &Bytes) -> Result<(), SendError> {
        self.send_lane(peer, lane_of(group, self.config.lanes), frame)
    }

    /// Queues `frame` (a shared reference, never copied) for `peer` on `lane`. Never suspends.
    pub fn send_lane(&self, peer: u8, lane: u8, frame: &Bytes) -> Result<(), SendError> {
        let owner = shard_of_lane(lane, self.shards);
        if owner != self.shard {
            return Err(SendError::OtherShard(owner));
        }
        let conns = self.conns.borrow();
        let conn = match conns.get(&(peer, lane)) {
            Some(conn) if conn.closed.get().is_none() => conn,
            _ => {
                self.counters.send_dropped(SendDrop::NotConnected);
                return Err(SendError::NotConnected);
            }
        };
        let mut queue = conn.queue.borrow_mut();
        if queue.len() >= conn.capacity {
            self.counters.send_dropped(SendDrop::QueueFull);
            return Err(SendError::QueueFull);
        }
        queue.push_back(frame.clone());
        drop(queue);
        conn.wake();
        Ok(())
    }

    /// Runs the accept loop on this shard's executor until [`Plane::shutdown`].
    pub fn serve(self: &Rc<Self>, listener: TcpListener) {
        let plane = self.clone();
        glommio::spawn_local(async move {
            loop {
                let accepted = or(async { Some(listener.accept().await) }, async {
                    plane.stop.wait().await;
                    None
                })
                .await;
                match accepted {
                    None => break,
                    Some(Ok(tcp)) => plane.spawn_accept(tcp),
                    Some(Err(error)) => {
                        tracing::warn!(%error, "replica accept failed");
                        Timer::new(ACCEPT_RETRY).await;
                    }
                }
            }
        })
        .detach();
    }

    fn spawn_accept(self: &Rc<Self>, tcp: TcpStream) {
        let slots = &self.node.handshakes;
        if slots.fetch_add(1, Ordering::AcqRel) >= MAX_HANDSHAKES_IN_FLIGHT {
            slots.fetch_sub(1, Ordering::AcqRel);
            self.counters.handshake_failed(Handshake::CapFull);
            tracing::warn!(
                "{MAX_HANDSHAKES_IN_FLIGHT} replica handshakes in flight; closing a new connection"
            );
            return;
        }
        let slot = HandshakeSlot(slots.clone());
        let plane = self.clone();
        glommio::spawn_local(async move {
            let grace = plane.config.handshake_grace;
            let result = within(grace, handshake::accept(tcp, &plane.config)).await;
            drop(slot);
            match result {
                Ok(established) => plane.route(established),
                Err(failure) => plane.counters.handshake_failed(failure),
            }
        })
        .detach();
    }

    /// Installs an accepted connection here or hands it to the shard owning its lane.
    fn route(self: &Rc<Self>, established: Established) {
        let target = shard_of_lane(established.lane, self.shards);
        if target == self.shard {
            self.install(established, true);
            return;
        }
        let Established { stream, peer, lane } = established;
        let handoff = self.handoff.borrow();
        let Some(handoff) = handoff.as_ref() else {
            tracing::error!(
                peer,
                lane,
                target,
                "no handoff hook; closing the connection"
            );
            self.counters.handshake_failed(Handshake::HandoffFailed);
            return;
        };
        let detached = match stream.detach() {
            Ok(detached) => detached,
            Err(error) => {
                tracing::warn!(peer, lane, %error, "cannot duplicate the socket for handoff");
                self.counters.handshake_failed(Handshake::HandoffFailed);
                return;
            }
        };
        match handoff(
            target,
            Handed {
                detached,
                peer,
                lane,
            },
        ) {
            Ok(()) => Counters::add(&self.counters.handed_off, 1),
            Err(_closed_on_drop) => {
                tracing::warn!(
                    peer,
                    lane,
                    target,
                    "shard inbox full; closing a handed connection"
                );
                self.counters.handshake_failed(Handshake::HandoffFailed);
            }
        }
    }

    /// Installs a connection another shard handed over.
    pub fn adopt(self: &Rc<Self>, handed: Handed) {
        if shard_of_lane(handed.lane, self.shards) != self.shard {
            tracing::error!(
                lane = handed.lane,
                shard = self.shard,
                "handed a lane this shard does not own"
            );
            self.counters.handshake_failed(Handshake::HandoffFailed);
            return;
        }
        Counters::add(&self.counters.adopted, 1);
        self.install(
            Established {
                stream: Stream::attach(handed.detached),
                peer: handed.peer,
                lane: handed.lane,
            },
            true,
        );
    }

    /// Starts the reconnect sweep: every `reconnect_period`, each lane this shard owns towards
    /// each higher-id peer without a connection or a dial in flight is dialled.
    pub fn start_connector(self: &Rc<Self>) {
        let plane = self.clone();
        glommio::spawn_local(async move {
            while !plane.stop.stopped.get() {
                plane.sweep();
                let period = plane.config.reconnect_period;
                let stopped = or(
                    async {
                        Timer::new(period).await;
                        false
                    },
                    async {
                        plane.stop.wait().await;
                        true
                    },
                )
                .await;
                if stopped {
                    break;
                }
            }
        })
        .detach();
    }

    fn sweep(self: &Rc<Self>) {
        let config = self.config.clone();
        for peer in config.roster.iter().filter(|p| p.id > config.self_id) {
            for lane in self.own_lanes() {
                let key = (peer.id, lane);
                if self.conns.borrow().contains_key(&key) || !self.dialing.borrow_mut().insert(key)
                {
                    continue;
                }
                Counters::add(&self.counters.dials, 1);
                let plane = self.clone();
                let peer = peer.clone();
                glommio::spawn_local(async move {
                    // The connect is bounded by reconnect_period inside; TLS and the handshake
                    // by handshake_grace.
                    let bound = plane.config.reconnect_period + plane.config.handshake_grace;
                    let result = within(bound, handshake::dial(&plane.config, &peer, lane)).await;
                    plane.dialing.borrow_mut().remove(&key);
                    match result {
                        Ok(established) => plane.install(established, false),
                        Err(failure) => plane.counters.handshake_failed(failure),
                    }
                })
                .detach();
            }
        }
    }

    fn install(self: &Rc<Self>, established: Established, inbound: bool) {
        let Established { stream, peer, lane } = established;
        let key = (peer, lane);
        if self.stop.stopped.get() {
            stream.shutdown();
            return;
        }
        if self.conns.borrow().contains_key(&key) {
            tracing::info!(
                peer,
                lane,
                "second connection for a peer and lane; closing it"
            );
            self.counters.closed(Closed::Duplicate);
            stream.shutdown();
            return;
        }
        let (read, write) = match stream.split() {
            Ok(halves) => halves,
            Err(error) => {
                tracing::warn!(peer, lane, %error, "cannot split a replica connection");
                self.counters.closed(Closed::Local);
                return;
            }
        };
        let id = self.next_id.get();
        self.next_id.set(id + 1);
        let conn = Rc::new(Conn {
            id,
            origin: Origin { peer, lane },
            queue: RefCell::new(VecDeque::new()),
            capacity: self.config.peer_queue_capacity,
            waker: Cell::new(None),
            closed: Cell::new(None),
            // A session that just finished its handshake (or moved here) may hold records to
            // send: the writer's first turn flushes them.
            flush: Cell::new(true),
            writing: Cell::new(0),
        });
        if self.conns.borrow_mut().insert(key, conn.clone()).is_none() {
            Counters::add(&self.counters.open, 1);
        }
        let established = if inbound {
            &self.counters.established_inbound
        } else {
            &self.counters.established_outbound
        };
        Counters::add(established, 1);
        tracing::info!(
            peer,
            lane,
            shard = self.shard,
            inbound,
            "replica connection established"
        );
        // Before the reader runs, so a pump hears "up" before the first frame of the connection.
        self.sink.connected(conn.origin);
        glommio::spawn_local(self.clone().reader(conn.clone(), read)).detach();
        glommio::spawn_local(self.clone().writer(conn, write)).detach();
    }

    /// Marks `conn` closed for `reason` (the first reason wins and is counted) and unregisters
    /// it; the writer then shuts the socket down, which ends the reader.
    fn close(&self, conn: &Conn, reason: Closed) {
        if conn.closed.get().is_some() {
            return;
        }
        conn.closed.set(Some(reason));
        conn.wake();
        self.counters.closed(reason);
        let Origin { peer, lane } = conn.origin;
        tracing::info!(
            peer,
            lane,
            reason = reason.label(),
            "replica connection closed"
        );
        let mut conns = self.conns.borrow_mut();
        if conns.get(&(peer, lane)).is_some_and(|c| c.id == conn.id) {
            conns.remove(&(peer, lane));
            self.counters
                .open
                .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        }
        drop(conns);
        self.sink.disconnected(conn.origin);
    }

    async fn reader(self: Rc<Self>, conn: Rc<Conn>, mut half: ReadHalf) {
        let config = &self.config;
        let mut framer = Framer::new(config.max_message_size);
        // Bytes read since the shard's rings last turned.
        let mut unturned = 0usize;
        let reason = 'connection: loop {
            if conn.closed.get().is_some() {
                break None;
            }
            // Reads into the framer stop at `READ_CHUNK`, so a large frame is never whole
            // in one read: its header arrives with at most a chunk of its body and the rest
            // goes straight into its own buffer below.
            let spare = framer.spare();
            let chunk = spare.len().min(wire::framer::READ_CHUNK);
            match self
                .read_into(&conn, &mut half, &mut spare[..chunk], &mut unturned)
                .await
            {
                Ok(n) => framer.filled(n),
                Err(reason) => break Some(reason),
            }
            while let Some(frame) = framer.next_frame() {
                let frame = match frame {
                    Ok(frame) => frame,
                    Err(error) => {
                        tracing::warn!(peer = conn.origin.peer, lane = conn.origin.lane, %error, "replica framing violation");
                        break 'connection Some(closed_for(error));
                    }
                };
                if let Err(reason) = self.deliver(&conn, frame, None) {
                    break 'connection Some(reason);
                }
            }
            // A large frame under way is read into its own buffer, which the sink keeps: no
            // copy out of the framer's buffer and no compaction of it (decision 365).
            if let Some((mut frame, mut filled)) = framer.take_partial(DIRECT_READ_MIN) {
                while filled < frame.len() {
                    if conn.closed.get().is_some() {
                        break 'connection None;
                    }
                    match self
                        .read_into(&conn, &mut half, &mut frame[filled..], &mut unturned)
                        .await
                    {
                        Ok(n) => filled += n,
                        Err(reason) => break 'connection Some(reason),
                    }
                }
                let frame = Bytes::from(frame);
                if let Err(reason) = self.deliver(&conn, &frame, Some(&frame)) {
                    break 'connection Some(reason);
                }
            }
        };
        if let Some(reason) = reason {
            self.close(&conn, reason);
        }
    }

    /// One read from the connection into `buf`: the bytes read, or why the connection ends
    /// (end of stream, a read error). `unturned` counts the bytes read since the shard's rings
    /// last turned; past [`READ_TURN_BYTES`] they turn before this read (decision 502).
    async fn read_into(
        &self,
        conn: &Conn,
        half: &mut ReadHalf,
        buf: &mut [u8],
        unturned: &mut usize,
    ) -> Result<usize, Closed> {
        if *unturned >= READ_TURN_BYTES {
            *unturned = 0;
            crate::pump::reactor_turn().await;
        }
        match half.read(buf).await {
            Ok((0, _)) => Err(Closed::Eof),
            Ok((n, wants_write)) => {
                *unturned += n;
                if wants_write {
                    conn.flush.set(true);
                    conn.wake();
                }
                Ok(n)
            }
            Err(error) => {
                tracing::info!(peer = conn.origin.peer, %error, "replica read failed");
                Err(Closed::ReadError)
            }
        }
    }

    /// The receive checks of one whole frame, then the sink (`owned`: the frame is `frame`'s
    /// own buffer, which the sink may keep); `Err` closes the connection.
    fn deliver(&self, conn: &Conn, frame: &[u8], owned: Option<&Bytes>) -> Result<(), Closed> {
        let config = &self.config;
        match screen(
            frame,
            config.max_message_size,
            config.replica_count(),
            config.self_id,
        ) {
            Ok(message) => {
                Counters::add(&self.counters.frames_in, 1);
                Counters::add(&self.counters.bytes_in, frame.len() as u64);
                match owned {
                    Some(bytes) => self.sink.frame_owned(conn.origin, &message, bytes),
                    None => self.sink.frame(conn.origin, &message, frame),
                }
                Ok(())
            }
            Err(Refusal::Drop(reason)) => {
                self.counters.dropped(reason);
                tracing::debug!(
                    peer = conn.origin.peer,
                    reason = reason.label(),
                    "replica frame dropped"
                );
                Ok(())
            }
            Err(Refusal::Close(reason)) => Err(reason),
        }
    }

    async fn writer(self: Rc<Self>, conn: Rc<Conn>, mut half: WriteHalf) {
        let max_batch = self.config.max_batch;
        let mut batch: Vec<Bytes> = Vec::with_capacity(max_batch);
        loop {
            conn.work().await;
            if conn.closed.get().is_some() {
                break;
            }
            conn.flush.set(false);
            {
                let mut queue = conn.queue.borrow_mut();
                let n = queue.len().min(max_batch);
                batch.extend(queue.drain(..n));
            }
            conn.writing.set(batch.len());
            let result = if batch.is_empty() {
                half.flush().await
            } else {
                half.write_frames(&batch).await
            };
            conn.writing.set(0);
            if let Err(error) = result {
                tracing::info!(peer = conn.origin.peer, %error, "replica write failed");
                self.close(&conn, Closed::WriteError);
                break;
            }
            if !batch.is_empty() {
                let bytes: usize = batch.iter().map(Bytes::len).sum();
                Counters::add(&self.counters.frames_out, batch.len() as u64);
                Counters::add(&self.counters.bytes_out, bytes as u64);
                Counters::add(&self.counters.batches_out, 1);
            }
            batch.clear();
        }
        half.shutdown();
        conn.queue.borrow_mut().clear();
    }

    /// Stops accepting and dialing, lets every writer hand its queued frames to the kernel for
    /// at most `bound` (`message_bus.close_peer_timeout`), then closes every connection.
    /// Returns the frames still queued when the bound ran out (dropped).
    pub async fn drain(&self, bound: Duration) -> usize {
        self.stop.fire();
        let idle = |conns: &HashMap<(u8, u8), Rc<Conn>>| {
            conns
                .values()
                .all(|c| c.queue.borrow().is_empty() && c.writing.get() == 0)
        };
        let poll = async {
            while !idle(&self.conns.borrow()) {
                Timer::new(DRAIN_POLL).await;
            }
        };
        or(poll, async {
            Timer::new(bound).await;
        })
        .await;
        let left = self
            .conns
            .borrow()
            .values()
            .map(|c| c.queue.borrow().len() + c.writing.get())
            .sum();
        self.shutdown();
        left
    }

    /// Stops accepting and dialing and closes every connection of this shard now; queued
    /// frames are dropped.
    pub fn shutdown(&self) {
        self.stop.fire();
        let conns: Vec<Rc<Conn>> = self.conns.borrow().values().cloned().collect();
        for conn in conns {
            self.close(&conn, Closed::Local);
        }
    }
}

/// `future`, or `Handshake::Timeout` after `bound`.
async fn within<T>(
    bound: Duration,
    future: impl Future<Output = Result<T, Handshake>>,
) -> Result<T, Handshake> {
    or(future, async {
        Timer::new(bound).await;
        Err(Handshake::Timeout)
    })
    .await
}
