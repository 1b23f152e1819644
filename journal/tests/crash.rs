//! Crash tests of the file backend: a child process appends to a real on-disk journal under
//! load and acknowledges each durable step; the parent stops it at a random moment, recovers
//! the directory, and checks that every acknowledged record is there, byte for byte.
//!
//! Two ways to stop it:
//! - SIGKILL (`sigkill_*`): the process dies, the page cache survives. Kills default to 25;
//!   `JOURNAL_CRASH_KILLS=1000` runs the long mode.
//! - Power cuts (`power_cut_*`): the data directory is on `powerfs` (tests/powerfs), a FUSE
//!   filesystem that keeps only what was fsynced (and directory entries whose directory was
//!   fsynced). The parent cuts the power at a random moment (unsynced writes lost, or torn to
//!   a prefix of sectors, or reordered; unsynced directory entries dropped on every other
//!   cut), kills the child, remounts, recovers. Cuts default to 12 per plane;
//!   `JOURNAL_POWER_CUTS=1000` runs the long mode. These tests need `/dev/fuse` and root (or
//!   `fusermount3`); without them they fail, never skip.
//!
//! Four planes: the metadata journal (with superblock writes and checkpoints), the shard WAL
//! (group commits, file rotation, reclamation), a partition's segments (flushes with
//! `enforce_fsync`, each rewriting the partly filled last sector), and bodies written once
//! (decision 414, plane `once`: several groups whose SendMessages bodies are reserved at their
//! segments' tails and referenced from the WAL or held whole in it, with truncations, rewinds
//! and checkpoints; decisions 430-433). The write-once child can break its protocol on purpose
//! (`JOURNAL_CRASH_BREAK`): the `write_once_*_is_caught` tests assert that the campaign fails.
//!
//! Acknowledgements travel in a file of their own (`JOURNAL_CRASH_ACKS`), one `write(2)` per
//! line, never mixed with the test harness's output; every complete line must parse (a kill
//! can cut only the last one short). Metadata acknowledgements carry a checksum of the whole
//! acknowledged frame, compared after recovery; WAL and segment records are derived from their
//! lsn or offset and compared byte for byte.
//!
//! The bug knobs `bug-sync-noop` and `bug-ack-early` (journal features) must make the power-cut
//! campaign fail: with either, only `bug_knob_*` tests run here, and they assert the failure.

mod powerfs;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use journal::wal::BodyRef;
use journal::{
    FileStorage, FlushPolicy, GroupReplay, Identity, JournalConfig, PartitionLog, PartitionWal,
    Prng, SECTOR, VsrState, WalConfig, block_on, recover_metadata, recover_partition,
};
use powerfs::{Cut, PowerFs, Tear};
use wire::encode::{Sender, finish_header};
use wire::header::{FrameHeader, Layout, PrepareHeader};
use wire::{GroupId, HEADER_SIZE, Operation};

const CHILD_ENV: &str = "JOURNAL_CRASH_CHILD_DIR";
const ACKS_ENV: &str = "JOURNAL_CRASH_ACKS";
const ID: Identity = Identity {
    cluster: 7,
    replica_id: 0,
    replica_count: 1,
};
const CONFIG: JournalConfig = JournalConfig {
    slot_count: 64,
    slot_size: 4 * SECTOR as u64,
};

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// FNV-1a, 64 bits: the checksum a metadata acknowledgement carries of its whole frame.
fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

fn prepare(op: u64, parent: u128, body_len: usize, salt: u64) -> Vec<u8> {
    let mut header = PrepareHeader::zeroed();
    header.frame = FrameHeader::new(
        wire::Command::Prepare,
        Sender {
            cluster: ID.cluster,
            replica: 0,
            view: 1,
        },
    );
    header.op.set(op);
    header.parent.set(parent);
    header.commit.set(op - 1);
    header.timestamp.set(op);
    header.operation = Operation::CreateStream.byte();
    header.group.set(GroupId::METADATA.0);
    let mut prng = Prng::new(salt ^ op);
    let body: Vec<u8> = (0..body_len).map(|_| prng.next_u64() as u8).collect();
    finish_header(&mut header, &body).expect("finish");
    let mut frame = header.bytes().to_vec();
    frame.extend_from_slice(&body);
    frame
}

fn storage(dir: &Path) -> FileStorage {
    // O_DIRECT where the filesystem supports it (powerfs does; tmpfs does not).
    let direct = FileStorage::new(dir, true).expect("dir");
    let probe = block_on(journal::Storage::open(
        &direct,
        "probe",
        journal::OpenMode::Create,
    ));
    if probe.is_ok() {
        drop(probe);
        block_on(journal::Storage::remove(&direct, "probe")).expect("remove probe");
        direct
    } else {
        FileStorage::new(dir, false).expect("dir")
    }
}

/// The child's acknowledgement channel: a file of its own, one `write(2)` per line.
struct Acks(std::fs::File);

impl Acks {
    fn open() -> Acks {
        let path = std::env::var(ACKS_ENV).expect("ack file");
        let file = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(path)
            .expect("ack file");
        Acks(file)
    }

    fn say(&mut self, line: String) {
        self.0
            .write_all(format!("{line}\n").as_bytes())
            .expect("ack");
    }
}

/// Reports the damage a child's recovery found, unless the power was cut under it. A cut that
/// lands while the recovery scan is still reading (one run in four stops at a random moment
/// from the spawn) fails every later read with `EIO`, which the scan rightly classifies as
/// unreadable sectors; a real process would have died with the power, so such a finding says
/// nothing about the disk. The parent's own recovery of the image the cut leaves still judges
/// it. The probe is a read of every file in `dir` through the filesystem (every powerfs open
/// is direct I/O, so no cache answers it): it fails only once the power is off.
fn say_damage(dir: &Path, acks: &mut Acks, line: String) -> ! {
    // Strict: an entry that cannot be listed or a file that cannot be read means no power,
    // and so does a directory without a single readable file.
    let powered = std::fs::read_dir(dir).is_ok_and(|entries| {
        let mut read = 0;
        for entry in entries {
            let Ok(entry) = entry else {
                return false;
            };
            if entry.path().is_file() {
                if std::fs::read(entry.path()).is_err() {
                    return false;
                }
                read += 1;
            }
        }
        read > 0
    });
    if powered {
        acks.say(line);
    }
    std::process::exit(3);
}

/// The metadata child: recover, then append forever, acknowledging each durable append with
/// its frame's checksum and each durable superblock write.
fn metadata_child(dir: &Path, seed: u64, acks: &mut Acks) -> ! {
    let storage = storage(dir);
    let mut r = block_on(recover_metadata(storage, ID, CONFIG)).expect("recover");
    if !r.recovery.is_clean() || !r.recovery.chain_breaks.is_empty() {
        say_damage(dir, acks, format!("ERR {:?}", r.recovery.repair));
    }
    let mut state = r.state.unwrap_or(VsrState {
        cluster: ID.cluster,
        replica_id: ID.replica_id,
        replica_count: ID.replica_count,
        ..VsrState::default()
    });
    let mut op = r.recovery.op_head;
    let mut parent = r.recovery.headers.last().map_or(0, |h| h.identity());
    let mut prng = Prng::new(seed);
    loop {
        if r.journal.capacity_remaining() <= 8 {
            // Checkpoint: the superblock names it durably before the floor moves (G4).
            state.checkpoint_op = op - 16;
            state.op_head = op;
            block_on(r.superblock.write(&state)).expect("superblock");
            r.journal
                .set_checkpoint(state.checkpoint_op)
                .expect("checkpoint");
            acks.say(format!("S {} {}", state.view, state.checkpoint_op));
        }
        op += 1;
        let body = prng.below(3 * SECTOR as u64) as usize;
        let frame = prepare(op, parent, body, seed);
        block_on(r.journal.append(&frame)).expect("append");
        parent = journal::prepare::verify_frame(&frame, true)
            .expect("ours")
            .identity();
        acks.say(format!("A {op} {:016x}", fnv(&frame)));
        if prng.one_in(10) {
            state.view += 1;
            state.log_view = state.view;
            state.op_head = op;
            state.commit_max = op;
            block_on(r.superblock.write(&state)).expect("superblock");
            acks.say(format!("S {} {}", state.view, state.checkpoint_op));
        }
    }
}

