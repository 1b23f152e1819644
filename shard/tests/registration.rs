//! Whether glommio really registered each executor's buffer pool, checked against the kernel.
//!
//! One test in its own binary: it changes the process's `RLIMIT_MEMLOCK` and this thread's
//! capabilities, which would disturb executors other tests start in parallel. The kernel
//! accounts every io_uring buffer registration in the process's `VmPin` (also for a caller with
//! `CAP_IPC_LOCK`, which only skips the per-user limit), so the probe's answer can be checked
//! against what the kernel pinned.

use std::time::Duration;

use shard::runtime::{RINGS_PER_EXECUTOR, raise_memlock_limit};
use shard::{BufferRegistration, MeshCapacity, Runtime, RuntimeConfig, RuntimeError, Sharding};

const CAP_IPC_LOCK: u32 = 14;
const CAPABILITY_VERSION_3: u32 = 0x2008_0522;

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

fn capabilities() -> [CapData; 2] {
    let mut header = CapHeader {
        version: CAPABILITY_VERSION_3,
        pid: 0,
    };
    let mut data = [CapData {
        effective: 0,
        permitted: 0,
        inheritable: 0,
    }; 2];
    // SAFETY: capget with a version-3 header writes two `CapData` structs, which `data` holds.
    let rc = unsafe { libc::syscall(libc::SYS_capget, &mut header, data.as_mut_ptr()) };
    assert_eq!(rc, 0, "capget: {}", std::io::Error::last_os_error());
    data
}

/// Sets this thread's effective CAP_IPC_LOCK (threads it spawns inherit it).
fn set_ipc_lock(on: bool) {
    let mut data = capabilities();
    if on {
        data[0].effective |= 1 << CAP_IPC_LOCK;
    } else {
        data[0].effective &= !(1 << CAP_IPC_LOCK);
    }
    let mut header = CapHeader {
        version: CAPABILITY_VERSION_3,
        pid: 0,
    };
    // SAFETY: capset reads a version-3 header and two `CapData` structs.
    let rc = unsafe { libc::syscall(libc::SYS_capset, &mut header, data.as_ptr()) };
    assert_eq!(rc, 0, "capset: {}", std::io::Error::last_os_error());
}

fn has_ipc_lock() -> bool {
    capabilities()[0].effective & (1 << CAP_IPC_LOCK) != 0
}

fn set_memlock_soft(bytes: u64) {
    // SAFETY: one plain rlimit struct read and written.
    unsafe {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        assert_eq!(libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut limit), 0);
        limit.rlim_cur = bytes.min(limit.rlim_max);
        assert_eq!(libc::setrlimit(libc::RLIMIT_MEMLOCK, &limit), 0);
    }
}

fn vm_pin_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmPin:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .map(|v| v.trim().parse().unwrap())
        .expect("VmPin line");
    kib * 1024
}

const IO_MEMORY: usize = 1 << 20;

fn config() -> RuntimeConfig {
    RuntimeConfig {
        sharding: Sharding::Unpinned(1),
        io_memory: IO_MEMORY,
        ring_depth: 32,
        mesh: MeshCapacity { main: 4, reply: 4 },
        stop_poll_interval: Duration::from_millis(5),
    }
}

/// Starts one shard, reads `VmPin` while it runs, stops it; returns (probe, runtime stat, pinned).
fn one_shard() -> Result<(BufferRegistration, BufferRegistration, u64), RuntimeError> {
    // A stopped executor's pinned pool is released after its thread is joined, not always
    // before: wait until `VmPin` settles so the previous shard's pages are not counted.
    let mut before = vm_pin_bytes();
    for _ in 0..100 {
        std::thread::sleep(Duration::from_millis(50));
        let now = vm_pin_bytes();
        if now == before {
            break;
        }
        before = now;
    }
    let runtime = Runtime::<BufferRegistration>::start(
        &config(),
        |ctx: shard::ShardContext<()>| async move {
            ctx.stop.wait().await;
            ctx.registration
        },
    )?;
    let pinned = vm_pin_bytes().saturating_sub(before);
    let stat = runtime.stats().registration(0);
    let probe = runtime.stop_and_join(Duration::from_secs(30))?[0];
    Ok((probe, stat, pinned))
}

#[test]
fn the_probe_tells_registered_from_unregistered() {
    let (soft, _hard) = raise_memlock_limit().unwrap();
    let needed = IO_MEMORY as u64 * RINGS_PER_EXECUTOR;
    let root = has_ipc_lock();
    assert!(
        root || soft >= needed,
        "this test needs CAP_IPC_LOCK or `ulimit -l` >= {needed}"
    );

    // 1. With CAP_IPC_LOCK or a high enough limit: registered, and the kernel pinned the pool
    //    once per ring.
    let (probe, stat, pinned) = one_shard().unwrap();
    assert_eq!(probe, BufferRegistration::Registered);
    assert_eq!(stat, BufferRegistration::Registered);
    assert!(
        pinned >= needed,
        "VmPin grew by {pinned}, want at least {needed}"
    );

    // 2. Without CAP_IPC_LOCK and a limit that holds the pool once but not three times:
    //    glommio registers with the main ring, fails on the next, unregisters and goes on.
    set_ipc_lock(false);
    set_memlock_soft(IO_MEMORY as u64 + (64 << 10));
    let result = one_shard();
    // 3. Below glommio's floor the executor is not built at all, and the error says so.
    set_memlock_soft(256 << 10);
    let floor = one_shard();
    set_memlock_soft(u64::MAX);
    if root {
        set_ipc_lock(true);
    }
    let (probe, stat, pinned) = result.unwrap();
    assert_eq!(probe, BufferRegistration::Unregistered);
    assert_eq!(stat, BufferRegistration::Unregistered);
    assert_eq!(
        pinned, 0,
        "nothing stays pinned after a failed registration"
    );
    match floor {
        Err(RuntimeError::Executor { shard: 0, message }) => {
            assert!(message.contains("RLIMIT_MEMLOCK"), "{message}")
        }
        other => panic!("expected an executor error, got {other:?}"),
    }

    // 4. Restored: registered again.
    assert_eq!(one_shard().unwrap().0, BufferRegistration::Registered);
}
