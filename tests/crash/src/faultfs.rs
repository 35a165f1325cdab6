//! faultfs: an in-memory FUSE filesystem that keeps what was written apart from what was made
//! durable, and can drop the former on command (a simulated power cut), fail writes or fsyncs
//! with `EIO`, or slow fsyncs down.
//!
//! The model (what a power cut keeps):
//! - a file's bytes and size as of its last successful `fsync`/`fdatasync` (both are treated
//!   alike: fdatasync also covers the size, as it does for data reads on ext4 and xfs);
//! - a directory's entries (names, creations, unlinks, renames) as of its last successful
//!   `fsync` of the directory itself; a file whose entry was never made durable vanishes, even
//!   if its data was fsynced;
//! - nothing else: there is no background writeback, so in this model data that nobody fsyncs
//!   is lost at every cut (the worst case; a real kernel writes dirty pages back after about
//!   30 s, `vm.dirty_expire_centisecs`).
//!
//! Not modelled: torn sectors inside one fsynced write, reordering of writes to the media
//! before a fsync returns (a cut keeps all or none of a file's unsynced writes, not a
//! subset), hard links, mmap, extended attributes. A failed fsync behaves as Linux does after
//! a writeback error: the dirty data is marked clean without reaching the disk, so a later
//! successful fsync does not save it and a cut loses it.

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, LockOwner,
    OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty,
    ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, TimeOrNow, WriteFlags,
};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ffi::{OsStr, OsString};
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

/// Files are kept in chunks of this many bytes; a missing chunk reads as zeros (fjall
/// preallocates 64 MiB journals and writes only their head).
const CHUNK: u64 = 16 * 1024;
const TTL: Duration = Duration::from_secs(1);
const ROOT: u64 = 1;

#[derive(Default, Clone)]
struct Data {
    size: u64,
    chunks: BTreeMap<u64, Box<[u8]>>,
}

impl Data {
    fn read(&self, offset: u64, len: u64) -> Vec<u8> {
        let end = (offset + len).min(self.size);
        if offset >= end {
            return Vec::new();
        }
        let mut out = vec![0u8; (end - offset) as usize];
        let mut pos = offset;
        while pos < end {
            let idx = pos / CHUNK;
            let within = pos % CHUNK;
            let n = (CHUNK - within).min(end - pos);
            if let Some(c) = self.chunks.get(&idx) {
                let at = (pos - offset) as usize;
                out[at..at + n as usize]
                    .copy_from_slice(&c[within as usize..(within + n) as usize]);
            }
            pos += n;
        }
        out
    }

    /// Writes `buf` at `offset`; returns the chunks touched.
    fn write(&mut self, offset: u64, buf: &[u8], dirty: &mut BTreeSet<u64>) {
        let mut pos = offset;
        let end = offset + buf.len() as u64;
        while pos < end {
            let idx = pos / CHUNK;
            let within = pos % CHUNK;
            let n = (CHUNK - within).min(end - pos);
            let c = self
                .chunks
                .entry(idx)
                .or_insert_with(|| vec![0u8; CHUNK as usize].into_boxed_slice());
            let from = (pos - offset) as usize;
            c[within as usize..(within + n) as usize]
                .copy_from_slice(&buf[from..from + n as usize]);
            dirty.insert(idx);
            pos += n;
        }
        self.size = self.size.max(end);
    }

    fn truncate(&mut self, size: u64, dirty: &mut BTreeSet<u64>) {
        if size < self.size {
            let keep = size.div_ceil(CHUNK);
            let gone: Vec<u64> = self.chunks.range(keep..).map(|(k, _)| *k).collect();
            for k in gone {
                self.chunks.remove(&k);
                dirty.insert(k);
            }
            if !size.is_multiple_of(CHUNK)
                && let Some(c) = self.chunks.get_mut(&(size / CHUNK))
            {
                c[(size % CHUNK) as usize..].fill(0);
                dirty.insert(size / CHUNK);
            }
        }
        self.size = size;
    }
}

struct FileNode {
    cur: Data,
    dur: Data,
    /// Chunks changed since the last fsync.
    dirty: BTreeSet<u64>,
}

struct DirNode {
    cur: BTreeMap<OsString, u64>,
    dur: BTreeMap<OsString, u64>,
    parent: u64,
}

enum Kind {
    File(FileNode),
    Dir(DirNode),
}

struct Node {
    kind: Kind,
    perm: u16,
    mtime: SystemTime,
    /// In some directory's current entries.
    linked: bool,
    /// In how many directories' durable entries.
    dur_refs: u32,
    open: u32,
}

