//! The shard runtime: one glommio `LocalExecutor` per shard, each on its own thread, pinned to
//! one core (`--cores`) or unpinned (`--shards N`), with `io_memory` and the ring depth set
//! explicitly (DESIGN.md §3, architecture.md §1, §12).
//!
//! Glommio registers each executor's `io_memory` pool with its three io_uring rings and, when
//! that fails (the locked-memory limit), logs a warning and goes on with unregistered buffers.
//! The limit alone does not predict it (root with `CAP_IPC_LOCK` registers beyond
//! `RLIMIT_MEMLOCK`, and the limit counts per user across processes), so each shard asks its
//! own executor after it is built ([`BufferRegistration`]), logs the answer and keeps it in
//! [`RuntimeStats`] for the metrics endpoint.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use glommio::{LocalExecutorBuilder, Placement};
use thiserror::Error;
use tracing::{error, info, warn};

use crate::cores::{CoreList, thread_allowed_cpus};
use crate::mesh::{self, Mesh, MeshCapacity, MeshCounters, ShardId};

/// glommio refuses to build an executor below this `RLIMIT_MEMLOCK` (its own floor).
pub const GLOMMIO_MEMLOCK_FLOOR: u64 = 512 * 1024;
/// io_uring rings per glommio executor that register the `io_memory` pool (main, poll,
/// latency): registration needs `3 x io_memory` of locked memory per shard.
pub const RINGS_PER_EXECUTOR: u64 = 3;

/// How many shards and where they run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sharding {
    /// One shard per listed core, shard `i` pinned to the `i`-th core (`--cores`).
    Pinned(CoreList),
    /// `N` shards the kernel may schedule anywhere (`--shards N`).
    Unpinned(usize),
}

impl Sharding {
    /// Shard count.
    pub fn shards(&self) -> usize {
        match self {
            Sharding::Pinned(cores) => cores.len(),
            Sharding::Unpinned(n) => *n,
        }
    }
}

/// What the runtime needs to start.
#[derive(Debug, Clone)]
pub struct RuntimeConfig {
    /// Shards and placement.
    pub sharding: Sharding,
    /// Bytes of each executor's registered DMA buffer pool (glommio rounds up to 4 KiB, at
    /// least 64 KiB).
    pub io_memory: usize,
    /// Submission queue depth of each io_uring ring.
    pub ring_depth: usize,
    /// Mesh ring capacities per lane.
    pub mesh: MeshCapacity,
    /// How often a shard looks at the stop flag (`system.sharding.shutdown_poll_interval`).
    pub stop_poll_interval: Duration,
}

/// Whether an executor's DMA buffer pool is registered with its io_uring rings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BufferRegistration {
    /// Not probed yet.
    Unknown = 0,
    /// Registered: DMA IO from the pool uses `READ_FIXED` / `WRITE_FIXED`.
    Registered = 1,
    /// Registration failed; DMA IO uses plain reads and writes (slower, still correct).
    Unregistered = 2,
    /// The probe could not tell (a glommio whose buffers describe themselves differently, or a
    /// probe buffer that did not come from the pool).
    Undetermined = 3,
}

impl BufferRegistration {
    fn from_u8(v: u8) -> BufferRegistration {
        match v {
            1 => BufferRegistration::Registered,
            2 => BufferRegistration::Unregistered,
            3 => BufferRegistration::Undetermined,
            _ => BufferRegistration::Unknown,
        }
    }

    /// Name for logs.
    pub fn name(self) -> &'static str {
        match self {
            BufferRegistration::Unknown => "unknown",
            BufferRegistration::Registered => "registered",
            BufferRegistration::Unregistered => "unregistered",
            BufferRegistration::Undetermined => "undetermined",
        }
    }

    /// Asks the calling executor. Glommio keeps the registered buffer index of its pool private
    /// but prints it in the `Debug` form of a pool buffer (`uring_buffer_id: Some(..)` once all
    /// three rings registered the pool, `None` after a failure); a fresh executor's first small
    /// allocation always comes from the pool. Pinned to glommio 0.9 by a test that drops
    /// `CAP_IPC_LOCK` and lowers the limit (`tests/registration.rs`).
    pub fn probe() -> BufferRegistration {
        let buffer = glommio::allocate_dma_buffer(4096);
        let described = format!("{buffer:?}");
        if !described.contains("Uring(") {
            BufferRegistration::Undetermined
        } else if described.contains("uring_buffer_id: Some(") {
            BufferRegistration::Registered
        } else if described.contains("uring_buffer_id: None") {
            BufferRegistration::Unregistered
        } else {
            BufferRegistration::Undetermined
        }
    }
}

