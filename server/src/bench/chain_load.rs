//! A chain of replicas with no server in it, under the run's load (decision 516).
//!
//! Issue 12 holds a 3-replica run at 100 B to 0.6x the messages/s of a 1-replica run. On one
//! machine every replica writes to the same disk and runs on the same cores, so that ratio is
//! bounded by what the kernel does per batch at each replica count, whatever the server does
//! above it. This probe measures that bound in the run: as many producers as the run, each in
//! a closed loop with one batch in flight, and as many nodes as the run's replicas, each a set
//! of threads doing a node's kernel work for a batch and nothing else:
//!
//! - node 0 reads the batch from its producer over loopback TCP, node `i` passes it on to node
//!   `i + 1` as it arrives (the chain);
//! - each node appends it to a segment file of its own (`O_DIRECT | O_DSYNC`, its blocks
//!   reserved ahead as a node's segments are, decisions 514-515) while a second thread writes a
//!   4 KiB WAL record (`O_DSYNC`, over blocks written before the chain starts);
//! - the nodes of the first quorum acknowledge back along the chain once their writes returned
//!   and their successor's acknowledgement came in; node 0 then answers the producer.
//!
//! The same load then runs against one such node alone. The ratio of the two is what any
//! server writing each batch once per replica, durably, could reach on this machine.

use std::fs::File;
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use shard::net::CongestionControl;
use shard::net::socket::{std_connect, std_listener};

use journal::AlignedBuf;

use super::baseline::{ALIGN, CONNECT_TIMEOUT, LOCALHOST_ANY_PORT, create_probe_file_with};

/// What [`chain_load`] measured (the report's `baseline.chain_load`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChainLoad {
    /// Nodes in the chain: the run's replicas.
    pub replicas: u32,
    /// Producers, each with one batch in flight: the run's producers.
    pub producers: u32,
    /// Bytes of each batch's write (the run's SendMessages frame, rounded up to 4096).
    pub write_size: usize,
    /// Batches per second acknowledged by the chain of `replicas` nodes.
    pub chain_batches_s: f64,
    /// Batches per second acknowledged by one node alone, the same load.
    pub single_batches_s: f64,
    /// `chain_batches_s / single_batches_s`: the most a run of `replicas` replicas can reach
    /// against a run of one on this machine, with no server cost at all.
    pub ratio: f64,
    /// Seconds measured of each of the two (after a warm-up).
    pub measured_s: f64,
}

/// What one chain measured.
#[derive(Debug, Clone, PartialEq)]
pub struct ChainRun {
    /// Batches per second acknowledged over the measured span.
    pub batches_s: f64,
    /// Batches the producers had acknowledged when they stopped.
    pub acked: u64,
    /// Bytes each node's segment files hold after the run, in chain order.
    pub appended: Vec<u64>,
    /// The measured span.
    pub measured: Duration,
}

/// Each chain runs this long before its span is measured.
const WARMUP: Duration = Duration::from_millis(250);

/// Each node's WAL records go round a file of this many bytes, written before the chain starts.
const WAL_RING: u64 = 8 << 20;

/// One WAL record.
const WAL_RECORD: usize = 4096;

/// An acknowledgement on the chain.
const ACK: [u8; 8] = *b"chain-ok";

/// The load a chain is measured under.
#[derive(Debug, Clone, Copy)]
pub struct Load {
    /// Bytes of each batch (rounded up to 4096 for the writes).
    pub write_size: usize,
    /// Closed-loop producers, one batch in flight each.
    pub producers: u32,
    /// How long each chain is measured, after a warm-up.
    pub time: Duration,
    /// A chain's span ends early once its nodes wrote this many bytes (at least one batch
    /// acknowledged).
    pub bytes_max: u64,
}

/// One node alone, then (with more than one replica) the chain of `replicas` nodes, each
/// under `load`. The files live in `dir` and are removed after each chain; every socket is
/// under `congestion` when given.
pub fn chain_load(
    dir: &Path,
    load: Load,
    replicas: u32,
    congestion: Option<&CongestionControl>,
) -> std::io::Result<ChainLoad> {
    let single = run_chain(dir, load, 1, congestion)?;
    // With one replica the chain is that node: measured once.
    let chain = if replicas > 1 {
        run_chain(dir, load, replicas, congestion)?
    } else {
        single.clone()
    };
    Ok(ChainLoad {
        replicas: replicas.max(1),
        producers: load.producers.max(1),
        write_size: write_len(load.write_size),
        chain_batches_s: chain.batches_s,
        single_batches_s: single.batches_s,
        ratio: chain.batches_s / single.batches_s,
        measured_s: chain
            .measured
            .as_secs_f64()
            .min(single.measured.as_secs_f64()),
    })
}

