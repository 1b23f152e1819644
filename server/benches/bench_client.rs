//! Hot-path pieces of a SendMessages (issue 12 item 5): the bench client framing a batch
//! (building the frame once, restamping it per send), and the server side's batch validation
//! (`wire::batch::verify`) and stamping (`wire::batch::stamp`), at 1000 x 1000 B and
//! 1000 x 100 B batches.

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use server::bench::client::{RequestFields, SendFrame};
use wire::Operation;

const FIELDS: RequestFields = RequestFields {
    client: 1,
    session: 1,
    request: 1,
    operation: Operation::SendMessages,
    code: 0,
    stamped: false,
};

const SHAPES: [(usize, u32); 2] = [(1000, 1000), (100, 1000)];

fn framing(c: &mut Criterion) {
    let mut group = c.benchmark_group("send_frame");
    for (size, batch) in SHAPES {
        let id = format!("{batch}x{size}B");
        group.throughput(Throughput::Bytes(size as u64 * u64::from(batch)));
        group.bench_function(BenchmarkId::new("build", &id), |b| {
            b.iter(|| SendFrame::new(FIELDS, 0, 0, 0, size, batch));
        });
        let mut frame = SendFrame::new(FIELDS, 0, 0, 0, size, batch);
        let mut origin = 1u64;
        group.bench_function(BenchmarkId::new("restamp", &id), |b| {
            b.iter(|| {
                origin += 1;
                frame.stamp_origin(origin);
            });
        });
    }
    group.finish();
}

fn batch(c: &mut Criterion) {
    let mut group = c.benchmark_group("batch");
    for (size, batch) in SHAPES {
        let id = format!("{batch}x{size}B");
        let mut frame = SendFrame::new(FIELDS, 0, 0, 0, size, batch);
        frame.stamp_origin(1);
        let mut bytes = frame.batch().to_vec();
        group.throughput(Throughput::Bytes(bytes.len() as u64));
        group.bench_function(BenchmarkId::new("verify", &id), |b| {
            b.iter(|| wire::batch::verify(&bytes).expect("a valid batch"));
        });
        let mut offset = 0u64;
        group.bench_function(BenchmarkId::new("stamp", &id), |b| {
            b.iter(|| {
                offset += u64::from(batch);
                wire::batch::stamp(&mut bytes, 3, offset, 1_000);
            });
        });
    }
    group.finish();
}

criterion_group!(benches, framing, batch);
criterion_main!(benches);