const WAL: WalConfig = WalConfig {
    file_size_max: 1024 * 1024,
    window_bytes_max: 256 * 1024,
    window_us_max: 0,
};

/// The payload of WAL record `lsn`: derived from the lsn, so the parent can check every byte.
fn wal_payload(lsn: u64) -> Vec<u8> {
    let mut prng = Prng::new(lsn);
    let len = prng.below(20_000) as usize;
    (0..len).map(|_| prng.next_u64() as u8).collect()
}

/// The WAL child: recover, then submit records from several groups and group-commit them,
/// acknowledging each durable lsn, and reclaim old files, reporting the floor it leaves.
fn wal_child(dir: &Path, seed: u64, acks: &mut Acks) -> ! {
    let (mut wal, recovery) =
        block_on(PartitionWal::open(storage(dir), WAL, |_| {})).expect("recover");
    if !recovery.damage.is_empty() || !recovery.truncated.is_empty() {
        say_damage(dir, acks, format!("ERR {recovery:?}"));
    }
    // `unverified` windows (a reordered torn write the WAL cannot prove unacknowledged) are
    // judged by the parent, which knows what was acknowledged.
    let mut prng = Prng::new(seed);
    loop {
        let mut lsn = wal.durable_lsn();
        for _ in 0..1 + prng.below(16) {
            lsn += 1;
            let submitted = wal.submit(lsn % 7, &wal_payload(lsn), 0).expect("submit");
            assert_eq!(submitted, lsn);
        }
        let durable = block_on(wal.commit()).expect("commit");
        acks.say(format!("D {durable}"));
        if wal.file_count() > 3 {
            acks.say("R".to_owned());
            block_on(wal.reclaim(durable.saturating_sub(50))).expect("reclaim");
            acks.say(format!("F {}", wal.floor()));
        }
    }
}

const SEGMENT_POLICY: FlushPolicy = FlushPolicy {
    enforce_fsync: true,
    messages_required_to_save: 3,
    size_of_messages_required_to_save: 1 << 20,
    segment_size: 48 * 1024,
};

/// The batch at `offset`: its message count and bytes derive from the offset alone.
fn segment_batch(offset: u64) -> Vec<u8> {
    let mut prng = Prng::new(offset ^ 0x5E6);
    let messages = 1 + prng.below(3) as usize;
    let payloads: Vec<Vec<u8>> = (0..messages)
        .map(|_| {
            let len = 1 + prng.below(1500) as usize;
            (0..len).map(|_| prng.next_u64() as u8).collect()
        })
        .collect();
    let refs: Vec<&[u8]> = payloads.iter().map(Vec::as_slice).collect();
    journal::batch::build(1, offset, 1_000 + offset, &refs)
}

/// The segment child: commit batches and flush them with `enforce_fsync` (each flush rewrites
/// the partly filled last sector of the log), acknowledging the synced offset after each.
fn segment_child(dir: &Path, acks: &mut Acks) -> ! {
    let (mut log, recovery) =
        block_on(PartitionLog::open(storage(dir), "p1-", SEGMENT_POLICY, 0)).expect("recover");
    if !recovery.damage.is_empty() {
        say_damage(dir, acks, format!("ERR {recovery:?}"));
    }
    loop {
        let next = log.next_offset();
        log.commit_batch(segment_batch(next)).expect("commit");
        if log.should_flush(0, 0) {
            block_on(log.flush()).expect("flush");
            acks.say(format!("B {}", log.synced_offset()));
        }
    }
}

/// The write-once plane (decision 414): several partition groups whose SendMessages bodies are
/// reserved at their segments' tails; bodies of [`ONCE_REF_MIN`] bytes or more are referenced
/// from the shard WAL (`submit_ref`) and synced by `flush_synced` before the window's
/// acknowledgements, shorter ones ride whole in the WAL and their segment copy is written but
/// not synced, as the node does (`server::partition_group::REF_BODY_MIN`).
const ONCE_GROUPS: u64 = 3;

/// As the node: a body this long or longer is referenced, a shorter one is held whole.
const ONCE_REF_MIN: usize = 64 * 1024;

/// No fsync of its own (only `flush_synced` makes reserved bodies durable), and segments small
/// enough that bodies and rewinds cross rotations.
const ONCE_POLICY: FlushPolicy = FlushPolicy {
    enforce_fsync: false,
    messages_required_to_save: 1 << 20,
    size_of_messages_required_to_save: 1 << 30,
    segment_size: 256 * 1024,
};

/// The knob that makes the write-once child break its protocol on purpose (the `break_*`
/// tests): `ack-early` acknowledges a window after the WAL commit and before `flush_synced`,
/// `rewind-early` rewinds the segment before the truncation is durable in the WAL.
const BREAK_ENV: &str = "JOURNAL_CRASH_BREAK";

fn once_prefix(group: u64) -> String {
    format!("g{group}-")
}

/// The batch `group` prepares at offset `base` with `salt`: its messages and bytes derive from
/// the three, so the parent can check every byte; the salt's low bit makes it referenced
/// (at least [`ONCE_REF_MIN`]) or held whole (well below it).
fn once_body(group: u64, base: u64, salt: u64) -> Vec<u8> {
    let mut prng = Prng::new(salt ^ (group << 56) ^ base.rotate_left(20));
    let referenced = salt & 1 == 1;
    let messages = 1 + prng.below(3) as usize;
    let payloads: Vec<Vec<u8>> = (0..messages)
        .map(|i| {
            let len = match (referenced, i) {
                (true, 0) => ONCE_REF_MIN + prng.below(64 * 1024) as usize,
                (true, _) => prng.below(8 * 1024) as usize,
                (false, _) => 1 + prng.below(16_000) as usize,
            };
            (0..len).map(|_| prng.next_u64() as u8).collect()
        })
        .collect();
    let refs: Vec<&[u8]> = payloads.iter().map(Vec::as_slice).collect();
    journal::batch::build(group, base, 1_000 + base, &refs)
}

/// The whole SendMessages prepare of `group`'s op `op` carrying `body`.
fn once_frame(group: u64, op: u64, body: &[u8]) -> Vec<u8> {
    let mut header = PrepareHeader::zeroed();
    header.frame = FrameHeader::new(
        wire::Command::Prepare,
        Sender {
            cluster: ID.cluster,
            replica: 0,
            view: 1,
        },
    );
    header.op.set(op);
    header.commit.set(op - 1);
    header.timestamp.set(op);
    header.operation = Operation::SendMessages.byte();
    header.group.set(group);
    finish_header(&mut header, body).expect("finish");
    let mut frame = header.bytes().to_vec();
    frame.extend_from_slice(body);
    frame
}

/// The batch a whole prepare frame carries (ours: the parent built or checked it).
fn once_batch(frame: &[u8]) -> Option<journal::batch::BatchInfo> {
    journal::batch::peek(frame.get(HEADER_SIZE..)?)
}

/// One partition group as a write-once child or the parent's check recovers it.
struct OnceGroup {
    superblock: journal::Superblock<FileStorage>,
    /// The group's checkpoint: `(checkpoint_op, offset_frontier)`.
    checkpoint: (u64, u64),
    log: PartitionLog<FileStorage>,
    /// Op → whole prepare (referenced bodies resolved).
    frames: BTreeMap<u64, Vec<u8>>,
    unresolved: Vec<u64>,
}

/// What a write-once recovery found: the WAL, each group, and the last replayed WAL record
/// when it is a truncation (`(group, from_op)`).
struct OnceBoot {
    wal: PartitionWal<FileStorage>,
    recovery: journal::WalRecovery,
    groups: Vec<OnceGroup>,
    last_truncation: Option<(u64, u64)>,
}

