//! A FUSE filesystem with a power switch, for the file backend's power-loss tests.
//!
//! It holds everything in memory and models durability the way the journal's contract states
//! it: a write (and a length change) of a file lands in the file's unsynced log and is durable
//! only once an `fsync`/`fdatasync` of that file has returned; a directory entry (create,
//! mkdir, unlink, rename) is durable only once an `fsync` of its parent directory has returned.
//!
//! [`PowerFs::cut`] cuts the power at that instant: from then on every request fails with
//! `EIO`, and the image the disk comes back with is fixed by the cut's [`Cut`] mode (every
//! unsynced write lost; or a prefix of the unsynced writes of each file kept with the next one
//! torn at a sector boundary; or each unsynced sector kept or lost independently), with
//! unsynced directory entries reverted to their last synced state when the cut says so.
//! [`PowerFs::remount`] unmounts (dropping every kernel cache), installs the image and mounts
//! again.
//!
//! Every open is answered with `FOPEN_DIRECT_IO`, so no data goes through the page cache and
//! the filesystem sees each `O_DIRECT` write as the backend issued it (split at most at the
//! kernel's `max_write`, which a real disk may also tear at).

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, UNIX_EPOCH};

use fuser::{
    BackgroundSession, Config, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags,
    Generation, INodeNo, LockOwner, MountOption, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate,
    ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyWrite, Request, WriteFlags,
};

/// The sector the journal writes in and the unit at which the cut tears writes.
pub const SECTOR: u64 = 4096;

/// How the power cut treats what was not yet synced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tear {
    /// Every unsynced write and length change is lost.
    LoseAll,
    /// Per file, a random prefix of its unsynced operations survived, and the next write was
    /// torn: a random prefix of its sectors survived.
    TornPrefix,
    /// Per file, each unsynced write's sectors survive or vanish independently (the device
    /// reordered them), length changes likewise.
    Reordered,
}

/// A power cut: what happens to unsynced data and to unsynced directory entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cut {
    /// Unsynced data.
    pub tear: Tear,
    /// Whether directory entries not made durable by an fsync of their directory are reverted.
    pub drop_dir_entries: bool,
    /// Seed of the cut's random choices.
    pub seed: u64,
}

#[derive(Debug, Clone)]
enum Pending {
    Write { offset: u64, data: Vec<u8> },
    SetLen(u64),
}

#[derive(Debug, Clone)]
enum Body {
    File {
        data: Vec<u8>,
        durable: Vec<u8>,
        unsynced: Vec<Pending>,
    },
    Dir {
        entries: BTreeMap<String, u64>,
        durable: BTreeMap<String, u64>,
    },
}

/// Counters over the filesystem's life (all mounts).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Opens (and creates) of regular files.
    pub opens: u64,
    /// Of them, opens that carried `O_DIRECT`.
    pub opens_direct: u64,
    /// Writes received.
    pub writes: u64,
    /// Of them, writes that carried `O_DSYNC` (each durable on its reply).
    pub writes_dsync: u64,
    /// File syncs received.
    pub fsyncs: u64,
    /// Directory syncs received.
    pub dir_fsyncs: u64,
    /// Power cuts.
    pub cuts: u64,
    /// Directory entries reverted by cuts.
    pub entries_reverted: u64,
    /// Unsynced operations (writes, length changes) dropped or torn by cuts.
    pub ops_lost: u64,
}

#[derive(Debug)]
struct Disk {
    nodes: HashMap<u64, Body>,
    next_ino: u64,
    powered: bool,
    /// The image fixed at the last cut, installed by the next remount.
    image: Option<HashMap<u64, Body>>,
    /// A cut that happens right after this many more mutating requests.
    armed: Option<(u64, Cut)>,
    stats: Stats,
}

/// A tiny deterministic generator for the cut's choices (splitmix64).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next() % n }
    }
}

fn apply_write(data: &mut Vec<u8>, offset: u64, bytes: &[u8]) {
    let end = offset as usize + bytes.len();
    if data.len() < end {
        data.resize(end, 0);
    }
    data[offset as usize..end].copy_from_slice(bytes);
}

