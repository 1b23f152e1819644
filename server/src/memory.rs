//! How a node gets its memory (decision 512): its allocator keeps what the node frees, and the
//! node faults in, once at boot, the memory its caches will hold.
//!
//! A node under load allocates and frees batch-sized blocks all the time: received frames, the
//! prepares built from requests, segment write buffers, the read cache's tails (up to
//! `partition.read_cache_bytes` each). With glibc's defaults such blocks are mapped and
//! unmapped one by one, a thread's arena unmaps a heap that empties, and a free top is trimmed,
//! so the node keeps taking fresh pages from the kernel, a fault per 4 KiB, while its caches
//! grow and after. On the development machine (a VM) the nodes spent the first 5-25 s of a run
//! growing and moved a third of their later rate meanwhile (decision 511's figures).
//!
//! [`keep_freed_memory`] runs first in `strand start`, before any thread exists: one arena for
//! the process (the main heap, which glibc never unmaps), blocks up to 32 MiB from it, and no
//! trimming below 2 GiB of free top. [`prefault_in_background`] then touches
//! `system.memory_prefault_bytes` and frees it, so the caches later grow into pages the process
//! already has. It runs on a thread of its own (decision 513): the node serves while it runs,
//! and [`Prefault::pending_bytes`] (`strand_memory_prefault_pending_bytes`) says when it is
//! done.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The largest block glibc serves from an arena when told to (its mmap threshold's maximum on
/// 64-bit targets): every batch-sized block is far below it.
pub const ARENA_BLOCK_BYTES_MAX: i32 = 32 << 20;

/// The free top of the heap that glibc gives back to the kernel above this (the largest value
/// `mallopt` takes): never while a node's caches are within their default budgets.
pub const TRIM_BYTES_MIN: i32 = i32::MAX;

/// The block [`prefault_in_background`] allocates and touches at a time.
pub const PREFAULT_BLOCK_BYTES: usize = 1 << 20;

const PAGE: usize = 4096;

/// What [`keep_freed_memory`] could not set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AllocatorError {
    /// This build's C library has no `mallopt` (not glibc).
    #[error("the C library is not glibc: the allocator keeps its own defaults")]
    Unsupported,
    /// glibc refused one setting.
    #[error("glibc refused mallopt({param}, {value})")]
    Refused {
        /// The `M_*` parameter.
        param: i32,
        /// The value refused.
        value: i32,
    },
}

/// Tells glibc's allocator to keep the memory the process frees for its next blocks (one
/// arena, blocks up to [`ARENA_BLOCK_BYTES_MAX`] from it, no trim below [`TRIM_BYTES_MIN`]).
/// Call it before any thread starts: a thread that allocated already has its arena.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn keep_freed_memory() -> Result<(), AllocatorError> {
    for (param, value) in [
        (libc::M_ARENA_MAX, 1),
        (libc::M_MMAP_THRESHOLD, ARENA_BLOCK_BYTES_MAX),
        (libc::M_TRIM_THRESHOLD, TRIM_BYTES_MIN),
    ] {
        // SAFETY: mallopt(3) takes two integers and changes only the allocator's tunables;
        // no memory is passed, and the values are within the ranges glibc documents.
        if unsafe { libc::mallopt(param, value) } != 1 {
            return Err(AllocatorError::Refused { param, value });
        }
    }
    Ok(())
}

/// Not glibc: nothing to set.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn keep_freed_memory() -> Result<(), AllocatorError> {
    Err(AllocatorError::Unsupported)
}

/// What [`prefault_in_background`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Prefaulted {
    /// Bytes allocated, touched and freed.
    pub bytes: u64,
    /// How long it took.
    pub took: Duration,
}

/// A prefault's progress, shared with `/metrics`: the bytes it has still to touch.
#[derive(Debug, Default)]
pub struct Prefault {
    pending: AtomicU64,
}

impl Prefault {
    /// Bytes not yet touched: 0 once the prefault is done (or when there is none).
    pub fn pending_bytes(&self) -> u64 {
        self.pending.load(Ordering::Relaxed)
    }

    /// Counts a prefault of `bytes`, rounded up to whole blocks, as pending.
    fn begin(&self, bytes: u64) {
        let rounded = bytes.div_ceil(PREFAULT_BLOCK_BYTES as u64) * PREFAULT_BLOCK_BYTES as u64;
        self.pending.store(rounded, Ordering::Relaxed);
    }
}

