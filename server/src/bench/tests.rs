//! Unit tests of the harness's pure parts: the client's frames decode with the server's own
//! decoders, partition ownership, the ceiling, validation messages, `compare`.

use super::client::{RequestFields, SendFrame};
use super::*;
use crate::client::request::Request;
use wire::Operation;

fn fields() -> RequestFields {
    RequestFields {
        client: 7,
        session: 3,
        request: 1,
        operation: Operation::SendMessages,
        code: 0,
        stamped: false,
    }
}

#[test]
fn a_send_frame_decodes_and_verifies_after_every_restamp() {
    let mut frame = SendFrame::new(fields(), 2, 5, 1, 100, 10);
    for origin in [1, 1_796_000_000_000_000, u64::MAX] {
        frame.stamp_origin(origin);
        let (header, body) =
            wire::decode::decode_request(frame.bytes(), wire::MAX_MESSAGE_SIZE_DEFAULT).unwrap();
        assert_eq!(header.session.get(), 3);
        assert_eq!(header.request_checksum.get(), 0);
        let Request::SendMessages(send) =
            Request::decode(Operation::SendMessages, 0, body).unwrap()
        else {
            panic!("not a send");
        };
        assert_eq!(send.messages_count, 10);
        assert_eq!(
            send.partitioning,
            crate::client::codec::Partitioning::Partition(1)
        );
        let batch = wire::batch::verify(send.batch).unwrap();
        assert_eq!(batch.origin_timestamp, origin);
        assert_eq!(batch.message_count, 10);
        assert_eq!(send.batch.len() as u64, batch.length);
    }
    assert_eq!(frame.bytes().len() as u64, send_frame_size(100, 10));
}

#[test]
fn a_restamp_that_skips_the_checksum_is_caught() {
    // What `stamp_origin` must not forget: the batch checksum covers origin_timestamp.
    let mut frame = SendFrame::new(fields(), 0, 0, 0, 10, 3);
    frame.stamp_origin(5);
    let mut bytes = frame.batch().to_vec();
    bytes[24..32].copy_from_slice(&6u64.to_le_bytes());
    assert_eq!(
        wire::batch::verify(&bytes),
        Err(wire::batch::BatchFault::Checksum)
    );
}

#[test]
fn metadata_requests_are_stamped_and_numbered() {
    let stream = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = stream.local_addr().unwrap();
    let mut conn = client::Connection::connect(addr, std::time::Duration::ZERO).unwrap();
    let a = conn.fields(Operation::CreateStream, 0);
    let b = conn.fields(Operation::CreateTopic, 0);
    let c = conn.fields(Operation::SendMessages, 0);
    let d = conn.fields(Operation::NonReplicated, 100);
    assert_eq!((a.request, a.stamped), (1, true));
    assert_eq!((b.request, b.stamped), (2, true));
    assert_eq!((c.request, c.stamped), (3, false));
    assert_eq!((d.request, d.stamped, d.code), (3, false, 100));
    let mut frame = Vec::new();
    let logged_in = RequestFields { session: 9, ..a };
    client::put_request(&mut frame, logged_in, b"\x02s1");
    let (header, _) = wire::decode::decode_request(&frame, wire::MAX_MESSAGE_SIZE_DEFAULT).unwrap();
    assert_eq!(
        header.request_checksum.get(),
        u128::from(wire::integrity::xxh3(b"\x02s1"))
    );
}

#[test]
fn partitions_are_shared_out() {
    let parts = [0, 1, 2, 3, 4];
    assert_eq!(load::owned(0, 2, &parts), [0, 2, 4]);
    assert_eq!(load::owned(1, 2, &parts), [1, 3]);
    assert_eq!(load::owned(3, 8, &[0, 1]), [1]);
    assert_eq!(load::owned(0, 1, &[9]), [9]);
}

fn baseline(loopback: f64, disk: Option<f64>) -> baseline::Baseline {
    baseline::Baseline {
        loopback_mb_s: loopback,
        rtt_us_p50: 10.0,
        rtt_us_p99: 20.0,
        disk_write_mb_s: disk,
        fdatasync_us_p50: disk.map(|_| 500.0),
        disk_direct_io: disk.map(|_| true),
        write_size: 4096,
    }
}