impl Disk {
    /// Cuts the power now (a no-op without power).
    fn cut(&mut self, cut: Cut) {
        if !self.powered {
            return;
        }
        let image = self.crash_image(cut);
        self.image = Some(image);
        self.powered = false;
        self.armed = None;
        self.stats.cuts += 1;
    }

    /// Counts a mutating request that has just been applied, and fires an armed cut.
    fn mutated(&mut self) {
        if let Some((left, cut)) = &mut self.armed {
            *left = left.saturating_sub(1);
            if *left == 0 {
                let cut = *cut;
                self.cut(cut);
            }
        }
    }

    /// The image after a power cut now.
    fn crash_image(&mut self, cut: Cut) -> HashMap<u64, Body> {
        let mut rng = Rng(cut.seed);
        let mut image = HashMap::new();
        let mut inos: Vec<u64> = self.nodes.keys().copied().collect();
        inos.sort_unstable();
        for ino in inos {
            let body = match &self.nodes[&ino] {
                Body::File {
                    durable, unsynced, ..
                } => {
                    let mut data = durable.clone();
                    let n = unsynced.len();
                    match cut.tear {
                        Tear::LoseAll => self.stats.ops_lost += n as u64,
                        Tear::TornPrefix => {
                            let kept = rng.below(n as u64 + 1) as usize;
                            for op in &unsynced[..kept] {
                                match op {
                                    Pending::Write { offset, data: b } => {
                                        apply_write(&mut data, *offset, b)
                                    }
                                    Pending::SetLen(len) => data.resize(*len as usize, 0),
                                }
                            }
                            if let Some(Pending::Write { offset, data: b }) = unsynced.get(kept) {
                                let sectors = (b.len() as u64).div_ceil(SECTOR);
                                let keep = (rng.below(sectors) * SECTOR) as usize;
                                apply_write(&mut data, *offset, &b[..keep.min(b.len())]);
                            }
                            self.stats.ops_lost += (n - kept) as u64;
                        }
                        Tear::Reordered => {
                            for op in unsynced {
                                match op {
                                    Pending::Write { offset, data: b } => {
                                        for (i, chunk) in b.chunks(SECTOR as usize).enumerate() {
                                            if rng.below(2) == 0 {
                                                self.stats.ops_lost += 1;
                                                continue;
                                            }
                                            let at = offset + i as u64 * SECTOR;
                                            apply_write(&mut data, at, chunk);
                                        }
                                    }
                                    Pending::SetLen(len) => {
                                        if rng.below(2) == 0 {
                                            self.stats.ops_lost += 1;
                                        } else {
                                            data.resize(*len as usize, 0);
                                        }
                                    }
                                }
                            }
                        }
                    }
                    Body::File {
                        data: data.clone(),
                        durable: data,
                        unsynced: Vec::new(),
                    }
                }
                Body::Dir { entries, durable } => {
                    let kept = if cut.drop_dir_entries {
                        durable.clone()
                    } else {
                        entries.clone()
                    };
                    Body::Dir {
                        entries: kept.clone(),
                        durable: kept,
                    }
                }
            };
            image.insert(ino, body);
        }
        // Nodes no entry reaches are gone.
        let mut reachable = vec![INodeNo::ROOT.0];
        let mut seen = std::collections::HashSet::new();
        while let Some(ino) = reachable.pop() {
            if !seen.insert(ino) {
                continue;
            }
            if let Some(Body::Dir { entries, .. }) = image.get(&ino) {
                reachable.extend(entries.values().copied());
            }
        }
        image.retain(|ino, _| seen.contains(ino));
        // Entries the cut reverted, in the directories that survive it.
        for (ino, body) in &image {
            if let (Body::Dir { entries: now, .. }, Some(Body::Dir { entries: was, .. })) =
                (body, self.nodes.get(ino))
            {
                let reverted = was.iter().filter(|(k, v)| now.get(*k) != Some(v)).count()
                    + now.keys().filter(|k| !was.contains_key(*k)).count();
                self.stats.entries_reverted += reverted as u64;
            }
        }
        image
    }
}

