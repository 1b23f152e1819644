//! The in-memory backend with fault injection, deterministic given a seed. The simulator runs
//! the journal on it.
//!
//! Each file keeps its durable image and the list of writes and length changes since the last
//! sync. [`MemStorage::crash`] rebuilds every file from its durable image plus whatever part of
//! the unsynced operations the [`CrashMode`] lets through; faults on durable bytes (bit flips,
//! zeroed sectors, lost sectors, truncation) are injected by name and offset. Clones share the
//! same disk, so a test can keep a handle for faults while the journal owns another.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;

use crate::storage::{OpenMode, SECTOR, Storage, StorageError, check_aligned, check_name};

/// A small deterministic PRNG (SplitMix64) for fault choices and tests.
#[derive(Debug, Clone)]
pub struct Prng(u64);

impl Prng {
    /// A generator from a seed.
    pub fn new(seed: u64) -> Prng {
        Prng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0, "Prng::below(0)");
        self.next_u64() % n
    }

    /// True with probability `1/n`.
    pub fn one_in(&mut self, n: u64) -> bool {
        self.below(n) == 0
    }
}

/// What a crash does to operations that were not yet synced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrashMode {
    /// Every unsynced write and length change is lost.
    LoseUnsynced,
    /// A random prefix of the unsynced operations survives, and the first lost write may be torn
    /// at a sector boundary (a prefix of its sectors lands).
    TornPrefix,
    /// Each unsynced sector write survives or not independently (a disk that reorders), length
    /// changes in order.
    Reorder,
    /// Every unsynced operation of a file lands except its last write, which lands torn: a
    /// random non-empty strict prefix of its sectors, or, for a one-sector write, the sector
    /// with one byte flipped (a device without sector atomicity). The simulator's tear: it
    /// lands the writes a crash let through and leaves the last one unsynced.
    TornLast,
}

#[derive(Debug, Clone)]
enum Pending {
    Write { offset: u64, data: Vec<u8> },
    SetLen(u64),
}

#[derive(Debug, Clone, Default)]
struct MemFile {
    durable: Vec<u8>,
    current: Vec<u8>,
    pending: Vec<Pending>,
    lost: BTreeSet<u64>,
    /// The length [`Storage::reserve_blocks`] last reserved (no effect on the bytes: a file
    /// system's blocks reserved past the length read as nothing).
    reserved: u64,
}

/// Which call [`MemStorage::fail_next`] makes fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailOp {
    /// The next `write_at`.
    Write,
    /// The next `sync`.
    Sync,
    /// The next `reserve_blocks`.
    Reserve,
}

#[derive(Debug, Default)]
struct MemState {
    files: BTreeMap<String, MemFile>,
    fail: Vec<FailOp>,
    /// A failure planned after this many more successful calls of its op.
    fail_after: Option<(FailOp, u64)>,
    writes: u64,
    syncs: u64,
    /// Bytes `read_at` was asked for, whatever it returned.
    read_bytes: u64,
    lying_sync: bool,
    /// Syncs of the file of this name wait until released (a slow device, held by a test).
    held: Option<String>,
    held_wakers: Vec<std::task::Waker>,
    /// Removals of files whose name starts with this wait until released (held by a test).
    held_removes: Option<String>,
    held_remove_wakers: Vec<std::task::Waker>,
    /// Every write's `(file, offset, len)` while a test asks for them.
    write_log: Option<Vec<(String, u64, usize)>>,
}

/// The in-memory disk. Cloning shares it.
#[derive(Debug, Clone, Default)]
pub struct MemStorage {
    state: Rc<RefCell<MemState>>,
}

/// An open file of a [`MemStorage`]: its name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemFileHandle(String);

impl MemFile {
    /// Makes every pending operation durable. The durable image plus the pending operations is
    /// the current image: applying them costs what was written since the last sync, not the
    /// file's size.
    fn sync_all(&mut self) {
        for op in self.pending.drain(..) {
            match op {
                Pending::Write { offset, data } => apply_write(&mut self.durable, offset, &data),
                Pending::SetLen(len) => self.durable.resize(len as usize, 0),
            }
        }
    }
}

