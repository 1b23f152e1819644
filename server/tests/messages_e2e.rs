//! Messages end to end through three real `strand start` processes on loopback (issue 10 items
//! 4 and 8): a raw client logs in on the metadata primary, creates a stream and a topic of two
//! partitions, sends batches to both partitions (explicit partitioning) on the node that is
//! the partition groups' primary, polls them back by offset on every node and compares
//! payloads and offsets, stores and reads a consumer offset. Then a backup is SIGKILLed, more
//! messages are acknowledged by the two survivors, the backup restarts and reads back every
//! acknowledged message in order; all three are SIGKILLed and restarted and every node still
//! reads every acknowledged message; finally the partition primary is SIGKILLed, the
//! survivors elect a new primary of both groups, which acknowledges more, and both survivors
//! read everything.
//!
//! Node 0 runs two shards (one group on each) and the others one: on node 0 a client's
//! connection lives on one shard and one of the two partitions' requests and reads cross the
//! shard mesh to the other (`ShardMsg::Partition` / `Read`, replies back on the reply lane).
//!
//! Every wait is bounded; nothing asserts on elapsed time.

mod common;

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::client::{
    CREATE_STREAM, CREATE_TOPIC, Client, GET_CLUSTER_METADATA, SEND_MESSAGES, cluster_roles, frame,
    name, send_body, topic_body,
};
use common::{Node, eventually, kill_all, partition_sum, payload};
use server::client::codec::PollingStrategy;
use server::client::reply::decode_send_reply;

const SHARDS: [u8; 3] = [2, 1, 1];
/// `cluster.replica_lanes` (the default).
const LANES: u16 = 16;

/// The first stream id whose topic 0 has partitions 0 and 1 on different shards of a
/// two-shard node, so node 0 runs one group on each shard.
fn stream_id() -> u32 {
    let shard = |stream: u32, partition: u32| {
        let group = wire::GroupId::partition(wire::PartitionKey {
            stream,
            topic: 0,
            partition,
        })
        .unwrap();
        shard::mapping::shard_of(group, LANES, 2)
    };
    (0..64).find(|&s| shard(s, 0) != shard(s, 1)).unwrap()
}

fn spawn(config: &Path, node: &mut Node, log: &Path) {
    common::spawn_plain(config, node, log, SHARDS[usize::from(node.id)]);
}

/// The nodes' `partition.read_cache_bytes` in the first test.
const READ_CACHE: &str = "64 KiB";

/// Sends `batches` batches of three 20,000-byte messages alternating over both partitions.
fn send_big(c: &mut Client, acked: &mut Acked, first: usize, batches: usize) {
    for b in first..first + batches {
        let partition = (b % 2) as u32;
        let payloads: Vec<Vec<u8>> = (0..3)
            .map(|i| {
                let mut p = payload(b, i);
                p.resize(20_000, (b * 7 + i) as u8);
                p
            })
            .collect();
        let (confirmed, base) = c.send(stream_id(), partition, &payloads);
        let list = &mut acked[partition as usize];
        assert_eq!((confirmed, base), (partition, list.len() as u64));
        for (i, p) in payloads.into_iter().enumerate() {
            list.push((base + i as u64, p));
        }
    }
}

/// What the test acknowledged: per partition, `(offset, payload)` in offset order.
type Acked = [Vec<(u64, Vec<u8>)>; 2];

fn send_batches(c: &mut Client, acked: &mut Acked, first: usize, batches: usize) {
    common::send_batches(c, stream_id(), acked, first, batches);
}

fn reads_back(tcp: u16, client: u128, acked: &Acked, logs: &Path, what: &str) {
    common::reads_back(tcp, client, stream_id(), acked, logs, what);
}

fn partition_primary(nodes: &[Node], live: &[usize], logs: &Path) -> usize {
    common::partition_primary(nodes, live, 2, logs)
}

fn metadata_primary(nodes: &[Node], logs: &Path) -> usize {
    let all: Vec<&Node> = nodes.iter().collect();
    let metrics = common::wait_until("one metadata primary", &all, logs, common::one_primary);
    metrics.iter().position(|m| m["is_primary"] == 1).unwrap()
}