#[test]
fn the_ceiling_is_the_slower_path_over_the_replicas() {
    let c = |b, r| baseline::ceiling_mb_s(&b, r);
    assert_eq!(c(baseline(3000.0, Some(900.0)), Some(3)), Some(300.0));
    assert_eq!(c(baseline(600.0, Some(900.0)), Some(3)), Some(200.0));
    assert_eq!(c(baseline(600.0, Some(900.0)), Some(1)), Some(600.0));
    assert_eq!(c(baseline(600.0, None), Some(2)), Some(300.0));
    assert_eq!(c(baseline(600.0, None), None), None);
    assert_eq!(c(baseline(600.0, None), Some(0)), None);
}

fn parse(args: &[&str]) -> Result<BenchArgs, clap::Error> {
    #[derive(Debug, clap::Parser)]
    struct Top {
        #[command(flatten)]
        bench: BenchArgs,
    }
    <Top as clap::Parser>::try_parse_from(std::iter::once("bench").chain(args.iter().copied()))
        .map(|t| t.bench)
}

#[test]
fn flags_parse_and_refusals_name_the_flag() {
    let args = parse(&[
        "--spawn",
        "3",
        "--ack",
        "memory",
        "--producers",
        "2",
        "--partitions",
        "2",
        "--message-size",
        "100",
        "--batch",
        "10",
        "--duration",
        "20",
        "--out",
        "d",
    ])
    .unwrap();
    let run = args.run;
    assert_eq!(run.spawn, Some(3));
    assert_eq!(run.ack, Some(AckArg::Memory));
    assert_eq!(
        (run.producers, run.partitions, run.message_size, run.batch),
        (2, 2, 100, 10)
    );
    assert_eq!(run.duration, Some(20.0));
    validate(&run).unwrap();

    let kind = |a: &[&str]| parse(a).unwrap_err().kind();
    use clap::error::ErrorKind;
    assert_eq!(
        kind(&["--spawn", "3", "--address", "x:1"]),
        ErrorKind::ArgumentConflict
    );
    assert_eq!(
        kind(&["--messages", "5", "--duration", "1"]),
        ErrorKind::ArgumentConflict
    );
    assert_eq!(kind(&["--spawn", "0"]), ErrorKind::ValueValidation);
    assert_eq!(kind(&["--spawn", "10"]), ErrorKind::ValueValidation);
    assert_eq!(kind(&["--batch", "0"]), ErrorKind::ValueValidation);
    assert_eq!(
        kind(&["--ack", "fast", "--spawn", "1"]),
        ErrorKind::InvalidValue
    );
    assert_eq!(
        kind(&["--sink", "--spawn", "1"]),
        ErrorKind::ArgumentConflict
    );

    let error = |a: &[&str]| validate(&parse(a).unwrap().run).unwrap_err().to_string();
    assert!(error(&[]).contains("--address"), "{}", error(&[]));
    let big = error(&[
        "--address",
        "x:1",
        "--batch",
        "100000",
        "--message-size",
        "1000",
    ]);
    assert!(
        big.contains("--batch 100000 x --message-size 1000"),
        "{big}"
    );
    assert!(error(&["--address", "x:1", "--ack", "memory"]).contains("--ack memory"));
    assert!(error(&["--address", "x:1", "--data-dir", "d"]).contains("--data-dir"));
    assert!(error(&["--address", "x:1", "--duration", "0"]).contains("--duration"));
    assert!(error(&["--address", "x:1", "--rate=-1"]).contains("--rate"));
    assert!(error(&["--address", "x:1", "--messages", "0"]).contains("--messages"));
    assert!(error(&["--address", "x:1", "--baseline-seconds", "0"]).contains("--baseline-seconds"));
}