/// Allocates `bytes` (rounded up to [`PREFAULT_BLOCK_BYTES`]) in blocks, writes one byte per
/// page so the kernel backs every page, and frees them all: after [`keep_freed_memory`] the
/// process keeps those pages, and the blocks it allocates next take them without a fault.
/// Counts `progress` down block by block from what [`Prefault::begin`] set.
fn prefault(bytes: u64, progress: &Prefault) -> Prefaulted {
    let started = Instant::now();
    let count = bytes.div_ceil(PREFAULT_BLOCK_BYTES as u64) as usize;
    let mut blocks: Vec<Vec<u8>> = Vec::with_capacity(count);
    for _ in 0..count {
        // Zeroed by the allocator (fast in a debug build too); the writes below make sure
        // every page is backed even where the zeroing was skipped for fresh memory.
        let mut block = vec![0u8; PREFAULT_BLOCK_BYTES];
        for page in block.chunks_mut(PAGE) {
            page[0] = 1;
        }
        blocks.push(std::hint::black_box(block));
        // The last block's bytes stay pending until the blocks are freed: only then do they
        // serve the node's own allocations.
        if blocks.len() < count {
            progress
                .pending
                .fetch_sub(PREFAULT_BLOCK_BYTES as u64, Ordering::Relaxed);
        }
    }
    drop(blocks);
    progress.pending.store(0, Ordering::Relaxed);
    Prefaulted {
        bytes: (count * PREFAULT_BLOCK_BYTES) as u64,
        took: started.elapsed(),
    }
}

/// Starts faulting in `bytes` on a thread of its own (`strand-prefault`), which calls
/// `done` with what it did. `progress` counts `bytes` (rounded up to whole blocks) pending from
/// the moment this returns, so a reader never sees 0 before the thread ran. A node boots and
/// serves meanwhile: three nodes faulting 1 GiB at once took 9-11 s each on the development
/// machine, which the boot used to wait for (decision 513).
pub fn prefault_in_background(
    bytes: u64,
    progress: Arc<Prefault>,
    done: impl FnOnce(Prefaulted) + Send + 'static,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    progress.begin(bytes);
    let spawned = std::thread::Builder::new()
        .name("strand-prefault".into())
        .spawn({
            let progress = progress.clone();
            move || done(prefault(bytes, &progress))
        });
    if spawned.is_err() {
        progress.pending.store(0, Ordering::Relaxed);
    }
    spawned
}

/// `MemAvailable` of `/proc/meminfo`, in bytes: what the kernel could give without swapping.
pub fn available_bytes() -> Option<u64> {
    available_of_meminfo(&std::fs::read_to_string("/proc/meminfo").ok()?)
}

/// The `MemAvailable:` line of a `/proc/meminfo` text (kB), in bytes.
pub fn available_of_meminfo(meminfo: &str) -> Option<u64> {
    kb_field(meminfo, "MemAvailable:")
}

/// The `KEY  N kB` line of a `/proc` text (`/proc/meminfo`, `/proc/PID/status`), in bytes.
pub fn kb_field(text: &str, key: &str) -> Option<u64> {
    let kb: u64 = text.lines().find_map(|line| {
        line.strip_prefix(key)?
            .trim()
            .strip_suffix("kB")?
            .trim()
            .parse()
            .ok()
    })?;
    Some(kb * 1024)
}

/// How much of `wanted` a node prefaults when the machine has `available` bytes free: at most
/// half of it, so a small machine is never pushed to swap or to the OOM killer by a default.
pub fn prefault_budget(wanted: u64, available: Option<u64>) -> u64 {
    available.map_or(wanted, |free| wanted.min(free / 2))
}

/// `system.memory_prefault_bytes`'s default.
pub const PREFAULT_BYTES_DEFAULT: u64 = 1 << 30;
/// The least non-zero `system.memory_prefault_bytes`: one prefault block.
pub const PREFAULT_BYTES_MIN: u64 = PREFAULT_BLOCK_BYTES as u64;
/// The most `system.memory_prefault_bytes` takes.
pub const PREFAULT_BYTES_MAX: u64 = 1 << 40;

