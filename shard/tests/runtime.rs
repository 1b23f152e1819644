//! Shard executors on real threads: placement, the mesh between shards, drop counting.
//!
//! Glommio needs `RLIMIT_MEMLOCK` of at least 512 KiB; every test raises the soft limit to the
//! hard one first (`.ci/run` also runs `ulimit -l unlimited` where it may).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use shard::cores::thread_allowed_cpus;
use shard::runtime::{GLOMMIO_MEMLOCK_FLOOR, raise_memlock_limit};
use shard::{
    CoreList, DropReason, Lane, MeshCapacity, Runtime, RuntimeConfig, RuntimeError, Sharding,
};

const JOIN: Duration = Duration::from_secs(60);

fn config(sharding: Sharding, mesh: MeshCapacity) -> RuntimeConfig {
    let (soft, _) = raise_memlock_limit().expect("getrlimit");
    assert!(
        soft >= GLOMMIO_MEMLOCK_FLOOR,
        "RLIMIT_MEMLOCK {soft} is below glommio's floor {GLOMMIO_MEMLOCK_FLOOR}: run `ulimit -l unlimited`"
    );
    RuntimeConfig {
        sharding,
        io_memory: 256 * 1024,
        ring_depth: 64,
        mesh,
        stop_poll_interval: Duration::from_millis(5),
    }
}

const SMALL: MeshCapacity = MeshCapacity {
    main: 64,
    reply: 64,
};