/// One chain of `replicas` nodes under `load` (see [`chain_load`]).
pub fn run_chain(
    dir: &Path,
    load: Load,
    replicas: u32,
    congestion: Option<&CongestionControl>,
) -> std::io::Result<ChainRun> {
    let Load {
        write_size,
        producers,
        time,
        bytes_max,
    } = load;
    let nodes = replicas.max(1) as usize;
    let producers = producers.max(1) as usize;
    let quorum = nodes / 2 + 1;
    let size = write_len(write_size);
    std::fs::create_dir_all(dir)?;
    let mut paths: Vec<PathBuf> = Vec::new();
    let result = (|| {
        let mut wals = Vec::with_capacity(nodes);
        for node in 0..nodes {
            let path = dir.join(format!(".strand-bench-load-wal-{node}"));
            paths.push(path.clone());
            wals.push(Wal::create(&path)?);
        }
        // Every hop of every producer's chain, connected before any thread starts.
        let mut hops = Vec::with_capacity(producers * nodes);
        let mut fronts = Vec::with_capacity(producers);
        for producer in 0..producers {
            let (front, mut input) = pair(congestion)?;
            fronts.push(front);
            for node in 0..nodes {
                let path = segment_path(dir, node, producer);
                paths.push(path.clone());
                let (next, following) = if node + 1 < nodes {
                    let (to_next, next_input) = pair(congestion)?;
                    (Some(to_next), Some(next_input))
                } else {
                    (None, None)
                };
                hops.push(Hop {
                    node,
                    quorum,
                    input,
                    next,
                    segment: open_synced(&path)?,
                    appended: 0,
                    reserved: 0,
                });
                match following {
                    Some(following) => input = following,
                    None => break,
                }
            }
        }
        let acked = AtomicU64::new(0);
        let stop = AtomicBool::new(false);
        let span = std::thread::scope(|scope| {
            let mut handles = Vec::new();
            for hop in hops {
                let wal = &wals[hop.node];
                handles.push(scope.spawn(move || hop.run(size, wal)));
            }
            for front in fronts {
                let (acked, stop) = (&acked, &stop);
                handles.push(scope.spawn(move || produce(front, size, acked, stop)));
            }
            std::thread::sleep(WARMUP);
            let (from, started) = (acked.load(Ordering::Relaxed), Instant::now());
            let per_batch = (size * nodes) as u64;
            while started.elapsed() < time
                && acked.load(Ordering::Relaxed).saturating_sub(from) * per_batch < bytes_max
                && !handles.iter().any(|h| h.is_finished())
            {
                std::thread::sleep(Duration::from_millis(5));
            }
            let (to, measured) = (acked.load(Ordering::Relaxed), started.elapsed());
            stop.store(true, Ordering::Relaxed);
            let mut failure = None;
            for handle in handles {
                match handle.join() {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => {
                        failure.get_or_insert(e);
                    }
                    Err(_) => {
                        failure.get_or_insert(std::io::Error::other("a chain thread panicked"));
                    }
                }
            }
            if let Some(e) = failure {
                return Err(e);
            }
            if to == from {
                return Err(std::io::Error::other(
                    "the chain load probe acknowledged no batch",
                ));
            }
            Ok((to - from, measured))
        })?;
        // What each node's segments hold, from the files themselves.
        let mut appended = vec![0u64; nodes];
        for (node, held) in appended.iter_mut().enumerate() {
            for producer in 0..producers {
                *held += std::fs::metadata(segment_path(dir, node, producer))?.len();
            }
        }
        Ok(ChainRun {
            batches_s: span.0 as f64 / span.1.as_secs_f64(),
            acked: acked.into_inner(),
            appended,
            measured: span.1,
        })
    })();
    for path in paths {
        let _ = std::fs::remove_file(path);
    }
    result
}

/// Bytes of each write for batches of `write_size`: a whole number of direct-I/O blocks.
fn write_len(write_size: usize) -> usize {
    write_size.max(1).div_ceil(ALIGN) * ALIGN
}

/// Where `node` keeps the segment of `producer`'s chain.
fn segment_path(dir: &Path, node: usize, producer: usize) -> PathBuf {
    dir.join(format!(".strand-bench-load-{node}-{producer}"))
}

/// A loopback connection, both ends without Nagle's delay: (the connecting end, the accepted
/// end).
fn pair(congestion: Option<&CongestionControl>) -> std::io::Result<(TcpStream, TcpStream)> {
    let listener = std_listener(LOCALHOST_ANY_PORT, congestion)?;
    let near = std_connect(listener.local_addr()?, CONNECT_TIMEOUT, congestion)?;
    let (far, _) = listener.accept()?;
    near.set_nodelay(true)?;
    far.set_nodelay(true)?;
    Ok((near, far))
}

/// A new file at `path` whose writes return once durable: `O_DSYNC`, with `O_DIRECT` where
/// the file system takes it (tmpfs refuses it).
fn open_synced(path: &Path) -> std::io::Result<File> {
    create_probe_file_with(path, libc::O_DSYNC).map(|(file, _)| file)
}

