//! `strand bench` end to end against the sink (the harness, its client, the report files and
//! `compare`), the baseline probes, the CLI's refusals, and `--spawn` up to the cluster's
//! client port. Nothing here asserts on wall time: figures are checked for sanity (positive,
//! finite, ordered percentiles, counts that add up), never for speed.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use server::bench::{self, BenchArgs, RunArgs, baseline, report, sink::Sink};

fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("strand-bench-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn parse(args: &[&str]) -> RunArgs {
    #[derive(Debug, clap::Parser)]
    struct Top {
        #[command(flatten)]
        bench: BenchArgs,
    }
    let top =
        <Top as clap::Parser>::try_parse_from(std::iter::once("bench").chain(args.iter().copied()))
            .unwrap();
    top.bench.run
}

fn strand() -> Command {
    Command::new(env!("CARGO_BIN_EXE_strand"))
}

/// Every key issue 12 item 3 names, as a JSON path.
const KEYS: &[&str] = &[
    "throughput_msgs_s",
    "throughput_mb_s",
    "latency_us.p50",
    "latency_us.p90",
    "latency_us.p99",
    "latency_us.p999",
    "latency_us.max",
    "baseline.loopback_mb_s",
    "baseline.rtt_us_p50",
    "baseline.rtt_us_p99",
    "baseline.disk_write_mb_s",
    "baseline.fdatasync_us_p50",
    "ceiling_mb_s",
    "ratio_to_ceiling",
    "ratio_to_loopback",
    "replicas",
    "message_size",
    "batch",
    "acked",
    "consumer.throughput_msgs_s",
    "consumer.throughput_mb_s",
    "consumer.latency_us.p50",
    "consumer.latency_us.p90",
    "consumer.latency_us.p99",
    "consumer.latency_us.p999",
    "consumer.latency_us.max",
    "commit",
];

fn at<'a>(json: &'a serde_json::Value, path: &str) -> Option<&'a serde_json::Value> {
    path.split('.').try_fold(json, |v, k| v.as_object()?.get(k))
}

fn positive(json: &serde_json::Value, path: &str) -> f64 {
    let v = at(json, path)
        .and_then(|v| v.as_f64())
        .unwrap_or_else(|| panic!("{path} is not a number"));
    assert!(v.is_finite() && v > 0.0, "{path} = {v}");
    v
}

fn ordered(json: &serde_json::Value, prefix: &str) {
    let v: Vec<f64> = ["p50", "p90", "p99", "p999", "max"]
        .iter()
        .map(|k| positive(json, &format!("{prefix}.{k}")))
        .collect();
    assert!(v.windows(2).all(|w| w[0] <= w[1]), "{prefix}: {v:?}");
}

fn run_against_sink(out: &Path, extra: &[&str]) -> (report::Report, Sink) {
    run_against(Sink::spawn("127.0.0.1:0").unwrap(), out, extra)
}

fn run_against(sink: Sink, out: &Path, extra: &[&str]) -> (report::Report, Sink) {
    let addr = sink.addr().to_string();
    let out_s = out.to_str().unwrap();
    let mut args = vec![
        "--address",
        &addr,
        "--producers",
        "2",
        "--consumers",
        "2",
        "--partitions",
        "3",
        "--message-size",
        "100",
        "--batch",
        "50",
        "--baseline-seconds",
        "0.1",
        "--out",
        out_s,
    ];
    args.extend_from_slice(extra);
    let report = bench::run(&parse(&args), Path::new(env!("CARGO_BIN_EXE_strand"))).unwrap();
    (report, sink)
}