/// `pending` without the bytes `offset..offset + len`, which a durable write replaced: an
/// unsynced write over them keeps only its parts outside them (sector multiples, as every
/// write is), so no crash lands what the durable write replaced.
fn supersede(pending: Vec<Pending>, offset: u64, len: usize) -> Vec<Pending> {
    let end = offset + len as u64;
    let mut kept = Vec::with_capacity(pending.len());
    for op in pending {
        match op {
            Pending::Write { offset: at, data } if at < end && offset < at + data.len() as u64 => {
                if at < offset {
                    let data = data[..(offset - at) as usize].to_vec();
                    kept.push(Pending::Write { offset: at, data });
                }
                if at + data.len() as u64 > end {
                    let data = data[(end - at) as usize..].to_vec();
                    kept.push(Pending::Write { offset: end, data });
                }
            }
            other => kept.push(other),
        }
    }
    kept
}

fn apply_write(bytes: &mut Vec<u8>, offset: u64, data: &[u8]) {
    let end = offset as usize + data.len();
    if bytes.len() < end {
        bytes.resize(end, 0);
    }
    bytes[offset as usize..end].copy_from_slice(data);
}

impl MemStorage {
    /// An empty disk.
    pub fn new() -> MemStorage {
        MemStorage::default()
    }

    fn not_found(name: &str) -> StorageError {
        StorageError::NotFound(name.to_owned())
    }

    /// Simulates a power loss: each file keeps its durable image plus what `mode` lets through
    /// of its unsynced operations, chosen by `prng`.
    pub fn crash(&self, mode: CrashMode, prng: &mut Prng) {
        let mut state = self.state.borrow_mut();
        for file in state.files.values_mut() {
            let mut image = std::mem::take(&mut file.durable);
            let pending = std::mem::take(&mut file.pending);
            match mode {
                CrashMode::LoseUnsynced => {}
                CrashMode::TornPrefix => {
                    let keep = prng.below(pending.len() as u64 + 1) as usize;
                    for op in &pending[..keep] {
                        match op {
                            Pending::Write { offset, data } => {
                                apply_write(&mut image, *offset, data)
                            }
                            Pending::SetLen(len) => image.resize(*len as usize, 0),
                        }
                    }
                    if let Some(Pending::Write { offset, data }) = pending.get(keep) {
                        let sectors = data.len() / SECTOR;
                        let torn = prng.below(sectors as u64 + 1) as usize * SECTOR;
                        apply_write(&mut image, *offset, &data[..torn]);
                    }
                }
                CrashMode::TornLast => {
                    let last = pending
                        .iter()
                        .rposition(|op| matches!(op, Pending::Write { .. }));
                    for (i, op) in pending.iter().enumerate() {
                        match op {
                            Pending::Write { offset, data } if Some(i) == last => {
                                let sectors = data.len() / SECTOR;
                                if sectors >= 2 {
                                    let keep = 1 + prng.below(sectors as u64 - 1) as usize;
                                    apply_write(&mut image, *offset, &data[..keep * SECTOR]);
                                } else {
                                    let mut torn = data.clone();
                                    if !torn.is_empty() {
                                        let at = prng.below(torn.len() as u64) as usize;
                                        torn[at] ^= 0xFF;
                                    }
                                    apply_write(&mut image, *offset, &torn);
                                }
                            }
                            Pending::Write { offset, data } => {
                                apply_write(&mut image, *offset, data)
                            }
                            Pending::SetLen(len) => image.resize(*len as usize, 0),
                        }
                    }
                }
                CrashMode::Reorder => {
                    for op in &pending {
                        match op {
                            Pending::Write { offset, data } => {
                                for (i, sector) in data.chunks(SECTOR).enumerate() {
                                    if prng.one_in(2) {
                                        let at = offset + (i * SECTOR) as u64;
                                        apply_write(&mut image, at, sector);
                                    }
                                }
                            }
                            Pending::SetLen(len) => image.resize(*len as usize, 0),
                        }
                    }
                }
            }
            file.current = image.clone();
            file.durable = image;
        }
        // Failures planned for calls that never came are forgotten with the power.
        state.fail.clear();
        state.fail_after = None;
    }