struct State {
    nodes: HashMap<u64, Node>,
    next_ino: u64,
    next_fh: u64,
}

/// What to inject, shared with the test that drives the filesystem.
#[derive(Default)]
pub struct Faults {
    /// The next this many fsyncs (of files or directories) fail with `EIO`.
    pub fail_fsyncs: AtomicU32,
    /// While set, every write fails with `EIO`.
    pub fail_writes: AtomicBool,
    /// Every fsync takes at least this long (ms).
    pub fsync_delay_ms: AtomicU64,
    /// Counters.
    pub fsyncs: AtomicU64,
    /// Fsyncs answered with `EIO`.
    pub failed_fsyncs: AtomicU64,
    /// Writes answered with `EIO`.
    pub failed_writes: AtomicU64,
}

/// What a power cut dropped.
#[derive(Debug, Default, Clone, Copy)]
pub struct CutReport {
    /// Chunks (16 KiB) written since their file's last fsync, now back to their durable state.
    pub dirty_chunks: u64,
    /// Files and directories that vanished (their entries were never made durable).
    pub nodes_dropped: u64,
    /// With `torn`: unsynced chunks that reached the disk anyway.
    pub torn_chunks_kept: u64,
}

/// The filesystem's state; cheap to clone (shared).
#[derive(Clone)]
pub struct FaultFs {
    state: Arc<Mutex<State>>,
    /// The injected faults.
    pub faults: Arc<Faults>,
}

impl Default for FaultFs {
    fn default() -> Self {
        Self::new()
    }
}

