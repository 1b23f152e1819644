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

/// `--tcp-congestion` (decision 501): a name of the kernel's shape parses, a malformed one is
/// refused by the parser, one the kernel lacks by `validate` before anything runs, naming the
/// flag; the harness's connections start under it.
#[test]
fn the_congestion_control_flag_is_checked_and_reaches_the_connections() {
    let args = parse(&["--spawn", "1", "--tcp-congestion", "reno"]).unwrap();
    assert_eq!(
        args.run.tcp_congestion.as_ref().map(|c| c.name()),
        Some("reno")
    );
    validate(&args.run).unwrap();
    let error = parse(&["--spawn", "1", "--tcp-congestion", "cu bic"]).unwrap_err();
    assert!(error.to_string().contains("--tcp-congestion"), "{error}");
    for mode in ["--spawn", "--sink"] {
        let args = if mode == "--sink" {
            parse(&["--sink", "--tcp-congestion", "no_such_cc"]).unwrap()
        } else {
            parse(&["--spawn", "1", "--tcp-congestion", "no_such_cc"]).unwrap()
        };
        let error = format!("{:#}", validate(&args.run).unwrap_err());
        assert!(
            error.starts_with("--tcp-congestion") && error.contains("no_such_cc"),
            "{mode}: {error}"
        );
    }
    let default = std::fs::read_to_string(baseline::CONGESTION_CONTROL_PATH).unwrap();
    let chosen = if default.trim() == "reno" {
        "cubic"
    } else {
        "reno"
    };
    let chosen = shard::net::CongestionControl::new(chosen).unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let conn = client::Connection::connect(addr, std::time::Duration::ZERO, Some(&chosen)).unwrap();
    assert_eq!(conn.congestion_control().unwrap(), chosen.name());
    let plain = client::Connection::connect(addr, std::time::Duration::ZERO, None).unwrap();
    assert_eq!(plain.congestion_control().unwrap(), default.trim());
    // `--sink --tcp-congestion`: the sink's listener takes it too, and serves as before.
    let sink = sink::Sink::spawn_under(([127, 0, 0, 1], 0).into(), Some(&chosen)).unwrap();
    let mut conn =
        client::Connection::connect(sink.addr(), std::time::Duration::ZERO, Some(&chosen)).unwrap();
    conn.login("iggy", "iggy").unwrap();
}

#[test]
fn metadata_requests_are_stamped_and_numbered() {
    let stream = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = stream.local_addr().unwrap();
    let mut conn = client::Connection::connect(addr, std::time::Duration::ZERO, None).unwrap();
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
        disk_read_mb_s: disk.map(|d| 2.0 * d),
        disk_direct_io: disk.map(|_| true),
        write_size: 4096,
        tcp_congestion_control: Some("cubic".into()),
        socket_congestion_control: None,
        chain_writes: None,
        chain_load: None,
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
    assert!(!run.no_chain_probe, "the chain probe runs unless told");
    validate(&run).unwrap();
    // The chain with no server in it (decision 516): as fast as acks allow, in batches, unless
    // told not to.
    assert!(runs_chain_probe(&run));
    let probes = |a: &[&str]| runs_chain_probe(&parse(a).unwrap().run);
    assert!(!probes(&["--spawn", "3", "--no-chain-probe"]));
    assert!(!probes(&["--spawn", "3", "--rate", "50%"]));
    assert!(!probes(&["--spawn", "3", "--batch", "1"]));

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
    let rate = parse(&["--address", "x:1", "--rate=-1"]).unwrap_err();
    assert_eq!(rate.kind(), ErrorKind::ValueValidation);
    assert!(rate.to_string().contains("--rate -1"), "{rate}");
    assert!(
        error(&["--address", "x:1", "--consumers", "0", "--read-back"]).contains("--read-back")
    );
    assert!(error(&["--address", "x:1", "--warmup=-1"]).contains("--warmup"));
    assert!(error(&["--address", "x:1", "--probe-seconds", "0"]).contains("--probe-seconds"));
    assert!(error(&["--address", "x:1", "--messages", "0"]).contains("--messages"));
    assert!(error(&["--address", "x:1", "--baseline-seconds", "0"]).contains("--baseline-seconds"));
}

fn sample_report(mb: f64, commit: &str) -> report::Report {
    report::Report {
        commit: commit.into(),
        invariant_sweep: false,
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
        disk_bytes_per_payload_byte: None,
        minor_faults_per_mb: None,
        node_resident_peak_mb: None,
        consumer: None,
        timeline: Vec::new(),
        read_back: false,
        before_clock: None,
        replica_sends_dropped_not_connected: None,
        checks: Vec::new(),
    }
}

