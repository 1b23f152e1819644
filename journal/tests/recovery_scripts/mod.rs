//! Recovery scripts shared by the storage fuzz targets (`fuzz/fuzz_targets/wal_recover.rs`,
//! `metadata_recover.rs`) and the journal's property test (`tests/recovery_scripts_prop.rs`):
//! the input bytes drive writes through the journal's own code, faults in the durable images, a
//! power loss and two reopens, and every oracle is an assertion.
#![allow(dead_code)]

pub mod faults {
    use journal::{MemStorage, OpenMode, SECTOR, Storage, block_on};

    /// The fuzzer's bytes as a stream of small numbers (zeros once they run out).
    pub struct Script<'a>(pub &'a [u8]);

    impl Script<'_> {
        pub fn u8(&mut self) -> u8 {
            let Some((&first, rest)) = self.0.split_first() else {
                return 0;
            };
            self.0 = rest;
            first
        }

        pub fn u16(&mut self) -> u16 {
            u16::from(self.u8()) | u16::from(self.u8()) << 8
        }
    }

    /// One fault, chosen by `script`, in the durable image of `name` (`sectors` long): a bit flip,
    /// a zeroed sector, one sector's bytes written over another's (a misdirected write), or the
    /// file cut at a sector.
    pub fn damage(disk: &MemStorage, name: &str, sectors: u64, script: &mut Script<'_>) {
        let sectors = sectors.max(1);
        let sector = u64::from(script.u8()) % sectors;
        match script.u8() % 4 {
            0 => {
                let byte = sector * SECTOR as u64 + u64::from(script.u16()) % SECTOR as u64;
                disk.flip_bit(name, byte, script.u8() % 8).expect("exists");
            }
            1 => disk.zero_sector(name, sector).expect("exists"),
            2 => {
                let to = u64::from(script.u8()) % sectors;
                let image = disk.durable_image(name).expect("exists");
                let at = (sector as usize * SECTOR).min(image.len());
                let mut copy = image[at..(at + SECTOR).min(image.len())].to_vec();
                copy.resize(SECTOR, 0);
                block_on(async {
                    let file = disk.open(name, OpenMode::Existing).await.expect("exists");
                    disk.write_at(&file, to * SECTOR as u64, &copy)
                        .await
                        .expect("aligned");
                    disk.sync(&file).await.expect("in memory");
                });
            }
            _ => disk
                .truncate_file(name, sector * SECTOR as u64)
                .expect("exists"),
        }
    }
}

pub mod wal {
    use std::collections::BTreeMap;

    use journal::block_on;
    use journal::wal::END_FILE;
    use journal::{
        CrashMode, MemStorage, PartitionWal, Prng, SECTOR, Storage, WalConfig, WalRecovery,
    };

    use super::faults::{Script, damage};
    const CONFIG: WalConfig = WalConfig {
        file_size_max: 16 * SECTOR as u64,
        window_bytes_max: 4 * SECTOR,
        window_us_max: 0,
    };

    /// What was written under one lsn: `(group, payload, truncate_from)`.
    type Written = (u64, Vec<u8>, Option<u64>);

    fn payload(lsn: u64, len: usize) -> Vec<u8> {
        (0..len)
            .map(|i| (lsn as u8).wrapping_mul(31) ^ i as u8)
            .collect()
    }

    /// Every record an open hands back, in order, and what it reported.
    fn reopen(disk: &MemStorage) -> Option<(Vec<(u64, Written)>, WalRecovery)> {
        let mut seen = Vec::new();
        let opened = block_on(PartitionWal::open(disk.clone(), CONFIG, |r| {
            let frame = r.frame.to_vec();
            seen.push((r.lsn, (r.group, frame, r.truncate_from)));
        }));
        opened.ok().map(|(_, recovery)| (seen, recovery))
    }

    /// The strong oracle: every lsn up to `durable` comes back byte-exact or lies in a range
    /// the open reported lost (damaged or unverified).
    fn every_durable_lsn_back_or_reported(
        durable: u64,
        written: &BTreeMap<u64, Written>,
        seen: &[(u64, Written)],
        recovery: &WalRecovery,
        which: &str,
    ) {
        let back: BTreeMap<u64, &Written> = seen.iter().map(|(l, r)| (*l, r)).collect();
        for lsn in 1..=durable {
            let reported = recovery
                .damage
                .iter()
                .chain(&recovery.unverified)
                .any(|d| d.lsn_first <= lsn && lsn <= d.lsn_last);
            assert!(
                back.get(&lsn) == written.get(&lsn).as_ref() || reported,
                "{which} open: durable lsn {lsn} neither came back nor was reported lost: \
                 {recovery:?}"
            );
        }
    }