/// Per-shard facts any thread can read (the metrics endpoint, logs).
#[derive(Debug)]
pub struct RuntimeStats {
    registration: Box<[AtomicU8]>,
    cores: Box<[Option<usize>]>,
}

impl RuntimeStats {
    fn new(sharding: &Sharding) -> RuntimeStats {
        let cores = match sharding {
            Sharding::Pinned(list) => list.ids().iter().map(|&c| Some(c)).collect(),
            Sharding::Unpinned(n) => vec![None; *n].into_boxed_slice(),
        };
        RuntimeStats {
            registration: (0..sharding.shards()).map(|_| AtomicU8::new(0)).collect(),
            cores,
        }
    }

    /// Shard count.
    pub fn shards(&self) -> usize {
        self.registration.len()
    }

    /// Whether `shard`'s buffers are registered (a gauge: 1 registered, 0 not).
    pub fn registration(&self, shard: ShardId) -> BufferRegistration {
        BufferRegistration::from_u8(self.registration[usize::from(shard)].load(Ordering::Acquire))
    }

    /// The core `shard` is pinned to, if pinned.
    pub fn core(&self, shard: ShardId) -> Option<usize> {
        self.cores[usize::from(shard)]
    }
}

/// A flag every shard watches; set once to stop the node.
#[derive(Debug, Clone)]
pub struct StopSignal {
    flag: Arc<AtomicBool>,
    poll: Duration,
}

impl StopSignal {
    /// Whether stop was requested.
    pub fn is_set(&self) -> bool {
        self.flag.load(Ordering::Acquire)
    }

    /// Requests stop (any thread).
    pub fn set(&self) {
        self.flag.store(true, Ordering::Release);
    }

    /// Resolves once stop was requested; looks every poll interval (on a glommio executor).
    pub async fn wait(&self) {
        while !self.is_set() {
            glommio::timer::sleep(self.poll).await;
        }
    }
}

/// What a shard's body gets.
pub struct ShardContext<T: Send + 'static> {
    /// This shard.
    pub id: ShardId,
    /// Shards on the node.
    pub shards: usize,
    /// The core it is pinned to, if pinned.
    pub core: Option<usize>,
    /// What the probe found for this executor.
    pub registration: BufferRegistration,
    /// Its connected ends of the shard mesh.
    pub mesh: Mesh<T>,
    /// The node's stop flag.
    pub stop: StopSignal,
}

impl<T: Send + 'static> std::fmt::Debug for ShardContext<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardContext")
            .field("id", &self.id)
            .field("core", &self.core)
            .field("registration", &self.registration)
            .finish_non_exhaustive()
    }
}

/// Why the runtime did not start or stop cleanly.
#[derive(Debug, Error)]
pub enum RuntimeError {
    /// No shards asked for.
    #[error("no shards: a node needs at least one")]
    NoShards,
    /// A pinned core this process may not run on.
    #[error("core {core} is not available to this process (allowed: {allowed})")]
    CoreUnavailable {
        /// The core asked for.
        core: usize,
        /// What `sched_getaffinity` allows.
        allowed: String,
    },
    /// Reading the allowed CPUs failed.
    #[error("reading the allowed CPUs: {0}")]
    Affinity(std::io::Error),
    /// The OS refused a thread.
    #[error("starting shard {shard}'s thread: {source}")]
    Thread {
        /// Which shard.
        shard: ShardId,
        /// The OS error.
        source: std::io::Error,
    },
    /// glommio could not build the executor (memlock floor, io_uring setup, placement).
    #[error("building shard {shard}'s executor: {message}")]
    Executor {
        /// Which shard.
        shard: ShardId,
        /// glommio's error, printed.
        message: String,
    },
    /// A shard thread panicked.
    #[error("shard {0} panicked")]
    Panicked(ShardId),
    /// Shards still running after the join timeout.
    #[error("shards {0:?} did not stop within the join timeout")]
    Wedged(Vec<ShardId>),
}

/// A running set of shards.
#[derive(Debug)]
pub struct Runtime<R> {
    threads: Vec<JoinHandle<Option<R>>>,
    stop: StopSignal,
    stats: Arc<RuntimeStats>,
    counters: Arc<MeshCounters>,
}