/// Issue 10's replica-plane figure: 3 replicas and prepares of about 1 MiB on disk, against
/// min(loopback / 2, disk / 3) of the same run; no such check for other shapes.
#[test]
fn the_replica_plane_check_uses_issue_10s_ceiling() {
    let check = |mb: f64, edit: &dyn Fn(&mut report::Report)| {
        let mut r = sample_report(mb, "a");
        // Loopback 300, disk 600: issue 10's ceiling is min(150, 200) = 150 MB/s (issue
        // 12's would be min(300, 600) / 3 = 100).
        r.baseline = baseline(300.0, Some(600.0));
        r.disk_bytes_per_payload_byte = Some(1.0);
        edit(&mut r);
        report::checks(&r)
            .into_iter()
            .find(|c| c.name == "replica_plane")
    };
    let c = check(80.0, &|_| {}).expect("3 replicas, 1 MB batches");
    assert!((c.value - 80.0 / 150.0).abs() < 1e-9, "{c:?}");
    assert!(c.pass && c.target.contains("150.0 MB/s"), "{c:?}");
    let limit = c.limit.expect("the disk cap");
    assert!(
        (limit.value - 600.0 / 3.0 / 150.0).abs() < 1e-9,
        "{limit:?}"
    );
    assert!(
        !check(70.0, &|_| {}).unwrap().pass,
        "70 of 150 is under half"
    );
    assert!(check(80.0, &|r| r.replicas = Some(1)).is_none());
    assert!(check(80.0, &|r| r.batch = 10).is_none(), "10 kB prepares");
    assert!(check(80.0, &|r| r.acked = "memory".into()).is_none());
    assert!(check(80.0, &|r| r.rate_msgs_s = Some(1.0)).is_none());
}

#[test]
fn compare_prints_both_reports_and_their_ratio() {
    let report = sample_report;
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
    // The chain probe (decision 509) is compared where a report has it; an older report,
    // without the key, reads as null.
    let mut probed = report(100.0, "ccc");
    probed.baseline.chain_writes = Some(baseline::ChainWrites {
        writers: 3,
        quorum: 2,
        stagger_us: 230.0,
        rounds: 100,
        append_quorum_us_p50: 2500.0,
        overwrite_quorum_us_p50: 1400.0,
    });
    let mut older = serde_json::to_value(report(100.0, "ddd")).unwrap();
    older["baseline"]
        .as_object_mut()
        .unwrap()
        .remove("chain_writes");
    let older: report::Report = serde_json::from_value(older).unwrap();
    let text = report::compare(&older, &probed, "A", "B");
    let line = text
        .lines()
        .find(|l| l.starts_with("baseline.chain_writes.append_quorum_us_p50"))
        .unwrap();
    assert!(line.contains("null") && line.contains("2500"), "{line}");
}

/// The report names the kernel's default congestion control (decision 500): read from the
/// file Linux shows it in, one word; anything else is `null`, never a guess.
#[test]
fn the_baseline_names_the_congestion_control_it_ran_under() {
    let dir = crate::scratch_dir("bench-congestion");
    let file = |text: &str| {
        let path = dir.join("tcp_congestion_control");
        std::fs::write(&path, text).unwrap();
        baseline::congestion_control(&path)
    };
    assert_eq!(file("bbr\n").as_deref(), Some("bbr"));
    assert_eq!(file("cubic").as_deref(), Some("cubic"));
    assert_eq!(file("\n"), None);
    assert_eq!(file("bbr cubic\n"), None);
    assert_eq!(baseline::congestion_control(&dir.join("absent")), None);
    let _ = std::fs::remove_dir_all(&dir);
    // On Linux the measured baseline carries the running kernel's choice.
    let here =
        baseline::congestion_control(std::path::Path::new(baseline::CONGESTION_CONTROL_PATH))
            .expect("Linux shows its default congestion control");
    let measured = baseline::measure(
        4096,
        None,
        baseline::Budget::standard(std::time::Duration::from_millis(50)),
        None,
    )
    .unwrap();
    assert_eq!(measured.tcp_congestion_control, Some(here.clone()));
    assert_eq!(measured.socket_congestion_control, None);
    // `--tcp-congestion` is recorded beside the kernel's default, which it does not change.
    let reno = shard::net::CongestionControl::new("reno").unwrap();
    let measured = baseline::measure(
        4096,
        None,
        baseline::Budget::standard(std::time::Duration::from_millis(50)),
        Some(&reno),
    )
    .unwrap();
    assert_eq!(measured.tcp_congestion_control, Some(here));
    assert_eq!(measured.socket_congestion_control.as_deref(), Some("reno"));
    // Reports from before the field read back with it `null`; `compare` prints it.
    let mut old = serde_json::to_value(sample_report(100.0, "old")).unwrap();
    old["baseline"]
        .as_object_mut()
        .unwrap()
        .remove("tcp_congestion_control");
    let old: report::Report = serde_json::from_value(old).unwrap();
    assert_eq!(old.baseline.tcp_congestion_control, None);
    let text = report::compare(&old, &sample_report(100.0, "new"), "A", "B");
    let line = text
        .lines()
        .find(|l| l.starts_with("baseline.tcp_congestion_control"))
        .unwrap();
    assert!(line.contains("null") && line.contains("cubic"), "{line}");
    let mut chosen = sample_report(100.0, "new");
    chosen.baseline.socket_congestion_control = Some("reno".into());
    let text = report::compare(&old, &chosen, "A", "B");
    let line = text
        .lines()
        .find(|l| l.starts_with("baseline.socket_congestion_control"))
        .unwrap();
    assert!(line.contains("null") && line.contains("reno"), "{line}");
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
            for wal_size in [None, Some(8 << 20), Some(1 << 30)] {
                let congestion =
                    wal_size.map(|_| shard::net::CongestionControl::new("reno").unwrap());
                let spawned = cluster::Spawned {
                    ack: ack.as_str(),
                    wal_size,
                    read_cache: wal_size.map(|_| 64 << 20),
                    memory_prefault: wal_size.map(|_| 0),
                    congestion: congestion.as_ref(),
                };
                let text = cluster::config_text(&nodes, &spawned);
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
                assert_eq!(config.partition.wal_size, wal_size.unwrap_or(64 << 20));
                // `--read-cache` reaches the node's config (here with each explicit WAL size).
                let cache = if wal_size.is_some() {
                    64 << 20
                } else {
                    256 << 20
                };
                assert_eq!(config.partition.read_cache_bytes, cache);
                // `--memory-prefault` too (0 with each explicit WAL size, else the default).
                assert_eq!(
                    config.system.memory_prefault_bytes,
                    if wal_size.is_some() {
                        0
                    } else {
                        crate::memory::PREFAULT_BYTES_DEFAULT
                    }
                );
                // `--tcp-congestion` reaches it too (here with each explicit WAL size).
                assert_eq!(
                    config
                        .network
                        .tcp_congestion_control
                        .as_ref()
                        .map(|c| c.name()),
                    congestion.as_ref().map(|c| c.name())
                );
            }
        }
    }
}