/// The filesystem: a shared disk and, while mounted, the FUSE session serving it.
pub struct PowerFs {
    disk: Arc<Mutex<Disk>>,
    mountpoint: PathBuf,
    session: Option<BackgroundSession>,
}

struct Server {
    disk: Arc<Mutex<Disk>>,
}

const TTL: Duration = Duration::ZERO;

fn attr(ino: u64, body: &Body) -> FileAttr {
    let (kind, size, perm) = match body {
        Body::File { data, .. } => (FileType::RegularFile, data.len() as u64, 0o644),
        Body::Dir { entries, .. } => (FileType::Directory, entries.len() as u64, 0o755),
    };
    FileAttr {
        ino: INodeNo(ino),
        size,
        blocks: size.div_ceil(512),
        atime: UNIX_EPOCH,
        mtime: UNIX_EPOCH,
        ctime: UNIX_EPOCH,
        crtime: UNIX_EPOCH,
        kind,
        perm,
        nlink: if kind == FileType::Directory { 2 } else { 1 },
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: SECTOR as u32,
        flags: 0,
    }
}

impl Server {
    /// The disk, if it has power.
    fn disk(&self) -> Result<MutexGuard<'_, Disk>, Errno> {
        let disk = self.disk.lock().unwrap_or_else(|p| p.into_inner());
        if disk.powered {
            Ok(disk)
        } else {
            Err(Errno::EIO)
        }
    }

    fn new_node(&self, parent: INodeNo, name: &OsStr, body: Body) -> Result<FileAttr, Errno> {
        let name = name.to_str().ok_or(Errno::EINVAL)?.to_owned();
        let mut disk = self.disk()?;
        let ino = disk.next_ino;
        match disk.nodes.get_mut(&parent.0) {
            Some(Body::Dir { entries, .. }) => {
                if entries.contains_key(&name) {
                    return Err(Errno::EEXIST);
                }
                entries.insert(name, ino);
            }
            Some(_) => return Err(Errno::ENOTDIR),
            None => return Err(Errno::ENOENT),
        }
        disk.next_ino += 1;
        let a = attr(ino, &body);
        disk.nodes.insert(ino, body);
        disk.mutated();
        Ok(a)
    }

    fn remove_entry(&self, parent: INodeNo, name: &OsStr, dir: bool) -> Result<(), Errno> {
        let name = name.to_str().ok_or(Errno::EINVAL)?;
        let mut disk = self.disk()?;
        let ino = match disk.nodes.get(&parent.0) {
            Some(Body::Dir { entries, .. }) => *entries.get(name).ok_or(Errno::ENOENT)?,
            _ => return Err(Errno::ENOTDIR),
        };
        match (disk.nodes.get(&ino), dir) {
            (Some(Body::Dir { entries, .. }), true) if !entries.is_empty() => {
                return Err(Errno::ENOTEMPTY);
            }
            (Some(Body::Dir { .. }), false) => return Err(Errno::EISDIR),
            (Some(Body::File { .. }), true) => return Err(Errno::ENOTDIR),
            _ => {}
        }
        if let Some(Body::Dir { entries, .. }) = disk.nodes.get_mut(&parent.0) {
            entries.remove(name);
        }
        disk.mutated();
        // The node stays until the next remount: a durable entry may still name it.
        Ok(())
    }

    fn opened(&self, ino: INodeNo, flags: i32) -> Result<(), Errno> {
        let mut disk = self.disk()?;
        if let Some(Body::File { .. }) = disk.nodes.get(&ino.0) {
            disk.stats.opens += 1;
            if flags & libc::O_DIRECT != 0 {
                disk.stats.opens_direct += 1;
            }
        }
        Ok(())
    }
}

macro_rules! answer {
    ($reply:expr, $result:expr, $ok:ident $(, $arg:expr)*) => {
        match $result {
            Ok(v) => $reply.$ok(v $(, $arg)*),
            Err(e) => $reply.error(e),
        }
    };
}