enum Startup {
    Built(BufferRegistration),
    Failed(String),
}

/// The `RLIMIT_MEMLOCK` `(soft, hard)` limits in bytes, `u64::MAX` meaning unlimited.
pub fn memlock_limit() -> std::io::Result<(u64, u64)> {
    let limit = get_memlock()?;
    Ok((rlim_bytes(limit.rlim_cur), rlim_bytes(limit.rlim_max)))
}

/// Raises the soft `RLIMIT_MEMLOCK` to the hard limit (a process may always do that) and returns
/// `(soft, hard)` after the attempt, `u64::MAX` meaning unlimited.
pub fn raise_memlock_limit() -> std::io::Result<(u64, u64)> {
    let limit = get_memlock()?;
    if limit.rlim_cur < limit.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: limit.rlim_max,
            rlim_max: limit.rlim_max,
        };
        // SAFETY: setrlimit reads one plain `rlimit` struct we own. A refusal leaves the old
        // limit, which memlock_limit reports.
        unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &raised) };
    }
    memlock_limit()
}

fn get_memlock() -> std::io::Result<libc::rlimit> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one plain `rlimit` struct we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut limit) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(limit)
}

fn rlim_bytes(v: libc::rlim_t) -> u64 {
    if v == libc::RLIM_INFINITY {
        u64::MAX
    } else {
        v
    }
}