/// `--wal-size` takes the config's spellings and refuses what the node would refuse, naming
/// the flag (decision 401).
#[test]
fn wal_size_takes_config_sizes_and_refuses_what_the_node_would() {
    assert_eq!(parse_wal_size("1 GiB"), Ok(1 << 30));
    assert_eq!(parse_wal_size("268435456"), Ok(256 << 20));
    assert_eq!(parse_wal_size("8 MiB"), Ok(8 << 20));
    for bad in ["4 MiB", "2 GiB", "16777217", "lots"] {
        let error = parse_wal_size(bad).expect_err(bad);
        assert!(error.starts_with(&format!("--wal-size {bad}:")), "{error}");
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

#[test]
fn memory_prefault_takes_zero_or_the_configs_range() {
    assert_eq!(parse_memory_prefault("0"), Ok(0));
    assert_eq!(parse_memory_prefault("512 MiB"), Ok(512 << 20));
    assert_eq!(parse_memory_prefault("1 TiB"), Ok(1 << 40));
    for bad in ["4 KiB", "2 TiB", "lots"] {
        let error = parse_memory_prefault(bad).expect_err(bad);
        assert!(
            error.starts_with(&format!("--memory-prefault {bad}:")),
            "{error}"
        );
    }
}

#[test]
fn rates_parse_as_a_number_or_a_percentage_of_the_maximum() {
    assert_eq!(parse_rate("1500"), Ok(RateArg::Fixed(1500.0)));
    assert_eq!(parse_rate("0.5"), Ok(RateArg::Fixed(0.5)));
    assert_eq!(parse_rate("50%"), Ok(RateArg::OfMax(0.5)));
    assert_eq!(parse_rate("100%"), Ok(RateArg::OfMax(1.0)));
    for bad in ["0", "-3", "nan", "inf", "0%", "101%", "x%", "%", ""] {
        assert!(parse_rate(bad).is_err(), "{bad}");
    }
    let run = parse(&["--address", "x:1", "--rate", "50%", "--probe-seconds", "2"])
        .unwrap()
        .run;
    assert_eq!(run.rate, Some(RateArg::OfMax(0.5)));
    assert_eq!(run.probe_seconds, 2.0);
    validate(&run).unwrap();
}

fn check<'a>(r: &'a report::Report, name: &str) -> Option<&'a report::Check> {
    r.checks.iter().find(|c| c.name == name)
}

fn checked(mut r: report::Report) -> report::Report {
    r.checks = report::checks(&r);
    r
}

#[test]
fn a_fixed_load_is_held_to_its_tail_and_its_baseline_derived_p50() {
    // 1000 x 1000 B: a frame of send_frame_size bytes at 1000 MB/s loopback, fdatasync 500 us.
    let mut r = sample_report(100.0, "a");
    r.rate_msgs_s = Some(50_000.0);
    r.latency_us = report::Latency {
        p50: 3000,
        p90: 4000,
        p99: 5000,
        p999: 15_000,
        max: 20_000,
    };
    let transfer = send_frame_size(1000, 1000) as f64 / 1000.0;
    assert!((report::batch_transfer_us(&r) - transfer).abs() < 1e-9);
    let r = checked(r);
    let tail = check(&r, "fixed_load_tail").unwrap();
    assert_eq!(
        (tail.value, tail.bound, tail.pass),
        (15_000.0, 15_000.0, true)
    );
    let p50 = check(&r, "fixed_load_p50").unwrap();
    let bound = 2.0 * (3.0 * transfer + 500.0);
    assert_eq!((p50.value, p50.bound), (3000.0, bound));
    assert_eq!(p50.pass, 3000.0 <= bound);
    assert!(p50.target.contains("fdatasync"), "{}", p50.target);
    // One microsecond past each bound fails it.
    let mut worse = r.clone();
    worse.latency_us.p999 = 15_001;
    worse.latency_us.p50 = bound.floor() as u64 + 1;
    let worse = checked(worse);
    assert!(!check(&worse, "fixed_load_tail").unwrap().pass);
    assert!(!check(&worse, "fixed_load_p50").unwrap().pass);
    assert!(
        report::check_line(check(&worse, "fixed_load_tail").unwrap()).ends_with("FAIL"),
        "{}",
        report::check_line(check(&worse, "fixed_load_tail").unwrap())
    );
    // A fixed load is not a throughput run: no throughput check.
    assert!(check(&r, "throughput").is_none());
    // Without a disk figure (against --address) the p50 bound cannot be derived: no check,
    // the tail check stays.
    let mut remote = r.clone();
    remote.baseline = baseline(1000.0, None);
    let remote = checked(remote);
    assert!(check(&remote, "fixed_load_p50").is_none());
    assert!(check(&remote, "fixed_load_tail").is_some());
}