/// Recovers the write-once directory the way a node boots a shard: the WAL with a
/// [`GroupReplay`], then each group through `recover_partition` (which settles its segment
/// tail against the replayed records and resolves the body references).
fn once_recover(storage: &FileStorage) -> Result<OnceBoot, String> {
    let mut replay = GroupReplay::default();
    let mut last_truncation = None;
    let (wal, recovery) = block_on(PartitionWal::open(storage.clone(), WAL, |r| {
        last_truncation = r.truncate_from.map(|from| (r.group, from));
        replay.apply(r);
    }))
    .map_err(|e| format!("recover the WAL: {e}"))?;
    let mut groups = Vec::new();
    for group in 1..=ONCE_GROUPS {
        let (frames, bodies) = replay.take(group);
        let boot = block_on(recover_partition(
            storage.clone(),
            &once_prefix(group),
            ID,
            ONCE_POLICY,
            frames,
            &bodies,
        ))
        .map_err(|e| format!("recover group {group}: {e}"))?;
        groups.push(OnceGroup {
            superblock: boot.superblock,
            checkpoint: boot
                .state
                .map_or((0, 0), |s| (s.checkpoint_op, s.offset_frontier)),
            log: boot.log,
            frames: boot.frames,
            unresolved: boot.unresolved,
        });
    }
    Ok(OnceBoot {
        wal,
        recovery,
        groups,
        last_truncation,
    })
}

/// The write-once child: recover, drop (durably) the ops whose referenced body did not come
/// back (never acknowledged: the parent checks that), put bodies held whole in the WAL whose
/// segment copy a crash lost back at the tail, then loop: now and then a durable truncation
/// of a group's last ops followed by a rewind of its segment and new bodies at the same
/// offsets; windows of a few prepares over the groups, WAL commit and `flush_synced` of the
/// segments holding referenced bodies in either order, and only then the acknowledgements.
fn once_child(dir: &Path, seed: u64, acks: &mut Acks) -> ! {
    let brk = std::env::var(BREAK_ENV).unwrap_or_default();
    let storage = storage(dir);
    let OnceBoot {
        mut wal,
        recovery,
        mut groups,
        ..
    } = once_recover(&storage).expect("recover");
    if !recovery.damage.is_empty() || !recovery.truncated.is_empty() {
        say_damage(dir, acks, format!("ERR {recovery:?}"));
    }
    for (group, g) in (1..).zip(groups.iter_mut()) {
        if let Some(&first) = g.unresolved.first() {
            // A single replica has no peer to repair them from; never acknowledged, they go.
            g.frames.split_off(&first);
            wal.submit_truncate(group, first, 0).expect("truncate");
            block_on(wal.commit()).expect("commit");
        }
        for frame in g.frames.values() {
            let info = once_batch(frame).expect("ours");
            if info.base_offset >= g.log.next_offset() {
                g.log
                    .reserve(Bytes::copy_from_slice(&frame[HEADER_SIZE..]))
                    .expect("a held body goes back at the tail");
            }
        }
    }
    let mut prng = Prng::new(seed);
    let mut again = None;
    loop {
        if prng.one_in(10) {
            // A checkpoint: the segments synced, then the superblock names the op and the
            // offset frontier. The WAL keeps the ops below it (nothing is reclaimed here, as
            // in a node whose slowest group holds the reclaim back), so every boot resolves
            // their referenced bodies below the frontier.
            let group = 1 + prng.below(ONCE_GROUPS);
            let g = &mut groups[group as usize - 1];
            if let Some((&op, frame)) = g.frames.iter().next_back() {
                let frontier = once_batch(frame).expect("ours").end_offset();
                block_on(g.log.sync()).expect("sync");
                let state = VsrState {
                    cluster: ID.cluster,
                    replica_id: ID.replica_id,
                    replica_count: ID.replica_count,
                    op_head: op,
                    commit_max: op,
                    checkpoint_op: op,
                    offset_frontier: frontier,
                    ..VsrState::default()
                };
                block_on(g.superblock.write(&state)).expect("superblock");
                g.checkpoint = (op, frontier);
                acks.say(format!("K {group} {op} {frontier}"));
            }
        }
        if prng.one_in(4) {
            let group = 1 + prng.below(ONCE_GROUPS);
            let g = &mut groups[group as usize - 1];
            // Never below the checkpoint: committed ops are not truncated.
            if let Some(&head) = g.frames.keys().next_back()
                && head > g.checkpoint.0
            {
                let from = head - prng.below((head - g.checkpoint.0).min(4));
                let base = once_batch(&g.frames[&from]).expect("ours").base_offset;
                acks.say(format!("t {group} {from}"));
                if brk == "rewind-early" {
                    block_on(g.log.rewind(base)).expect("rewind");
                    // The break opens a window between the rewind and the durable
                    // truncation; a kill must land in it to show. Held open for a while, so
                    // the campaign's random kills find it in any disk phase (it was a few
                    // milliseconds wide, and 150 kills missed it in one CI run of several).
                    std::thread::sleep(Duration::from_millis(20));
                }
                wal.submit_truncate(group, from, 0).expect("truncate");
                block_on(wal.commit()).expect("commit");
                acks.say(format!("T {group} {from}"));
                if brk != "rewind-early" {
                    block_on(g.log.rewind(base)).expect("rewind");
                }
                g.frames.split_off(&from);
                again = Some(group);
            }
        }
        let mut lines = Vec::new();
        let mut touched = std::collections::BTreeSet::new();
        let mut referenced = std::collections::BTreeSet::new();
        for i in 0..1 + prng.below(3) {
            let group = match again.take() {
                Some(group) if i == 0 => group,
                _ => 1 + prng.below(ONCE_GROUPS),
            };
            let g = &mut groups[group as usize - 1];
            let op = g.frames.keys().next_back().map_or(1, |h| h + 1);
            let base = g.log.next_offset();
            let salt = prng.next_u64();
            let body = once_body(group, base, salt);
            let frame = once_frame(group, op, &body);
            let (segment, position) = g
                .log
                .reserve(Bytes::from(body.clone()))
                .expect("reserved at the tail");
            touched.insert(group);
            if body.len() >= ONCE_REF_MIN {
                let at = BodyRef::of(segment, position, &body).expect("ours");
                assert_eq!(at.base_offset, base);
                let header: &[u8; HEADER_SIZE] = frame[..HEADER_SIZE].try_into().expect("256");
                wal.submit_ref(group, header, &at, 0).expect("submit");
                referenced.insert(group);
            } else {
                wal.submit(group, &frame, 0).expect("submit");
            }
            g.frames.insert(op, frame);
            lines.push(format!("P {group} {op} {base} {salt}"));
        }
        // The node runs the WAL commit and the segment syncs together: either may land first.
        let wal_first = prng.one_in(2) || brk == "ack-early";
        acks.say(format!("C {}", u8::from(wal_first)));
        let segments = |groups: &mut Vec<OnceGroup>| {
            for group in &touched {
                let log = &mut groups[*group as usize - 1].log;
                if referenced.contains(group) {
                    block_on(log.flush_synced()).expect("flush_synced");
                } else {
                    // Held whole in the WAL: the segment copy is written, not synced.
                    block_on(log.flush()).expect("flush");
                }
            }
        };
        if brk == "ack-early" {
            block_on(wal.commit()).expect("commit");
            for line in lines.drain(..) {
                acks.say(line);
            }
            // The unsynced window lasts only the tens of microseconds a page-cache write takes,
            // so a kill at a random moment found it once in 60-120 runs for some seeds. In a
            // node the segment write queues behind other I/O; the pause stands for that, so
            // the campaign's catch rests on the oracle, not on the kill's luck.
            std::thread::sleep(Duration::from_millis(3));
            segments(&mut groups);
        } else if wal_first {
            block_on(wal.commit()).expect("commit");
            segments(&mut groups);
        } else {
            segments(&mut groups);
            block_on(wal.commit()).expect("commit");
        }
        for line in lines {
            acks.say(line);
        }
    }
}

#[test]
fn crash_child() {
    // Runs only as the child of the crash tests below.
    if let Ok(dir) = std::env::var(CHILD_ENV) {
        let seed = env_u64("JOURNAL_CRASH_SEED", 1);
        let mut acks = Acks::open();
        let dir = PathBuf::from(dir);
        match std::env::var("JOURNAL_CRASH_PLANE").as_deref() {
            Ok("wal") => wal_child(&dir, seed, &mut acks),
            Ok("segment") => segment_child(&dir, &mut acks),
            Ok("once") => once_child(&dir, seed, &mut acks),
            _ => metadata_child(&dir, seed, &mut acks),
        }
    }
}