impl FaultFs {
    /// An empty filesystem (the root directory only, durable).
    pub fn new() -> Self {
        let mut nodes = HashMap::new();
        nodes.insert(
            ROOT,
            Node {
                kind: Kind::Dir(DirNode {
                    cur: BTreeMap::new(),
                    dur: BTreeMap::new(),
                    parent: ROOT,
                }),
                perm: 0o755,
                mtime: SystemTime::now(),
                linked: true,
                dur_refs: 1,
                open: 0,
            },
        );
        FaultFs {
            state: Arc::new(Mutex::new(State {
                nodes,
                next_ino: ROOT + 1,
                next_fh: 1,
            })),
            faults: Arc::default(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Mounts the filesystem at `at` (root only: it calls mount(2) directly).
    pub fn mount(&self, at: &Path) -> io::Result<fuser::BackgroundSession> {
        let mut cfg = fuser::Config::default();
        cfg.mount_options = vec![
            fuser::MountOption::FSName("faultfs".into()),
            fuser::MountOption::Subtype("faultfs".into()),
            fuser::MountOption::RW,
        ];
        fuser::spawn_mount(self.clone(), at, &cfg)
    }

    /// Drops everything not made durable: every file back to its last fsync, every directory
    /// back to its last directory fsync, and whatever is no longer reachable from the root.
    /// Call it while unmounted (after the process using it is dead), as after a reboot.
    ///
    /// `torn`: before that, each 16 KiB chunk written since its file's last fsync reaches the
    /// disk or not at random (a disk that wrote some of the pages in any order): a file can
    /// then hold later data without earlier data, e.g. a journal with a hole before its tail.
    pub fn power_cut(&self, torn: bool) -> CutReport {
        let mut st = self.lock();
        let mut report = CutReport::default();
        if torn {
            let mut rng = crate::model::new_rng();
            for node in st.nodes.values_mut() {
                if let Kind::File(f) = &mut node.kind {
                    for idx in &f.dirty {
                        if !rand::RngExt::random_bool(&mut rng, 0.5) {
                            continue;
                        }
                        report.torn_chunks_kept += 1;
                        match f.cur.chunks.get(idx) {
                            Some(c) => {
                                f.dur.chunks.insert(*idx, c.clone());
                            }
                            None => {
                                f.dur.chunks.remove(idx);
                            }
                        }
                        f.dur.size = f.dur.size.max(f.cur.size.min((idx + 1) * CHUNK));
                    }
                }
            }
        }
        if std::env::var_os("FAULTFS_DEBUG").is_some() {
            for (ino, n) in &st.nodes {
                if let Kind::Dir(d) = &n.kind {
                    eprintln!("dir {ino}: cur {:?} dur {:?}", d.cur, d.dur);
                }
            }
        }
        for node in st.nodes.values_mut() {
            node.open = 0;
            match &mut node.kind {
                Kind::File(f) => {
                    report.dirty_chunks += f.dirty.len() as u64;
                    f.cur = f.dur.clone();
                    f.dirty.clear();
                }
                Kind::Dir(d) => d.cur = d.dur.clone(),
            }
        }
        // What is reachable from the root through durable entries survives.
        let mut reachable = BTreeSet::from([ROOT]);
        let mut todo = vec![ROOT];
        while let Some(ino) = todo.pop() {
            if let Some(Node {
                kind: Kind::Dir(d), ..
            }) = st.nodes.get(&ino)
            {
                for child in d.dur.values() {
                    if reachable.insert(*child) {
                        todo.push(*child);
                    }
                }
            }
        }
        let before = st.nodes.len();
        st.nodes.retain(|ino, _| reachable.contains(ino));
        report.nodes_dropped = (before - st.nodes.len()) as u64;
        let children: Vec<(u64, u64)> = st
            .nodes
            .iter()
            .filter_map(|(ino, n)| match &n.kind {
                Kind::Dir(d) => Some(d.dur.values().map(|c| (*ino, *c)).collect::<Vec<_>>()),
                Kind::File(_) => None,
            })
            .flatten()
            .collect();
        for n in st.nodes.values_mut() {
            n.linked = false;
            n.dur_refs = 0;
        }
        for (parent, child) in children {
            if let Some(n) = st.nodes.get_mut(&child) {
                n.linked = true;
                n.dur_refs += 1;
                if let Kind::Dir(d) = &mut n.kind {
                    d.parent = parent;
                }
            }
        }
        if let Some(root) = st.nodes.get_mut(&ROOT) {
            root.linked = true;
            root.dur_refs = 1;
        }
        report
    }
}

impl State {
    fn attr(&self, ino: u64) -> Option<FileAttr> {
        let n = self.nodes.get(&ino)?;
        let (kind, size, nlink) = match &n.kind {
            Kind::File(f) => (FileType::RegularFile, f.cur.size, 1),
            Kind::Dir(_) => (FileType::Directory, 0, 2),
        };
        Some(FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: size.div_ceil(512),
            atime: n.mtime,
            mtime: n.mtime,
            ctime: n.mtime,
            crtime: n.mtime,
            kind,
            perm: n.perm,
            nlink,
            uid: 0,
            gid: 0,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        })
    }

    fn dir(&mut self, ino: u64) -> Result<&mut DirNode, Errno> {
        match self.nodes.get_mut(&ino).map(|n| &mut n.kind) {
            Some(Kind::Dir(d)) => Ok(d),
            Some(Kind::File(_)) => Err(Errno::ENOTDIR),
            None => Err(Errno::ENOENT),
        }
    }

    fn file(&mut self, ino: u64) -> Result<&mut FileNode, Errno> {
        match self.nodes.get_mut(&ino).map(|n| &mut n.kind) {
            Some(Kind::File(f)) => Ok(f),
            Some(Kind::Dir(_)) => Err(Errno::EISDIR),
            None => Err(Errno::ENOENT),
        }
    }

    /// Frees a node that no directory names (now or durably) and nobody has open.
    fn collect(&mut self, ino: u64) {
        let Some(n) = self.nodes.get(&ino) else {
            return;
        };
        if ino == ROOT || n.linked || n.dur_refs > 0 || n.open > 0 {
            return;
        }
        let n = self.nodes.remove(&ino).expect("present");
        if let Kind::Dir(d) = n.kind {
            for child in d.dur.values() {
                if let Some(c) = self.nodes.get_mut(child) {
                    c.dur_refs -= 1;
                }
                self.collect(*child);
            }
        }
    }

    fn new_node(&mut self, parent: u64, name: &OsStr, kind: Kind, perm: u16) -> Result<u64, Errno> {
        let d = self.dir(parent)?;
        if d.cur.contains_key(name) {
            return Err(Errno::EEXIST);
        }
        let ino = self.next_ino;
        self.next_ino += 1;
        self.dir(parent)?.cur.insert(name.to_owned(), ino);
        self.nodes.insert(
            ino,
            Node {
                kind,
                perm,
                mtime: SystemTime::now(),
                linked: true,
                dur_refs: 0,
                open: 0,
            },
        );
        Ok(ino)
    }

    fn unlink(&mut self, parent: u64, name: &OsStr, want_dir: bool) -> Result<(), Errno> {
        let ino = *self.dir(parent)?.cur.get(name).ok_or(Errno::ENOENT)?;
        match (&self.nodes[&ino].kind, want_dir) {
            (Kind::Dir(d), true) if !d.cur.is_empty() => return Err(Errno::ENOTEMPTY),
            (Kind::Dir(_), false) => return Err(Errno::EISDIR),
            (Kind::File(_), true) => return Err(Errno::ENOTDIR),
            _ => {}
        }
        self.dir(parent)?.cur.remove(name);
        self.nodes.get_mut(&ino).expect("present").linked = false;
        self.collect(ino);
        Ok(())
    }

    fn rename(
        &mut self,
        parent: u64,
        name: &OsStr,
        newparent: u64,
        newname: &OsStr,
        flags: RenameFlags,
    ) -> Result<(), Errno> {
        if flags.contains(RenameFlags::RENAME_EXCHANGE) {
            return Err(Errno::EINVAL);
        }
        let ino = *self.dir(parent)?.cur.get(name).ok_or(Errno::ENOENT)?;
        let replaced = self.dir(newparent)?.cur.get(newname).copied();
        if let Some(old) = replaced {
            if flags.contains(RenameFlags::RENAME_NOREPLACE) {
                return Err(Errno::EEXIST);
            }
            if old == ino {
                return Ok(());
            }
            if let Kind::Dir(d) = &self.nodes[&old].kind
                && !d.cur.is_empty()
            {
                return Err(Errno::ENOTEMPTY);
            }
        }
        self.dir(parent)?.cur.remove(name);
        self.dir(newparent)?.cur.insert(newname.to_owned(), ino);
        if let Kind::Dir(d) = &mut self.nodes.get_mut(&ino).expect("present").kind {
            d.parent = newparent;
        }
        if let Some(old) = replaced {
            self.nodes.get_mut(&old).expect("present").linked = false;
            self.collect(old);
        }
        Ok(())
    }

    fn fsync_dir(&mut self, ino: u64) -> Result<(), Errno> {
        let d = self.dir(ino)?;
        let before: Vec<u64> = d.dur.values().copied().collect();
        d.dur = d.cur.clone();
        let after: Vec<u64> = d.dur.values().copied().collect();
        for c in &after {
            if let Some(n) = self.nodes.get_mut(c) {
                n.dur_refs += 1;
            }
        }
        for c in before {
            if let Some(n) = self.nodes.get_mut(&c) {
                n.dur_refs -= 1;
            }
            self.collect(c);
        }
        Ok(())
    }

    fn fsync_file(&mut self, ino: u64, fail: bool) -> Result<(), Errno> {
        let f = self.file(ino)?;
        let dirty = std::mem::take(&mut f.dirty);
        if fail {
            // As Linux after a writeback error: the pages are marked clean, not written.
            return Err(Errno::EIO);
        }
        for idx in dirty {
            match f.cur.chunks.get(&idx) {
                Some(c) => {
                    f.dur.chunks.insert(idx, c.clone());
                }
                None => {
                    f.dur.chunks.remove(&idx);
                }
            }
        }
        f.dur.size = f.cur.size;
        let keep = f.dur.size.div_ceil(CHUNK);
        let gone: Vec<u64> = f.dur.chunks.range(keep..).map(|(k, _)| *k).collect();
        for k in gone {
            f.dur.chunks.remove(&k);
        }
        Ok(())
    }
}

impl FaultFs {
    /// Runs a file or directory fsync, with the injected delay and failures.
    fn fsync(&self, ino: u64, dir: bool, reply: ReplyEmpty) {
        let faults = &self.faults;
        faults.fsyncs.fetch_add(1, Ordering::Relaxed);
        let fail = faults
            .fail_fsyncs
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .is_ok();
        if fail {
            faults.failed_fsyncs.fetch_add(1, Ordering::Relaxed);
        }
        let delay = faults.fsync_delay_ms.load(Ordering::Relaxed);
        let this = self.clone();
        let finish = move || {
            let mut st = this.lock();
            let r = if dir {
                if fail {
                    Err(Errno::EIO)
                } else {
                    st.fsync_dir(ino)
                }
            } else {
                st.fsync_file(ino, fail)
            };
            match r {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(e),
            }
        };
        if delay == 0 {
            finish();
        } else {
            // Slow, but without blocking the other requests.
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(delay));
                finish();
            });
        }
    }
}

