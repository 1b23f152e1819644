//! Wire microbenchmarks: seals, identities, body digests next to raw XXH3, and decode + validate
//! of every header kind.

use std::hint::black_box;

use benches::sample_frames;
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use wire::MAX_MESSAGE_SIZE_DEFAULT;
use wire::integrity::{body_digest, prepare_identity, seal, verify_seal};

fn header_of(frame: &[u8]) -> [u8; 256] {
    frame[..256].try_into().unwrap()
}

fn integrity(c: &mut Criterion) {
    let samples = sample_frames();
    let commit = samples
        .iter()
        .find(|(c, _)| *c == wire::Command::Commit)
        .unwrap();
    let prepare = samples
        .iter()
        .find(|(c, _)| *c == wire::Command::Prepare)
        .unwrap();
    let mut header = header_of(&commit.1);
    c.bench_function("seal+verify/header", |b| {
        b.iter(|| {
            seal(black_box(&mut header));
            assert!(verify_seal(black_box(&header)));
        })
    });
    let prepare = header_of(&prepare.1);
    c.bench_function("prepare_identity/header", |b| {
        b.iter(|| prepare_identity(black_box(&prepare)))
    });

    let mut group = c.benchmark_group("body_digest");
    for size in [1 << 10, 64 << 10, 1 << 20] {
        let body: Vec<u8> = (0..size).map(|i| (i * 31 % 251) as u8).collect();
        group.throughput(Throughput::Bytes(size as u64));
        group.bench_with_input(BenchmarkId::new("raw_xxh3", size), &body, |b, body| {
            b.iter(|| xxhash_rust::xxh3::xxh3_64(black_box(body)))
        });
        group.bench_with_input(BenchmarkId::new("body_digest", size), &body, |b, body| {
            b.iter(|| body_digest(black_box(body)))
        });
    }
    group.finish();
}

fn decode(c: &mut Criterion) {
    let mut group = c.benchmark_group("decode_replica");
    for (command, frame) in sample_frames() {
        group.bench_with_input(
            BenchmarkId::from_parameter(command.name()),
            &frame,
            |b, frame| {
                b.iter(|| wire::decode_replica(black_box(frame), MAX_MESSAGE_SIZE_DEFAULT).is_ok())
            },
        );
    }
    group.finish();
}

criterion_group!(benches, integrity, decode);
criterion_main!(benches);
