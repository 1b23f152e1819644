//! The allocator's handling of large blocks on the node (decision 271).
//!
//! Every SendMessages batch passes through a few buffers of about its size (the request frame,
//! the prepare, the WAL window's and the segment flush's DMA buffers). glibc serves blocks
//! above its mmap threshold with a fresh `mmap` and returns them with `munmap` on free, and
//! trims a heap's freed top back to the kernel: each megabyte batch then faults in and zeroes
//! new pages again (a quarter of the node's CPU in the profile of decision 271). Raising both
//! thresholds keeps freed large blocks in the heap for the next batch.

/// Blocks up to this size come from the heap, not from `mmap` (glibc's largest allowed value on
/// 64-bit targets: half its 64 MiB heap size).
pub const MMAP_THRESHOLD: i32 = 32 * 1024 * 1024;

/// Freed memory at a heap's top kept before it is trimmed back to the kernel.
pub const TRIM_THRESHOLD: i32 = 512 * 1024 * 1024;

/// Applies [`MMAP_THRESHOLD`] and [`TRIM_THRESHOLD`] unless `GLIBC_TUNABLES` names malloc
/// settings (an operator's choice wins). Call before the shards start. Returns whether both
/// were applied.
pub fn keep_large_blocks() -> bool {
    if std::env::var("GLIBC_TUNABLES").is_ok_and(|t| t.contains("glibc.malloc.")) {
        return false;
    }
    apply()
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn apply() -> bool {
    // SAFETY: mallopt(3) takes no pointers and only changes glibc's allocator parameters (under
    // the arena lock); it is called once at node start, before the shard threads exist.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
            && libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn apply() -> bool {
    false
}