    /// The partition WAL's recovery on images it wrote itself and the fuzzer then damaged (bit
    /// flips, zeroed sectors, a sector copied over another as a misdirected write would, a cut
    /// file), followed by a power loss. Whatever recovery does, it must not panic, every record it
    /// hands back must be one that was written under that lsn, lsns must rise, and a second open
    /// must hand back the same records. Without damage, every record reported durable comes back
    /// and recovery is clean.
    pub fn run(data: &[u8]) {
        let mut script = Script(data);
        let disk = MemStorage::new();
        let (mut wal, _) =
            block_on(PartitionWal::open(disk.clone(), CONFIG, |_| {})).expect("fresh");
        // The durable-end record after every commit, so that the oracle can hold every durable
        // lsn to account (at a sparser cadence the lsns past the record are the documented
        // blind spot for a last window that lost head and marker both).
        wal.set_end_interval(1);
        let mut written: BTreeMap<u64, Written> = BTreeMap::new();
        for _ in 0..script.u8() % 48 {
            match script.u8() % 5 {
                0 | 1 => {
                    let group = u64::from(script.u8() % 4);
                    let len = usize::from(script.u16()) % (3 * SECTOR);
                    let lsn_next = written.keys().last().map_or(1, |l| l + 1);
                    let bytes = payload(lsn_next, len);
                    if let Ok(lsn) = wal.submit(group, &bytes, 0) {
                        written.insert(lsn, (group, bytes, None));
                    }
                }
                2 => {
                    let group = u64::from(script.u8() % 4);
                    let from = u64::from(script.u8());
                    if let Ok(lsn) = wal.submit_truncate(group, from, 0) {
                        written.insert(lsn, (group, Vec::new(), Some(from)));
                    }
                }
                _ => {
                    block_on(wal.commit()).expect("in-memory commit");
                }
            }
        }
        let durable = wal.durable_lsn();
        drop(wal);
        // WAL files only: the record's damage is drawn last, so that the inputs of earlier
        // findings keep their meaning.
        let names: Vec<String> = block_on(disk.list())
            .expect("list")
            .into_iter()
            .filter(|n| n.as_str() != END_FILE)
            .collect();
        let damages = script.u8() % 4;
        for _ in 0..damages {
            let Some(name) = names.get(usize::from(script.u8()) % names.len().max(1)) else {
                break;
            };
            damage(
                &disk,
                name,
                CONFIG.file_size_max / SECTOR as u64,
                &mut script,
            );
        }
        disk.crash(
            CrashMode::LoseUnsynced,
            &mut Prng::new(u64::from(script.u8())),
        );
        let record_damaged = script.u8() % 4 == 1;
        if record_damaged {
            let sectors = (disk.durable_image(END_FILE).expect("written").len() / SECTOR) as u64;
            damage(&disk, END_FILE, sectors, &mut script);
        }

        let Some((first, recovery)) = reopen(&disk) else {
            return; // a refused open is an answer (an IO error, or an untrustworthy record)
        };
        every_durable_lsn_back_or_reported(durable, &written, &first, &recovery, "first");
        let mut last = 0;
        for (lsn, record) in &first {
            assert!(*lsn > last, "lsns rise: {lsn} after {last}");
            last = *lsn;
            assert!(
                written.get(lsn) == Some(record),
                "record {lsn} is what was written"
            );
        }
        if damages == 0 && !record_damaged {
            assert!(recovery.is_clean(), "{recovery:?}");
            let lsns: Vec<u64> = first.iter().map(|(l, _)| *l).collect();
            assert_eq!(
                lsns,
                (1..=durable).collect::<Vec<_>>(),
                "every durable record comes back"
            );
        }
        let (second, again) = reopen(&disk).expect("a WAL that opened once opens again");
        // The loss is remembered: a second open (after the first one's repairs) still accounts
        // for every durable lsn.
        every_durable_lsn_back_or_reported(durable, &written, &second, &again, "second");
        let lsns = |records: &[(u64, Written)]| records.iter().map(|(l, _)| *l).collect::<Vec<_>>();
        assert_eq!(lsns(&first), lsns(&second), "recovery is repeatable");
        assert!(
            first == second,
            "recovery hands back the same records twice"
        );
    }
}

pub mod metadata {
    use std::collections::BTreeMap;

    use journal::block_on;
    use journal::metadata::{HEADERS_FILE, PREPARES_FILE};
    use journal::{CrashMode, JournalConfig, MemStorage, MetadataJournal, Prng, SECTOR};
    use wire::header::{FrameHeader, PrepareHeader};
    use wire::{Command, Layout, Operation};

    use super::faults::{Script, damage};

    const CONFIG: JournalConfig = JournalConfig {
        slot_count: 8,
        slot_size: 2 * SECTOR as u64,
    };