#[test]
fn the_harness_against_the_sink_writes_a_sane_report() {
    let out = scratch("sink");
    let (report, sink) = run_against_sink(&out, &["--messages", "20000", "--warmup", "0.3"]);
    // 20000 messages = 400 batches of 50, shared by 2 producers over 3 partitions.
    assert_eq!(report.messages, 20_000);
    assert_eq!(
        sink.rejected(),
        0,
        "the sink refused a batch the client framed"
    );
    // The warm-up's batches reached the sink but are not the load's: the report counts only
    // what was sent after the clock started, and the consumers start after the warm-up.
    let before = report.before_clock.clone().unwrap();
    assert_eq!(before.warmup_s, 0.3);
    assert!(before.unrecorded_messages > 0, "{before:?}");
    assert!(
        before.waited_for.is_none(),
        "nothing to wait for at --address"
    );
    let appended: u64 = (0..3).map(|p| sink.appended(p)).sum();
    assert_eq!(appended, 20_000 + before.unrecorded_messages);
    let consumer = report.consumer.clone().unwrap();
    assert_eq!(consumer.messages, 20_000, "consumers read the load back");
    assert_eq!(consumer.latency_kind, report::END_TO_END);
    assert!(!report.read_back && report.replica_sends_dropped_not_connected.is_none());

    let text = std::fs::read_to_string(out.join(report::JSON)).unwrap();
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    for key in KEYS {
        assert!(at(&json, key).is_some(), "report.json lacks {key}");
    }
    positive(&json, "throughput_msgs_s");
    let mb = positive(&json, "throughput_mb_s");
    let msgs = positive(&json, "throughput_msgs_s");
    assert!(
        (mb - msgs * 100.0 / 1e6).abs() < 1e-6 * mb.max(1.0),
        "{mb} vs {msgs}"
    );
    ordered(&json, "latency_us");
    ordered(&json, "consumer.latency_us");
    let loopback = positive(&json, "baseline.loopback_mb_s");
    assert!(positive(&json, "baseline.rtt_us_p50") <= positive(&json, "baseline.rtt_us_p99"));
    // Against --address: no disk figure, acknowledgement unknown, replicas from the roster
    // the sink answers GetClusterMetadata with (one node).
    assert!(at(&json, "baseline.disk_write_mb_s").unwrap().is_null());
    assert!(at(&json, "baseline.fdatasync_us_p50").unwrap().is_null());
    assert_eq!(json["acked"], "unknown");
    assert_eq!(json["replicas"], 1);
    assert_eq!(json["message_size"], 100);
    assert_eq!(json["batch"], 50);
    let ceiling = positive(&json, "ceiling_mb_s");
    assert_eq!(ceiling, loopback);
    let ratio = positive(&json, "ratio_to_ceiling");
    assert!((ratio - mb / ceiling).abs() < 1e-9, "{ratio}");
    assert_eq!(
        json["commit"].as_str().unwrap().len(),
        40,
        "{}",
        json["commit"]
    );
    assert!(!json["timeline"].as_array().unwrap().is_empty());

    let svg = std::fs::read_to_string(out.join(report::SVG)).unwrap();
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    assert!(svg.matches("<polyline").count() >= 3, "{svg}");
    for hgrm in [report::PRODUCER_HGRM, report::CONSUMER_HGRM] {
        let text = std::fs::read_to_string(out.join(hgrm)).unwrap();
        assert!(
            text.contains("Percentile") && text.contains("#[Max"),
            "{text}"
        );
    }

    // compare: the binary prints both reports side by side.
    let b = scratch("sink-b");
    let (_, _) = run_against_sink(&b, &["--messages", "5000"]);
    let (a_path, b_path) = (out.join(report::JSON), b.join(report::JSON));
    let output = strand()
        .args(["bench", "compare"])
        .arg(&a_path)
        .arg(&b_path)
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let text = String::from_utf8(output.stdout).unwrap();
    assert!(text.contains(a_path.to_str().unwrap()) && text.contains(b_path.to_str().unwrap()));
    for row in [
        "throughput_mb_s",
        "latency_us.p99",
        "baseline.loopback_mb_s",
        "consumer.throughput_msgs_s",
    ] {
        assert!(
            text.lines().any(|l| l.starts_with(row)),
            "no {row} row:\n{text}"
        );
    }
}