    /// A device that acknowledges flushes it never did: while on, `sync` reports success and
    /// makes nothing durable (a crash loses every write since). For checker self-tests.
    pub fn set_lying_sync(&self, on: bool) {
        self.state.borrow_mut().lying_sync = on;
    }

    /// Holds every `sync` of the file `name` (issued now or later) until
    /// [`MemStorage::release_syncs`]: a device whose flush of that file does not return.
    pub fn hold_syncs(&self, name: &str) {
        self.state.borrow_mut().held = Some(name.to_owned());
    }

    /// Lets the held syncs go on.
    pub fn release_syncs(&self) {
        let wakers = {
            let mut state = self.state.borrow_mut();
            state.held = None;
            std::mem::take(&mut state.held_wakers)
        };
        wakers.into_iter().for_each(std::task::Waker::wake);
    }

    /// Holds every `remove` (and `retire`) of a file whose name starts with `prefix`, issued
    /// now or later, until [`MemStorage::release_removes`]: a file system slow to free files.
    pub fn hold_removes(&self, prefix: &str) {
        self.state.borrow_mut().held_removes = Some(prefix.to_owned());
    }

    /// Lets the held removals go on.
    pub fn release_removes(&self) {
        let wakers = {
            let mut state = self.state.borrow_mut();
            state.held_removes = None;
            std::mem::take(&mut state.held_remove_wakers)
        };
        wakers.into_iter().for_each(std::task::Waker::wake);
    }

    /// Makes the next call of `op` fail with [`StorageError::Injected`] (queued in order).
    pub fn fail_next(&self, op: FailOp) {
        self.state.borrow_mut().fail.push(op);
    }

    /// Makes the call of `op` after `skip` successful ones fail with
    /// [`StorageError::Injected`] (one such plan at a time; a crash forgets it): a power cut
    /// at the chosen step of a sequence.
    pub fn fail_after(&self, op: FailOp, skip: u64) {
        self.state.borrow_mut().fail_after = Some((op, skip));
    }

    fn take_failure(&self, op: FailOp) -> bool {
        let mut state = self.state.borrow_mut();
        if let Some((planned, skip)) = state.fail_after
            && planned == op
        {
            if skip == 0 {
                state.fail_after = None;
                return true;
            }
            state.fail_after = Some((planned, skip - 1));
        }
        if let Some(i) = state.fail.iter().position(|f| *f == op) {
            state.fail.remove(i);
            return true;
        }
        false
    }

    fn with_file<T>(
        &self,
        name: &str,
        f: impl FnOnce(&mut MemFile) -> T,
    ) -> Result<T, StorageError> {
        let mut state = self.state.borrow_mut();
        let file = state
            .files
            .get_mut(name)
            .ok_or_else(|| Self::not_found(name))?;
        Ok(f(file))
    }

    /// Flips one bit of the file, durably (bit rot). Offsets past the end are ignored.
    pub fn flip_bit(&self, name: &str, byte: u64, bit: u8) -> Result<(), StorageError> {
        self.with_file(name, |file| {
            for image in [&mut file.durable, &mut file.current] {
                if let Some(b) = image.get_mut(byte as usize) {
                    *b ^= 1 << (bit % 8);
                }
            }
        })
    }

    /// Zeroes one sector durably (a misdirected or lost write that reads back as zeros).
    pub fn zero_sector(&self, name: &str, sector: u64) -> Result<(), StorageError> {
        self.with_file(name, |file| {
            for image in [&mut file.durable, &mut file.current] {
                let start = (sector as usize * SECTOR).min(image.len());
                let end = (start + SECTOR).min(image.len());
                image[start..end].fill(0);
            }
        })
    }

    /// Makes one sector unreadable: reads covering it fail until it is written again.
    pub fn lose_sector(&self, name: &str, sector: u64) -> Result<(), StorageError> {
        self.with_file(name, |file| {
            file.lost.insert(sector);
        })
    }

    /// Truncates the file durably (a lost tail).
    pub fn truncate_file(&self, name: &str, len: u64) -> Result<(), StorageError> {
        self.with_file(name, |file| {
            let len = len as usize;
            file.durable.truncate(len);
            file.current.truncate(len);
        })
    }