/// The allowed CPUs of the calling thread as the kernel lists them in
/// `/proc/self/task/TID/status` (a second source beside `sched_getaffinity`).
fn proc_allowed_list() -> String {
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() };
    let status = std::fs::read_to_string(format!("/proc/self/task/{tid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .expect("Cpus_allowed_list line")
        .trim()
        .to_string()
}

fn pinned_shards_see_only_their_core(cores: CoreList) {
    let runtime = Runtime::<(Option<usize>, Vec<usize>, String)>::start(
        &config(Sharding::Pinned(cores.clone()), SMALL),
        |ctx: shard::ShardContext<()>| async move {
            (
                ctx.core,
                thread_allowed_cpus().unwrap(),
                proc_allowed_list(),
            )
        },
    )
    .unwrap();
    let seen = runtime.join(JOIN).unwrap();
    assert_eq!(seen.len(), cores.len());
    for (shard, (core, allowed, listed)) in seen.into_iter().enumerate() {
        let want = cores.ids()[shard];
        assert_eq!(core, Some(want), "shard {shard}");
        assert_eq!(allowed, [want], "shard {shard} sched_getaffinity");
        assert_eq!(listed, want.to_string(), "shard {shard} Cpus_allowed_list");
    }
}

#[test]
fn cores_pin_one_shard_per_listed_core() {
    let available = thread_allowed_cpus().unwrap();
    // Every available core (the default, and `--cores 0-N` on this machine).
    pinned_shards_see_only_their_core(CoreList::from_ids(available.clone()).unwrap());
    // The list's order decides: shard 0 on the last core.
    let reversed: Vec<usize> = available.iter().rev().copied().collect();
    pinned_shards_see_only_their_core(CoreList::from_ids(reversed).unwrap());
    // A single core from a comma list.
    let last = *available.last().unwrap();
    pinned_shards_see_only_their_core(CoreList::parse(&last.to_string()).unwrap());
}

#[test]
fn unpinned_shards_may_run_anywhere_the_process_may() {
    let process = thread_allowed_cpus().unwrap();
    let runtime = Runtime::<Vec<usize>>::start(
        &config(Sharding::Unpinned(3), SMALL),
        |ctx: shard::ShardContext<()>| async move {
            assert_eq!(ctx.core, None);
            thread_allowed_cpus().unwrap()
        },
    )
    .unwrap();
    assert_eq!(runtime.join(JOIN).unwrap(), vec![process; 3]);
}

#[test]
fn a_core_the_process_may_not_use_is_refused() {
    let available = thread_allowed_cpus().unwrap();
    let absent = (0..=shard::cores::CPU_ID_MAX)
        .find(|c| !available.contains(c))
        .unwrap();
    let error = Runtime::<()>::start(
        &config(
            Sharding::Pinned(CoreList::from_ids(vec![absent]).unwrap()),
            SMALL,
        ),
        |_ctx: shard::ShardContext<()>| async move {},
    )
    .unwrap_err();
    match error {
        RuntimeError::CoreUnavailable { core, .. } => assert_eq!(core, absent),
        other => panic!("{other}"),
    }
}

/// Two shards: shard 0 sends requests on the main lane, shard 1 answers each on the reply lane.
#[test]
fn two_shards_talk_both_ways() {
    const N: u64 = 100;
    let runtime = Runtime::<u64>::start(
        &config(Sharding::Unpinned(2), SMALL),
        |ctx: shard::ShardContext<u64>| async move {
            let mesh = &ctx.mesh;
            if ctx.id == 0 {
                let mut sum = 0;
                for i in 0..N {
                    mesh.try_send(1, Lane::Main, i).unwrap();
                    let reply = mesh.recv(Lane::Reply).await.unwrap();
                    assert_eq!((reply.from, reply.to, reply.body), (1, 0, i * 2));
                    sum += reply.body;
                }
                sum
            } else {
                let mut seen = 0;
                for i in 0..N {
                    let request = mesh.recv(Lane::Main).await.unwrap();
                    assert_eq!((request.from, request.to, request.body), (0, 1, i));
                    mesh.try_send(0, Lane::Reply, request.body * 2).unwrap();
                    seen += 1;
                }
                seen
            }
        },
    )
    .unwrap();
    let counters = Arc::clone(runtime.mesh_counters());
    assert_eq!(runtime.join(JOIN).unwrap(), [N * (N - 1), N]);
    assert_eq!(counters.sent(0, Lane::Main), N);
    assert_eq!(counters.received(1, Lane::Main), N);
    assert_eq!(counters.sent(1, Lane::Reply), N);
    assert_eq!(counters.received(0, Lane::Reply), N);
    assert_eq!(counters.dropped_total(), 0);
}

/// A full ring refuses with `InboxFull` and counts it; a stopped shard's ring refuses with
/// `Closed`; an id beyond the node with `NoSuchShard`; the loopback is bounded too.
#[test]
fn drops_are_counted_by_reason() {
    const CAPACITY: usize = 4;
    const SENT: usize = 10;
    let filled = Arc::new(AtomicBool::new(false));
    let drained = Arc::new(AtomicU64::new(u64::MAX));
    // Sends that found room between shard 1's drain and its ring's close (a race of the test:
    // the ring is empty then, so a send may land before the close, or fill it again).
    let (late, late_full) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let (f, d) = (Arc::clone(&filled), Arc::clone(&drained));
    let (l, lf) = (Arc::clone(&late), Arc::clone(&late_full));
    let runtime = Runtime::<Vec<DropReason>>::start(
        &config(
            Sharding::Unpinned(2),
            MeshCapacity {
                main: CAPACITY,
                reply: 1,
            },
        ),
        move |ctx: shard::ShardContext<usize>| {
            let (filled, drained) = (Arc::clone(&f), Arc::clone(&d));
            let (late, late_full) = (Arc::clone(&l), Arc::clone(&lf));
            async move {
                let mesh = &ctx.mesh;
                let mut refused = Vec::new();
                if ctx.id == 0 {
                    for i in 0..SENT {
                        if let Err(e) = mesh.try_send(1, Lane::Main, i) {
                            assert_eq!(e.body, i, "the body comes back");
                            refused.push(e.reason);
                        }
                    }
                    refused.extend(mesh.try_send(2, Lane::Main, 0).err().map(|e| e.reason));
                    // Loopback: bounded by the same capacity.
                    for i in 0..CAPACITY + 1 {
                        refused.extend(mesh.try_send(0, Lane::Main, i).err().map(|e| e.reason));
                    }
                    for i in 0..CAPACITY {
                        assert_eq!(mesh.try_recv(Lane::Main).unwrap().body, i);
                    }
                    filled.store(true, Ordering::Release);
                    // Wait until shard 1 has drained and stopped, then its ring is closed.
                    while drained.load(Ordering::Acquire) == u64::MAX {
                        glommio::timer::sleep(Duration::from_millis(1)).await;
                    }
                    while !ctx.stop.is_set() {
                        match mesh.try_send(1, Lane::Main, 99) {
                            Err(e) if e.reason == DropReason::Closed => {
                                refused.push(e.reason);
                                break;
                            }
                            Ok(()) => {
                                late.fetch_add(1, Ordering::Relaxed);
                                glommio::timer::sleep(Duration::from_millis(1)).await;
                            }
                            Err(e) => {
                                assert_eq!(e.reason, DropReason::InboxFull);
                                late_full.fetch_add(1, Ordering::Relaxed);
                                glommio::timer::sleep(Duration::from_millis(1)).await;
                            }
                        }
                    }
                } else {
                    while !filled.load(Ordering::Acquire) {
                        glommio::timer::sleep(Duration::from_millis(1)).await;
                    }
                    let mut got = 0;
                    while let Some(envelope) = mesh.try_recv(Lane::Main) {
                        assert_eq!(envelope.body, got);
                        got += 1;
                    }
                    drained.store(got as u64, Ordering::Release);
                }
                refused
            }
        },
    )
    .unwrap();
    let counters = Arc::clone(runtime.mesh_counters());
    let refused = runtime.join(JOIN).unwrap();
    let full = SENT - CAPACITY;
    let mut want = vec![DropReason::InboxFull; full];
    want.push(DropReason::NoSuchShard);
    want.push(DropReason::InboxFull);
    want.push(DropReason::Closed);
    assert_eq!(refused[0], want);
    assert_eq!(drained.load(Ordering::Acquire), CAPACITY as u64);
    let late_full = late_full.load(Ordering::Relaxed);
    assert_eq!(
        counters.dropped(0, Lane::Main, DropReason::InboxFull),
        full as u64 + 1 + late_full
    );
    assert_eq!(counters.dropped(0, Lane::Main, DropReason::NoSuchShard), 1);
    assert_eq!(counters.dropped(0, Lane::Main, DropReason::Closed), 1);
    assert_eq!(counters.dropped(1, Lane::Main, DropReason::InboxFull), 0);
    assert_eq!(counters.dropped_total(), full as u64 + 3 + late_full);
    assert_eq!(
        counters.sent(0, Lane::Main),
        2 * CAPACITY as u64 + late.load(Ordering::Relaxed)
    );
    assert_eq!(counters.received(1, Lane::Main), CAPACITY as u64);
}

/// Shards run until the stop flag is set, then return.
#[test]
fn stop_reaches_every_shard() {
    let runtime = Runtime::<u16>::start(
        &config(Sharding::Unpinned(2), SMALL),
        |ctx: shard::ShardContext<()>| async move {
            ctx.stop.wait().await;
            ctx.id
        },
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(runtime.stop_and_join(JOIN).unwrap(), [0, 1]);
}

/// Both shards flood each other through small rings while draining their own: every message is either
/// received or counted as dropped, in both directions (no loss goes uncounted), and what
/// arrives arrives in order.
#[test]
fn every_message_is_received_or_counted() {
    const N: u64 = 4_000;
    let runtime = Runtime::<(u64, u64)>::start(
        &config(
            Sharding::Unpinned(2),
            MeshCapacity {
                main: 16,
                reply: 16,
            },
        ),
        |ctx: shard::ShardContext<u64>| async move {
            let mesh = &ctx.mesh;
            let peer = 1 - ctx.id;
            let (mut accepted, mut got, mut last) = (0u64, 0u64, None);
            let mut take = |envelope: shard::Envelope<u64>| {
                assert!(last < Some(envelope.body), "out of order");
                last = Some(envelope.body);
                got += 1;
            };
            // As a pump does: send, and between sends drain what has arrived.
            for i in 0..N {
                accepted += u64::from(mesh.try_send(peer, Lane::Main, i).is_ok());
                if i % 8 == 0 {
                    while let Some(envelope) = mesh.try_recv(Lane::Main) {
                        take(envelope);
                    }
                    // Give the peer a moment so both rings see traffic and overruns.
                    glommio::timer::sleep(Duration::from_micros(50)).await;
                }
            }
            mesh.close();
            while let Some(envelope) = mesh.recv(Lane::Main).await {
                take(envelope);
            }
            (accepted, got)
        },
    )
    .unwrap();
    let counters = Arc::clone(runtime.mesh_counters());
    let results = runtime.join(JOIN).unwrap();
    for (shard, &(accepted, _)) in results.iter().enumerate() {
        let peer = 1 - shard;
        let (_, received) = results[peer];
        let full = counters.dropped(shard as u16, Lane::Main, DropReason::InboxFull);
        let closed = counters.dropped(shard as u16, Lane::Main, DropReason::Closed);
        eprintln!("shard {shard}: accepted {accepted} full {full} closed {closed}");
        assert_eq!(received, accepted, "shard {shard} -> {peer}");
        assert_eq!(
            accepted + full + closed,
            N,
            "shard {shard}: accepted {accepted}, full {full}, closed {closed}"
        );
        assert_eq!(counters.sent(shard as u16, Lane::Main), accepted);
        assert_eq!(counters.received(peer as u16, Lane::Main), received);
    }
}