/// A node that answers 57/58 (not committed / not accepted yet) gets the same request again,
/// as the SDK does; nothing is lost or doubled, and the report counts the repeats.
#[test]
fn transient_refusals_are_repeated_not_fatal() {
    let out = scratch("transient");
    let sink = Sink::spawn_refusing("127.0.0.1:0", 3).unwrap();
    let (report, sink) = run_against(sink, &out, &["--messages", "5000", "--warmup", "0"]);
    assert_eq!(report.messages, 5000);
    assert_eq!(report.before_clock.as_ref().unwrap().unrecorded_messages, 0);
    let appended: u64 = (0..3).map(|p| sink.appended(p)).sum();
    assert_eq!(
        appended, 5000,
        "a refused send was not appended, its repeat was"
    );
    assert_eq!(report.consumer.unwrap().messages, 5000);
    assert!(sink.refused() >= 3 * 5, "{}", sink.refused());
    // The setup connection's repeats are not the load's; every worker was refused 3 times
    // (Register, then its first sends or polls).
    assert!(
        report.transient_retries >= 4 * 3,
        "{}",
        report.transient_retries
    );
}

/// The SDK reads a reply's operation only to pick the body framing; a CreateTopic answered as
/// CreateTopicWithAssignments (64, same framing) is accepted, one that changes the framing is
/// not.
#[test]
fn a_reply_echoing_an_operation_of_the_same_framing_is_accepted() {
    let out = scratch("echo");
    let sink = Sink::spawn_with("127.0.0.1:0", 0, Some(64)).unwrap();
    let (report, _sink) = run_against(sink, &out, &["--messages", "1000"]);
    assert_eq!(report.messages, 1000);
    let sink = Sink::spawn_with("127.0.0.1:0", 0, Some(160)).unwrap();
    let args = parse(&[
        "--address",
        &sink.addr().to_string(),
        "--baseline-seconds",
        "0.05",
    ]);
    let error = bench::run(&args, Path::new(env!("CARGO_BIN_EXE_strand"))).unwrap_err();
    assert!(
        format!("{error:#}").contains("reply echoes operation 160"),
        "{error:#}"
    );
}

/// `--read-back`: the consumers wait for the producers, then read back exactly what the load
/// produced, in polls of `--poll-batch`, timed per poll.
#[test]
fn read_back_consumers_start_after_the_producers_and_read_the_load_back() {
    let out = scratch("read-back");
    let (report, sink) = run_against_sink(
        &out,
        &[
            "--messages",
            "6000",
            "--warmup",
            "0.1",
            "--read-back",
            "--poll-batch",
            "50",
        ],
    );
    assert!(report.read_back);
    let consumer = report.consumer.clone().unwrap();
    assert_eq!(consumer.messages, 6000);
    assert_eq!(consumer.latency_kind, report::PER_POLL);
    assert_eq!(consumer.poll_batch, 50);
    let appended: u64 = (0..3).map(|p| sink.appended(p)).sum();
    assert_eq!(
        appended,
        6000 + report.before_clock.as_ref().unwrap().unrecorded_messages
    );
    // The read-back is its own phase: no batch is produced in a timeline interval after the
    // first one in which the consumers read.
    let first_read = report
        .timeline
        .iter()
        .position(|p| p.consumed_mb_s > 0.0)
        .unwrap();
    let last_sent = report
        .timeline
        .iter()
        .rposition(|p| p.produced_mb_s > 0.0)
        .unwrap();
    assert!(
        first_read >= last_sent,
        "read at {first_read}, sent at {last_sent}"
    );
    let check = report
        .checks
        .iter()
        .find(|c| c.name == "read_back")
        .unwrap();
    assert_eq!(check.bound, 0.5);
    assert_eq!(check.value, consumer.ratio_to_loopback);
}

