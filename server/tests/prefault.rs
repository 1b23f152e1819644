//! Decision 513: a node's prefault runs on a thread of its own while its shards allocate on
//! theirs, so the pages it touched must serve the other threads. That holds only when every
//! thread shares the one arena [`server::memory::keep_freed_memory`] asks for, which it can
//! only ask for before any thread exists, as `strand start` does first thing. So this test has
//! a `main` of its own (`harness = false`): libtest would have started threads before it.

use std::sync::Arc;

use server::memory::{
    PREFAULT_BLOCK_BYTES, Prefault, keep_freed_memory, minor_faults_of_this_thread,
    prefault_in_background,
};

const PAGE: usize = 4096;

fn main() {
    keep_freed_memory().expect("glibc on the development machine");
    let progress = Arc::new(Prefault::default());
    let (tx, rx) = std::sync::mpsc::channel();
    let thread = prefault_in_background(48 << 20, progress.clone(), move |done| {
        tx.send(done).expect("main waits")
    })
    .expect("a thread");
    thread.join().expect("the prefault's thread");
    let done = rx.recv().expect("the prefault reported");
    assert_eq!(done.bytes, 48 << 20);
    assert_eq!(progress.pending_bytes(), 0);
    // The main thread's blocks, as a shard's would be: pages the prefault's thread backed.
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
        "{faults} faults for {pages} pages that the prefault's thread had backed"
    );
    println!(
        "prefault: {faults} faults for {pages} pages after a 48 MiB prefault on another thread"
    );
    // In libtest's words, so `.ci/run`'s count of passed tests includes this one.
    println!("test result: ok. 1 passed; 0 failed (harness = false)");
}