    /// The durable bytes of a file (for tests and the simulator's checkers).
    pub fn durable_image(&self, name: &str) -> Option<Vec<u8>> {
        self.state
            .borrow()
            .files
            .get(name)
            .map(|f| f.durable.clone())
    }

    /// A separate disk holding only the durable images of this one's files: what a power cut
    /// now would leave, while this disk goes on (tests).
    pub fn durable_copy(&self) -> MemStorage {
        let copy = MemStorage::new();
        {
            let state = self.state.borrow();
            let mut into = copy.state.borrow_mut();
            for (name, file) in &state.files {
                into.files.insert(
                    name.clone(),
                    MemFile {
                        durable: file.durable.clone(),
                        current: file.durable.clone(),
                        ..MemFile::default()
                    },
                );
            }
        }
        copy
    }

    /// The part every sync shares: an injected failure, a held flush, the count. Returns
    /// whether the sync really makes anything durable (false while the device lies).
    async fn sync_gate(&self, file: &MemFileHandle) -> Result<bool, StorageError> {
        if self.take_failure(FailOp::Sync) {
            return Err(StorageError::Injected {
                op: "sync",
                name: file.0.clone(),
            });
        }
        std::future::poll_fn(|cx| {
            let mut state = self.state.borrow_mut();
            if state.held.as_deref() == Some(file.0.as_str()) {
                state.held_wakers.push(cx.waker().clone());
                return std::task::Poll::Pending;
            }
            std::task::Poll::Ready(())
        })
        .await;
        let mut state = self.state.borrow_mut();
        state.syncs += 1;
        Ok(!state.lying_sync)
    }

    /// Starts keeping every write's `(file, offset, len)` (off by default: simulations write
    /// millions of times).
    pub fn log_writes(&self) {
        self.state
            .borrow_mut()
            .write_log
            .get_or_insert_with(Vec::new);
    }

    /// The `(offset, len)` of every write to `name` since [`MemStorage::log_writes`], in order.
    pub fn writes_to(&self, name: &str) -> Vec<(u64, usize)> {
        self.state
            .borrow()
            .write_log
            .iter()
            .flatten()
            .filter(|(file, _, _)| file == name)
            .map(|(_, offset, len)| (*offset, *len))
            .collect()
    }

    /// `(writes, syncs)` issued so far.
    pub fn counts(&self) -> (u64, u64) {
        let state = self.state.borrow();
        (state.writes, state.syncs)
    }

    /// Bytes asked of `read_at` so far (the I/O a reader issued, sector padding included).
    pub fn bytes_read(&self) -> u64 {
        self.state.borrow().read_bytes
    }

    /// How far the file `name`'s blocks are reserved ([`Storage::reserve_blocks`]; a length
    /// change since takes back what lies past it), `None` without such a file.
    pub fn reserved(&self, name: &str) -> Option<u64> {
        self.state.borrow().files.get(name).map(|f| f.reserved)
    }
}

impl Storage for MemStorage {
    fn location(&self) -> String {
        String::from("(in-memory directory)")
    }

    type File = MemFileHandle;

    async fn open(&self, name: &str, mode: OpenMode) -> Result<MemFileHandle, StorageError> {
        check_name(name)?;
        let mut state = self.state.borrow_mut();
        if !state.files.contains_key(name) {
            if mode == OpenMode::Existing {
                return Err(Self::not_found(name));
            }
            state.files.insert(name.to_owned(), MemFile::default());
        }
        Ok(MemFileHandle(name.to_owned()))
    }