/// One acknowledgement line.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Ack {
    /// Metadata op durable, with its frame's checksum.
    Append(u64, u64),
    /// Superblock durable: view, checkpoint.
    Super(u32, u64),
    /// WAL durable up to an lsn.
    Durable(u64),
    /// WAL reclamation starting.
    Reclaiming,
    /// WAL reclamation done: the WAL's floor.
    Floor(u64),
    /// Segments synced up to an offset.
    Synced(u64),
    /// Write-once: group, op, base offset and salt of an acknowledged prepare.
    Prepared(u64, u64, u64, u64),
    /// Write-once: a truncation of a group's ops from an op is starting.
    Truncating(u64, u64),
    /// Write-once: that truncation is durable.
    Truncated(u64, u64),
    /// Write-once: a group's checkpoint is durable: group, checkpoint op, offset frontier.
    Checkpoint(u64, u64, u64),
    /// Write-once: a window's WAL commit and segment syncs start; whether the commit goes
    /// first.
    Order(bool),
    /// The child found damage at recovery.
    Err(String),
}

fn parse_line(line: &str) -> Option<Ack> {
    let words: Vec<&str> = line.split(' ').collect();
    Some(match words[..] {
        ["A", op, sum] => Ack::Append(op.parse().ok()?, u64::from_str_radix(sum, 16).ok()?),
        ["S", view, checkpoint] => Ack::Super(view.parse().ok()?, checkpoint.parse().ok()?),
        ["D", lsn] => Ack::Durable(lsn.parse().ok()?),
        ["R"] => Ack::Reclaiming,
        ["F", lsn] => Ack::Floor(lsn.parse().ok()?),
        ["B", offset] => Ack::Synced(offset.parse().ok()?),
        ["P", group, op, base, salt] => Ack::Prepared(
            group.parse().ok()?,
            op.parse().ok()?,
            base.parse().ok()?,
            salt.parse().ok()?,
        ),
        ["K", group, op, frontier] => Ack::Checkpoint(
            group.parse().ok()?,
            op.parse().ok()?,
            frontier.parse().ok()?,
        ),
        ["t", group, from] => Ack::Truncating(group.parse().ok()?, from.parse().ok()?),
        ["T", group, from] => Ack::Truncated(group.parse().ok()?, from.parse().ok()?),
        ["C", "0"] => Ack::Order(false),
        ["C", "1"] => Ack::Order(true),
        ["ERR", ..] => Ack::Err(line.to_owned()),
        _ => return None,
    })
}

/// Parses the ack file: every line that ends in a newline must parse; only a last line
/// without one (the kill landed inside its write) is dropped.
fn parse_acks(text: &str) -> Result<Vec<Ack>, String> {
    let mut lines: Vec<&str> = text.split('\n').collect();
    lines.pop(); // "" after the final newline, or the cut-short last line
    lines
        .iter()
        .map(|l| parse_line(l).ok_or_else(|| format!("unparseable acknowledgement {l:?}")))
        .collect()
}

#[test]
fn ack_parser_takes_every_line_and_refuses_garbage() {
    let acks = parse_acks(
        "A 1 00000000000000ff\nS 2 0\nD 9\nR\nF 4\nB 12\nP 1 2 3 4\nK 1 2 3\nt 1 2\nT 1 2\nC 1\nA 2 0",
    )
    .unwrap();
    assert_eq!(
        acks,
        [
            Ack::Append(1, 0xff),
            Ack::Super(2, 0),
            Ack::Durable(9),
            Ack::Reclaiming,
            Ack::Floor(4),
            Ack::Synced(12),
            Ack::Prepared(1, 2, 3, 4),
            Ack::Checkpoint(1, 2, 3),
            Ack::Truncating(1, 2),
            Ack::Truncated(1, 2),
            Ack::Order(true)
        ]
    );
    assert!(parse_acks("C 2\n").is_err());
    assert!(parse_acks("P 1 2 3\n").is_err());
    assert!(parse_acks("test crash_child ... A 1 00\n").is_err());
    assert!(parse_acks("A 1\n").is_err());
    assert!(parse_acks("A x 00\n").is_err());
}

/// How the parent stops the child.
enum Stop<'a> {
    Kill,
    Power(&'a mut PowerFs, Cut),
}