#[test]
fn compare_prints_both_reports_and_their_ratio() {
    let report = |mb: f64, commit: &str| report::Report {
        commit: commit.into(),
        started_at_us: 0,
        replicas: Some(3),
        acked: "disk".into(),
        target: "127.0.0.1:1".into(),
        message_size: 1000,
        batch: 1000,
        producers: 2,
        consumers: 0,
        partitions: 2,
        rate_msgs_s: None,
        duration_s: 20.0,
        messages: 1,
        throughput_msgs_s: mb * 1000.0,
        throughput_mb_s: mb,
        transient_retries: 0,
        latency_us: report::Latency {
            p50: 1,
            p90: 2,
            p99: 3,
            p999: 4,
            max: 5,
        },
        baseline: baseline(1000.0, Some(600.0)),
        ceiling_mb_s: Some(200.0),
        ratio_to_ceiling: Some(mb / 200.0),
        ratio_to_loopback: mb / 1000.0,
        cpu_s_per_gb: None,
        consumer: None,
        timeline: Vec::new(),
    };
    let text = report::compare(
        &report(100.0, "aaa"),
        &report(150.0, "bbb"),
        "A.json",
        "B.json",
    );
    assert!(text.contains("A.json") && text.contains("B.json"), "{text}");
    let line = text
        .lines()
        .find(|l| l.starts_with("throughput_mb_s"))
        .unwrap();
    assert!(
        line.contains(" 100 ") && line.contains(" 150 ") && line.ends_with("1.50"),
        "{line}"
    );
    assert!(text.contains("aaa") && text.contains("bbb"));
}

#[test]
fn polled_offsets_come_from_the_frames() {
    // A stored batch of 5 messages at base 100; a poll that returns messages 2..=3 keeps the
    // base and the frames' deltas (client-plane.md §8.3).
    let whole = wire::batch::build(0, 100, 1, 1, &[b"a", b"bb", b"ccc", b"dddd", b"e"]);
    assert_eq!(client::frame_deltas(&whole, 5), Some((0, 4)));
    let frame = |i: usize| {
        let sizes = [1usize, 2, 3, 4, 1];
        let start = 256 + (0..i).map(|k| 48 + sizes[k]).sum::<usize>();
        start..start + 48 + sizes[i]
    };
    let mut part = whole[..256].to_vec();
    part.extend_from_slice(&whole[frame(2)]);
    part.extend_from_slice(&whole[frame(3)]);
    assert_eq!(client::frame_deltas(&part, 2), Some((2, 3)));
    // Frames that do not tile the bytes, or fewer than counted.
    assert_eq!(client::frame_deltas(&part, 3), None);
    assert_eq!(client::frame_deltas(&part, 1), None);
    assert_eq!(client::frame_deltas(&part[..part.len() - 1], 2), None);
}

#[test]
fn the_spawn_config_loads_for_each_ack_and_size() {
    for ack in [AckArg::Disk, AckArg::Memory] {
        for n in [1u16, 3, 9] {
            let nodes: Vec<cluster::NodePorts> = (0..n)
                .map(|i| cluster::NodePorts {
                    tcp: 20_000 + 3 * i,
                    http: 20_001 + 3 * i,
                    tcp_replica: 20_002 + 3 * i,
                })
                .collect();
            let text = cluster::config_text(&nodes, ack.as_str());
            let overrides = crate::config::Overrides {
                replica_id: u64::from(n - 1),
                shards: Some(1),
                available_cpus: vec![0],
                ..crate::config::Overrides::default()
            };
            let config = crate::config::load(&text, &overrides)
                .unwrap_or_else(|e| panic!("{} x {n}: {e}", ack.as_str()));
            let expected = match ack {
                AckArg::Disk => crate::config::Ack::Disk,
                AckArg::Memory => crate::config::Ack::Memory,
            };
            assert_eq!(config.partition.ack, expected);
        }
    }
}

#[test]
fn cpu_seconds_come_from_utime_and_stime_past_a_name_with_spaces_and_parens() {
    // Fields: pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt
    // utime stime ...
    let stat = "4242 (str and) (x) S 1 2 3 4 5 6 7 8 9 10 250 130 11 12 20 0 1 0";
    assert_eq!(cluster::cpu_seconds_of_stat(stat, 100.0), Some(3.8));
    assert_eq!(
        cluster::cpu_seconds_of_stat("4242 (cut) S 1 2", 100.0),
        None
    );
    assert_eq!(cluster::cpu_seconds_of_stat("no name here", 100.0), None);
    // This process: the figure is read and does not go backwards while it spins.
    let before = cluster::process_cpu_seconds(std::process::id()).expect("/proc readable");
    let spin = std::time::Instant::now();
    let mut x = 0u64;
    while spin.elapsed() < std::time::Duration::from_millis(50) {
        x = std::hint::black_box(x.wrapping_add(1));
    }
    let after = cluster::process_cpu_seconds(std::process::id()).expect("/proc readable");
    assert!(after >= before, "{before} -> {after}");
}