impl<R: Send + 'static> Runtime<R> {
    /// Starts one executor thread per shard and runs `body` on each. Returns once every
    /// executor is built and has probed its buffer registration; if any shard fails to build,
    /// none runs its body and the first error is returned.
    pub fn start<T, F, Fut>(config: &RuntimeConfig, body: F) -> Result<Runtime<R>, RuntimeError>
    where
        T: Send + 'static,
        F: Fn(ShardContext<T>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = R> + 'static,
    {
        let shards = config.sharding.shards();
        if shards == 0 {
            return Err(RuntimeError::NoShards);
        }
        if let Sharding::Pinned(cores) = &config.sharding {
            let allowed = thread_allowed_cpus().map_err(RuntimeError::Affinity)?;
            if let Some(&core) = cores.ids().iter().find(|c| !allowed.contains(c)) {
                let allowed = CoreList::from_ids(allowed)
                    .map(|l| l.to_string())
                    .unwrap_or_default();
                return Err(RuntimeError::CoreUnavailable { core, allowed });
            }
        }
        let stats = Arc::new(RuntimeStats::new(&config.sharding));
        let stop = StopSignal {
            flag: Arc::new(AtomicBool::new(false)),
            poll: config.stop_poll_interval,
        };
        let (ports, counters) = mesh::build::<T>(shards, config.mesh);
        let body = Arc::new(body);
        let (ready_tx, ready_rx) = mpsc::channel::<(ShardId, Startup)>();
        let mut go = Vec::with_capacity(shards);
        let mut threads = Vec::with_capacity(shards);
        for port in ports {
            let id = port.id();
            let core = stats.core(id);
            let placement = core.map_or(Placement::Unbound, Placement::Fixed);
            let builder = LocalExecutorBuilder::new(placement)
                .name(&format!("strand-shard-{id}"))
                .io_memory(config.io_memory)
                .ring_depth(config.ring_depth);
            let (go_tx, go_rx) = mpsc::channel::<bool>();
            go.push(go_tx);
            let (ready_tx, body, stats, stop) = (
                ready_tx.clone(),
                Arc::clone(&body),
                Arc::clone(&stats),
                stop.clone(),
            );
            let thread = std::thread::Builder::new()
                .name(format!("strand-shard-{id}"))
                .spawn(move || {
                    let executor = match builder.make() {
                        Ok(executor) => executor,
                        Err(e) => {
                            let mut message = e.to_string();
                            if message.contains("MemLockLimit") {
                                message.push_str(
                                    " (RLIMIT_MEMLOCK is below glommio's 512 KiB floor: raise \
                                     `ulimit -l`)",
                                );
                            }
                            let _ = ready_tx.send((id, Startup::Failed(message)));
                            return None;
                        }
                    };
                    executor.run(async move {
                        let registration = BufferRegistration::probe();
                        stats.registration[usize::from(id)]
                            .store(registration as u8, Ordering::Release);
                        let _ = ready_tx.send((id, Startup::Built(registration)));
                        drop(ready_tx);
                        // Nothing else runs on this executor yet, so waiting here blocks no task.
                        if !go_rx.recv().unwrap_or(false) {
                            return None;
                        }
                        let mesh = port.connect().await;
                        let context = ShardContext {
                            id,
                            shards: stats.shards(),
                            core,
                            registration,
                            mesh,
                            stop,
                        };
                        Some(body(context).await)
                    })
                })
                .map_err(|source| RuntimeError::Thread { shard: id, source });
            match thread {
                Ok(thread) => threads.push(thread),
                Err(e) => {
                    abort(go, threads);
                    return Err(e);
                }
            }
        }
        drop(ready_tx);
        let mut failure = None;
        for _ in 0..shards {
            match ready_rx.recv() {
                Ok((id, Startup::Built(registration))) => {
                    log_registration(id, stats.core(id), registration, config);
                }
                Ok((shard, Startup::Failed(message))) => {
                    error!(shard, %message, "shard executor failed to build");
                    failure.get_or_insert(RuntimeError::Executor { shard, message });
                }
                Err(_) => {
                    failure.get_or_insert(RuntimeError::Executor {
                        shard: u16::MAX,
                        message: "a shard thread ended before reporting".into(),
                    });
                    break;
                }
            }
        }
        if let Some(failure) = failure {
            abort(go, threads);
            return Err(failure);
        }
        for tx in go {
            let _ = tx.send(true);
        }
        Ok(Runtime {
            threads,
            stop,
            stats,
            counters,
        })
    }

    /// The node's stop flag.
    pub fn stop_signal(&self) -> StopSignal {
        self.stop.clone()
    }

    /// Per-shard facts (registration, cores).
    pub fn stats(&self) -> &Arc<RuntimeStats> {
        &self.stats
    }

    /// The mesh counters.
    pub fn mesh_counters(&self) -> &Arc<MeshCounters> {
        &self.counters
    }

    /// Sets the stop flag and waits up to `timeout` for every shard's body to return; their
    /// results in shard order.
    pub fn stop_and_join(self, timeout: Duration) -> Result<Vec<R>, RuntimeError> {
        self.stop.set();
        self.join(timeout)
    }

    /// Waits up to `timeout` for every shard's body to return.
    pub fn join(self, timeout: Duration) -> Result<Vec<R>, RuntimeError> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline && !self.threads.iter().all(|t| t.is_finished()) {
            std::thread::sleep(Duration::from_millis(5));
        }
        let wedged: Vec<ShardId> = (0..self.threads.len())
            .filter(|&i| !self.threads[i].is_finished())
            .map(|i| i as ShardId)
            .collect();
        if !wedged.is_empty() {
            return Err(RuntimeError::Wedged(wedged));
        }
        let mut results = Vec::with_capacity(self.threads.len());
        for (i, thread) in self.threads.into_iter().enumerate() {
            match thread.join() {
                Ok(Some(result)) => results.push(result),
                Ok(None) | Err(_) => return Err(RuntimeError::Panicked(i as ShardId)),
            }
        }
        Ok(results)
    }
}

fn abort<R>(go: Vec<mpsc::Sender<bool>>, threads: Vec<JoinHandle<Option<R>>>) {
    for tx in go {
        let _ = tx.send(false);
    }
    for thread in threads {
        let _ = thread.join();
    }
}

fn log_registration(
    shard: ShardId,
    core: Option<usize>,
    registration: BufferRegistration,
    config: &RuntimeConfig,
) {
    let core = core.map_or_else(|| "unpinned".to_string(), |c| c.to_string());
    let (io_memory, ring_depth) = (config.io_memory, config.ring_depth);
    match registration {
        BufferRegistration::Registered => info!(
            shard,
            %core,
            io_memory,
            ring_depth,
            buffers = registration.name(),
            "shard executor up"
        ),
        _ => {
            let (soft, hard) = memlock_limit().unwrap_or((0, 0));
            warn!(
                shard,
                %core,
                io_memory,
                ring_depth,
                buffers = registration.name(),
                memlock_soft = soft,
                memlock_hard = hard,
                needed = config.io_memory as u64 * RINGS_PER_EXECUTOR,
                "shard executor up without registered io buffers: DMA IO falls back to \
                 unregistered buffers (raise `ulimit -l`, grant CAP_IPC_LOCK, or lower io_memory)"
            )
        }
    }
}