#[test]
fn single_messages_read_back_and_throughput_have_their_checks() {
    let mut single = sample_report(1.0, "a");
    single.batch = 1;
    single.message_size = 100;
    single.latency_us.p50 = 1530;
    let single = checked(single);
    // 3 x (10 us round trip + 500 us fdatasync).
    let c = check(&single, "single_message_p50").unwrap();
    assert_eq!((c.value, c.bound, c.pass), (1530.0, 1530.0, true));
    assert_eq!(single.checks.len(), 1, "{:?}", single.checks);

    let mut read = sample_report(100.0, "a");
    read.read_back = true;
    read.consumers = 2;
    read.consumer = Some(report::ConsumerReport {
        throughput_msgs_s: 499_000.0,
        throughput_mb_s: 499.0,
        latency_us: read.latency_us,
        messages: 1,
        ratio_to_loopback: 0.499,
        latency_kind: report::PER_POLL.into(),
        poll_batch: 1000,
    });
    let read = checked(read);
    let c = check(&read, "read_back").unwrap();
    assert_eq!((c.value, c.bound, c.pass), (0.499, 0.5, false));
    // Beside it, what the segments allow: the sample's disk reads 1200 MB/s, loopback 1000.
    let limit = c.limit.clone().expect("the segment read cap");
    assert!((limit.value - 1.2).abs() < 1e-9, "{limit:?}");
    assert!(limit.why.contains("1200 MB/s"), "{limit:?}");

    // 1000 B as fast as acks come, on disk: 0.5 for 3 replicas, 0.6 for 1.
    let three = checked(sample_report(100.0, "a"));
    let c = check(&three, "throughput").unwrap();
    assert_eq!((c.value, c.bound, c.pass), (0.5, 0.5, true));
    let mut one = sample_report(100.0, "a");
    one.replicas = Some(1);
    let one = checked(one);
    let c = check(&one, "throughput").unwrap();
    assert_eq!((c.bound, c.pass), (0.6, false));
    // Acknowledged from memory or of another size: the issue sets no such target.
    let mut memory = sample_report(100.0, "a");
    memory.acked = "memory".into();
    assert!(report::checks(&memory).is_empty());
    let mut small = sample_report(100.0, "a");
    small.message_size = 100;
    assert!(report::checks(&small).is_empty());
}

#[test]
fn compare_prints_the_checks_of_either_report() {
    let a = checked(sample_report(100.0, "a"));
    let mut b = sample_report(100.0, "b");
    b.rate_msgs_s = Some(10.0);
    let b = checked(b);
    let text = report::compare(&a, &b, "A", "B");
    let line = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("no {name}:\n{text}"))
            .to_string()
    };
    assert!(line("check.throughput").contains("PASS") && line("check.throughput").contains("null"));
    assert!(line("check.fixed_load_tail").contains("null"));
}

#[test]
fn family_sums_add_every_label_set_of_that_family_only() {
    let text = "# TYPE strand_replica_connections_open gauge\n\
                strand_replica_connections_open{shard=\"0\"} 2\n\
                strand_replica_connections_open{shard=\"1\"} 3\n\
                strand_replica_connections_opened 100\n\
                strand_status{plane=\"metadata\"} 0\n\
                strand_partition_groups{plane=\"partition\",shard=\"0\"} 4\n\
                strand_partition_groups_removed_total{plane=\"partition\",shard=\"0\"} 9\n\
                strand_bare 7\n";
    let sum = |n| cluster::family_sum(text, n);
    assert_eq!(sum("strand_replica_connections_open"), Some(5));
    assert_eq!(sum("strand_status"), Some(0));
    assert_eq!(sum("strand_partition_groups"), Some(4));
    assert_eq!(sum("strand_bare"), Some(7));
    assert_eq!(sum("strand_absent"), None);
    let dropped = "strand_replica_send_dropped_total{shard=\"0\",reason=\"not_connected\"} 4\n\
                   strand_replica_send_dropped_total{shard=\"0\",reason=\"queue_full\"} 1\n\
                   strand_replica_send_dropped_total{shard=\"1\",reason=\"not_connected\"} 2\n";
    let name = "strand_replica_send_dropped_total";
    assert_eq!(
        cluster::labelled_sum(dropped, name, "reason=\"not_connected\""),
        Some(6)
    );
    assert_eq!(cluster::labelled_sum(dropped, name, ""), Some(7));
    assert_eq!(cluster::labelled_sum(dropped, name, "reason=\"x\""), None);
}

#[test]
fn the_readiness_wait_expects_the_generated_configs_lanes() {
    let nodes = [cluster::NodePorts {
        tcp: 1,
        http: 2,
        tcp_replica: 3,
    }];
    let config = crate::config::load(
        &cluster::config_text(
            &nodes,
            &cluster::Spawned {
                ack: "disk",
                wal_size: None,
                read_cache: None,
                memory_prefault: None,
                congestion: None,
            },
        ),
        &crate::config::Overrides {
            shards: Some(1),
            available_cpus: vec![0],
            ..crate::config::Overrides::default()
        },
    )
    .unwrap();
    assert_eq!(
        u64::from(config.cluster.replica_lanes),
        cluster::BENCH_LANES
    );
}