#[test]
fn messages_are_sent_polled_and_survive_a_killed_backup_and_a_full_restart() {
    let _serial = common::serial();
    let dir = common::scratch("messages");
    let ports = common::free_ports(9);
    let config_path = dir.join("strand.toml");
    // A small read cache: older polls read the segments (decision 280), here and after the
    // restarts (the boot rebuilds only the tail).
    let extra = format!("[partition]\nread_cache_bytes = \"{READ_CACHE}\"");
    std::fs::write(
        &config_path,
        common::config("messages-e2e", 3, &ports, &extra),
    )
    .unwrap();
    let logs = dir.join("nodes.log");
    let mut nodes = common::nodes(&dir, 3, &ports);
    let tcp = |i: usize| ports[i * 3];
    for node in nodes.iter_mut() {
        spawn(&config_path, node, &logs);
    }
    common::run_killed(&mut nodes, &logs, &dir, |nodes| {
        let mp = metadata_primary(nodes, &logs);

        // 1. On the metadata primary: log in, create streams up to the one whose two
        // partitions land on different shards of node 0, and there a topic of two partitions.
        let mut admin = Client::connect(tcp(mp), 0xAD);
        admin.login();
        for s in 0..=stream_id() {
            let answer = admin.replicated(CREATE_STREAM, &name(&format!("orders-{s}")));
            assert_eq!(answer.result(), 0);
        }
        let topic = topic_body(stream_id(), 2, "events");
        assert_eq!(admin.replicated(CREATE_TOPIC, &topic).result(), 0);

        // 2. Every node runs both groups; send on their primary (partition primaries do not
        // follow the metadata primary yet).
        let pp = partition_primary(nodes, &[0, 1, 2], &logs);
        eprintln!("metadata primary n{mp}, partition primary n{pp}");
        let n0 = common::scrape(nodes[0].http).unwrap();
        let per_shard: Vec<u64> = (0..2)
            .map(|s| n0[&format!("strand_partition_groups{{plane=\"partition\",shard=\"{s}\"}}")])
            .collect();
        assert_eq!(per_shard, [1, 1], "n0 runs one group on each shard");
        let mut producer = Client::connect(tcp(pp), 0xB0B);
        producer.login();
        let mut acked: Acked = [Vec::new(), Vec::new()];
        send_batches(&mut producer, &mut acked, 0, 10);
        // Read-your-writes on the primary: every acknowledged message is committed there.
        let got = producer.poll(stream_id(), 1).unwrap();
        assert_eq!(got, acked[1], "the primary polls what it acknowledged");
        for i in 0..3 {
            reads_back(tcp(i), 0xC0 + i as u128, &acked, &logs, &format!("n{i}"));
        }

        // 3. A consumer offset: stored through the group, read back on every node.
        assert_eq!(
            producer.store_offset(stream_id(), 1, 4),
            0,
            "StoreConsumerOffset"
        );
        let stored = producer
            .consumer_offset(stream_id(), 1)
            .expect("an offset is stored");
        assert_eq!(
            (
                stored.partition_id,
                stored.stored_offset,
                stored.current_offset
            ),
            (1, 4, acked[1].len() as u64 - 1)
        );
        assert_eq!(
            producer.consumer_offset(stream_id(), 0),
            None,
            "nothing stored on partition 0"
        );
        for i in 0..3 {
            let mut c = Client::connect(tcp(i), 0xD0 + i as u128);
            c.login();
            eventually(&format!("n{i} reads the stored offset"), &logs, || {
                c.consumer_offset(stream_id(), 1)
                    .filter(|o| o.stored_offset == 4)
                    .map(|_| ())
            });
        }

        // Auto-commit: a Next poll stores the last offset it returned, so the next Next poll
        // continues after it (consumer 7 has nothing stored on partition 0 yet).
        let next = |c: &mut Client| {
            c.poll_with(stream_id(), 0, PollingStrategy::Next(0), 5, true)
                .expect("a Next poll")
        };
        assert_eq!(next(&mut producer), acked[0][0..5]);
        assert_eq!(next(&mut producer), acked[0][5..10]);
        let stored = producer
            .consumer_offset(stream_id(), 0)
            .expect("auto-commit stored an offset");
        assert_eq!(stored.stored_offset, 9);

        // 4. SIGKILL a backup of both planes; the survivors acknowledge more; the backup
        // restarts and reads back every acknowledged message in order.
        let backup = (0..3).find(|&i| i != mp && i != pp).unwrap();
        eprintln!("SIGKILL backup n{backup}");
        common::kill(&mut nodes[backup]);
        send_batches(&mut producer, &mut acked, 10, 10);
        spawn(&config_path, &mut nodes[backup], &logs);
        reads_back(tcp(backup), 0xE0, &acked, &logs, "restarted backup");

        // 4b. Several times the read cache and past a segment flush (1 MiB by the default
        // policy): polls from offset 0 read the segments, payloads equal; every node's tails
        // hold well under what the partitions hold.
        let before: usize = acked.iter().flatten().map(|(_, p)| p.len()).sum();
        send_big(&mut producer, &mut acked, 100, 80);
        let total: usize = acked.iter().flatten().map(|(_, p)| p.len()).sum();
        assert!(total - before > 4 << 20);
        for (i, node) in nodes.iter().enumerate() {
            reads_back(
                tcp(i),
                0x1A0 + i as u128,
                &acked,
                &logs,
                &format!("n{i} big"),
            );
            let cached = partition_sum(
                &common::scrape(node.http).unwrap(),
                "strand_partition_cache_bytes",
            );
            eprintln!("n{i}: {cached} bytes of {total} in the partitions' tails");
            assert!(
                (cached as usize) < total / 2,
                "n{i}: tails hold {cached} of {total} bytes"
            );
        }
        // Decision 493: the running log hash of those commits was left owing on the reply
        // path and is paid while the node is idle.
        for (i, node) in nodes.iter().enumerate() {
            eventually(&format!("n{i} pays its log hash"), &logs, || {
                let owed = partition_sum(
                    &common::scrape(node.http).unwrap(),
                    "strand_partition_hash_owed_bytes",
                );
                (owed == 0).then_some(())
            });
        }

        // 5. SIGKILL all three and restart: every node reads every acknowledged message
        // (recovered from WAL and segments), and the groups take new messages again.
        kill_all(nodes);
        for node in nodes.iter_mut() {
            spawn(&config_path, node, &logs);
        }
        for i in 0..3 {
            reads_back(
                tcp(i),
                0xF0 + i as u128,
                &acked,
                &logs,
                &format!("n{i} restarted"),
            );
        }
        let pp = partition_primary(nodes, &[0, 1, 2], &logs);
        eprintln!(
            "after the restart: metadata primary n{}, partition primary n{pp}",
            metadata_primary(nodes, &logs)
        );
        let mut producer = Client::connect(tcp(pp), 0xB0B + 1);
        producer.login();
        send_batches(&mut producer, &mut acked, 20, 4);
        for i in 0..3 {
            reads_back(
                tcp(i),
                0x100 + i as u128,
                &acked,
                &logs,
                &format!("n{i} at the end"),
            );
        }
        let stored = producer
            .consumer_offset(stream_id(), 1)
            .expect("the offset survived");
        assert_eq!(stored.stored_offset, 4);

        // 6. SIGKILL the partition primary: the two survivors elect a new primary for both
        // groups (view change of each group), which acknowledges more; both survivors read
        // every acknowledged message.
        eprintln!("SIGKILL partition primary n{pp}");
        common::kill(&mut nodes[pp]);
        let survivors: Vec<usize> = (0..3).filter(|&i| i != pp).collect();
        let new_pp = partition_primary(nodes, &survivors, &logs);
        let alive: Vec<&Node> = survivors.iter().map(|&i| &nodes[i]).collect();
        let metrics = common::wait_until("a metadata primary", &alive, &logs, common::one_primary);
        let new_mp = survivors[metrics.iter().position(|m| m["is_primary"] == 1).unwrap()];
        eprintln!("new partition primary n{new_pp}, metadata primary n{new_mp}");
        let mut producer = Client::connect(tcp(new_pp), 0xB0B + 2);
        producer.login();
        send_batches(&mut producer, &mut acked, 24, 4);
        for &i in &survivors {
            reads_back(
                tcp(i),
                0x110 + i as u128,
                &acked,
                &logs,
                &format!("n{i} after failover"),
            );
        }
        eprintln!(
            "acknowledged {} + {} messages, all read back on every live node",
            acked[0].len(),
            acked[1].len()
        );
        for &i in &survivors {
            let m = common::scrape(nodes[i].http).unwrap();
            eprintln!(
                "n{i}: frames forwarded between shards {}, partition appends {}, WAL commits {}",
                partition_sum(&m, "strand_frames_forwarded_total"),
                partition_sum(&m, "strand_partition_appends_total"),
                partition_sum(&m, "strand_wal_commits_total"),
            );
        }
        // Where the batches' time went (decision 350): the new primary followed its ops
        // through every stage and its client connections their requests; a backup its
        // Prepares up to their PrepareOk.
        let stage = |i: usize, name: &str| {
            let m = common::scrape(nodes[i].http).unwrap();
            m.get(&format!("strand_batch_stage_count{{stage=\"{name}\"}}"))
                .copied()
                .unwrap_or(0)
        };
        for name in [
            "queued",
            "prepared",
            "windowed",
            "written",
            "synced",
            "fed",
            "committed",
            "delivered",
            "read",
            "routed",
            "waited",
            "wrote",
        ] {
            assert!(
                stage(new_pp, name) > 0,
                "n{new_pp}: no op through stage {name}"
            );
        }
        let received: u64 = survivors.iter().map(|&i| stage(i, "received")).sum();
        assert!(
            received > 0,
            "no backup followed a Prepare to its PrepareOk"
        );
    });
}

