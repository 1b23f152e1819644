//! Consensus microbenchmarks: `Replica::step` throughput of a 3-replica in-memory cluster (all
//! replicas in one thread, 1 KiB bodies, every frame decoded and every storage completion fed
//! back), and the cost of one tick over 1, 1,000 and 10,000 partition groups per replica.

use std::hint::black_box;

use consensus::testing::Cluster;
use consensus::{
    DigestStateMachine, GroupId, Input, Now, Outbox, RawConfig, Recovered, Replica, ReplicaId,
    build_batch, build_send_messages_request,
};
use criterion::{BatchSize, BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use wire::{Operation, PartitionKey};

fn partition(p: u32) -> GroupId {
    GroupId::partition(PartitionKey {
        stream: 1,
        topic: 1,
        partition: p,
    })
    .expect("packable")
}

const BURST: u64 = 32;

fn step_throughput(c: &mut Criterion) {
    let mut group = c.benchmark_group("replica_step");
    group.throughput(Throughput::Elements(BURST));

    // Partition plane: SendMessages with one 1 KiB message, stamped and re-derived.
    let body = build_send_messages_request(&build_batch(&[&[7u8; 1024]]), 1);
    group.bench_function("3_replicas/partition_send_1KiB", |b| {
        let mut cluster = Cluster::new(3, partition(1), |_| {});
        let mut request = 0u64;
        b.iter(|| {
            for _ in 0..BURST {
                request += 1;
                let r = Cluster::request(11, Operation::SendMessages, 1, request, body.clone());
                cluster.step(ReplicaId(0), Input::Request(r));
            }
            cluster.run();
            assert_eq!(cluster.replica(0).commit_min(), request);
            if request.is_multiple_of(4096) {
                for disk in &mut cluster.disks {
                    disk.journal.clear();
                }
                cluster.replies.clear();
            }
        });
    });

    // Partition plane at the replica-plane benchmark's shape: SendMessages of 1000 x 1000 B
    // messages (a 1 MB batch): the copies and hashes of the prepare path on all three
    // replicas, per payload byte (decisions 261-263).
    let payloads: Vec<Vec<u8>> = (0..1000u32).map(|i| vec![i as u8; 1000]).collect();
    let refs: Vec<&[u8]> = payloads.iter().map(Vec::as_slice).collect();
    let big = build_send_messages_request(&build_batch(&refs), 1);
    const BIG_BURST: u64 = 4;
    group.throughput(Throughput::Bytes(BIG_BURST * 1_000_000));
    group.bench_function("3_replicas/partition_send_1000x1000B", |b| {
        let mut cluster = Cluster::new(3, partition(1), |_| {});
        let mut request = 0u64;
        b.iter(|| {
            for _ in 0..BIG_BURST {
                request += 1;
                let r = Cluster::request(11, Operation::SendMessages, 1, request, big.clone());
                cluster.step(ReplicaId(0), Input::Request(r));
            }
            cluster.run();
            assert_eq!(cluster.replica(0).commit_min(), request);
            if request.is_multiple_of(16) {
                for disk in &mut cluster.disks {
                    disk.journal.clear();
                }
                cluster.replies.clear();
            }
        });
    });
    group.throughput(Throughput::Elements(BURST));
    group.finish();

    // The primary's prepare of a 1 MB SendMessages batch (1000 x 1000 B) on a 1-replica group,
    // admission check to commit, the request built outside the timing: its body read into a
    // buffer with a header's room spare, as the client core does (the prepare is made in that
    // buffer, decision 460), or sized exactly (the prepare needs a new allocation and a copy).
    let mut group = c.benchmark_group("primary_send_1000x1000B");
    group.throughput(Throughput::Bytes(1_000_000));
    for (name, room) in [
        ("body_with_header_room", wire::HEADER_SIZE),
        ("body_exact", 0),
    ] {
        group.bench_function(name, |b| {
            let mut cluster = Cluster::new(1, partition(1), |_| {});
            let mut request = 0u64;
            b.iter_batched(
                || {
                    request += 1;
                    let mut body = Vec::with_capacity(big.len() + room);
                    body.extend_from_slice(&big);
                    Cluster::request(11, Operation::SendMessages, 1, request, body)
                },
                |r| {
                    cluster.step(ReplicaId(0), Input::Request(r));
                    cluster.run();
                    if cluster.replica(0).commit_min().is_multiple_of(16) {
                        for disk in &mut cluster.disks {
                            disk.journal.clear();
                        }
                        cluster.replies.clear();
                    }
                },
                BatchSize::PerIteration,
            );
        });
    }
    group.finish();
    let mut group = c.benchmark_group("replica_step");
    group.throughput(Throughput::Elements(BURST));

    // Metadata plane: 32 registered clients, one 1 KiB op each per burst (dedup, client table,
    // sealed bodies, reply cache).
    let body = vec![9u8; 1024];
    group.bench_function("3_replicas/metadata_1KiB", |b| {
        let mut cluster = Cluster::new(3, GroupId::METADATA, |_| {});
        let mut sessions = Vec::new();
        for client in 1..=BURST as u128 {
            cluster.submit(
                0,
                Cluster::request(client, Operation::Register, 0, 0, vec![]),
            );
            sessions.push(cluster.replica(0).commit_min());
        }
        let mut request = 0u64;
        let base = cluster.replica(0).commit_min();
        b.iter(|| {
            request += 1;
            for (i, session) in sessions.iter().enumerate() {
                let r = Cluster::request(
                    i as u128 + 1,
                    Operation::CreateStream,
                    *session,
                    request,
                    body.clone(),
                );
                cluster.step(ReplicaId(0), Input::Request(r));
            }
            cluster.run();
            assert_eq!(cluster.replica(0).commit_min(), base + request * BURST);
            if request.is_multiple_of(128) {
                for disk in &mut cluster.disks {
                    disk.journal.clear();
                }
                cluster.replies.clear();
            }
        });
    });
    group.finish();
}

fn tick_cost(c: &mut Criterion) {
    let mut group = c.benchmark_group("tick");
    for groups in [1u32, 1_000, 10_000] {
        let mut out = Outbox::new();
        let mut replicas: Vec<Replica<DigestStateMachine>> = (0..groups)
            .map(|g| {
                let config = RawConfig::new(1, ReplicaId(0), 3, partition(g))
                    .validate()
                    .expect("valid");
                Replica::new(
                    config,
                    Recovered::fresh(u128::from(g) + 1),
                    DigestStateMachine::default(),
                    &mut out,
                )
            })
            .collect();
        out.clear();
        let mut now = Now::default();
        group.throughput(Throughput::Elements(u64::from(groups)));
        group.bench_with_input(
            BenchmarkId::new("primaries_idle", groups),
            &groups,
            |b, _| {
                b.iter(|| {
                    now.tick += 1;
                    for replica in &mut replicas {
                        let _ = replica.step(now, Input::Tick, &mut out);
                    }
                    black_box(out.len());
                    out.clear();
                })
            },
        );
    }
    group.finish();
}

criterion_group!(benches, step_throughput, tick_cost);
criterion_main!(benches);