#[test]
fn the_cluster_is_ready_only_when_every_node_says_so() {
    let with_prefault =
        |status: u64, open: u64, groups: u64, lost: u64, primaries: u64, pending: u64| {
            Some(format!(
                "strand_status{{plane=\"metadata\"}} {status}\n\
                 strand_replica_connections_open{{shard=\"0\"}} {open}\n\
                 strand_partition_groups{{plane=\"partition\",shard=\"0\"}} {groups}\n\
                 strand_partition_lost_groups{{plane=\"partition\",shard=\"0\"}} {lost}\n\
                 strand_partition_primaries{{plane=\"partition\",shard=\"0\"}} {primaries}\n\
                 strand_memory_prefault_pending_bytes {pending}\n"
            ))
        };
    let node = |status: u64, open: u64, groups: u64, lost: u64, primaries: u64| {
        with_prefault(status, open, groups, lost, primaries, 0)
    };
    // Three nodes, two partitions: node 0 leads both.
    let ready = vec![
        node(0, 2, 2, 0, 2),
        node(0, 2, 2, 0, 0),
        node(0, 2, 2, 0, 0),
    ];
    assert!(cluster::not_ready(&ready, 2, 2).is_empty());
    let mut cases = Vec::new();
    let mut one = |i: usize, text: Option<String>, why: &str| {
        let mut texts = ready.clone();
        texts[i] = text;
        cases.push((texts, why.to_string()));
    };
    one(2, node(0, 1, 2, 0, 0), "node 2: Some(1) of 2 connections");
    one(1, node(1, 2, 2, 0, 0), "node 1: metadata status Some(1)");
    one(
        1,
        node(0, 2, 1, 0, 0),
        "node 1: groups Some(1), lost Some(0)",
    );
    one(
        2,
        node(0, 2, 2, 1, 0),
        "node 2: groups Some(2), lost Some(1)",
    );
    one(0, node(0, 2, 2, 0, 1), "1 of 2 partition primaries");
    // Decision 513: a node still faulting in its memory is not ready for a measured load.
    one(
        1,
        with_prefault(0, 2, 2, 0, 0, 1 << 20),
        "node 1: memory prefault pending Some(1048576) bytes",
    );
    one(1, None, "node 1: /metrics unanswered");
    one(2, Some(String::new()), "node 2: None of 2 connections");
    for (texts, why) in cases {
        let missing = cluster::not_ready(&texts, 2, 2);
        assert!(missing.contains(&why), "{why}: {missing:?}");
    }
}

#[test]
fn write_bytes_come_from_the_io_file_and_grow_with_a_synced_write() {
    let io = "rchar: 10\nwchar: 20\nsyscr: 1\nsyscw: 2\nread_bytes: 4096\nwrite_bytes: 8192\n\
              cancelled_write_bytes: 0\n";
    assert_eq!(cluster::write_bytes_of_io(io), Some(8192));
    assert_eq!(cluster::write_bytes_of_io("rchar: 1\n"), None);
    assert_eq!(cluster::write_bytes_of_io("write_bytes: many\n"), None);
    // This process: a synced 1 MiB write shows in its own figure.
    let pid = std::process::id();
    let before = cluster::process_write_bytes(pid).expect("/proc/self/io readable");
    let path = std::env::temp_dir().join(format!("strand-bench-write-bytes-{pid}"));
    {
        use std::io::Write as _;
        let mut file = std::fs::File::create(&path).expect("create");
        file.write_all(&vec![7u8; 1 << 20]).expect("write");
        file.sync_all().expect("sync");
    }
    let after = cluster::process_write_bytes(pid).expect("/proc/self/io readable");
    let _ = std::fs::remove_file(&path);
    assert!(after >= before + (1 << 20), "{before} -> {after}");
}

/// Decision 511: the nodes' fresh-page faults and peak resident set come from `/proc`, and
/// touching memory the process never had shows in its own figure.
#[test]
fn minor_faults_and_the_resident_peak_come_from_proc_and_grow_with_fresh_pages() {
    // Fields: pid (comm) state ppid pgrp session tty tpgid flags minflt ...
    let stat = "4242 (str and) (x) S 1 2 3 4 5 6 77 8 9 10 250 130 11 12 20 0 1 0";
    assert_eq!(crate::memory::minor_faults_of_stat(stat), Some(77));
    assert_eq!(
        crate::memory::minor_faults_of_stat("4242 (cut) S 1 2"),
        None
    );
    assert_eq!(crate::memory::minor_faults_of_stat("no name here"), None);
    assert_eq!(crate::memory::stat_field(stat, 3), Some("S"));
    assert_eq!(
        crate::memory::stat_field(stat, 2),
        None,
        "the name is not a field here"
    );
    let status = "Name:\tstrand\nVmPeak:\t  9000 kB\nVmHWM:\t  5120 kB\nVmRSS:\t  4096 kB\n";
    let peak_of = |text| crate::memory::kb_field(text, "VmHWM:");
    assert_eq!(peak_of(status), Some(5120 * 1024));
    assert_eq!(peak_of("VmRSS:\t1 kB\n"), None);
    assert_eq!(peak_of("VmHWM:\tlots kB\n"), None);
    // This process: 64 MiB is above glibc's largest mmap threshold (32 MiB), so the block is
    // mapped fresh, and writing one byte per page faults every page in.
    let pid = std::process::id();
    let before = cluster::process_minor_faults(pid).expect("/proc/self/stat readable");
    let mut block: Vec<u8> = Vec::with_capacity(64 << 20);
    let pages = block.capacity() / 4096;
    block.resize(block.capacity(), 0);
    for page in block.chunks_mut(4096) {
        page[0] = 1;
    }
    std::hint::black_box(&block);
    let after = cluster::process_minor_faults(pid).expect("/proc/self/stat readable");
    assert!(
        after >= before + pages as u64 / 2,
        "{before} -> {after} for {pages} fresh pages"
    );
    let peak = cluster::process_resident_peak_bytes(pid).expect("/proc/self/status readable");
    assert!(peak >= 64 << 20, "peak {peak} with 64 MiB resident");
    drop(block);
    // The per-MB figure: 3000 faults over 2000 messages of 1000 B (2 MB) is 1500 per MB.
    assert_eq!(per_payload_mb(3000.0, 2000, 1000), Some(1500.0));
    assert_eq!(per_payload_mb(3000.0, 0, 1000), None);
}