/// Decision 240 across processes, for partition groups: a rejoined node whose metadata group
/// left lost state crashes before its partition groups' superblocks land. The test makes that
/// directory: a backup of both partition groups is killed, its partition data (WAL and
/// group files, every shard) is removed, its metadata kept, and its stamp records a rejoin
/// (the line `strand start --rejoin` writes). With the other partition backup down it boots
/// both partition groups in lost state (`strand_partition_lost_groups`, the boot log's
/// `rejoin_lost=true`), and a SendMessages at the partition primary does not commit
/// (`strand_partition_commit` stands); once the other backup returns, the send commits and
/// the rejoined node's groups leave lost state.
#[test]
fn a_rejoined_node_boots_its_partition_groups_lost_and_never_helps_their_quorum() {
    let _serial = common::serial();
    let dir = common::scratch("partition-rejoin");
    let ports = common::free_ports(9);
    let config_path = dir.join("strand.toml");
    std::fs::write(
        &config_path,
        common::config("partition-rejoin-e2e", 3, &ports, ""),
    )
    .unwrap();
    let logs = dir.join("nodes.log");
    let mut nodes = common::nodes(&dir, 3, &ports);
    let tcp = |i: usize| ports[i * 3];
    for node in nodes.iter_mut() {
        spawn(&config_path, node, &logs);
    }
    common::run_killed(&mut nodes, &logs, &dir, |nodes| {
        let mp = metadata_primary(nodes, &logs);
        let mut admin = Client::connect(tcp(mp), 0xAD);
        admin.login();
        for s in 0..=stream_id() {
            let answer = admin.replicated(CREATE_STREAM, &name(&format!("orders-{s}")));
            assert_eq!(answer.result(), 0);
        }
        let topic = topic_body(stream_id(), 2, "events");
        assert_eq!(admin.replicated(CREATE_TOPIC, &topic).result(), 0);
        let pp = partition_primary(nodes, &[0, 1, 2], &logs);
        let mut producer = Client::connect(tcp(pp), 0xB0B);
        producer.login();
        let mut acked: Acked = [Vec::new(), Vec::new()];
        send_batches(&mut producer, &mut acked, 0, 6);
        for i in 0..3 {
            reads_back(tcp(i), 0xC0 + i as u128, &acked, &logs, &format!("n{i}"));
        }
        let backups: Vec<usize> = (0..3).filter(|&i| i != pp).collect();
        let (wiped, other) = (backups[0], backups[1]);
        eprintln!("partition primary n{pp}, rejoined n{wiped}, other backup n{other}");
        common::kill(&mut nodes[wiped]);
        common::kill(&mut nodes[other]);
        // The cut rejoin: metadata kept, every partition file gone, the stamp a rejoin.
        for entry in std::fs::read_dir(&nodes[wiped].dir).unwrap() {
            let shard = entry.unwrap().path();
            if !shard.is_dir() {
                continue;
            }
            for inner in std::fs::read_dir(&shard).unwrap() {
                let path = inner.unwrap().path();
                if path.file_name().unwrap() != "metadata" {
                    if path.is_dir() {
                        std::fs::remove_dir_all(&path).unwrap();
                    } else {
                        std::fs::remove_file(&path).unwrap();
                    }
                }
            }
        }
        let stamp = nodes[wiped].dir.join("strand.cluster");
        let mut text = std::fs::read_to_string(&stamp).unwrap();
        assert!(!text.contains("rejoin ="), "{text}");
        text.push_str("rejoin = true\n");
        std::fs::write(&stamp, text).unwrap();

        // The other backup is down: the metadata group runs on the primary and the rejoined
        // node (its metadata is intact), the partition groups cannot commit.
        spawn(&config_path, &mut nodes[wiped], &logs);
        let pair = [pp, wiped];
        let both = eventually("the rejoined node hosts both groups, lost", &logs, || {
            let all: Option<Vec<_>> = pair
                .iter()
                .map(|&i| common::scrape(nodes[i].http))
                .collect();
            let all = all?;
            (partition_sum(&all[1], "strand_partition_groups") == 2
                && partition_sum(&all[1], "strand_partition_lost_groups") == 2)
                .then_some(all)
        });
        let commit = partition_sum(&both[0], "strand_partition_commit");
        let booted: Vec<String> = std::fs::read_to_string(&logs)
            .unwrap()
            .lines()
            .filter(|l| l.contains("partition group recovered") && l.contains("rejoin_lost=true"))
            .map(str::to_owned)
            .collect();
        assert_eq!(booted.len(), 2, "{booted:?}");
        let mut pending = Client::connect(tcp(pp), 0xBAD);
        pending.login();
        let request = frame(
            pending.client,
            SEND_MESSAGES,
            0,
            pending.session,
            pending.request,
            &send_body(stream_id(), 0, &[payload(99, 0)]),
        );
        pending.stream.write_all(&request).unwrap();
        let mut samples = 0;
        let watched = Instant::now();
        while watched.elapsed() < Duration::from_secs(5) {
            if let (Some(p), Some(w)) = (
                common::scrape(nodes[pp].http),
                common::scrape(nodes[wiped].http),
            ) {
                samples += 1;
                assert_eq!(
                    partition_sum(&p, "strand_partition_commit"),
                    commit,
                    "the partition primary committed with the lost node's help"
                );
                assert_eq!(partition_sum(&w, "strand_partition_lost_groups"), 2);
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        assert!(samples >= 5, "too few samples: {samples}");

        // The other backup returns: the send commits, the rejoined node catches up and
        // leaves lost state.
        spawn(&config_path, &mut nodes[other], &logs);
        eventually(
            "the send commits and the rejoined node leaves lost state",
            &logs,
            || {
                let p = common::scrape(nodes[pp].http)?;
                let w = common::scrape(nodes[wiped].http)?;
                (partition_sum(&p, "strand_partition_commit") > commit
                    && partition_sum(&w, "strand_partition_lost_groups") == 0)
                    .then_some(())
            },
        );
        // The commit that moved is the pending send (the only request): the rejoined node
        // reads it after everything acknowledged before.
        let next = acked[0].len() as u64;
        acked[0].push((next, payload(99, 0)));
        reads_back(tcp(wiped), 0xE0, &acked, &logs, "the rejoined node");
    });
}

/// The SDK's path on `strand dev --replicas 3` (default ports, one shard per node): connect to
/// node 0's client port, log in, find the leader with GetClusterMetadata and move there,
/// create a stream and a topic of two partitions, send with balanced partitioning, poll by
/// offset, store and read a consumer offset; Ctrl-C stops the cluster with exit 0.
#[test]
fn the_sdk_path_works_on_strand_dev() {
    let _serial = common::serial();
    let dir = common::scratch("dev");
    let log = dir.join("dev.log");
    let mut dev = Command::new(env!("CARGO_BIN_EXE_strand"))
        .env("RUST_LOG", "info")
        .env_remove("IGGY_ROOT_USERNAME")
        .env_remove("IGGY_ROOT_PASSWORD")
        .args(["dev", "--replicas", "3", "--data-dir"])
        .arg(&dir)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut first = Client::connect(8090, 0x5D1);
        first.login();
        let roles = eventually("GetClusterMetadata names a leader", &log, || {
            let answer = first.read(GET_CLUSTER_METADATA, &[]);
            let roles = cluster_roles(answer.body());
            (roles.len() == 3 && roles.iter().filter(|(_, r)| *r == 0).count() == 1)
                .then_some(roles)
        });
        let leader = roles.iter().find(|(_, r)| *r == 0).unwrap().0;
        let mut c = Client::connect(leader, 0x5D2);
        c.login();
        for s in 0..=stream_id() {
            let answer = c.replicated(CREATE_STREAM, &name(&format!("dev-{s}")));
            assert_eq!(answer.result(), 0);
        }
        let topic = topic_body(stream_id(), 2, "events");
        assert_eq!(c.replicated(CREATE_TOPIC, &topic).result(), 0);
        // Balanced partitioning: the node picks the partition; both get messages.
        let mut seen = [0u32; 2];
        let mut sent: Vec<Vec<u8>> = Vec::new();
        for b in 0..6 {
            let payloads: Vec<Vec<u8>> = (0..2).map(|i| payload(b, i)).collect();
            let slices: Vec<&[u8]> = payloads.iter().map(Vec::as_slice).collect();
            let batch = wire::batch::build(0, 0, 0, 0, &slices);
            let mut envelope = vec![1, 4];
            envelope.extend_from_slice(&stream_id().to_le_bytes());
            envelope.extend_from_slice(&[1, 4, 0, 0, 0, 0, 1, 0]);
            envelope.extend_from_slice(&2u32.to_le_bytes());
            let mut body = (envelope.len() as u32).to_le_bytes().to_vec();
            body.extend_from_slice(&envelope);
            body.extend_from_slice(&batch);
            let answer = c.replicated(SEND_MESSAGES, &body);
            assert_eq!(answer.status(), 0, "balanced SendMessages on the leader");
            let confirmed = decode_send_reply(answer.body()).unwrap();
            seen[confirmed[0].partition as usize] += 2;
            sent.extend(payloads);
        }
        assert!(seen[0] > 0 && seen[1] > 0, "{seen:?}");
        let mut polled: Vec<Vec<u8>> = Vec::new();
        for partition in 0..2 {
            let got = c.poll(stream_id(), partition).unwrap();
            assert_eq!(got.len() as u32, seen[partition as usize]);
            polled.extend(got.into_iter().map(|(_, p)| p));
        }
        polled.sort();
        sent.sort();
        assert!(polled == sent, "every sent payload is polled back once");
        assert_eq!(c.store_offset(stream_id(), 0, 1), 0);
        assert_eq!(c.consumer_offset(stream_id(), 0).unwrap().stored_offset, 1);
    }));
    common::signal(&dev, libc::SIGINT);
    let status = dev.wait().unwrap();
    if let Err(panic) = result {
        eprintln!(
            "logs:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::panic::resume_unwind(panic);
    }
    assert!(
        status.success(),
        "{status}\n{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The files of partition group `(stream_id(), topic 0, partition)` under a node's data
/// directory (every shard's `partitions/`).
fn group_files(node: &Node, partition: u32) -> Vec<String> {
    let group = wire::GroupId::partition(wire::PartitionKey {
        stream: stream_id(),
        topic: 0,
        partition,
    })
    .unwrap();
    let prefix = format!("p{:016x}-", group.0);
    let mut out = Vec::new();
    for shard in std::fs::read_dir(&node.dir).into_iter().flatten().flatten() {
        let dir = shard.path().join("partitions");
        for file in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let name = file.file_name().to_string_lossy().into_owned();
            if name.starts_with(&prefix)
                || name.ends_with(&format!("-{prefix}.0"))
                || name.ends_with(&format!("-{prefix}.1"))
                || name.starts_with(&format!("staging-{prefix}"))
            {
                out.push(name);
            }
        }
    }
    out
}

/// A stream/topic identifier body: numeric `stream_id()` and topic 0.
fn stream_topic() -> Vec<u8> {
    let mut body = vec![1, 4];
    body.extend_from_slice(&stream_id().to_le_bytes());
    body.extend_from_slice(&[1, 4]);
    body.extend_from_slice(&0u32.to_le_bytes());
    body
}

const UPDATE_STREAM: u8 = 129;
const DELETE_STREAM: u8 = 130;
const PURGE_TOPIC: u8 = 135;
const PURGE_STREAM: u8 = 131;
const DELETE_TOPIC: u8 = 134;
const CREATE_PARTITIONS: u8 = 136;
const DELETE_PARTITIONS: u8 = 137;
const GET_TOPIC: u32 = 300;

/// Topic lifecycle across three processes (decisions 340-342, 346): PurgeTopic re-incarnates
/// the topic's groups on every node (empty at once on the node that answered, offsets from 0,
/// the stored consumer offset gone, nothing back after a backup's restart); a topic's groups,
/// files and gauges leave every node when DeleteTopic commits, a restarted node does not bring
/// them back, the key used again by a new topic starts empty (offset 0, none of the old
/// messages), CreatePartitions adds a group that takes sends, DeletePartitions removes the
/// highest.
#[test]
fn deleted_topics_leave_every_node_and_partitions_come_and_go() {
    let _serial = common::serial();
    let dir = common::scratch("lifecycle");
    let ports = common::free_ports(9);
    let config_path = dir.join("strand.toml");
    std::fs::write(&config_path, common::config("lifecycle-e2e", 3, &ports, "")).unwrap();
    let logs = dir.join("nodes.log");
    let mut nodes = common::nodes(&dir, 3, &ports);
    let tcp = |i: usize| ports[i * 3];
    for node in nodes.iter_mut() {
        spawn(&config_path, node, &logs);
    }
    let groups_on = |nodes: &[Node], i: usize| {
        common::scrape(nodes[i].http).map(|m| {
            (
                partition_sum(&m, "strand_partition_groups"),
                partition_sum(&m, "strand_partition_groups_removed_total"),
            )
        })
    };
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mp = metadata_primary(&nodes, &logs);
        let mut admin = Client::connect(tcp(mp), 0xAD);
        admin.login();
        for s in 0..=stream_id() {
            let answer = admin.replicated(CREATE_STREAM, &name(&format!("life-{s}")));
            assert_eq!(answer.result(), 0);
        }
        let create_topic = |admin: &mut Client, partitions: u32| {
            let mut topic = vec![1, 4];
            topic.extend_from_slice(&stream_id().to_le_bytes());
            topic.extend_from_slice(&partitions.to_le_bytes());
            topic.extend_from_slice(&name("events"));
            assert_eq!(admin.replicated(CREATE_TOPIC, &topic).result(), 0);
        };
        create_topic(&mut admin, 2);
        let pp = partition_primary(&nodes, &[0, 1, 2], &logs);
        let mut producer = Client::connect(tcp(pp), 0xB0B);
        producer.login();
        let mut acked: Acked = [Vec::new(), Vec::new()];
        send_batches(&mut producer, &mut acked, 0, 6);
        for (i, node) in nodes.iter().enumerate() {
            reads_back(tcp(i), 0xC0 + i as u128, &acked, &logs, &format!("n{i}"));
            for p in 0..2 {
                assert!(!group_files(node, p).is_empty(), "n{i} p{p} has files");
            }
        }

        // UpdateStream commits.
        let mut rename = vec![1, 4];
        rename.extend_from_slice(&stream_id().to_le_bytes());
        rename.extend_from_slice(&name("renamed"));
        assert_eq!(admin.replicated(UPDATE_STREAM, &rename).result(), 0);

        // PurgeTopic (decision 346): every node removes the old incarnation of both groups
        // and boots them empty; the stored consumer offset goes with them.
        assert_eq!(producer.store_offset(stream_id(), 0, 2), 0);
        assert_eq!(
            producer
                .consumer_offset(stream_id(), 0)
                .map(|o| o.stored_offset),
            Some(2)
        );
        let purge = admin.replicated(PURGE_TOPIC, &stream_topic());
        assert_eq!((purge.status(), purge.body()), (0, &[0u8; 4][..]));
        // The node that answered applied it: at once, before its pump's next tick removes the
        // old incarnation, polls there find nothing of it (a dead incarnation serves no one).
        for p in 0..2 {
            let got = eventually(&format!("p{p} polls at once on n{mp}"), &logs, || {
                admin.poll(stream_id(), p)
            });
            assert!(
                got.is_empty(),
                "p{p}: the old incarnation answered a poll ({} messages)",
                got.len()
            );
        }
        for i in 0..3 {
            eventually(&format!("n{i} re-incarnated both groups"), &logs, || {
                (groups_on(&nodes, i)? == (2, 2)).then_some(())
            });
        }
        let pp = partition_primary(&nodes, &[0, 1, 2], &logs);
        for i in 0..3 {
            let mut c = Client::connect(tcp(i), 0xE0 + i as u128);
            c.login();
            for p in 0..2 {
                let got = eventually(&format!("n{i} p{p} polls after the purge"), &logs, || {
                    c.poll(stream_id(), p)
                });
                assert!(
                    got.is_empty(),
                    "n{i} p{p}: the purge left {} messages",
                    got.len()
                );
            }
            assert!(
                c.consumer_offset(stream_id(), 0).is_none(),
                "n{i}: the consumer offset survived the purge"
            );
        }
        // Sends start at offset 0 again (send_batches checks the base offsets).
        let mut producer = Client::connect(tcp(pp), 0xB0D);
        producer.login();
        let mut purged: Acked = [Vec::new(), Vec::new()];
        send_batches(&mut producer, &mut purged, 200, 4);
        for i in 0..3 {
            reads_back(
                tcp(i),
                0xE4 + i as u128,
                &purged,
                &logs,
                &format!("n{i} after the purge"),
            );
        }
        // A restarted backup brings none of the purged messages back (reads_back refuses
        // more than was acknowledged).
        let backup = (0..3).find(|&i| i != mp && i != pp).unwrap();
        common::kill(&mut nodes[backup]);
        spawn(&config_path, &mut nodes[backup], &logs);
        metadata_primary(&nodes, &logs);
        reads_back(
            tcp(backup),
            0xE8,
            &purged,
            &logs,
            "the restarted backup after the purge",
        );

        // PurgeStream while that backup is down: the live nodes re-incarnate the groups; the
        // backup boots the old incarnation from its disk, learns of the purge from the
        // metadata group, removes it (2 removals since its start) and then has only what is
        // sent after the purge.
        common::kill(&mut nodes[backup]);
        let mut whole = vec![1, 4];
        whole.extend_from_slice(&stream_id().to_le_bytes());
        assert_eq!(admin.replicated(PURGE_STREAM, &whole).result(), 0);
        for i in (0..3).filter(|&i| i != backup) {
            let mut c = Client::connect(tcp(i), 0xF0 + i as u128);
            c.login();
            for p in 0..2 {
                let got = eventually(&format!("n{i} p{p} after PurgeStream"), &logs, || {
                    c.poll(stream_id(), p)
                });
                assert!(got.is_empty(), "n{i} p{p}: PurgeStream left {}", got.len());
            }
        }
        spawn(&config_path, &mut nodes[backup], &logs);
        metadata_primary(&nodes, &logs);
        eventually(
            &format!("n{backup} removed the purged incarnations after its restart"),
            &logs,
            || (groups_on(&nodes, backup)? == (2, 2)).then_some(()),
        );
        let pp = partition_primary(&nodes, &[0, 1, 2], &logs);
        let mut producer = Client::connect(tcp(pp), 0xB0E);
        producer.login();
        let mut purged: Acked = [Vec::new(), Vec::new()];
        send_batches(&mut producer, &mut purged, 300, 2);
        for i in 0..3 {
            reads_back(
                tcp(i),
                0xF4 + i as u128,
                &purged,
                &logs,
                &format!("n{i} after PurgeStream"),
            );
        }

        // DeleteTopic: every node's groups stop, their files go, the gauges say so.
        let removed: Vec<u64> = (0..3).map(|i| groups_on(&nodes, i).unwrap().1).collect();
        assert_eq!(admin.replicated(DELETE_TOPIC, &stream_topic()).result(), 0);
        for i in 0..3 {
            eventually(&format!("n{i} removed both groups"), &logs, || {
                (groups_on(&nodes, i)? == (0, removed[i] + 2)).then_some(())
            });
            for p in 0..2 {
                assert_eq!(group_files(&nodes[i], p), Vec::<String>::new(), "n{i} p{p}");
            }
        }
        // Sends answer 20, polls the topic's not-found code, GetTopic nothing.
        let mut c = Client::connect(tcp(pp), 0xB1);
        c.login();
        let send = c.replicated(
            SEND_MESSAGES,
            &send_body(stream_id(), 0, &[b"late".to_vec()]),
        );
        assert_eq!(send.status(), 20);
        let poll = {
            use server::client::codec::Identifier;
            use server::client::request::{PollMessages, Request};
            let mut body = Vec::new();
            Request::PollMessages(PollMessages {
                consumer: common::client::consumer(),
                stream: Identifier::Numeric(stream_id()),
                topic: Identifier::Numeric(0),
                partition: Some(0),
                strategy: PollingStrategy::Offset(0),
                count: 10,
                auto_commit: false,
            })
            .encode(&mut body);
            c.read(common::client::POLL_MESSAGES, &body)
        };
        assert_eq!(poll.status(), 2010);
        assert!(c.read(GET_TOPIC, &stream_topic()).body().is_empty());

        // A restarted backup does not bring them back.
        let backup = (0..3).find(|&i| i != mp && i != pp).unwrap();
        common::kill(&mut nodes[backup]);
        spawn(&config_path, &mut nodes[backup], &logs);
        metadata_primary(&nodes, &logs);
        let mut probe = Client::connect(tcp(backup), 0xB2);
        probe.login();
        for i in 0..3 {
            assert_eq!(groups_on(&nodes, i).unwrap().0, 0, "n{i} after the restart");
            for p in 0..2 {
                assert_eq!(group_files(&nodes[i], p), Vec::<String>::new(), "n{i} p{p}");
            }
        }

        // The same key again: a topic of one partition, then one more partition.
        let mp = metadata_primary(&nodes, &logs);
        let mut admin = Client::connect(tcp(mp), 0xAE);
        admin.login();
        create_topic(&mut admin, 1);
        let mut more = stream_topic();
        more.extend_from_slice(&1u32.to_le_bytes());
        assert_eq!(admin.replicated(CREATE_PARTITIONS, &more).result(), 0);
        let details = admin.read(GET_TOPIC, &stream_topic());
        let topic = server::client::reply::TopicDetails::decode(details.body()).unwrap();
        assert_eq!(topic.topic.partitions_count, 2);
        let pp = partition_primary(&nodes, &[0, 1, 2], &logs);
        let mut producer = Client::connect(tcp(pp), 0xB0C);
        producer.login();
        let mut fresh: Acked = [Vec::new(), Vec::new()];
        // Offsets start at 0 on both: nothing of the deleted incarnation came back.
        send_batches(&mut producer, &mut fresh, 100, 4);
        for i in 0..3 {
            reads_back(
                tcp(i),
                0xD0 + i as u128,
                &fresh,
                &logs,
                &format!("n{i} new"),
            );
        }

        // DeletePartitions 1: partition 1 leaves every node; partition 0 keeps its messages.
        let mut fewer = stream_topic();
        fewer.extend_from_slice(&1u32.to_le_bytes());
        assert_eq!(admin.replicated(DELETE_PARTITIONS, &fewer).result(), 0);
        for i in 0..3 {
            eventually(&format!("n{i} removed partition 1"), &logs, || {
                let (groups, _) = groups_on(&nodes, i)?;
                (groups == 1 && group_files(&nodes[i], 1).is_empty()).then_some(())
            });
        }
        let mut c = Client::connect(tcp(pp), 0xB3);
        c.login();
        assert_eq!(c.poll(stream_id(), 0).unwrap(), fresh[0]);
        assert_eq!(c.poll(stream_id(), 1), None, "partition 1 is gone");

        // DeleteStream takes its topics' groups along (decision 343).
        let mut stream = vec![1, 4];
        stream.extend_from_slice(&stream_id().to_le_bytes());
        assert_eq!(admin.replicated(DELETE_STREAM, &stream).result(), 0);
        for (i, node) in nodes.iter().enumerate() {
            eventually(&format!("n{i} removed the stream's group"), &logs, || {
                let (groups, _) = groups_on(&nodes, i)?;
                (groups == 0 && group_files(node, 0).is_empty()).then_some(())
            });
        }
    }));
    kill_all(&mut nodes);
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
    let _ = std::fs::remove_dir_all(&dir);
}
