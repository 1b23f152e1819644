use super::*;
use crate::mem::{CrashMode, FailOp, MemStorage, Prng};
use crate::prepare::tests::prepare;
use crate::storage::block_on;

const SMALL: JournalConfig = JournalConfig {
    slot_count: 32,
    slot_size: 3 * SECTOR as u64,
};

/// Appends ops `from..=to` chained from `parent`, returns the last identity.
fn append_chain(
    journal: &mut MetadataJournal<MemStorage>,
    from: u64,
    to: u64,
    mut parent: u128,
    salt: u8,
) -> u128 {
    for op in from..=to {
        let frame = prepare(op, parent, 100 + (op as usize * 397) % 9000, salt);
        block_on(journal.append(&frame)).unwrap();
        parent = verify_frame(&frame, true).unwrap().identity();
    }
    parent
}

fn open(disk: &MemStorage, floor: u64, head_min: u64) -> (MetadataJournal<MemStorage>, Recovery) {
    block_on(MetadataJournal::open(disk.clone(), SMALL, floor, head_min)).unwrap()
}

#[test]
fn append_read_reopen_round_trip() {
    let disk = MemStorage::new();
    let (mut journal, recovery) = open(&disk, 0, 0);
    assert!(recovery.is_clean());
    assert_eq!(recovery.op_head, 0);
    append_chain(&mut journal, 1, 20, 0, 0);
    let (journal, recovery) = open(&disk, 0, 0);
    assert!(recovery.is_clean(), "{recovery:?}");
    assert_eq!(recovery.op_head, 20);
    assert!(recovery.chain_breaks.is_empty());
    let ops: Vec<u64> = recovery.headers.iter().map(|h| h.op()).collect();
    assert_eq!(ops, (1..=20).collect::<Vec<_>>());
    for op in 1..=20 {
        let frame = block_on(journal.read(op)).unwrap();
        assert_eq!(verify_frame(&frame, true).unwrap().op(), op);
    }
    assert_eq!(block_on(journal.read(21)), Err(JournalError::NotFound(21)));
    assert_eq!(recovery.counts().0, 20);
}

#[test]
fn a_slot_above_the_checkpoint_is_never_overwritten() {
    let disk = MemStorage::new();
    let (mut journal, _) = open(&disk, 0, 0);
    let parent = append_chain(&mut journal, 1, 32, 0, 0);
    let next = prepare(33, parent, 10, 0);
    assert_eq!(
        block_on(journal.append(&next)),
        Err(JournalError::SlotOccupied {
            op: 33,
            occupant: 1
        })
    );
    journal.set_checkpoint(8).unwrap();
    append_chain(&mut journal, 33, 40, parent, 0);
    let (_, recovery) = open(&disk, 8, 0);
    assert!(recovery.is_clean(), "{recovery:?}");
    assert_eq!(recovery.headers.first().unwrap().op(), 9);
    assert_eq!(recovery.op_head, 40);
    assert!(recovery.chain_breaks.is_empty());
}

#[test]
fn truncate_from_is_durable_and_never_resurrects() {
    let disk = MemStorage::new();
    let (mut journal, _) = open(&disk, 0, 0);
    append_chain(&mut journal, 1, 10, 0, 0);
    assert_eq!(block_on(journal.truncate_from(6)).unwrap(), 5);
    assert_eq!(journal.op_head(), 5);
    disk.crash(CrashMode::LoseUnsynced, &mut Prng::new(1));
    let (mut journal, recovery) = open(&disk, 0, 0);
    assert!(recovery.is_clean());
    assert_eq!(recovery.op_head, 5);
    let parent = recovery.headers.last().unwrap().identity();
    append_chain(&mut journal, 6, 8, parent, 9);
    let (_, recovery) = open(&disk, 0, 0);
    assert_eq!(recovery.op_head, 8);
    assert!(recovery.chain_breaks.is_empty());
}

#[test]
fn a_torn_unacknowledged_append_is_cut_and_nothing_else() {
    for seed in 0..100 {
        let disk = MemStorage::new();
        let (mut journal, _) = open(&disk, 0, 0);
        let parent = append_chain(&mut journal, 1, 7, 0, 0);
        disk.fail_next(FailOp::Sync);
        let frame = prepare(8, parent, 9000, 0);
        assert!(block_on(journal.append(&frame)).is_err());
        let mode = [CrashMode::TornPrefix, CrashMode::Reorder][seed as usize % 2];
        disk.crash(mode, &mut Prng::new(seed));
        let (_, recovery) = open(&disk, 0, 0);
        assert!(recovery.is_clean(), "seed {seed}: {recovery:?}");
        assert!(recovery.op_head == 7 || recovery.op_head == 8);
        assert_eq!(recovery.headers.len() as u64, recovery.op_head);
    }
}

