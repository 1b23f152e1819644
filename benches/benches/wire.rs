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

fn manifest(c: &mut Criterion) {
    use wire::manifest::{ArtifactKind, COUNT_MAX, ManifestEntry, decode, encode};
    let entries: Vec<ManifestEntry> = (0..u64::from(COUNT_MAX))
        .map(|i| ManifestEntry {
            kind: ArtifactKind::SEGMENT_LOG,
            frontier: i * 1000,
            len: 1 << 20,
            checksum: i.wrapping_mul(0x9e37_79b9_7f4a_7c15),
        })
        .collect();
    let mut encoded = Vec::new();
    encode(&entries, &mut encoded).unwrap();
    let mut group = c.benchmark_group("manifest_65536");
    group.throughput(Throughput::Bytes(encoded.len() as u64));
    let mut out = Vec::with_capacity(encoded.len());
    group.bench_function("encode", |b| {
        b.iter(|| {
            out.clear();
            encode(black_box(&entries), &mut out).unwrap();
        })
    });
    group.bench_function("decode", |b| {
        b.iter(|| {
            decode(black_box(&encoded))
                .unwrap()
                .iter()
                .map(|e| e.len)
                .sum::<u64>()
        })
    });
    group.finish();
}

/// A 64 MiB block of frames, one third header-only, one third with 1 KiB bodies and one third
/// with 64 KiB bodies, larger than any cache so that the stream is not served from it.
fn mixed_block() -> Vec<u8> {
    const BLOCK: usize = 64 << 20;
    let bodies = [0usize, 1 << 10, 64 << 10];
    let mut block = Vec::with_capacity(BLOCK + (64 << 10) + 256);
    let mut i = 0;
    while block.len() < BLOCK {
        let size = 256 + bodies[i % 3];
        let start = block.len();
        block.resize(start + size, (i % 251) as u8);
        block[start + 48..start + 52].copy_from_slice(&(size as u32).to_le_bytes());
        block[start + 60] = wire::Command::Prepare.byte();
        i += 1;
    }
    block
}

fn framer(c: &mut Criterion) {
    use wire::framer::{Framer, READ_CHUNK};
    const STREAM: usize = 1 << 30;
    let block = mixed_block();
    let mut group = c.benchmark_group("framer");
    group.sample_size(10);
    group.throughput(Throughput::Bytes(
        (STREAM / block.len() * block.len()) as u64,
    ));
    group.bench_function("mixed_1GiB_64KiB_reads", |b| {
        let mut framer = Framer::default();
        b.iter(|| {
            let mut frames = 0u64;
            for _ in 0..STREAM / block.len() {
                for read in block.chunks(READ_CHUNK) {
                    // The socket read: the kernel copies into the framer's buffer.
                    framer.spare()[..read.len()].copy_from_slice(read);
                    framer.filled(read.len());
                    while let Some(frame) = framer.next_frame() {
                        frames += u64::from(frame.unwrap()[60]);
                    }
                }
            }
            frames
        })
    });
    // Decision 365: 1 MiB prepares read in 64 KiB socket reads, each frame ending up in a
    // buffer of its own (the sink keeps it). `copied_out`: sliced from the framer's buffer and
    // copied (the reader before); `read_into_own`: taken out once its header is in and the rest
    // read straight into its buffer.
    let big = {
        let size = 1 << 20;
        let mut frames = Vec::new();
        for i in 0..16u8 {
            let start = frames.len();
            frames.resize(start + size, i);
            frames[start + 48..start + 52].copy_from_slice(&(size as u32).to_le_bytes());
            frames[start + 60] = wire::Command::Prepare.byte();
        }
        frames
    };
    group.throughput(Throughput::Bytes(big.len() as u64));
    group.bench_function("1MiB_frames_copied_out", |b| {
        let mut framer = Framer::default();
        b.iter(|| {
            let mut kept = 0u64;
            for read in big.chunks(READ_CHUNK) {
                framer.spare()[..read.len()].copy_from_slice(read);
                framer.filled(read.len());
                while let Some(frame) = framer.next_frame() {
                    let owned = std::hint::black_box(frame.unwrap().to_vec());
                    kept += u64::from(owned[60]);
                }
            }
            kept
        })
    });
    group.bench_function("1MiB_frames_read_into_own", |b| {
        let mut framer = Framer::default();
        b.iter(|| {
            let mut kept = 0u64;
            let mut at = 0;
            while at < big.len() {
                let read = &big[at..(at + READ_CHUNK).min(big.len())];
                framer.spare()[..read.len()].copy_from_slice(read);
                framer.filled(read.len());
                at += read.len();
                while let Some(frame) = framer.next_frame() {
                    kept += u64::from(frame.unwrap()[60]);
                }
                if let Some((mut frame, mut filled)) = framer.take_partial(READ_CHUNK) {
                    while filled < frame.len() {
                        let n = READ_CHUNK.min(frame.len() - filled);
                        frame[filled..filled + n].copy_from_slice(&big[at..at + n]);
                        filled += n;
                        at += n;
                    }
                    let owned = std::hint::black_box(frame);
                    kept += u64::from(owned[60]);
                }
            }
            kept
        })
    });
    group.finish();
}

criterion_group!(benches, integrity, decode, manifest, framer);
criterion_main!(benches);