impl Filesystem for FaultFs {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let mut st = self.lock();
        let ino = match st.dir(parent.0) {
            Ok(d) => d.cur.get(name).copied(),
            Err(e) => return reply.error(e),
        };
        match ino.and_then(|i| st.attr(i)) {
            Some(a) => reply.entry(&TTL, &a, Generation(0)),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.lock().attr(ino.0) {
            Some(a) => reply.attr(&TTL, &a),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let mut st = self.lock();
        if let Some(size) = size {
            if self.faults.fail_writes.load(Ordering::Relaxed) {
                self.faults.failed_writes.fetch_add(1, Ordering::Relaxed);
                return reply.error(Errno::EIO);
            }
            match st.file(ino.0) {
                Ok(f) => f.cur.truncate(size, &mut f.dirty),
                Err(e) => return reply.error(e),
            }
        }
        if let Some(n) = st.nodes.get_mut(&ino.0) {
            if let Some(mode) = mode {
                n.perm = (mode & 0o7777) as u16;
            }
            n.mtime = SystemTime::now();
        }
        match st.attr(ino.0) {
            Some(a) => reply.attr(&TTL, &a),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn mkdir(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        let mut st = self.lock();
        let kind = Kind::Dir(DirNode {
            cur: BTreeMap::new(),
            dur: BTreeMap::new(),
            parent: parent.0,
        });
        match st.new_node(parent.0, name, kind, (mode & 0o7777) as u16) {
            Ok(ino) => reply.entry(&TTL, &st.attr(ino).expect("new"), Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self.lock().unlink(parent.0, name, false) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self.lock().unlink(parent.0, name, true) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        match self
            .lock()
            .rename(parent.0, name, newparent.0, newname, flags)
        {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let mut st = self.lock();
        let fh = st.next_fh;
        st.next_fh += 1;
        match st.nodes.get_mut(&ino.0) {
            Some(n) => {
                n.open += 1;
                reply.opened(FileHandle(fh), FopenFlags::empty());
            }
            None => reply.error(Errno::ENOENT),
        }
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        let mut st = self.lock();
        let kind = Kind::File(FileNode {
            cur: Data::default(),
            dur: Data::default(),
            dirty: BTreeSet::new(),
        });
        let ino = match st.new_node(parent.0, name, kind, (mode & 0o7777) as u16) {
            Ok(ino) => ino,
            Err(e) => return reply.error(e),
        };
        let fh = st.next_fh;
        st.next_fh += 1;
        st.nodes.get_mut(&ino).expect("new").open += 1;
        let attr = st.attr(ino).expect("new");
        reply.created(
            &TTL,
            &attr,
            Generation(0),
            FileHandle(fh),
            FopenFlags::empty(),
        );
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
        let mut st = self.lock();
        match st.file(ino.0) {
            Ok(f) => reply.data(&f.cur.read(offset, size as u64)),
            Err(e) => reply.error(e),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        if self.faults.fail_writes.load(Ordering::Relaxed) {
            self.faults.failed_writes.fetch_add(1, Ordering::Relaxed);
            return reply.error(Errno::EIO);
        }
        let mut st = self.lock();
        match st.file(ino.0) {
            Ok(f) => {
                f.cur.write(offset, data, &mut f.dirty);
                reply.written(data.len() as u32);
            }
            Err(e) => reply.error(e),
        }
        if let Some(n) = st.nodes.get_mut(&ino.0) {
            n.mtime = SystemTime::now();
        }
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

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let mut st = self.lock();
        if let Some(n) = st.nodes.get_mut(&ino.0) {
            n.open = n.open.saturating_sub(1);
        }
        st.collect(ino.0);
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
        FaultFs::fsync(self, ino.0, false, reply);
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let mut st = self.lock();
        match st.dir(ino.0) {
            Ok(_) => reply.opened(FileHandle(0), FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let mut st = self.lock();
        let (entries, parent) = match st.dir(ino.0) {
            Ok(d) => (
                d.cur
                    .iter()
                    .map(|(n, i)| (n.clone(), *i))
                    .collect::<Vec<_>>(),
                d.parent,
            ),
            Err(e) => return reply.error(e),
        };
        let mut all = vec![
            (OsString::from("."), ino.0, FileType::Directory),
            (OsString::from(".."), parent, FileType::Directory),
        ];
        for (name, child) in entries {
            let kind = match st.nodes.get(&child).map(|n| &n.kind) {
                Some(Kind::Dir(_)) => FileType::Directory,
                _ => FileType::RegularFile,
            };
            all.push((name, child, kind));
        }
        for (i, (name, child, kind)) in all.into_iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(child), (i + 1) as u64, kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        FaultFs::fsync(self, ino.0, true, reply);
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        // Plenty of room: free space is the tmpfs scenario's business.
        let blocks = 1u64 << 28;
        reply.statfs(blocks, blocks, blocks, 1 << 20, 1 << 20, 4096, 255, 4096);
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        reply.ok();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn st() -> FaultFs {
        FaultFs::new()
    }

    /// The model without the kernel: a cut keeps exactly what was fsynced, files need their
    /// directory fsynced too, and a failed fsync does not save data that a later one would.
    #[test]
    fn a_cut_keeps_only_what_was_fsynced() {
        let fs = st();
        let mut s = fs.lock();
        let kind = || {
            Kind::File(FileNode {
                cur: Data::default(),
                dur: Data::default(),
                dirty: BTreeSet::new(),
            })
        };
        let a = s.new_node(ROOT, OsStr::new("a"), kind(), 0o644).unwrap();
        let b = s.new_node(ROOT, OsStr::new("b"), kind(), 0o644).unwrap();
        let f = s.file(a).unwrap();
        f.cur.write(0, b"hello", &mut f.dirty);
        s.fsync_file(a, false).unwrap();
        s.fsync_dir(ROOT).unwrap();
        let f = s.file(a).unwrap();
        f.cur.write(5, b" world", &mut f.dirty);
        f.cur.write(CHUNK * 3, b"far", &mut f.dirty);
        let f = s.file(b).unwrap();
        f.cur.write(0, b"never durable", &mut f.dirty);
        s.fsync_file(b, false).unwrap();
        // c: created after the directory fsync, fsynced itself: its entry is not durable.
        let c = s.new_node(ROOT, OsStr::new("c"), kind(), 0o644).unwrap();
        s.fsync_file(c, false).unwrap();
        drop(s);
        let r = fs.power_cut(false);
        assert_eq!(r.nodes_dropped, 1, "c vanished");
        let mut s = fs.lock();
        assert_eq!(s.file(a).unwrap().cur.read(0, 100), b"hello");
        assert_eq!(s.file(b).unwrap().cur.read(0, 100), b"never durable");
        assert!(!s.dir(ROOT).unwrap().cur.contains_key(OsStr::new("c")));

        // A failed fsync marks the data clean: the next fsync succeeds and saves nothing.
        let f = s.file(a).unwrap();
        f.cur.write(0, b"HELLO", &mut f.dirty);
        assert!(s.fsync_file(a, true).is_err());
        s.fsync_file(a, false).unwrap();
        drop(s);
        fs.power_cut(false);
        assert_eq!(fs.lock().file(a).unwrap().cur.read(0, 5), b"hello");
    }

    #[test]
    fn renames_and_unlinks_are_durable_only_with_the_directory() {
        let fs = st();
        let mut s = fs.lock();
        let file = |s: &mut State, name: &str, data: &[u8]| {
            let ino = s
                .new_node(
                    ROOT,
                    OsStr::new(name),
                    Kind::File(FileNode {
                        cur: Data::default(),
                        dur: Data::default(),
                        dirty: BTreeSet::new(),
                    }),
                    0o644,
                )
                .unwrap();
            let f = s.file(ino).unwrap();
            f.cur.write(0, data, &mut f.dirty);
            s.fsync_file(ino, false).unwrap();
            ino
        };
        let old = file(&mut s, "current", b"v1");
        s.fsync_dir(ROOT).unwrap();
        let tmp = file(&mut s, "tmp", b"v2");
        s.rename(
            ROOT,
            OsStr::new("tmp"),
            ROOT,
            OsStr::new("current"),
            RenameFlags::empty(),
        )
        .unwrap();
        assert!(
            s.nodes.contains_key(&old),
            "kept: the durable entry names it"
        );
        drop(s);
        fs.power_cut(false);
        let mut s = fs.lock();
        let cur = s.dir(ROOT).unwrap().cur.get(OsStr::new("current")).copied();
        assert_eq!(cur, Some(old), "the rename was not made durable");
        assert!(!s.nodes.contains_key(&tmp));
        let tmp = file(&mut s, "tmp", b"v2");
        s.rename(
            ROOT,
            OsStr::new("tmp"),
            ROOT,
            OsStr::new("current"),
            RenameFlags::empty(),
        )
        .unwrap();
        s.fsync_dir(ROOT).unwrap();
        assert!(!s.nodes.contains_key(&old), "freed once no entry names it");
        drop(s);
        fs.power_cut(false);
        let mut s = fs.lock();
        assert_eq!(s.file(tmp).unwrap().cur.read(0, 2), b"v2");
    }
}