#[test]
fn the_disk_cap_and_the_quorum_floor_come_from_the_same_run() {
    // 3 nodes writing 2 bytes per payload byte each to a 600 MB/s disk move at most 100 MB/s;
    // the ceiling is 200 MB/s (disk / 3 would be, the sample says 200), so the cap is 0.5.
    let mut r = sample_report(100.0, "aaa");
    assert_eq!(report::disk_cap_ratio(&r), None, "no write figure, no cap");
    r.disk_bytes_per_payload_byte = Some(2.0);
    let cap = report::disk_cap_ratio(&r).expect("a cap");
    assert!((cap - 0.5).abs() < 1e-9, "{cap}");
    let throughput = report::checks(&r)
        .into_iter()
        .find(|c| c.name == "throughput")
        .expect("the throughput check");
    let limit = throughput.limit.clone().expect("a limit beside the bound");
    assert!(
        (limit.value - 0.5).abs() < 1e-9 && limit.why.contains("2.00 bytes"),
        "{limit:?}"
    );
    assert!(report::check_line(&throughput).contains("allows at best 0.500"));
    // The quorum floor: 2 of 3 copies of the frame at 600 MB/s (bytes per µs).
    let (floor, why) = report::quorum_write_floor_us(&r).expect("a floor");
    let frame = super::send_frame_size(1000, 1000) as f64;
    assert!((floor - 2.0 * frame / 600.0).abs() < 1e-6, "{floor}");
    assert!(why.starts_with("2 cop"), "{why}");
    r.replicas = Some(1);
    assert!((report::quorum_write_floor_us(&r).unwrap().0 - frame / 600.0).abs() < 1e-6);
    // Under a fixed rate the p50 check carries the batch's first transfer, the floor and one
    // fdatasync.
    r.replicas = Some(3);
    r.rate_msgs_s = Some(1000.0);
    let p50 = report::checks(&r)
        .into_iter()
        .find(|c| c.name == "fixed_load_p50")
        .expect("the fixed-load p50 check");
    let fsync = r
        .baseline
        .fdatasync_us_p50
        .expect("sample has a fdatasync figure");
    let limit = p50.limit.expect("a floor");
    let transfer = frame / r.baseline.loopback_mb_s;
    assert!(
        (limit.value - (transfer + 2.0 * frame / 600.0 + fsync)).abs() < 1e-6,
        "{limit:?}"
    );
    assert!(limit.why.starts_with("the batch's first"), "{limit:?}");
    // Where the run measured its chain's copies reaching the disk, the limit is that
    // measurement (decision 509), not the bandwidth arithmetic.
    r.baseline.chain_writes = Some(baseline::ChainWrites {
        writers: 3,
        quorum: 2,
        stagger_us: transfer,
        rounds: 100,
        append_quorum_us_p50: 2500.0,
        overwrite_quorum_us_p50: 1400.0,
    });
    let p50 = report::checks(&r)
        .into_iter()
        .find(|c| c.name == "fixed_load_p50")
        .expect("the fixed-load p50 check");
    let limit = p50.limit.expect("a measured floor");
    assert!(
        (limit.value - (transfer + 2500.0)).abs() < 1e-6,
        "{limit:?}"
    );
    assert!(
        limit.why.contains("2 of 3 writers") && limit.why.contains("1400 us"),
        "{limit:?}"
    );
}