/// Held while spawning a child and while unmounting: a child another test thread is forking
/// holds copies of this process's open files (on a powerfs mount too) until its exec, which
/// makes an unmount fail with `EBUSY`. `spawn` returns after the exec.
static FORKING: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Spawns the child on `dir`, lets it run for a random moment, stops it, and returns its
/// acknowledgements.
fn run_child(
    exe: &Path,
    dir: &Path,
    acks_path: &Path,
    plane: &str,
    brk: &str,
    prng: &mut Prng,
    stop: &mut Stop<'_>,
) -> Result<Vec<Ack>, String> {
    let _ = std::fs::remove_file(acks_path);
    let mut command = Command::new(exe);
    command
        .args(["--exact", "crash_child", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, dir)
        .env(ACKS_ENV, acks_path)
        .env("JOURNAL_CRASH_PLANE", plane)
        .env(BREAK_ENV, brk)
        .env("JOURNAL_CRASH_SEED", prng.next_u64().to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut child = {
        let _forking = FORKING.lock().unwrap_or_else(|p| p.into_inner());
        command.spawn().map_err(|e| format!("spawn: {e}"))?
    };
    // Power cuts: half the runs cut right after a random mutating request (so the cut often
    // finds unsynced writes and entries), the others at a random moment like the kills.
    if let Stop::Power(fs, cut) = stop
        && prng.one_in(2)
    {
        fs.arm(1 + prng.below(200), *cut);
        let waiting = Instant::now();
        while fs.powered()
            && waiting.elapsed() < Duration::from_secs(5)
            && child.try_wait().ok().flatten().is_none()
        {
            std::thread::sleep(Duration::from_micros(500));
        }
    }
    // One run in four stops at a random moment from the spawn (start-up, recovery and its
    // repairs are at stake too); the others at a random moment after the first
    // acknowledgement, so that most runs stop a child under load.
    else if !prng.one_in(4) {
        let waiting = Instant::now();
        while std::fs::metadata(acks_path).map_or(0, |m| m.len()) == 0
            && waiting.elapsed() < Duration::from_secs(5)
            && child.try_wait().ok().flatten().is_none()
        {
            std::thread::sleep(Duration::from_micros(500));
        }
    }
    if !matches!(stop, Stop::Power(fs, _) if !fs.powered()) {
        std::thread::sleep(Duration::from_micros(prng.below(60_000)));
    }
    // A child that ended on its own while the disk had power failed (a panic in it would
    // otherwise pass for a quiet run); status 3 is `say_damage`, whose line is judged below.
    // Its status is read before the power: power only goes off, so an exit seen while the
    // power is still on happened with power.
    let ended = child.try_wait().map_err(|e| format!("wait: {e}"))?;
    let powered = match stop {
        Stop::Kill => true,
        Stop::Power(fs, _) => fs.powered(),
    };
    if let Some(status) = ended
        && powered
        && status.code() != Some(3)
    {
        if let Stop::Power(fs, cut) = stop {
            fs.cut(*cut);
            let _forking = FORKING.lock().unwrap_or_else(|p| p.into_inner());
            fs.remount().map_err(|e| format!("remount: {e}"))?;
        }
        return Err(format!("the child ended on its own with power: {status}"));
    }
    if let Stop::Power(fs, cut) = stop {
        fs.cut(*cut);
        // The child outlives the power by a moment, as it does whenever this thread is
        // descheduled between the cut and the kill (a loaded CI machine): whatever it sees
        // then is `EIO`, and nothing it says afterwards may count (`say_damage`).
        std::thread::sleep(Duration::from_millis(5));
    }
    child.kill().map_err(|e| format!("kill: {e}"))?; // SIGKILL
    child.wait().map_err(|e| format!("wait: {e}"))?;
    if let Stop::Power(fs, _) = stop {
        let _forking = FORKING.lock().unwrap_or_else(|p| p.into_inner());
        fs.remount().map_err(|e| format!("remount: {e}"))?;
    }
    let text = std::fs::read_to_string(acks_path).unwrap_or_default();
    let _ = std::fs::remove_file(acks_path);
    parse_acks(&text)
}

/// What a campaign acknowledged and checked.
#[derive(Debug, Default)]
struct Figures {
    runs: u64,
    acks: u64,
    checked: u64,
    head: u64,
    /// Plane-specific counts for the report (empty or starting with "; ").
    note: String,
}

/// The parent's knowledge of one plane: what was acknowledged, and the check after recovery.
trait Oracle {
    const PLANE: &'static str;
    /// The child's [`BREAK_ENV`]: empty, or a protocol break the campaign must catch.
    const BREAK: &'static str = "";
    fn absorb(&mut self, ack: Ack, figures: &mut Figures) -> Result<(), String>;
    fn check(&mut self, dir: &Path, figures: &mut Figures) -> Result<(), String>;
    /// Plane-specific counts for the report.
    fn note(&self) -> String {
        String::new()
    }
}

#[derive(Default)]
struct Metadata {
    /// Acknowledged ops above the checkpoint, with their frame checksums.
    acked: BTreeMap<u64, u64>,
    view: u32,
    checkpoint: u64,
}

impl Oracle for Metadata {
    const PLANE: &'static str = "metadata";

    fn absorb(&mut self, ack: Ack, figures: &mut Figures) -> Result<(), String> {
        match ack {
            Ack::Append(op, sum) => {
                self.acked.insert(op, sum);
                figures.acks += 1;
            }
            Ack::Super(view, checkpoint) => {
                self.view = self.view.max(view);
                self.checkpoint = self.checkpoint.max(checkpoint);
            }
            other => return Err(format!("metadata child said {other:?}")),
        }
        Ok(())
    }

    fn check(&mut self, dir: &Path, figures: &mut Figures) -> Result<(), String> {
        let r = block_on(recover_metadata(storage(dir), ID, CONFIG))
            .map_err(|e| format!("recover: {e}"))?;
        if !r.recovery.is_clean() || !r.recovery.chain_breaks.is_empty() {
            return Err(format!("recovery not clean: {:?}", r.recovery.repair));
        }
        let (_, torn, corrupt, missing, damaged) = r.recovery.counts();
        if (corrupt, missing, damaged) != (0, 0, 0) || torn > 1 {
            return Err(format!(
                "torn {torn} corrupt {corrupt} missing {missing} damaged {damaged}"
            ));
        }
        let state = r.state.unwrap_or_default();
        if state.view < self.view || state.checkpoint_op < self.checkpoint {
            return Err(format!(
                "superblock regressed: view {} < {} or checkpoint {} < {}",
                state.view, self.view, state.checkpoint_op, self.checkpoint
            ));
        }
        self.acked = self.acked.split_off(&(state.checkpoint_op + 1));
        let head = self.acked.keys().next_back().copied().unwrap_or(0);
        if r.recovery.op_head < head {
            return Err(format!(
                "lost acknowledged ops: head {} < acknowledged {head}",
                r.recovery.op_head
            ));
        }
        for (op, sum) in &self.acked {
            let frame = block_on(r.journal.read(*op))
                .map_err(|e| format!("acknowledged op {op} unreadable: {e:?}"))?;
            if fnv(&frame) != *sum {
                return Err(format!("acknowledged op {op} came back different"));
            }
            figures.checked += 1;
        }
        let ops: Vec<u64> = r.recovery.headers.iter().map(|h| h.op()).collect();
        let expected: Vec<u64> = (state.checkpoint_op + 1..=r.recovery.op_head).collect();
        if ops != expected {
            return Err("recovered ops are not a prefix".to_owned());
        }
        figures.head = r.recovery.op_head;
        Ok(())
    }
}

#[derive(Default)]
struct Wal {
    durable: u64,
    /// The floor the last finished reclamation reported (the first replayed lsn at the last
    /// open otherwise), and whether a reclamation was cut short since.
    floor: Option<u64>,
    reclaiming: bool,
    /// `unverified` ranges already judged (a seal reports them at every open).
    unverified: Vec<(u64, u64)>,
    /// What the previous recovery found (for failure reports).
    previous: String,
}

impl Oracle for Wal {
    const PLANE: &'static str = "wal";

    fn absorb(&mut self, ack: Ack, figures: &mut Figures) -> Result<(), String> {
        match ack {
            Ack::Durable(lsn) => {
                self.durable = self.durable.max(lsn);
                figures.acks += 1;
            }
            Ack::Reclaiming => self.reclaiming = true,
            Ack::Floor(lsn) => {
                self.floor = Some(lsn);
                self.reclaiming = false;
            }
            other => return Err(format!("wal child said {other:?}")),
        }
        Ok(())
    }

    fn check(&mut self, dir: &Path, figures: &mut Figures) -> Result<(), String> {
        let mut fault = None;
        let (mut first, mut last) = (None, None);
        let mut gaps = Vec::new();
        let (wal, recovery) = block_on(PartitionWal::open(storage(dir), WAL, |r| {
            if r.frame != wal_payload(r.lsn) || r.group != r.lsn % 7 {
                fault.get_or_insert(format!("lsn {} came back different", r.lsn));
            }
            match last {
                Some(l) if r.lsn <= l => {
                    fault.get_or_insert(format!("lsn {} after {l}", r.lsn));
                }
                Some(l) if r.lsn != l + 1 => gaps.push((l + 1, r.lsn - 1)),
                _ => {}
            }
            first.get_or_insert(r.lsn);
            last = Some(r.lsn);
        }))
        .map_err(|e| format!("recover: {e}"))?;
        if let Some(f) = fault {
            return Err(f);
        }
        if !recovery.damage.is_empty() || !recovery.truncated.is_empty() {
            return Err(format!("damage reported: {recovery:?}"));
        }
        // A write torn by reordered sectors leaves a window the WAL cannot prove was never
        // acknowledged (`unverified`, sealed): fine only if it lies above everything
        // acknowledged when it first shows up. Records skip exactly such ranges.
        for u in &recovery.unverified {
            let range = (u.lsn_first, u.lsn_last);
            if !self.unverified.contains(&range) {
                if u.lsn_first <= self.durable {
                    return Err(format!(
                        "acknowledged lsns reported lost: {range:?}, acknowledged up to {}",
                        self.durable
                    ));
                }
                self.unverified.push(range);
            }
        }
        if let Some(gap) = gaps.iter().find(|g| !self.unverified.contains(g)) {
            return Err(format!("lsns {gap:?} missing, not a sealed range"));
        }
        if last.unwrap_or(0) < self.durable {
            return Err(format!(
                "lost acknowledged records: recovered to {last:?}, acknowledged {}; {recovery:?}; \
                 accepted unverified {:?}; previous recovery: {}",
                self.durable, self.unverified, self.previous
            ));
        }
        // Reclaimed files stay gone and no old file is lost: the first replayed lsn is the
        // floor the last reclamation left (or above it, if a later one was cut short), or the
        // first lsn after a sealed range that starts there.
        match (first, self.floor) {
            (Some(first), Some(mut floor)) => {
                // A sealed range the floor opens with is not replayed.
                while let Some(range) = self.unverified.iter().find(|r| r.0 == floor) {
                    floor = range.1 + 1;
                }
                let ok = if self.reclaiming {
                    first >= floor
                } else {
                    first == floor
                };
                if !ok {
                    return Err(format!(
                        "first replayed lsn {first}, reclaim floor {floor} (reclaiming: {})",
                        self.reclaiming
                    ));
                }
            }
            (Some(first), None) if first != 1 => {
                return Err(format!("first replayed lsn {first}, never reclaimed"));
            }
            (None, _) if self.durable > 0 => {
                return Err("nothing replayed after acknowledgements".to_owned());
            }
            _ => {}
        }
        if let Some(first) = first {
            // The WAL's floor is the lowest lsn not reclaimed; a sealed range it opens with
            // (unverified windows the last recovery accepted) holds no record to replay.
            let mut floor = wal.floor();
            while let Some(range) = self.unverified.iter().find(|r| r.0 == floor) {
                floor = range.1 + 1;
            }
            if floor != wal.floor() {
                eprintln!(
                    "wal: the floor {} opens with a sealed range, first replayed {first}",
                    wal.floor()
                );
            }
            if floor != first {
                return Err(format!(
                    "floor {} after open, first replayed {first}; {recovery:?}; layout {:?}; \
                     previous recovery: {}",
                    wal.floor(),
                    wal.layout(),
                    self.previous
                ));
            }
            self.floor = Some(first);
        }
        // `durable` stays the highest acknowledged lsn: a sealed range above it may end the
        // log, and the next life continues past it.
        self.previous = format!(
            "{recovery:?}, durable {}, layout {:?}",
            wal.durable_lsn(),
            wal.layout()
        );
        self.reclaiming = false;
        figures.checked += recovery.records;
        figures.head = wal.durable_lsn();
        Ok(())
    }
}

#[cfg(not(any(feature = "bug-sync-noop", feature = "bug-ack-early")))]
#[derive(Default)]
struct Segments {
    synced: u64,
}

#[cfg(not(any(feature = "bug-sync-noop", feature = "bug-ack-early")))]
impl Oracle for Segments {
    const PLANE: &'static str = "segment";

    fn absorb(&mut self, ack: Ack, figures: &mut Figures) -> Result<(), String> {
        match ack {
            Ack::Synced(offset) => {
                self.synced = self.synced.max(offset);
                figures.acks += 1;
            }
            other => return Err(format!("segment child said {other:?}")),
        }
        Ok(())
    }

    fn check(&mut self, dir: &Path, figures: &mut Figures) -> Result<(), String> {
        let (log, recovery) = block_on(PartitionLog::open(storage(dir), "p1-", SEGMENT_POLICY, 0))
            .map_err(|e| format!("recover: {e}"))?;
        if !recovery.damage.is_empty() {
            return Err(format!("damage reported: {recovery:?}"));
        }
        if log.next_offset() < self.synced {
            return Err(format!(
                "lost synced batches: next offset {}, synced {}",
                log.next_offset(),
                self.synced
            ));
        }
        // The last two segments: older ones are sealed and synced, never written again (the
        // first checks read them whole; rereading them every time would make a long campaign
        // quadratic).
        let bases = log.segment_bases();
        let from = bases.len().checked_sub(2).map_or(0, |i| bases[i]);
        let bytes = block_on(log.read_from_offset(from, u64::MAX))
            .map_err(|e| format!("read back: {e}"))?;
        let mut at = 0;
        let mut offset = from;
        while at < bytes.len() {
            let expected = segment_batch(offset);
            if bytes.get(at..at + expected.len()) != Some(&expected[..]) {
                return Err(format!("batch at offset {offset} came back different"));
            }
            at += expected.len();
            offset = journal::batch::verify(&expected)
                .expect("ours")
                .end_offset();
            figures.checked += 1;
        }
        if offset < self.synced {
            return Err(format!(
                "read back to offset {offset}, synced {}",
                self.synced
            ));
        }
        self.synced = offset;
        figures.head = offset;
        drop(log);
        if offset > 5_000 {
            // A fresh partition now and then: recovery reads every segment, so a long
            // campaign on one partition would grow quadratic.
            std::fs::remove_dir_all(dir).map_err(|e| format!("reset: {e}"))?;
            let parent = dir.parent().expect("data directory has a parent");
            std::fs::File::open(parent)
                .and_then(|d| d.sync_all())
                .map_err(|e| format!("reset: {e}"))?;
            self.synced = 0;
        }
        Ok(())
    }
}

/// The parent's knowledge of the write-once plane (decision 414); `B` picks the child's
/// protocol break (0: none, 1: `ack-early`, 2: `rewind-early`), which the campaign must catch.
#[derive(Default)]
struct Once<const B: u8> {
    /// `(group, op)` → `(base offset, salt)` of the acknowledged prepares not truncated since.
    acked: BTreeMap<(u64, u64), (u64, u64)>,
    /// group → the last acknowledged checkpoint `(op, offset frontier)`.
    checkpoints: BTreeMap<u64, (u64, u64)>,
    /// A truncation `(group, from_op)` whose durability was not acknowledged (yet).
    truncating: Option<(u64, u64)>,
    /// Whether the last window that started its WAL commit and segment syncs committed first.
    wal_first: bool,
    /// Durable truncations seen (acknowledged, or found in effect after the stop beat the
    /// acknowledgement).
    truncations: u64,
    /// Ops found unresolved (a referenced body the stop kept from its sync; never acknowledged).
    unresolved: u64,
    /// Acknowledged referenced bodies checked byte for byte.
    referenced: u64,
    /// Bodies held whole in the WAL whose unsynced segment copy a stop lost.
    held_lost: u64,
    /// Checkpoints acknowledged.
    checkpoints_seen: u64,
    /// Acknowledged bodies below the recovered checkpoint op checked in the segment (not
    /// replayed: decision 450).
    below_checkpoint: u64,
    /// Fresh directories started (a long campaign would grow quadratic on one).
    resets: u64,
}

impl<const B: u8> Once<B> {
    fn drop_from(&mut self, group: u64, from: u64) {
        self.acked.retain(|(g, op), _| *g != group || *op < from);
    }
}

impl<const B: u8> Oracle for Once<B> {
    const PLANE: &'static str = "once";
    const BREAK: &'static str = match B {
        1 => "ack-early",
        2 => "rewind-early",
        _ => "",
    };

    fn absorb(&mut self, ack: Ack, figures: &mut Figures) -> Result<(), String> {
        match ack {
            Ack::Prepared(group, op, base, salt) => {
                self.acked.insert((group, op), (base, salt));
                figures.acks += 1;
            }
            Ack::Truncating(group, from) => self.truncating = Some((group, from)),
            Ack::Truncated(group, from) => {
                self.truncating = None;
                self.drop_from(group, from);
                self.truncations += 1;
            }
            Ack::Order(wal_first) => self.wal_first = wal_first,
            Ack::Checkpoint(group, op, frontier) => {
                self.checkpoints.insert(group, (op, frontier));
                self.checkpoints_seen += 1;
            }
            other => return Err(format!("write-once child said {other:?}")),
        }
        Ok(())
    }

    fn check(&mut self, dir: &Path, figures: &mut Figures) -> Result<(), String> {
        let boot = once_recover(&storage(dir))?;
        if !boot.recovery.damage.is_empty() || !boot.recovery.truncated.is_empty() {
            return Err(format!("WAL damage reported: {:?}", boot.recovery));
        }
        // A truncation the stop kept from being acknowledged is in effect exactly when its
        // record is the last one replayed: the child writes nothing after it before it
        // acknowledges it.
        if let Some((group, from)) = self.truncating.take()
            && boot.last_truncation == Some((group, from))
        {
            self.drop_from(group, from);
            self.truncations += 1;
        }
        let mut total = 0;
        figures.head = 0;
        for (group, g) in (1..).zip(&boot.groups) {
            let acked: Vec<(u64, (u64, u64))> = self
                .acked
                .range((group, 0)..=(group, u64::MAX))
                .map(|(&(_, op), &at)| (op, at))
                .collect();
            let acked_head = acked.last().map_or(0, |(op, _)| *op);
            let checkpoint = self.checkpoints.get(&group).copied().unwrap_or_default();
            if g.checkpoint.0 < checkpoint.0 || g.checkpoint.1 < checkpoint.1 {
                return Err(format!(
                    "group {group}: checkpoint {:?} recovered, {checkpoint:?} acknowledged",
                    g.checkpoint
                ));
            }
            // A referenced body that did not come back belongs to a window whose WAL commit
            // landed and whose segment sync the stop beat: never acknowledged, above every
            // acknowledged op, and only possible when the commit went first.
            if let Some(&first) = g.unresolved.first() {
                self.unresolved += g.unresolved.len() as u64;
                if first <= acked_head {
                    return Err(format!(
                        "group {group}: ops {:?} unresolved (referenced bodies not found intact), \
                         acknowledged up to op {acked_head}",
                        g.unresolved
                    ));
                }
                if !self.wal_first {
                    return Err(format!(
                        "group {group}: ops {:?} unresolved after a window that synced its \
                         segments before its WAL commit",
                        g.unresolved
                    ));
                }
            }
            // Ops from the checkpoint op (or 1) to the head, recovered or unresolved, each
            // recovered batch starting where its recovered predecessor ended (an unresolved
            // op's batch is not known). The ops below the checkpoint op are not replayed
            // (decision 450): the segment is checked for them below.
            let from = g.checkpoint.0.max(1);
            let ops: std::collections::BTreeSet<u64> =
                g.frames.keys().chain(&g.unresolved).copied().collect();
            let mut end = (g.checkpoint.0 == 0).then_some(0);
            for (i, op) in (from..).zip(&ops) {
                if *op != i {
                    return Err(format!(
                        "group {group}: op {op} recovered where op {i} belongs (unresolved {:?})",
                        g.unresolved
                    ));
                }
                let Some(frame) = g.frames.get(op) else {
                    end = None;
                    continue;
                };
                let header = journal::prepare::verify_frame(frame, false)
                    .map_err(|e| format!("group {group}: op {op} recovered malformed: {e:?}"))?;
                let info = once_batch(frame)
                    .filter(|_| header.op() == *op)
                    .ok_or_else(|| format!("group {group}: op {op} recovered without its batch"))?;
                if end.is_some_and(|end| info.base_offset != end) {
                    return Err(format!(
                        "group {group}: op {op} starts at offset {}, its predecessor ends at {end:?}",
                        info.base_offset
                    ));
                }
                end = Some(info.end_offset());
            }
            let (below, acked): (Vec<_>, Vec<_>) =
                acked.into_iter().partition(|(op, _)| *op < g.checkpoint.0);
            for (op, (base, salt)) in acked {
                let Some(frame) = g.frames.get(&op) else {
                    return Err(format!(
                        "group {group}: acknowledged op {op} lost: recovered ops {:?}, unresolved \
                         {:?}",
                        g.frames.keys().next().zip(g.frames.keys().next_back()),
                        g.unresolved
                    ));
                };
                let body = once_body(group, base, salt);
                if *frame != once_frame(group, op, &body) {
                    return Err(format!(
                        "group {group}: acknowledged op {op} came back different"
                    ));
                }
                if body.len() >= ONCE_REF_MIN {
                    self.referenced += 1;
                }
                figures.checked += 1;
            }
            // The segment holds the recovered bodies in op order, a prefix of them, and
            // nothing else: past the last body a record vouches for nothing is served. Only
            // bodies held whole in the WAL may be missing from it.
            let bytes = block_on(g.log.read_from_offset(0, u64::MAX))
                .map_err(|e| format!("group {group}: read back: {e}"))?;
            // The read-back's batches: base offset -> (byte position, length).
            let mut batches = BTreeMap::new();
            let (mut pos, mut bytes_end) = (0, 0);
            while pos < bytes.len() {
                let info = journal::batch::peek(&bytes[pos..]).ok_or_else(|| {
                    format!("group {group}: the read-back holds no batch at byte {pos}")
                })?;
                batches.insert(info.base_offset, (pos, info.len as usize));
                pos += info.len as usize;
                bytes_end = info.end_offset();
            }
            // Acknowledged ops below the checkpoint op: their bodies are in the segment, at
            // their offsets, byte for byte.
            for (op, (base, salt)) in below {
                let body = once_body(group, base, salt);
                let found = batches.get(&base).and_then(|&(p, l)| bytes.get(p..p + l));
                if found != Some(body.as_slice()) {
                    return Err(format!(
                        "group {group}: acknowledged op {op} below the checkpoint op {}: the \
                         segment does not hold its body at offset {base}",
                        g.checkpoint.0
                    ));
                }
                if body.len() >= ONCE_REF_MIN {
                    self.referenced += 1;
                }
                self.below_checkpoint += 1;
                figures.checked += 1;
            }
            // From the checkpoint op's body on, the recovered ones follow in op order.
            let (mut at, mut served) = match g.frames.values().next() {
                Some(frame) => {
                    let base = once_batch(frame).expect("checked").base_offset;
                    match batches.get(&base) {
                        Some(&(p, _)) => (p, base),
                        None if base == bytes_end => (bytes.len(), base),
                        None => {
                            return Err(format!(
                                "group {group}: no batch boundary in the segment at offset {base}, \
                                 where the first recovered op starts"
                            ));
                        }
                    }
                }
                None => (0, 0),
            };
            for (op, frame) in &g.frames {
                let body = &frame[HEADER_SIZE..];
                if at < bytes.len() {
                    if bytes.get(at..at + body.len()) != Some(body) {
                        return Err(format!(
                            "group {group}: the segment holds other bytes than op {op}'s body \
                             at byte {at}"
                        ));
                    }
                    at += body.len();
                    served = once_batch(frame).expect("checked").end_offset();
                } else if body.len() >= ONCE_REF_MIN {
                    return Err(format!(
                        "group {group}: op {op} recovered with its referenced body, which the \
                         segment does not hold"
                    ));
                } else {
                    self.held_lost += 1;
                }
            }
            if at != bytes.len() || g.log.next_offset() != served {
                return Err(format!(
                    "group {group}: the segment serves {} bytes up to offset {}, the records vouch \
                     for {at} bytes up to offset {served}",
                    bytes.len(),
                    g.log.next_offset()
                ));
            }
            total += bytes.len();
            figures.head += end.unwrap_or(0);
        }
        drop(boot);
        if total > 6 << 20 {
            // A fresh directory now and then: every check reads every segment back.
            std::fs::remove_dir_all(dir).map_err(|e| format!("reset: {e}"))?;
            let parent = dir.parent().expect("data directory has a parent");
            std::fs::File::open(parent)
                .and_then(|d| d.sync_all())
                .map_err(|e| format!("reset: {e}"))?;
            self.acked.clear();
            self.checkpoints.clear();
            self.resets += 1;
        }
        Ok(())
    }

    fn note(&self) -> String {
        format!(
            "; {} acknowledged referenced bodies re-verified, {} acknowledged bodies below the \
             checkpoint op checked in the segment, {} checkpoints, {} truncations, {} unresolved (never \
             acknowledged), {} held-whole segment copies lost, {} fresh directories",
            self.referenced,
            self.below_checkpoint,
            self.checkpoints_seen,
            self.truncations,
            self.unresolved,
            self.held_lost,
            self.resets
        )
    }
}

/// Runs `runs` child lives on `dir`, killing each or (with `fs`) cutting its power; the first
/// violation ends it. Acknowledgements go to `acks`, which must not be on `fs`.
fn campaign<O: Oracle + Default>(
    dir: &Path,
    acks: &Path,
    runs: u64,
    seed: u64,
    mut fs: Option<&mut PowerFs>,
) -> Result<Figures, String> {
    let exe = std::env::current_exe().expect("exe");
    let mut prng = Prng::new(seed);
    let mut oracle = O::default();
    let mut figures = Figures::default();
    for run in 0..runs {
        let cut = Cut {
            tear: [Tear::LoseAll, Tear::TornPrefix, Tear::Reordered][run as usize % 3],
            drop_dir_entries: run % 2 == 0,
            seed: prng.next_u64(),
        };
        let mut stop = match fs.as_deref_mut() {
            Some(fs) => Stop::Power(fs, cut),
            None => Stop::Kill,
        };
        let context = |e: String| format!("{} run {run} ({cut:?}): {e}", O::PLANE);
        for ack in
            run_child(&exe, dir, acks, O::PLANE, O::BREAK, &mut prng, &mut stop).map_err(context)?
        {
            if let Ack::Err(line) = ack {
                return Err(context(format!("child found damage: {line}")));
            }
            oracle.absorb(ack, &mut figures).map_err(context)?;
        }
        oracle.check(dir, &mut figures).map_err(context)?;
        figures.runs += 1;
        figures.note = oracle.note();
    }
    Ok(figures)
}

fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("journal-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

/// A SIGKILL campaign that must lose nothing and acknowledge at least one step per kill on
/// average (a child that never gets going checks nothing).
#[cfg(not(any(feature = "bug-sync-noop", feature = "bug-ack-early")))]
fn sigkill<O: Oracle + Default>(seed: u64) {
    let kills = env_u64("JOURNAL_CRASH_KILLS", 25);
    let dir = temp_dir(&format!("crash-{}{}", O::PLANE, O::BREAK));
    let started = Instant::now();
    let figures = campaign::<O>(&dir.join("data"), &dir.join("acks"), kills, seed, None)
        .unwrap_or_else(|e| panic!("{e}"));
    eprintln!(
        "{} crash test: {kills} SIGKILLs, {} acknowledgements, {} acknowledged records \
         re-verified, head {}, none lost{}, {:.1}s",
        O::PLANE,
        figures.acks,
        figures.checked,
        figures.head,
        figures.note,
        started.elapsed().as_secs_f64()
    );
    assert!(
        figures.acks >= kills,
        "{}: only {} acknowledgements in {kills} runs",
        O::PLANE,
        figures.acks
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[cfg(not(any(feature = "bug-sync-noop", feature = "bug-ack-early")))]
#[test]
fn sigkill_at_random_moments_loses_nothing_durable() {
    sigkill::<Metadata>(env_u64("JOURNAL_CRASH_SEED", 0xC0FFEE));
}

#[cfg(not(any(feature = "bug-sync-noop", feature = "bug-ack-early")))]
#[test]
fn sigkill_during_wal_group_commit_loses_nothing_durable() {
    sigkill::<Wal>(env_u64("JOURNAL_CRASH_SEED", 0xFEED));
}

#[cfg(not(any(feature = "bug-sync-noop", feature = "bug-ack-early")))]
#[test]
fn sigkill_during_write_once_windows_loses_nothing_acknowledged() {
    sigkill::<Once<0>>(env_u64("JOURNAL_CRASH_SEED", 0x0CE));
}

/// A campaign whose child breaks the write-once protocol on purpose must fail.
#[cfg(not(any(feature = "bug-sync-noop", feature = "bug-ack-early")))]
fn break_caught<O: Oracle + Default>(seed: u64) {
    let runs = env_u64("JOURNAL_CRASH_BREAK_RUNS", 150);
    let dir = temp_dir(&format!("break-{}{}", O::PLANE, O::BREAK));
    let result = campaign::<O>(&dir.join("data"), &dir.join("acks"), runs, seed, None);
    let _ = std::fs::remove_dir_all(&dir);
    match result {
        Ok(f) => panic!(
            "{} with {}: survived {runs} SIGKILLs ({} acknowledgements)",
            O::PLANE,
            O::BREAK,
            f.acks
        ),
        Err(e) => eprintln!("{} caught: {e}", O::BREAK),
    }
}

/// Acknowledging a window after its WAL commit but before `flush_synced` loses referenced
/// bodies a SIGKILL keeps in memory.
#[cfg(not(any(feature = "bug-sync-noop", feature = "bug-ack-early")))]
#[test]
fn write_once_ack_before_flush_synced_is_caught() {
    break_caught::<Once<1>>(env_u64("JOURNAL_CRASH_SEED", 0xB1));
}

/// Rewinding a segment before the truncation is durable loses acknowledged referenced bodies
/// when the kill lands in between.
#[cfg(not(any(feature = "bug-sync-noop", feature = "bug-ack-early")))]
#[test]
fn write_once_rewind_before_durable_truncation_is_caught() {
    break_caught::<Once<2>>(env_u64("JOURNAL_CRASH_SEED", 0xB2));
}

/// A power-cut campaign on a fresh powerfs mount.
fn power<O: Oracle + Default>(cuts: u64, seed: u64) -> (Result<Figures, String>, powerfs::Stats) {
    let dir = temp_dir(&format!("power-{}{}", O::PLANE, O::BREAK));
    let mut fs = PowerFs::mount(&dir.join("mnt")).expect("mount powerfs (needs /dev/fuse)");
    // Two directory levels the backend creates itself, so their entries are at stake too.
    let data = dir.join("mnt").join("disk").join(O::PLANE);
    let result = campaign::<O>(&data, &dir.join("acks"), cuts, seed, Some(&mut fs));
    let stats = fs.stats();
    drop(fs);
    let _ = std::fs::remove_dir_all(&dir);
    (result, stats)
}

#[cfg(not(any(feature = "bug-sync-noop", feature = "bug-ack-early")))]
fn power_test<O: Oracle + Default>(seed: u64) -> powerfs::Stats {
    let cuts = env_u64("JOURNAL_POWER_CUTS", 12);
    let started = Instant::now();
    let (result, stats) = power::<O>(cuts, env_u64("JOURNAL_CRASH_SEED", seed));
    let figures = result.unwrap_or_else(|e| panic!("{e}"));
    eprintln!(
        "{} power-loss test: {cuts} cuts, {} acknowledgements, {} acknowledged records \
         re-verified, head {}, none lost{}; disk saw {} writes ({} O_DSYNC), {} fsyncs, {} \
         directory fsyncs, \
         {} of {} opens O_DIRECT; cuts dropped or tore {} unsynced writes and reverted {} \
         directory entries; {:.1}s",
        O::PLANE,
        figures.acks,
        figures.checked,
        figures.head,
        figures.note,
        stats.writes,
        stats.writes_dsync,
        stats.fsyncs,
        stats.dir_fsyncs,
        stats.opens_direct,
        stats.opens,
        stats.ops_lost,
        stats.entries_reverted,
        started.elapsed().as_secs_f64()
    );
    assert!(
        figures.acks >= cuts,
        "{}: only {} acknowledgements in {cuts} runs",
        O::PLANE,
        figures.acks
    );
    // The harness must have had something to throw away, and the backend ran O_DIRECT.
    assert!(stats.ops_lost > 0 && stats.opens_direct == stats.opens);
    stats
}

#[cfg(not(any(feature = "bug-sync-noop", feature = "bug-ack-early")))]
#[test]
fn power_cut_metadata_journal_loses_nothing_acknowledged() {
    power_test::<Metadata>(0xC0DE);
}

#[cfg(not(any(feature = "bug-sync-noop", feature = "bug-ack-early")))]
#[test]
fn power_cut_wal_loses_nothing_acknowledged() {
    let stats = power_test::<Wal>(0xFACE);
    // Every window is one O_DSYNC write (decision 496): the cuts test that path.
    assert!(stats.writes_dsync > 0, "no durable write reached the disk");
}

/// Every flush rewrites the partly filled last sector of the log, which holds synced batches;
/// cuts that tear that write (a prefix of its sectors) or reorder its sectors must not lose
/// them.
#[cfg(not(any(feature = "bug-sync-noop", feature = "bug-ack-early")))]
#[test]
fn power_cut_segment_tail_rewrite_loses_no_synced_batch() {
    power_test::<Segments>(0x5E6);
}

/// Bodies written once at the segments' tails (decision 414), referenced from the WAL or
/// held whole, through truncations and rewinds: every power cut keeps every acknowledged
/// prepare whole and serves nothing its records do not vouch for.
#[cfg(not(any(feature = "bug-sync-noop", feature = "bug-ack-early")))]
#[test]
fn power_cut_write_once_loses_nothing_acknowledged() {
    let stats = power_test::<Once<0>>(0x0CE1);
    assert!(stats.writes_dsync > 0, "no durable write reached the disk");
}

/// With a bug knob on, the power-cut campaign must find a loss within its budget.
#[cfg(any(feature = "bug-sync-noop", feature = "bug-ack-early"))]
fn bug_knob_caught<O: Oracle + Default>() {
    let cuts = env_u64("JOURNAL_POWER_CUTS", 200);
    let (result, _) = power::<O>(cuts, env_u64("JOURNAL_CRASH_SEED", 0xB06));
    match result {
        Ok(f) => panic!(
            "{}: the bug knob survived {cuts} power cuts ({} acknowledgements)",
            O::PLANE,
            f.acks
        ),
        Err(e) => eprintln!("bug knob caught: {e}"),
    }
}

#[cfg(any(feature = "bug-sync-noop", feature = "bug-ack-early"))]
#[test]
fn bug_knob_is_caught_by_metadata_power_cuts() {
    bug_knob_caught::<Metadata>();
}

#[cfg(any(feature = "bug-sync-noop", feature = "bug-ack-early"))]
#[test]
fn bug_knob_is_caught_by_wal_power_cuts() {
    bug_knob_caught::<Wal>();
}

#[cfg(any(feature = "bug-sync-noop", feature = "bug-ack-early"))]
#[test]
fn bug_knob_is_caught_by_write_once_power_cuts() {
    bug_knob_caught::<Once<0>>();
}