#[test]
fn a_rate_limited_run_offers_what_it_was_told() {
    let out = scratch("rate");
    // 2 producers x 2 batches of 50 at 400 msgs/s: each producer sends a batch every 0.25 s.
    let (report, _sink) = run_against_sink(
        &out,
        &["--messages", "200", "--rate", "400", "--warmup", "0"],
    );
    assert_eq!(report.messages, 200);
    assert_eq!(report.rate_msgs_s, Some(400.0));
    assert!(report.checks.iter().any(|c| c.name == "fixed_load_tail"));
    // The schedule spaces each producer's two batches 0.25 s apart, so the run lasts at least
    // that long whatever the machine's speed (a bound from below, not a timing assertion).
    assert!(report.duration_s >= 0.25, "{}", report.duration_s);

    // `--rate 50%`: a probe as fast as the sink answers, then half of it.
    let out = scratch("rate-of-max");
    let (report, sink) = run_against_sink(
        &out,
        &[
            "--messages",
            "2000",
            "--rate",
            "50%",
            "--probe-seconds",
            "0.3",
            "--warmup",
            "0",
        ],
    );
    let before = report.before_clock.clone().unwrap();
    let max = before.probe_msgs_s.unwrap();
    assert!(max > 0.0 && before.unrecorded_messages > 0, "{before:?}");
    assert_eq!(report.rate_msgs_s, Some((max * 0.5).max(50.0)));
    assert_eq!(report.messages, 2000);
    let appended: u64 = (0..3).map(|p| sink.appended(p)).sum();
    assert_eq!(appended, 2000 + before.unrecorded_messages);
}

#[test]
fn the_baseline_probes_return_plausible_numbers() {
    let dir = scratch("probe");
    let budget = baseline::Budget {
        time: Duration::from_millis(100),
        round_trips: 200,
        disk_bytes_max: 8 << 20,
    };
    let b = baseline::measure(1 << 20, Some(&dir), budget, None).unwrap();
    assert!(
        b.loopback_mb_s.is_finite() && b.loopback_mb_s > 0.0,
        "{b:?}"
    );
    assert!(b.rtt_us_p50 > 0.0 && b.rtt_us_p50 <= b.rtt_us_p99, "{b:?}");
    let disk = b.disk_write_mb_s.unwrap();
    assert!(disk.is_finite() && disk > 0.0, "{b:?}");
    assert!(b.fdatasync_us_p50.unwrap() > 0.0, "{b:?}");
    assert!(b.disk_direct_io.is_some());
    let read = b.disk_read_mb_s.unwrap();
    assert!(read.is_finite() && read > 0.0, "{b:?}");
    let probe = baseline::disk(&dir, 5000, budget).unwrap();
    assert!(probe.writes >= 4, "{probe:?}");
    assert!(probe.read_mb_s > 0.0, "{probe:?}");
    assert!(
        !dir.join(".strand-bench-disk-probe").exists(),
        "the probe file is removed"
    );
}

fn refusal(args: &[&str]) -> String {
    let output = strand().arg("bench").args(args).output().unwrap();
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    String::from_utf8(output.stderr).unwrap()
}

#[test]
fn cli_refusals_name_the_flag() {
    assert!(refusal(&["--duration", "1"]).contains("--address HOST:PORT"));
    assert!(refusal(&["--address", "127.0.0.1:1", "--ack", "memory"]).contains("--ack memory"));
    let big = refusal(&["--address", "127.0.0.1:1", "--batch", "100000"]);
    assert!(
        big.contains("--batch 100000 x --message-size 1000"),
        "{big}"
    );
    assert!(refusal(&["--spawn", "3", "--address", "127.0.0.1:1"]).contains("--spawn"));
    assert!(refusal(&["--spawn", "12"]).contains("--spawn"));
    assert!(refusal(&["--messages", "1", "--duration", "1"]).contains("--duration"));
    assert!(refusal(&["--address", "nowhere.invalid:1"]).contains("--address nowhere.invalid:1"));
    let missing = refusal(&["compare", "/nonexistent/a.json", "/nonexistent/b.json"]);
    assert!(missing.contains("/nonexistent/a.json"), "{missing}");
    // A closed port: the error names the address and the client plane.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let closed = refusal(&[
        "--address",
        &format!("127.0.0.1:{port}"),
        "--baseline-seconds",
        "0.05",
    ]);
    assert!(
        closed.contains(&format!("connecting to 127.0.0.1:{port}")),
        "{closed}"
    );
}