/// Whether `bytes` is a `system.memory_prefault_bytes` the node takes: 0 (none) or
/// [`PREFAULT_BYTES_MIN`]..=[`PREFAULT_BYTES_MAX`].
pub fn is_prefault_bytes(bytes: u64) -> bool {
    bytes == 0 || (PREFAULT_BYTES_MIN..=PREFAULT_BYTES_MAX).contains(&bytes)
}

/// The prefault each of `nodes` local nodes gets when one command starts them all (`strand
/// dev`, `strand bench --spawn`): the default, within half the available memory shared among
/// them (each node caps itself at half of what it sees, which does not know of its siblings),
/// in whole MiB; 0 below one MiB.
pub fn local_prefault_bytes(nodes: u8, available: Option<u64>) -> u64 {
    let share = available.map_or(PREFAULT_BYTES_DEFAULT, |free| {
        free / 2 / u64::from(nodes.max(1))
    });
    let mib = PREFAULT_BYTES_DEFAULT.min(share) >> 20;
    if mib == 0 { 0 } else { mib << 20 }
}

/// The calling thread's minor page faults so far (`/proc/thread-self/stat` field 10): other
/// threads' faults (a test run's other tests) do not count.
pub fn minor_faults_of_this_thread() -> Option<u64> {
    minor_faults_of_stat(&std::fs::read_to_string("/proc/thread-self/stat").ok()?)
}

/// Parses minflt (field 10) out of a `/proc/PID/stat` line.
pub fn minor_faults_of_stat(stat: &str) -> Option<u64> {
    stat_field(stat, 10)?.parse().ok()
}

/// Field `number` (as proc(5) counts them, from 1; 3 or more) of a `/proc/PID/stat` line. The
/// command name (field 2) may hold spaces and parentheses, so the fields are counted after its
/// last `)`.
pub fn stat_field(stat: &str, number: usize) -> Option<&str> {
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(number.checked_sub(3)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The prefault's progress reads its whole size (in blocks) from the moment it is started
    /// and 0 once it is done. Whether the pages it touched serve the node's other threads is
    /// `server/tests/prefault.rs`, in a process of its own.
    #[test]
    fn a_background_prefault_counts_down_to_zero() {
        let progress = Arc::new(Prefault::default());
        assert_eq!(progress.pending_bytes(), 0);
        // What the start counts, before the thread exists: whole blocks.
        progress.begin((3 << 20) - 5);
        assert_eq!(progress.pending_bytes(), 3 << 20);
        let (tx, rx) = std::sync::mpsc::channel();
        let thread = prefault_in_background((3 << 20) - 5, progress.clone(), move |done| {
            tx.send(done).expect("the test waits")
        })
        .expect("a thread");
        thread.join().expect("the prefault's thread");
        assert_eq!(rx.recv().expect("reported").bytes, 3 << 20);
        assert_eq!(progress.pending_bytes(), 0);
    }

    #[test]
    fn local_nodes_share_half_the_available_memory() {
        assert_eq!(
            local_prefault_bytes(3, Some(24 << 30)),
            PREFAULT_BYTES_DEFAULT
        );
        assert_eq!(local_prefault_bytes(3, None), PREFAULT_BYTES_DEFAULT);
        // 3 GiB free, 5 nodes: 3 GiB / 2 / 5 = 307.2 MiB, in whole MiB.
        assert_eq!(local_prefault_bytes(5, Some(3 << 30)), 307 << 20);
        assert_eq!(local_prefault_bytes(9, Some(8 << 20)), 0);
        assert_eq!(
            local_prefault_bytes(0, Some(4 << 30)),
            PREFAULT_BYTES_DEFAULT
        );
    }

    #[test]
    fn the_budget_is_at_most_half_the_available_memory() {
        let meminfo = "MemTotal:  24000000 kB\nMemFree:  1000 kB\nMemAvailable:  2048 kB\n";
        assert_eq!(available_of_meminfo(meminfo), Some(2048 * 1024));
        assert_eq!(available_of_meminfo("MemFree: 1 kB\n"), None);
        assert_eq!(prefault_budget(1 << 30, Some(4 << 30)), 1 << 30);
        assert_eq!(prefault_budget(1 << 30, Some(1 << 30)), 512 << 20);
        assert_eq!(prefault_budget(1 << 30, None), 1 << 30);
        assert_eq!(prefault_budget(0, Some(4 << 30)), 0);
        assert_eq!(prefault(0, &Prefault::default()).bytes, 0);
    }
}