    async fn read_at(
        &self,
        file: &MemFileHandle,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<usize, StorageError> {
        check_aligned("read", &file.0, offset, buf.len())?;
        self.state.borrow_mut().read_bytes += buf.len() as u64;
        self.with_file(&file.0, |f| {
            let first = offset / SECTOR as u64;
            let last = (offset + buf.len() as u64).div_ceil(SECTOR as u64);
            if let Some(&sector) = f.lost.range(first..last).next() {
                let end = f.current.len() as u64;
                if sector * (SECTOR as u64) < end {
                    return Err(StorageError::SectorLost {
                        name: file.0.clone(),
                        sector,
                    });
                }
            }
            let start = (offset as usize).min(f.current.len());
            let end = (start + buf.len()).min(f.current.len());
            buf[..end - start].copy_from_slice(&f.current[start..end]);
            Ok(end - start)
        })?
    }

    async fn write_at(
        &self,
        file: &MemFileHandle,
        offset: u64,
        data: &[u8],
    ) -> Result<(), StorageError> {
        check_aligned("write", &file.0, offset, data.len())?;
        if self.take_failure(FailOp::Write) {
            return Err(StorageError::Injected {
                op: "write",
                name: file.0.clone(),
            });
        }
        {
            let mut state = self.state.borrow_mut();
            state.writes += 1;
            if let Some(log) = state.write_log.as_mut() {
                log.push((file.0.clone(), offset, data.len()));
            }
        }
        self.with_file(&file.0, |f| {
            apply_write(&mut f.current, offset, data);
            let first = offset / SECTOR as u64;
            let last = first + (data.len() / SECTOR) as u64;
            let healed: Vec<u64> = f.lost.range(first..last).copied().collect();
            for sector in healed {
                f.lost.remove(&sector);
            }
            f.pending.push(Pending::Write {
                offset,
                data: data.to_vec(),
            });
        })
    }

    async fn sync(&self, file: &MemFileHandle) -> Result<(), StorageError> {
        if !self.sync_gate(file).await? {
            return self.with_file(&file.0, |_| ());
        }
        self.with_file(&file.0, MemFile::sync_all)
    }

    /// The write, then its sync half: it fails, waits and lies as [`Storage::sync`] does, and
    /// counts as one write and one sync. It makes durable this write's bytes and nothing else
    /// the file holds unsynced, the weakest a durable write promises; earlier unsynced writes
    /// lose the bytes it overlaps, so no crash can bring back what it replaced. With a length change unsynced, the whole file is synced instead: no caller
    /// does a durable write after an unsynced `set_len`, and a shorter length landing later
    /// would otherwise cut durable bytes.
    async fn write_durable(
        &self,
        file: &MemFileHandle,
        offset: u64,
        data: &[u8],
    ) -> Result<(), StorageError> {
        self.write_at(file, offset, data).await?;
        if !self.sync_gate(file).await? {
            return self.with_file(&file.0, |_| ());
        }
        self.with_file(&file.0, |f| {
            if f.pending.iter().any(|op| matches!(op, Pending::SetLen(_))) {
                return f.sync_all();
            }
            // The write's own pending entry lies wholly inside its bytes, so superseding them
            // drops it too, wherever it stands: a write to the same file may have been pushed
            // after it while the sync half waited (a held sync).
            f.pending = supersede(std::mem::take(&mut f.pending), offset, data.len());
            apply_write(&mut f.durable, offset, data);
        })
    }

    async fn len(&self, file: &MemFileHandle) -> Result<u64, StorageError> {
        self.with_file(&file.0, |f| f.current.len() as u64)
    }

    async fn set_len(&self, file: &MemFileHandle, len: u64) -> Result<(), StorageError> {
        self.with_file(&file.0, |f| {
            f.current.resize(len as usize, 0);
            f.pending.push(Pending::SetLen(len));
            f.reserved = f.reserved.min(len);
        })
    }

    async fn reserve_blocks(&self, file: &MemFileHandle, len: u64) -> Result<(), StorageError> {
        if self.take_failure(FailOp::Reserve) {
            return Err(StorageError::Injected {
                op: "reserve",
                name: file.0.clone(),
            });
        }
        self.with_file(&file.0, |f| f.reserved = f.reserved.max(len))
    }

    async fn remove(&self, name: &str) -> Result<(), StorageError> {
        std::future::poll_fn(|cx| {
            let mut state = self.state.borrow_mut();
            if state
                .held_removes
                .as_deref()
                .is_some_and(|prefix| name.starts_with(prefix))
            {
                state.held_remove_wakers.push(cx.waker().clone());
                return std::task::Poll::Pending;
            }
            std::task::Poll::Ready(())
        })
        .await;
        let mut state = self.state.borrow_mut();
        state
            .files
            .remove(name)
            .map(|_| ())
            .ok_or_else(|| Self::not_found(name))
    }

    async fn list(&self) -> Result<Vec<String>, StorageError> {
        Ok(self.state.borrow().files.keys().cloned().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::block_on;

    fn sector(byte: u8, n: usize) -> Vec<u8> {
        vec![byte; SECTOR * n]
    }

    #[test]
    fn unsynced_writes_are_lost_at_a_crash_and_synced_ones_stay() {
        let disk = MemStorage::new();
        block_on(async {
            let f = disk.open("a", OpenMode::Create).await.unwrap();
            disk.write_at(&f, 0, &sector(1, 1)).await.unwrap();
            disk.sync(&f).await.unwrap();
            disk.write_at(&f, SECTOR as u64, &sector(2, 1))
                .await
                .unwrap();
            disk.crash(CrashMode::LoseUnsynced, &mut Prng::new(1));
            let mut buf = sector(0, 2);
            assert_eq!(disk.read_at(&f, 0, &mut buf).await.unwrap(), SECTOR);
            assert_eq!(&buf[..SECTOR], &sector(1, 1)[..]);
        });
    }

    #[test]
    fn torn_writes_land_as_a_sector_prefix() {
        for seed in 0..64 {
            let disk = MemStorage::new();
            block_on(async {
                let f = disk.open("a", OpenMode::Create).await.unwrap();
                disk.write_at(&f, 0, &sector(7, 4)).await.unwrap();
                disk.crash(CrashMode::TornPrefix, &mut Prng::new(seed));
                let image = disk.durable_image("a").unwrap();
                assert_eq!(image.len() % SECTOR, 0);
                assert!(image.iter().all(|b| *b == 7));
            });
        }
    }

    #[test]
    fn unaligned_access_is_refused() {
        let disk = MemStorage::new();
        block_on(async {
            let f = disk.open("a", OpenMode::Create).await.unwrap();
            assert!(matches!(
                disk.write_at(&f, 1, &sector(0, 1)).await,
                Err(StorageError::Unaligned { .. })
            ));
            let mut small = [0u8; 100];
            assert!(disk.read_at(&f, 0, &mut small).await.is_err());
        });
    }

    #[test]
    fn lost_sectors_fail_reads_until_rewritten() {
        let disk = MemStorage::new();
        block_on(async {
            let f = disk.open("a", OpenMode::Create).await.unwrap();
            disk.write_at(&f, 0, &sector(1, 2)).await.unwrap();
            disk.sync(&f).await.unwrap();
            disk.lose_sector("a", 1).unwrap();
            let mut buf = sector(0, 2);
            let err = disk.read_at(&f, 0, &mut buf).await.unwrap_err();
            assert!(err.is_media());
            disk.write_at(&f, SECTOR as u64, &sector(3, 1))
                .await
                .unwrap();
            assert!(disk.read_at(&f, 0, &mut buf).await.is_ok());
        });
    }

    #[test]
    fn injected_failures_are_errors() {
        let disk = MemStorage::new();
        block_on(async {
            let f = disk.open("a", OpenMode::Create).await.unwrap();
            disk.fail_next(FailOp::Sync);
            disk.write_at(&f, 0, &sector(1, 1)).await.unwrap();
            assert!(matches!(
                disk.sync(&f).await,
                Err(StorageError::Injected { .. })
            ));
            assert!(disk.sync(&f).await.is_ok());
        });
    }

    #[test]
    fn torn_last_lands_all_but_a_torn_last_write() {
        for seed in 0..20 {
            let disk = MemStorage::new();
            block_on(async {
                let f = disk.open("a", OpenMode::Create).await.unwrap();
                disk.write_at(&f, 0, &sector(1, 1)).await.unwrap();
                disk.sync(&f).await.unwrap();
                disk.write_at(&f, 0, &sector(2, 1)).await.unwrap();
                disk.write_at(&f, 4096, &sector(3, 3)).await.unwrap();
                let g = disk.open("b", OpenMode::Create).await.unwrap();
                disk.write_at(&g, 0, &sector(4, 1)).await.unwrap();
            });
            disk.crash(CrashMode::TornLast, &mut Prng::new(seed));
            let a = disk.durable_image("a").unwrap();
            assert_eq!(
                a[..4096],
                sector(2, 1)[..],
                "an earlier unsynced write lands"
            );
            let landed = a[4096..]
                .chunks(4096)
                .take_while(|s| s.iter().all(|b| *b == 3));
            let landed = landed.count();
            assert!(
                (1..3).contains(&landed),
                "a strict, non-empty prefix: {landed}"
            );
            let b = disk.durable_image("b").unwrap();
            assert_eq!(b.iter().filter(|x| **x != 4).count(), 1, "one byte flipped");
        }
    }

    #[test]
    fn sync_makes_exactly_the_current_image_durable() {
        let disk = MemStorage::new();
        block_on(async {
            let f = disk.open("a", OpenMode::Create).await.unwrap();
            disk.write_at(&f, 8192, &sector(1, 2)).await.unwrap();
            disk.set_len(&f, 4096 * 5).await.unwrap();
            disk.write_at(&f, 0, &sector(2, 1)).await.unwrap();
            disk.sync(&f).await.unwrap();
            disk.write_at(&f, 4096, &sector(3, 1)).await.unwrap();
            disk.sync(&f).await.unwrap();
            disk.set_len(&f, 4096 * 3).await.unwrap();
            disk.sync(&f).await.unwrap();
        });
        let mut expected = sector(2, 1);
        expected.extend(sector(3, 1));
        expected.extend(sector(1, 1));
        assert_eq!(disk.durable_image("a").unwrap(), expected);
        disk.crash(CrashMode::LoseUnsynced, &mut Prng::new(1));
        assert_eq!(disk.durable_image("a").unwrap(), expected);
    }

    /// Decision 496: a durable write is durable at once, alone. Every crash mode keeps it,
    /// none keeps the file's other unsynced write for it, and an older unsynced write over the
    /// same sector never lands over it.
    #[test]
    fn a_durable_write_is_durable_alone() {
        let modes = [
            CrashMode::LoseUnsynced,
            CrashMode::TornPrefix,
            CrashMode::Reorder,
            CrashMode::TornLast,
        ];
        for (seed, mode) in (0..64).flat_map(|s| modes.map(|m| (s, m))) {
            let disk = MemStorage::new();
            block_on(async {
                let f = disk.open("a", OpenMode::Create).await.unwrap();
                disk.write_at(&f, 0, &sector(1, 3)).await.unwrap();
                disk.sync(&f).await.unwrap();
                // Unsynced: sectors 1 and 2 get 2s, then sector 2 durably gets 3s.
                disk.write_at(&f, 4096, &sector(2, 2)).await.unwrap();
                disk.write_durable(&f, 8192, &sector(3, 1)).await.unwrap();
                assert_eq!(disk.counts(), (3, 2), "one write and one sync");
            });
            let image = disk.durable_image("a").unwrap();
            assert_eq!(image[8192..], sector(3, 1)[..], "durable on return");
            assert_eq!(
                image[4096..8192],
                sector(1, 1)[..],
                "the other write stays unsynced"
            );
            disk.crash(mode, &mut Prng::new(seed));
            let image = disk.durable_image("a").unwrap();
            assert_eq!(image.len(), 3 * SECTOR, "{mode:?} seed {seed}");
            assert_eq!(image[8192..], sector(3, 1)[..], "{mode:?} seed {seed}");
        }
        // The sync half fails as a sync does: the bytes are written, not durable.
        let disk = MemStorage::new();
        block_on(async {
            let f = disk.open("a", OpenMode::Create).await.unwrap();
            disk.fail_next(FailOp::Sync);
            assert!(disk.write_durable(&f, 0, &sector(4, 1)).await.is_err());
        });
        assert_eq!(disk.durable_image("a").unwrap(), Vec::<u8>::new());
    }

    #[test]
    fn crashes_are_deterministic_given_a_seed() {
        let run = |seed| {
            let disk = MemStorage::new();
            block_on(async {
                let f = disk.open("a", OpenMode::Create).await.unwrap();
                for i in 0..8u8 {
                    disk.write_at(&f, i as u64 * 8192, &sector(i + 1, 2))
                        .await
                        .unwrap();
                }
            });
            disk.crash(CrashMode::Reorder, &mut Prng::new(seed));
            disk.durable_image("a").unwrap()
        };
        assert_eq!(run(9), run(9));
    }
}