#[test]
fn the_superblock_head_is_never_given_up() {
    let disk = MemStorage::new();
    let (mut journal, _) = open(&disk, 0, 0);
    append_chain(&mut journal, 1, 5, 0, 0);
    let (_, recovery) = open(&disk, 0, 7);
    assert_eq!(recovery.op_head, 7);
    assert_eq!(recovery.repair, vec![(6, 7)]);
    assert_eq!(recovery.chain_end(), 5);
    assert_eq!(recovery.slots[6], SlotState::Missing { op: 6 });
}

#[test]
fn a_chain_break_is_reported() {
    let disk = MemStorage::new();
    let (mut journal, _) = open(&disk, 0, 0);
    let parent = append_chain(&mut journal, 1, 3, 0, 0);
    append_chain(&mut journal, 4, 5, parent ^ 1, 0);
    let (journal, recovery) = open(&disk, 0, 0);
    assert_eq!(recovery.chain_breaks, vec![4]);
    assert_eq!(recovery.chain_end(), 3);
    assert_eq!(block_on(journal.read_range(1, 3)).unwrap().len(), 3);
}

#[test]
fn appends_of_bad_frames_are_refused() {
    let disk = MemStorage::new();
    let (mut journal, _) = open(&disk, 0, 0);
    let mut frame = prepare(1, 0, 50, 0);
    frame[300] ^= 1;
    assert_eq!(
        block_on(journal.append(&frame)),
        Err(JournalError::Frame(FrameFault::BodyDigest))
    );
    let big = prepare(1, 0, 3 * SECTOR - 256 - 7, 0);
    assert!(matches!(
        block_on(journal.append(&big)),
        Err(JournalError::TooLarge { .. })
    ));
    journal.set_checkpoint(4).unwrap();
    assert!(matches!(
        block_on(journal.append(&prepare(3, 0, 1, 0))),
        Err(JournalError::BelowCheckpoint { .. })
    ));
}

/// One injected fault of the corruption campaign.
#[derive(Debug, Clone, Copy)]
#[allow(dead_code)] // fields are read through Debug in failure messages
enum Fault {
    FlipPrepare { op: u64, byte: u64, bit: u8 },
    FlipRing { op: u64, byte: u64, bit: u8 },
    ZeroPrepareSector { op: u64, sector: u64 },
    LosePrepareSector { op: u64, sector: u64 },
    LoseRingSector { sector: u64 },
    TruncatePrepares { op: u64 },
}

