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
//! trimming below 2 GiB of free top. [`prefault`] then touches `system.memory_prefault_bytes`
//! and frees it, so the caches later grow into pages the process already has.

use std::time::{Duration, Instant};

/// The largest block glibc serves from an arena when told to (its mmap threshold's maximum on
/// 64-bit targets): every batch-sized block is far below it.
pub const ARENA_BLOCK_BYTES_MAX: i32 = 32 << 20;

/// The free top of the heap that glibc gives back to the kernel above this (the largest value
/// `mallopt` takes): never while a node's caches are within their default budgets.
pub const TRIM_BYTES_MIN: i32 = i32::MAX;

/// The block [`prefault`] allocates and touches at a time.
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

/// What [`prefault`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Prefaulted {
    /// Bytes allocated, touched and freed.
    pub bytes: u64,
    /// How long it took.
    pub took: Duration,
}

/// Allocates `bytes` (rounded up to [`PREFAULT_BLOCK_BYTES`]) in blocks, writes one byte per
/// page so the kernel backs every page, and frees them all: after [`keep_freed_memory`] the
/// process keeps those pages, and the blocks it allocates next take them without a fault.
pub fn prefault(bytes: u64) -> Prefaulted {
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
    }
    drop(blocks);
    Prefaulted {
        bytes: (count * PREFAULT_BLOCK_BYTES) as u64,
        took: started.elapsed(),
    }
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

    /// Set in the child process [`blocks_after_a_prefault_take_pages_the_process_has`] runs in.
    const ALONE: &str = "STRAND_TEST_PREFAULT_ALONE";

    /// The policy and the prefault together: after 48 MiB prefaulted, 32 MiB of 1 MiB blocks
    /// come from pages the process already has. With glibc's defaults the prefault's blocks
    /// are given back as they are freed (the trim, or a map per block), and every page of the
    /// next blocks faults again.
    ///
    /// It runs again in a process of its own, alone and on the main thread, as `strand start`
    /// would: the policy is the whole process's, and another test's blocks in the same arena
    /// could take the prefaulted pages first.
    #[test]
    fn blocks_after_a_prefault_take_pages_the_process_has() {
        let name = "memory::tests::blocks_after_a_prefault_take_pages_the_process_has";
        if std::env::var_os(ALONE).is_none() {
            let exe = std::env::current_exe().expect("the test binary");
            let output = std::process::Command::new(exe)
                .args(["--exact", name, "--test-threads=1"])
                .env(ALONE, "1")
                .output()
                .expect("the test binary runs");
            let stdout = String::from_utf8_lossy(&output.stdout);
            assert!(
                output.status.success() && stdout.contains("1 passed"),
                "the test alone: {}\n{stdout}{}",
                output.status,
                String::from_utf8_lossy(&output.stderr)
            );
            return;
        }
        keep_freed_memory().expect("glibc on the development machine");
        let done = prefault(48 << 20);
        assert_eq!(done.bytes, 48 << 20);
        let before = minor_faults_of_this_thread().expect("/proc/thread-self/stat");
        let mut blocks = Vec::new();
        for _ in 0..32 {
            let mut block: Vec<u8> = Vec::with_capacity(PREFAULT_BLOCK_BYTES);
            block.resize(PREFAULT_BLOCK_BYTES, 7);
            blocks.push(std::hint::black_box(block));
        }
        let faults = minor_faults_of_this_thread().expect("/proc/thread-self/stat") - before;
        let pages = 32 * PREFAULT_BLOCK_BYTES / PAGE;
        drop(blocks);
        assert!(
            faults < (pages / 10) as u64,
            "{faults} faults for {pages} pages that the prefault had backed"
        );
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
        assert_eq!(prefault(0).bytes, 0);
    }
}