impl Filesystem for Server {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let result = (|| {
            let disk = self.disk()?;
            let Some(Body::Dir { entries, .. }) = disk.nodes.get(&parent.0) else {
                return Err(Errno::ENOTDIR);
            };
            let ino = *entries
                .get(name.to_str().ok_or(Errno::ENOENT)?)
                .ok_or(Errno::ENOENT)?;
            Ok(attr(ino, &disk.nodes[&ino]))
        })();
        match result {
            Ok(a) => reply.entry(&TTL, &a, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let result = (|| {
            let disk = self.disk()?;
            let body = disk.nodes.get(&ino.0).ok_or(Errno::ENOENT)?;
            Ok(attr(ino.0, body))
        })();
        match result {
            Ok(a) => reply.attr(&TTL, &a),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<fuser::TimeOrNow>,
        _mtime: Option<fuser::TimeOrNow>,
        _ctime: Option<std::time::SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<std::time::SystemTime>,
        _chgtime: Option<std::time::SystemTime>,
        _bkuptime: Option<std::time::SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let result = (|| {
            let mut disk = self.disk()?;
            let body = disk.nodes.get_mut(&ino.0).ok_or(Errno::ENOENT)?;
            let mut changed = false;
            if let (Some(len), Body::File { data, unsynced, .. }) = (size, &mut *body) {
                data.resize(len as usize, 0);
                unsynced.push(Pending::SetLen(len));
                changed = true;
            }
            let a = attr(ino.0, body);
            if changed {
                disk.mutated();
            }
            Ok(a)
        })();
        match result {
            Ok(a) => reply.attr(&TTL, &a),
            Err(e) => reply.error(e),
        }
    }

    fn mkdir(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        _mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        let body = Body::Dir {
            entries: BTreeMap::new(),
            durable: BTreeMap::new(),
        };
        match self.new_node(parent, name, body) {
            Ok(a) => reply.entry(&TTL, &a, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        _mode: u32,
        _umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let body = Body::File {
            data: Vec::new(),
            durable: Vec::new(),
            unsynced: Vec::new(),
        };
        let result = self
            .new_node(parent, name, body)
            .and_then(|a| self.opened(a.ino, flags).map(|()| a));
        match result {
            Ok(a) => reply.created(
                &TTL,
                &a,
                Generation(0),
                FileHandle(0),
                FopenFlags::FOPEN_DIRECT_IO,
            ),
            Err(e) => reply.error(e),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        answer!(reply, self.remove_entry(parent, name, false), ok_unit);
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        answer!(reply, self.remove_entry(parent, name, true), ok_unit);
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        _flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let result = (|| {
            let (name, newname) = (
                name.to_str().ok_or(Errno::EINVAL)?,
                newname.to_str().ok_or(Errno::EINVAL)?.to_owned(),
            );
            let mut disk = self.disk()?;
            let ino = match disk.nodes.get_mut(&parent.0) {
                Some(Body::Dir { entries, .. }) => entries.remove(name).ok_or(Errno::ENOENT)?,
                _ => return Err(Errno::ENOTDIR),
            };
            match disk.nodes.get_mut(&newparent.0) {
                Some(Body::Dir { entries, .. }) => {
                    entries.insert(newname, ino);
                    disk.mutated();
                    Ok(())
                }
                _ => Err(Errno::ENOTDIR),
            }
        })();
        answer!(reply, result, ok_unit);
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        match self.opened(ino, flags.0) {
            Ok(()) => reply.opened(FileHandle(0), FopenFlags::FOPEN_DIRECT_IO),
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let result = (|| {
            let disk = self.disk()?;
            let Some(Body::File { data, .. }) = disk.nodes.get(&ino.0) else {
                return Err(Errno::EISDIR);
            };
            let start = (offset as usize).min(data.len());
            let end = (start + size as usize).min(data.len());
            Ok(data[start..end].to_vec())
        })();
        match result {
            Ok(bytes) => reply.data(&bytes),
            Err(e) => reply.error(e),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        bytes: &[u8],
        _write_flags: WriteFlags,
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        // The kernel passes a write's `O_DSYNC` (from the descriptor or `RWF_DSYNC`) in its
        // flags and leaves the sync to the filesystem on a direct-IO file.
        let dsync = flags.0 & libc::O_DSYNC != 0;
        let result = (|| {
            let mut disk = self.disk()?;
            disk.stats.writes += 1;
            disk.stats.writes_dsync += u64::from(dsync);
            let Some(Body::File {
                data,
                durable,
                unsynced,
            }) = disk.nodes.get_mut(&ino.0)
            else {
                return Err(Errno::EISDIR);
            };
            apply_write(data, offset, bytes);
            if !dsync {
                unsynced.push(Pending::Write {
                    offset,
                    data: bytes.to_vec(),
                });
            } else if unsynced.iter().any(|op| matches!(op, Pending::SetLen(_))) {
                // A shorter length landing after it would cut durable bytes: sync it all (no
                // caller writes durably after an unsynced length change).
                durable.clone_from(data);
                unsynced.clear();
            } else {
                // Durable alone, nothing else of the file with it. An older unsynced write
                // over the same bytes keeps only its parts outside them, so no cut can land
                // what this write replaced.
                let end = offset + bytes.len() as u64;
                let mut kept = Vec::with_capacity(unsynced.len());
                for op in unsynced.drain(..) {
                    match op {
                        Pending::Write {
                            offset: at,
                            data: old,
                        } if at < end && offset < at + old.len() as u64 => {
                            if at < offset {
                                let data = old[..(offset - at) as usize].to_vec();
                                kept.push(Pending::Write { offset: at, data });
                            }
                            if at + old.len() as u64 > end {
                                let data = old[(end - at) as usize..].to_vec();
                                kept.push(Pending::Write { offset: end, data });
                            }
                        }
                        other => kept.push(other),
                    }
                }
                *unsynced = kept;
                apply_write(durable, offset, bytes);
            }
            disk.mutated();
            Ok(bytes.len() as u32)
        })();
        answer!(reply, result, written);
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let result = (|| {
            let mut disk = self.disk()?;
            disk.stats.fsyncs += 1;
            if let Some(Body::File {
                data,
                durable,
                unsynced,
            }) = disk.nodes.get_mut(&ino.0)
            {
                durable.clone_from(data);
                unsynced.clear();
            }
            Ok(())
        })();
        answer!(reply, result, ok_unit);
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let result = (|| {
            let disk = self.disk()?;
            let Some(Body::Dir { entries, .. }) = disk.nodes.get(&ino.0) else {
                return Err(Errno::ENOTDIR);
            };
            let mut list = vec![
                (ino.0, FileType::Directory, ".".to_owned()),
                (ino.0, FileType::Directory, "..".to_owned()),
            ];
            for (name, child) in entries {
                let kind = match disk.nodes.get(child) {
                    Some(Body::Dir { .. }) => FileType::Directory,
                    _ => FileType::RegularFile,
                };
                list.push((*child, kind, name.clone()));
            }
            Ok(list)
        })();
        match result {
            Ok(list) => {
                for (i, (child, kind, name)) in list.into_iter().enumerate().skip(offset as usize) {
                    if reply.add(INodeNo(child), i as u64 + 1, kind, name) {
                        break;
                    }
                }
                reply.ok();
            }
            Err(e) => reply.error(e),
        }
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let result = (|| {
            let mut disk = self.disk()?;
            disk.stats.dir_fsyncs += 1;
            if let Some(Body::Dir { entries, durable }) = disk.nodes.get_mut(&ino.0) {
                durable.clone_from(entries);
            }
            Ok(())
        })();
        answer!(reply, result, ok_unit);
    }
}

/// `ReplyEmpty::ok` under a name the `answer!` macro can pass the unit value to.
trait OkUnit {
    fn ok_unit(self, unit: ());
}

impl OkUnit for ReplyEmpty {
    fn ok_unit(self, (): ()) {
        self.ok();
    }
}

impl PowerFs {
    /// Mounts an empty filesystem at `mountpoint` (created if missing).
    pub fn mount(mountpoint: &Path) -> std::io::Result<PowerFs> {
        std::fs::create_dir_all(mountpoint)?;
        let mut nodes = HashMap::new();
        nodes.insert(
            INodeNo::ROOT.0,
            Body::Dir {
                entries: BTreeMap::new(),
                durable: BTreeMap::new(),
            },
        );
        let disk = Disk {
            nodes,
            next_ino: INodeNo::ROOT.0 + 1,
            powered: true,
            image: None,
            armed: None,
            stats: Stats::default(),
        };
        let mut fs = PowerFs {
            disk: Arc::new(Mutex::new(disk)),
            mountpoint: mountpoint.to_owned(),
            session: None,
        };
        fs.start()?;
        Ok(fs)
    }

    fn start(&mut self) -> std::io::Result<()> {
        let mut config = Config::default();
        config.mount_options = vec![
            MountOption::FSName("strand-powerfs".to_owned()),
            MountOption::NoAtime,
        ];
        let server = Server {
            disk: Arc::clone(&self.disk),
        };
        self.session = Some(fuser::spawn_mount(server, &self.mountpoint, &config)?);
        Ok(())
    }

    fn disk(&self) -> MutexGuard<'_, Disk> {
        self.disk.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Cuts the power now: the disk's image is fixed and every later request fails. A no-op
    /// if the power is already off.
    pub fn cut(&self, cut: Cut) {
        self.disk().cut(cut);
    }

    /// Arms a cut right after the `ops`-th mutating request from now (a write, length change,
    /// create, mkdir, unlink or rename): the request is applied, unsynced, and the power dies
    /// before its reply.
    pub fn arm(&self, ops: u64, cut: Cut) {
        self.disk().armed = Some((ops.max(1), cut));
    }

    /// Whether the power is on.
    pub fn powered(&self) -> bool {
        self.disk().powered
    }

    /// Unmounts, installs the image of the last cut (if any), and mounts again with power.
    /// Every open file on the mount must be closed first.
    pub fn remount(&mut self) -> std::io::Result<()> {
        if let Some(session) = self.session.take() {
            // Unmount here, retrying while the mount is busy (the files of a child killed a
            // moment ago, or copies a child being forked by another test thread holds until
            // its exec). The session then reads the end of the connection and stops; fuser's
            // own unmount (in its drop) finds nothing mounted.
            let mut tries = 0;
            loop {
                match nix::mount::umount(&self.mountpoint) {
                    Ok(()) => break,
                    Err(nix::errno::Errno::EBUSY) if tries < 500 => {
                        tries += 1;
                        std::thread::sleep(Duration::from_millis(10));
                    }
                    Err(e) => {
                        return Err(std::io::Error::other(format!(
                            "umount: {e}; holders: {:?}",
                            holders(&self.mountpoint)
                        )));
                    }
                }
            }
            match session.join() {
                // The unmount went through; the session's last read of /dev/fuse found the
                // connection aborted rather than gone (a race in the kernel's teardown, seen
                // about once in a few hundred unmounts).
                Err(e) if e.raw_os_error() == Some(libc::ECONNABORTED) => {}
                other => other?,
            }
        }
        {
            let mut disk = self.disk();
            if let Some(image) = disk.image.take() {
                disk.nodes = image;
            }
            disk.powered = true;
            disk.armed = None;
        }
        self.start()
    }

    /// Counters so far.
    pub fn stats(&self) -> Stats {
        self.disk().stats
    }
}

/// The processes' files and directories under `mountpoint` (for an unmount that stays busy).
fn holders(mountpoint: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return out;
    };
    for p in procs.flatten() {
        let pid = p.file_name().to_string_lossy().into_owned();
        let mut links: Vec<PathBuf> = ["cwd", "root"].iter().map(|l| p.path().join(l)).collect();
        if let Ok(fds) = std::fs::read_dir(p.path().join("fd")) {
            links.extend(fds.flatten().map(|f| f.path()));
        }
        for link in links {
            if let Ok(target) = std::fs::read_link(&link)
                && target.starts_with(mountpoint)
            {
                out.push(format!("{pid} {} -> {}", link.display(), target.display()));
            }
        }
    }
    out
}

impl Drop for PowerFs {
    fn drop(&mut self) {
        if let Some(session) = self.session.take() {
            let _ = session.umount_and_join();
        }
    }
}