/// `--spawn 1`: the baselines include the disk, the node starts from the generated config and
/// becomes primary, the load runs against its client plane and partition groups, and the
/// report says `acked disk` with every message sent. The given --data-dir is kept; the node
/// is stopped.
#[test]
fn spawn_starts_a_cluster_and_reaches_its_client_port() {
    let dir = scratch("spawn");
    let out = dir.join("out");
    let output = strand()
        .args([
            "bench",
            "--spawn",
            "1",
            "--messages",
            "2000",
            "--batch",
            "100",
            "--message-size",
            "100",
            "--baseline-seconds",
            "0.1",
            "--data-dir",
        ])
        .arg(dir.join("cluster"))
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("node 0 is primary"), "{stderr}");
    assert!(dir.join("cluster/strand-bench.toml").exists());
    assert!(output.status.success(), "{stderr}");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join(report::JSON)).unwrap()).unwrap();
    assert_eq!(json["acked"], "disk");
    assert_eq!(json["replicas"], 1);
    assert!(json["baseline"]["disk_write_mb_s"].as_f64().unwrap() > 0.0);
    // One node with no server in it, measured after the load (decision 516).
    let chain = &json["baseline"]["chain_load"];
    assert_eq!(chain["replicas"], 1, "{chain}");
    assert!(chain["single_batches_s"].as_f64().unwrap() > 0.0, "{chain}");
    assert_eq!(json["messages"], 2000);
    assert!(
        json["before_clock"]["waited_for"]
            .as_str()
            .unwrap()
            .contains("0 replica connection(s) open, 1 partition group(s)"),
        "{}",
        json["before_clock"]
    );
    assert_eq!(
        json["before_clock"]["warmup_s"], 0.0,
        "no warm-up by default with --spawn"
    );
    assert_eq!(json["replica_sends_dropped_not_connected"], 0);
    assert!(out.join(report::SVG).exists());
    // The node was stopped: its log ends and no process holds the data directory's lock.
    let log = std::fs::read_to_string(dir.join("cluster/node-0.log")).unwrap();
    assert!(!log.is_empty());
}

/// `--spawn 3`: the harness waits until every node reports its peers connected and the
/// partitions' groups led (decision 360), so no replica send finds its connection missing
/// while the load runs; `--rate 50%` probes and then offers half; `--read-back` reads the
/// load back from the three-node cluster; the summary prints each target's check.
#[test]
fn spawn_three_waits_for_its_peers_probes_and_reads_back() {
    let dir = scratch("spawn3");
    let out = dir.join("out");
    let output = strand()
        .args([
            "bench",
            "--spawn",
            "3",
            "--memory-prefault",
            "0",
            "--producers",
            "2",
            "--consumers",
            "2",
            "--partitions",
            "2",
            "--messages",
            "4000",
            "--batch",
            "100",
            "--message-size",
            "100",
            "--rate",
            "50%",
            "--probe-seconds",
            "0.5",
            "--read-back",
            "--baseline-seconds",
            "0.1",
            "--out",
        ])
        .arg(&out)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stderr}");
    assert!(stderr.contains("ready after"), "{stderr}");
    let report: report::Report =
        serde_json::from_str(&std::fs::read_to_string(out.join(report::JSON)).unwrap()).unwrap();
    let before = report.before_clock.clone().unwrap();
    let waited = before.waited_for.unwrap();
    assert!(
        waited.contains("2 replica connection(s) open") && waited.contains("2 partition primaries"),
        "{waited}"
    );
    assert_eq!(
        report.replica_sends_dropped_not_connected,
        Some(0),
        "a replica send found no connection during the load"
    );
    assert!(before.probe_msgs_s.unwrap() > 0.0);
    assert_eq!(report.messages, 4000);
    let consumer = report.consumer.clone().unwrap();
    assert_eq!(consumer.messages, 4000);
    assert_eq!(consumer.latency_kind, report::PER_POLL);
    for name in ["fixed_load_tail", "fixed_load_p50", "read_back"] {
        let check = report.checks.iter().find(|c| c.name == name);
        let check = check.unwrap_or_else(|| panic!("no {name} check: {:?}", report.checks));
        assert!(check.bound > 0.0 && check.value > 0.0, "{check:?}");
        assert!(
            stdout.contains(&format!("target {name}: ")),
            "{name} not in the summary:\n{stdout}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