/// Injects a random fault into a 20-op journal and checks that recovery detects it: the damaged
/// prepare is reported for repair (with its identity when the ring knows it), a damaged ring
/// entry is reported stale and rewritten, and every other op stays intact. Returns the fault and
/// whether the recovery's report covers every damaged op (a repair range for a prepare, a stale
/// ring entry for a ring copy): what the campaign counts as detected.
fn corruption_trial(prng: &mut Prng) -> (Fault, bool) {
    let disk = MemStorage::new();
    let (mut journal, _) = open(&disk, 0, 0);
    append_chain(&mut journal, 1, 20, 0, prng.below(256) as u8);
    let sizes: Vec<u64> = (1..=20u64)
        .map(|op| block_on(journal.read(op)).unwrap().len() as u64)
        .collect();
    let op = 1 + prng.below(20);
    let size = sizes[op as usize - 1];
    let slot_at = op * SMALL.slot_size;
    let fault = match prng.below(7) {
        0 => Fault::FlipPrepare {
            op,
            byte: prng.below(size + 8),
            bit: prng.below(8) as u8,
        },
        6 => Fault::FlipPrepare {
            op,
            byte: 52 + prng.below(4), // `view`: outside the prepare identity
            bit: prng.below(8) as u8,
        },
        1 => Fault::FlipRing {
            op,
            byte: prng.below(HEADER_SIZE as u64),
            bit: prng.below(8) as u8,
        },
        2 => Fault::ZeroPrepareSector {
            op,
            sector: prng.below(size.div_ceil(SECTOR as u64)),
        },
        3 => Fault::LosePrepareSector {
            op,
            sector: prng.below(size.div_ceil(SECTOR as u64)),
        },
        4 => Fault::LoseRingSector {
            sector: prng.below(SMALL.ring_len() / SECTOR as u64),
        },
        _ => Fault::TruncatePrepares { op },
    };
    match fault {
        Fault::FlipPrepare { byte, bit, .. } => disk.flip_bit(PREPARES_FILE, slot_at + byte, bit),
        Fault::FlipRing { byte, bit, .. } => {
            disk.flip_bit(HEADERS_FILE, op * HEADER_SIZE as u64 + byte, bit)
        }
        Fault::ZeroPrepareSector { sector, .. } => {
            disk.zero_sector(PREPARES_FILE, slot_at / SECTOR as u64 + sector)
        }
        Fault::LosePrepareSector { sector, .. } => {
            disk.lose_sector(PREPARES_FILE, slot_at / SECTOR as u64 + sector)
        }
        Fault::LoseRingSector { sector } => disk.lose_sector(HEADERS_FILE, sector),
        Fault::TruncatePrepares { .. } => disk.truncate_file(PREPARES_FILE, slot_at + size / 2),
    }
    .unwrap();
    let (journal, recovery) = open(&disk, 0, 0);
    assert_eq!(recovery.op_head, 20, "{fault:?}");
    let damaged_ops: Vec<u64> = match fault {
        Fault::FlipPrepare { .. }
        | Fault::ZeroPrepareSector { .. }
        | Fault::LosePrepareSector { .. } => {
            vec![op]
        }
        Fault::TruncatePrepares { .. } => (op..=20).collect(),
        Fault::FlipRing { .. } | Fault::LoseRingSector { .. } => vec![],
    };
    let ring_damaged: Vec<u64> = match fault {
        Fault::FlipRing { .. } => vec![op],
        Fault::LoseRingSector { sector } => {
            let first = sector * (SECTOR / HEADER_SIZE) as u64;
            (first..first + 16)
                .filter(|s| (1..=20).contains(s))
                .collect()
        }
        _ => vec![],
    };
    let covered = damaged_ops
        .iter()
        .all(|d| recovery.repair.iter().any(|(a, b)| a <= d && d <= b))
        && ring_damaged.iter().all(|d| recovery.ring_stale.contains(d));
    let expected_repair: Vec<(u64, u64)> = match (damaged_ops.first(), damaged_ops.last()) {
        (Some(a), Some(b)) => vec![(*a, *b)],
        _ => vec![],
    };
    assert_eq!(recovery.repair, expected_repair, "{fault:?}");
    for d in &damaged_ops {
        let state = recovery.slots[*d as usize];
        assert!(
            matches!(state, SlotState::Corrupt { op, identity: Some(_) } if op == *d)
                || matches!(state, SlotState::Missing { op } if op == *d),
            "{fault:?}: {state:?}"
        );
        assert!(block_on(journal.read(*d)).is_err());
    }
    if !ring_damaged.is_empty() {
        assert_eq!(recovery.ring_stale, ring_damaged, "{fault:?}");
    }
    for other in (1..=20).filter(|o| !damaged_ops.contains(o)) {
        assert!(
            block_on(journal.read(other)).is_ok(),
            "{fault:?} op {other}"
        );
    }
    // The ring was rewritten: a second open finds it consistent again.
    let (_, again) = open(&disk, 0, 0);
    assert!(again.ring_stale.is_empty(), "{fault:?}");
    (fault, covered)
}

#[test]
fn every_injected_corruption_is_detected() {
    let trials: u64 = std::env::var("JOURNAL_CORRUPTION_TRIALS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(600);
    let mut prng = Prng::new(0x5eed);
    let mut kinds = [0u64; 6];
    let mut detected = 0u64;
    for _ in 0..trials {
        let (fault, covered) = corruption_trial(&mut prng);
        detected += u64::from(covered);
        let kind = match fault {
            Fault::FlipPrepare { .. } => 0,
            Fault::FlipRing { .. } => 1,
            Fault::ZeroPrepareSector { .. } => 2,
            Fault::LosePrepareSector { .. } => 3,
            Fault::LoseRingSector { .. } => 4,
            Fault::TruncatePrepares { .. } => 5,
        };
        kinds[kind] += 1;
    }
    eprintln!(
        "metadata corruption: {trials} injected, {detected} detected with a report covering the \
         damaged ops \
         (flip prepare {}, flip ring {}, zero sector {}, lost sector {}, lost ring sector {}, truncate {})",
        kinds[0], kinds[1], kinds[2], kinds[3], kinds[4], kinds[5]
    );
    assert_eq!(
        detected, trials,
        "every injected fault is covered by what recovery reported"
    );
}

#[test]
fn classify_is_pure_and_handles_an_empty_journal() {
    let reads = vec![(RingRead::Empty, PrepareRead::Zeroed); 4];
    let recovery = classify(&reads, 0, 0);
    assert_eq!(recovery.op_head, 0);
    assert!(recovery.is_clean());
    assert!(recovery.slots.iter().all(|s| *s == SlotState::Empty));
    let damaged = vec![(RingRead::Damaged, PrepareRead::Unreadable); 4];
    let recovery = classify(&damaged, 0, 0);
    assert_eq!(recovery.slots[1], SlotState::Torn);
    assert_eq!(recovery.slots[2], SlotState::Damaged);
}