/// The chain probe (decision 509) runs every writer in every round, reports the quorum's
/// time, and leaves no file behind; a writer whose file cannot be written fails the probe
/// instead of leaving the others waiting at a barrier.
#[test]
fn the_chain_probe_times_a_quorum_of_staggered_writers_and_cleans_up() {
    use std::time::Duration;
    let dir = crate::scratch_dir("chain-probe");
    let budget = baseline::Budget {
        time: Duration::from_millis(50),
        round_trips: 1,
        disk_bytes_max: 1 << 30,
    };
    // Longer than any 64 KiB write here takes, so only the stagger can explain a quorum this
    // late.
    let stagger = Duration::from_millis(5);
    let c = baseline::chain_writes(&dir, 64 * 1024, 3, stagger, budget).expect("probe");
    assert_eq!((c.writers, c.quorum), (3, 2));
    assert!(c.rounds >= 5, "{c:?}");
    // The second writer starts a stagger after the first, so a quorum is never sooner.
    assert!(c.append_quorum_us_p50 >= 5000.0, "{c:?}");
    assert!(c.overwrite_quorum_us_p50 >= 5000.0, "{c:?}");
    assert!((c.stagger_us - 5000.0).abs() < 1e-6);
    let left: Vec<_> = std::fs::read_dir(&dir).expect("listed").collect();
    assert!(left.is_empty(), "{left:?}");
    let one = baseline::chain_writes(&dir, 4096, 1, stagger, budget).expect("probe");
    assert_eq!((one.writers, one.quorum), (1, 1));
    // A directory that is a file: every writer fails to open, none hangs.
    let file = dir.join("not-a-dir");
    std::fs::write(&file, b"x").expect("written");
    assert!(baseline::chain_writes(&file, 4096, 3, stagger, budget).is_err());
    std::fs::remove_dir_all(&dir).expect("removed");
}

/// Under a rate, two producers' batches fall half an interval apart, evenly spaced over time
/// (decision 442); with the phase left out they would all be due at the same instants.
#[test]
fn producers_under_a_rate_are_spread_evenly_in_time() {
    use std::time::{Duration, Instant};
    let started = Instant::now();
    let interval = Duration::from_millis(20);
    let producers = 2u32;
    let mut all: Vec<Instant> = (0..producers)
        .flat_map(|p| {
            let phase = super::load::phase_of(p, producers);
            (0..4).map(move |sent| super::load::due(started, interval, sent, phase))
        })
        .collect();
    all.sort();
    for pair in all.windows(2) {
        let gap = pair[1] - pair[0];
        assert!(
            gap.abs_diff(interval / 2) < Duration::from_micros(1),
            "batches {gap:?} apart, want {:?}",
            interval / 2
        );
    }
}

/// Decision 490: a report says whether its build ran the core's invariant sweep, the summary
/// warns about it, and a report written before the field existed reads as a build without it.
#[test]
fn a_build_with_the_invariant_sweep_is_named_in_the_report_and_the_summary() {
    let mut r = sample_report(100.0, "a");
    let text = |r: &report::Report| {
        let mut out = Vec::new();
        summary(r, &mut out).unwrap();
        String::from_utf8(out).unwrap()
    };
    assert!(!text(&r).contains("invariant sweep"), "{}", text(&r));
    r.invariant_sweep = true;
    assert!(text(&r).contains("warning: this build runs the consensus core's invariant sweep"));
    let json = serde_json::to_value(&r).unwrap();
    assert_eq!(json["invariant_sweep"], true);
    let mut old = json;
    old.as_object_mut().unwrap().remove("invariant_sweep");
    let read: report::Report = serde_json::from_value(old).unwrap();
    assert!(!read.invariant_sweep);
}

/// The nodes' CPU per GB divides the CPU of the whole span (probe, warm-up and load) by the
/// messages of that span, not of the recorded load alone: a `--warmup` or `--rate 50%` run
/// reported 2-5x its real cost before.
#[test]
fn cpu_per_gb_is_over_the_span_the_cpu_was_measured_over() {
    let before = load::Before {
        messages: 1_000_000,
        ..load::Before::default()
    };
    assert_eq!(cpu_per_gb(4.0, 1_000_000, &before, 1000), Some(2.0));
    assert_eq!(
        cpu_per_gb(4.0, 1_000_000, &load::Before::default(), 1000),
        Some(4.0)
    );
    assert_eq!(cpu_per_gb(1.0, 0, &load::Before::default(), 1000), None);
}

/// Decision 516: a chain of nodes with no server in it passes every batch down the chain, and
/// every node appends each one durably; the producers count a batch once the first quorum
/// had it. So each node's segments hold exactly the acknowledged batches, and the files go.
#[test]
fn the_chain_load_probe_writes_every_batch_on_every_node_and_cleans_up() {
    use std::time::Duration;
    let dir = crate::scratch_dir("chain-load");
    let size = 64 * 1024;
    let load = |time: Duration, bytes_max: u64| chain_load::Load {
        write_size: size,
        producers: 2,
        time,
        bytes_max,
    };
    for nodes in [3u32, 1] {
        let run = chain_load::run_chain(
            &dir,
            load(Duration::from_millis(200), 64 << 20),
            nodes,
            None,
        )
        .expect("probe");
        assert!(run.acked > 0 && run.batches_s > 0.0, "{run:?}");
        assert_eq!(
            run.appended,
            vec![run.acked * size as u64; nodes as usize],
            "every node appends every acknowledged batch"
        );
        let left: Vec<_> = std::fs::read_dir(&dir).expect("listed").collect();
        assert!(left.is_empty(), "{left:?}");
    }
    // The byte bound ends the span early: 2 producers x 3 nodes x 64 KiB is one round.
    let bounded = chain_load::run_chain(
        &dir,
        load(Duration::from_secs(600), 3 * size as u64),
        3,
        None,
    )
    .expect("probe");
    assert!(bounded.measured < Duration::from_secs(600), "{bounded:?}");
    let small = |producers: u32| chain_load::Load {
        write_size: 5000,
        producers,
        time: Duration::from_millis(100),
        bytes_max: 1 << 30,
    };
    let both = chain_load::chain_load(&dir, small(1), 3, None).expect("probe");
    assert_eq!(
        (both.replicas, both.producers, both.write_size),
        (3, 1, 8192)
    );
    assert!((both.ratio - both.chain_batches_s / both.single_batches_s).abs() < 1e-9);
    // One replica: the chain is the node alone, measured once.
    let one = chain_load::chain_load(&dir, small(1), 1, None).expect("probe");
    assert_eq!((one.replicas, one.ratio), (1, 1.0));
    assert_eq!(one.chain_batches_s, one.single_batches_s);
    // A directory that is a file: the probe fails, and does not hang.
    let file = dir.join("not-a-dir");
    std::fs::write(&file, b"x").expect("written");
    assert!(
        chain_load::run_chain(&file, load(Duration::from_millis(50), 1 << 30), 3, None).is_err()
    );
    std::fs::remove_dir_all(&dir).expect("removed");
}