/// A node's WAL: 4 KiB records round a file written and synced before the chain starts.
struct Wal {
    file: File,
    at: AtomicU64,
}

impl Wal {
    fn create(path: &Path) -> std::io::Result<Wal> {
        let file = open_synced(path)?;
        let zeros = AlignedBuf::zeroed(1 << 20);
        for at in (0..WAL_RING).step_by(1 << 20) {
            file.write_all_at(zeros.as_slice(), at)?;
        }
        file.sync_all()?;
        Ok(Wal {
            file,
            at: AtomicU64::new(0),
        })
    }

    fn record(&self, buf: &[u8]) -> std::io::Result<()> {
        let at = self.at.fetch_add(WAL_RECORD as u64, Ordering::Relaxed) % WAL_RING;
        self.file.write_all_at(buf, at)
    }
}

/// One node's part of one producer's chain.
struct Hop {
    node: usize,
    quorum: usize,
    /// From the producer (node 0) or the node before; acknowledgements go back on it.
    input: TcpStream,
    /// To the next node, whose acknowledgement comes back on it.
    next: Option<TcpStream>,
    segment: File,
    appended: u64,
    reserved: u64,
}

impl Hop {
    /// Until its input ends: each batch passed on, appended beside a WAL record, and
    /// acknowledged if this node is in the first quorum.
    fn run(mut self, size: usize, wal: &Wal) -> std::io::Result<()> {
        let mut batch = AlignedBuf::zeroed(size);
        let buf = batch.as_mut_slice();
        let mut record = AlignedBuf::zeroed(WAL_RECORD);
        for (i, b) in record.as_mut_slice().iter_mut().enumerate() {
            *b = (i % 7) as u8;
        }
        let record = record.as_slice();
        let mut ack = [0u8; ACK.len()];
        std::thread::scope(|scope| {
            // The WAL record is written by a thread of its own, beside the segment append.
            let (go, asked) = mpsc::sync_channel::<()>(0);
            let (told, done) = mpsc::sync_channel::<std::io::Result<()>>(0);
            scope.spawn(move || {
                while asked.recv().is_ok() {
                    if told.send(wal.record(record)).is_err() {
                        break;
                    }
                }
            });
            loop {
                match self.input.read_exact(buf) {
                    Ok(()) => {}
                    Err(e) if e.kind() == ErrorKind::UnexpectedEof => return Ok(()),
                    Err(e) => return Err(e),
                }
                if let Some(next) = &mut self.next {
                    next.write_all(buf)?;
                }
                go.send(())
                    .map_err(|_| std::io::Error::other("the WAL thread ended"))?;
                let appending = self.append(buf);
                let recorded = done
                    .recv()
                    .map_err(|_| std::io::Error::other("the WAL thread ended"))?;
                appending?;
                recorded?;
                if self.node + 1 < self.quorum
                    && let Some(next) = &mut self.next
                {
                    next.read_exact(&mut ack)?;
                }
                if self.node < self.quorum {
                    self.input.write_all(&ACK)?;
                }
            }
        })
    }

    /// Appends `buf` at the segment's end, its blocks reserved ahead first as a node's
    /// segment flush reserves them.
    fn append(&mut self, buf: &[u8]) -> std::io::Result<()> {
        let end = self.appended + buf.len() as u64;
        // Its segments never fill: no size bounds the reservation.
        if let Some(to) = journal::segment::reservation_due(self.reserved, end, u64::MAX) {
            self.reserved = to;
            // SAFETY: `fallocate` reads no memory of ours; the descriptor is the segment's,
            // open for as long as `self.segment` lives. A failure leaves the appends to
            // allocate, as a node's does.
            let reserved = unsafe {
                libc::fallocate(
                    self.segment.as_raw_fd(),
                    libc::FALLOC_FL_KEEP_SIZE,
                    0,
                    self.reserved as libc::off_t,
                )
            };
            if reserved != 0 {
                self.reserved = u64::MAX;
            }
        }
        self.segment.write_all_at(buf, self.appended)?;
        self.appended = end;
        Ok(())
    }
}

/// A producer: one batch at a time, each acknowledged before the next, until `stop`.
fn produce(
    mut stream: TcpStream,
    size: usize,
    acked: &AtomicU64,
    stop: &AtomicBool,
) -> std::io::Result<()> {
    let batch = vec![0x5au8; size];
    let mut ack = [0u8; ACK.len()];
    while !stop.load(Ordering::Relaxed) {
        stream.write_all(&batch)?;
        stream.read_exact(&mut ack)?;
        if ack != ACK {
            return Err(std::io::Error::other("the chain answered something else"));
        }
        acked.fetch_add(1, Ordering::Relaxed);
    }
    Ok(())
}