    fn prepare(op: u64, parent: u128, body_len: usize) -> Vec<u8> {
        let sender = wire::encode::Sender {
            cluster: 1,
            replica: 0,
            view: 1,
        };
        let mut header = PrepareHeader::zeroed();
        header.frame = FrameHeader::new(Command::Prepare, sender);
        header.op.set(op);
        header.parent.set(parent);
        header.timestamp.set(op);
        header.operation = Operation::CreateStream.byte();
        let body: Vec<u8> = (0..body_len).map(|i| (op as u8) ^ i as u8).collect();
        wire::finish_header(&mut header, &body).expect("fits");
        let mut frame = header.bytes().to_vec();
        frame.extend_from_slice(&body);
        frame
    }

    fn identity(frame: &[u8]) -> u128 {
        u128::from_le_bytes(frame[0..16].try_into().expect("16 bytes"))
    }

    /// Intact ops with their frames, and the repair ranges, of one open.
    type Found = (BTreeMap<u64, Vec<u8>>, Vec<(u64, u64)>);

    fn reopen(disk: &MemStorage, floor: u64) -> Found {
        let (journal, recovery) =
            block_on(MetadataJournal::open(disk.clone(), CONFIG, floor, 0)).expect("open");
        let mut intact = BTreeMap::new();
        for header in &recovery.headers {
            let frame = block_on(journal.read(header.op())).expect("an intact op reads back");
            assert_eq!(identity(&frame), header.identity());
            intact.insert(header.op(), frame);
        }
        (intact, recovery.repair)
    }

    /// The metadata journal's recovery on images it wrote itself (appends, truncations, checkpoint
    /// floors) and the fuzzer then damaged (bit flips, zeroed sectors, a sector copied over another,
    /// a cut file), after a power loss. Recovery must not panic or fail, every intact op it reports
    /// must read back as exactly the frame appended under that op, a second open must agree, and
    /// without damage every durable op above the floor is intact and nothing needs repair.
    pub fn run(data: &[u8]) {
        let mut script = Script(data);
        let disk = MemStorage::new();
        let (mut journal, _) =
            block_on(MetadataJournal::open(disk.clone(), CONFIG, 0, 0)).expect("fresh");
        // Every frame ever appended under an op (a truncated op may be appended again).
        let mut appended: BTreeMap<u64, Vec<Vec<u8>>> = BTreeMap::new();
        let mut durable: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
        let mut floor = 0;
        for _ in 0..script.u8() % 40 {
            match script.u8() % 6 {
                0..=3 => {
                    let op = durable.keys().last().copied().unwrap_or(floor) + 1;
                    let parent = durable.get(&(op - 1)).map_or(0, |f| identity(f));
                    let frame = prepare(op, parent, usize::from(script.u16()) % (SECTOR + 500));
                    if block_on(journal.append(&frame)).is_ok() {
                        appended.entry(op).or_default().push(frame.clone());
                        durable.insert(op, frame);
                    }
                }
                4 => {
                    let from = floor + 1 + u64::from(script.u8() % 8);
                    block_on(journal.truncate_from(from)).expect("in memory");
                    durable.split_off(&from);
                }
                _ => {
                    // A checkpoint at the newest op (the superblock would name it).
                    let op = durable.keys().last().copied().unwrap_or(floor);
                    journal.set_checkpoint(op).expect("forward");
                    floor = op;
                    durable = durable.split_off(&op);
                }
            }
        }
        drop(journal);
        let damages = script.u8() % 4;
        for _ in 0..damages {
            let name = if script.u8() % 2 == 0 {
                PREPARES_FILE
            } else {
                HEADERS_FILE
            };
            let Some(image) = disk.durable_image(name) else {
                continue;
            };
            damage(&disk, name, (image.len() / SECTOR) as u64, &mut script);
        }
        disk.crash(
            CrashMode::LoseUnsynced,
            &mut Prng::new(u64::from(script.u8())),
        );

        let (intact, repair) = reopen(&disk, floor);
        for (op, frame) in &intact {
            let ever = appended.get(op).map(Vec::as_slice).unwrap_or_default();
            assert!(
                ever.contains(frame),
                "op {op} reads back as a frame never appended under it"
            );
            assert!(*op > floor, "op {op} at or below the floor {floor}");
        }
        if damages == 0 {
            let above: BTreeMap<u64, Vec<u8>> = durable.split_off(&(floor + 1));
            assert_eq!(intact, above, "every durable op above the floor is intact");
            assert!(repair.is_empty(), "nothing to repair: {repair:?}");
        }
        let (again, repair_again) = reopen(&disk, floor);
        assert!(again == intact, "a second open agrees on the intact ops");
        assert_eq!(repair, repair_again, "and on what must be repaired");
    }
}