/// Decision 516: `compare` checks a 1-replica and a 3-replica run of 100-byte batches against
/// the 3 / 1 target, under the 3-replica run whichever side it is on, with the limit that run
/// measured; other pairs have no such row.
#[test]
fn compare_checks_the_replica_ratio_of_a_matching_pair() {
    let shaped = |replicas: u32, msgs: f64| {
        let mut r = sample_report(1.0, "x");
        r.replicas = Some(replicas);
        r.message_size = 100;
        r.throughput_msgs_s = msgs;
        r
    };
    let single = shaped(1, 3_000_000.0);
    let mut replicated = shaped(3, 1_600_000.0);
    replicated.baseline.chain_load = Some(chain_load::ChainLoad {
        replicas: 3,
        producers: 2,
        write_size: 151_552,
        chain_batches_s: 2_500.0,
        single_batches_s: 4_700.0,
        ratio: 2_500.0 / 4_700.0,
        measured_s: 2.0,
    });
    let check = report::replica_ratio(&single, &replicated).expect("a matching pair");
    assert!(
        !check.pass && (check.value - 1.6 / 3.0).abs() < 1e-9,
        "{check:?}"
    );
    assert!((check.limit.as_ref().expect("measured").value - 0.532).abs() < 1e-3);
    let line = |text: &str, name: &str| {
        text.lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .unwrap_or_else(|| panic!("no {name}:\n{text}"))
            .split_whitespace()
            .skip(1)
            .collect::<Vec<_>>()
            .join(" ")
    };
    let text = report::compare(&single, &replicated, "A", "B");
    assert_eq!(
        line(&text, "check.replica_ratio"),
        "null 0.533 / 0.600 FAIL"
    );
    assert_eq!(line(&text, "check.replica_ratio.limit"), "null 0.532");
    let text = report::compare(&replicated, &single, "A", "B");
    assert_eq!(
        line(&text, "check.replica_ratio"),
        "0.533 / 0.600 FAIL null"
    );
    // 1000-byte messages, a fixed load, or other producers: not the target's pair.
    for change in [
        (|r: &mut report::Report| r.message_size = 1000) as fn(&mut report::Report),
        |r| r.rate_msgs_s = Some(1.0),
        |r| r.producers = 3,
    ] {
        let mut other = replicated.clone();
        change(&mut other);
        assert!(report::replica_ratio(&single, &other).is_none());
        assert!(!report::compare(&single, &other, "A", "B").contains("check.replica_ratio"));
    }
    let mut passing = replicated.clone();
    passing.throughput_msgs_s = 1_900_000.0;
    assert!(report::replica_ratio(&single, &passing).expect("pair").pass);
}

/// Decision 516: the throughput check's limit is the lower of the disk cap and what the run's
/// chain with no server in it moved over the ceiling.
#[test]
fn the_throughput_limit_is_the_lower_of_the_disk_cap_and_the_chain() {
    let chain = |batches_s: f64| chain_load::ChainLoad {
        replicas: 3,
        producers: 2,
        write_size: 1 << 20,
        chain_batches_s: batches_s,
        single_batches_s: 2.0 * batches_s,
        ratio: 0.5,
        measured_s: 2.0,
    };
    let mut r = sample_report(120.0, "x");
    // 600 MB/s of disk, 3 nodes writing 1 byte per payload byte, a ceiling of 200: cap 1.0.
    r.disk_bytes_per_payload_byte = Some(1.0);
    let limit = |r: &report::Report| {
        check(&checked(r.clone()), "throughput")
            .and_then(|c| c.limit.clone())
            .expect("a limit")
    };
    assert!((limit(&r).value - 1.0).abs() < 1e-9, "the disk cap alone");
    // 150 batches/s of 1000 x 1000 B is 150 MB/s: 0.75 of the ceiling, under the cap.
    r.baseline.chain_load = Some(chain(150.0));
    let l = limit(&r);
    assert!((l.value - 0.75).abs() < 1e-9, "{l:?}");
    assert!(l.why.contains("no server"), "{l:?}");
    r.baseline.chain_load = Some(chain(250.0));
    assert!(
        (limit(&r).value - 1.0).abs() < 1e-9,
        "the cap when it is lower"
    );
    r.disk_bytes_per_payload_byte = None;
    assert!((limit(&r).value - 1.25).abs() < 1e-9, "the chain alone");
}
