//! The prefix cache's disk tier (`--prefix-cache-dir`): cached blocks and snapshots in a
//! directory, so that a prefix evicted from memory, or cached before a restart, is read back
//! instead of computed again.
//!
//! # Why it looks like this
//!
//! - **What is written, and when.** A block's paged data is small (compressed entries and
//!   indexer keys), so every block the memory cache takes is written as it is taken
//!   (write-through: it survives a crash of the process). A snapshot (the window rows a
//!   resumed sequence reads) is several times larger, so only two are written: the one at
//!   the last block a sequence reached, when it ends (where the next turn of a chat resumes),
//!   and any the memory cache evicts.
//! - **Keys.** Chained SHA-256 over the block tokens, seeded with the cache's identity (the
//!   checkpoint's, the numerics, the layout of the records, this format's version), as vLLM's
//!   `sha256` prefix hashing chains them. Entries of another identity live in another
//!   subdirectory and are never looked at. A block entry also carries its tokens and its
//!   parent's hash, so a hit is checked link by link, as the memory cache compares content.
//! - **Who owns what.** The engine thread owns the [`index::Index`] (lookups never touch
//!   the disk) and reads hits itself; one writer thread writes. The index learns of an entry
//!   only once its write is complete, so a lookup never sees a half-written one.
//! - **Faults.** A torn write is a temporary file, removed at the next start. A file that is
//!   truncated, corrupt or of another model is a miss: logged, removed. A directory that
//!   cannot be written (full, read-only) leaves the cache memory-only, with a log line.
//!   Two servers on one directory would each evict the other's entries behind its index,
//!   so a `lock` file keeps the second out with an error.

mod entry;
mod index;
mod key;
mod prefetch;
mod writer;

use std::collections::HashSet;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

pub use entry::{Entry, Head, Kind, FORMAT_VERSION};
pub use key::{chain, of_parts, Digest};
pub use prefetch::ReadAhead;

use self::index::{file_name, Index, Key};
use self::prefetch::Prefetcher;
use self::writer::{Done, Op, Writer};
use super::CacheError;

/// Where the disk tier lives and how large it may grow.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiskConfig {
    pub dir: PathBuf,
    pub max_bytes: u64,
    /// The checkpoint's identity (its config, tensor index and a sample of its bytes).
    pub checkpoint: Digest,
    /// The kernels that compute the entries (`deepinfer_kernels::cpu::family`): another
    /// family's results are not these bits, so its entries live in another directory.
    pub kernels: &'static str,
}

/// Counters of the disk tier, shared with the metrics.
#[derive(Debug, Default)]
pub struct DiskStats {
    /// Prompt tokens looked up on disk (those past the memory hit), and found there.
    pub query_tokens: AtomicU64,
    pub hit_tokens: AtomicU64,
    pub read_bytes: AtomicU64,
    pub written_bytes: AtomicU64,
    /// Writes dropped because the queue was full.
    pub dropped_writes: AtomicU64,
    /// Writes and reads that failed (a full or read-only disk, a corrupt entry).
    pub errors: AtomicU64,
    /// What the directory holds now.
    pub entries: AtomicU64,
    pub bytes: AtomicU64,
}

fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

pub(super) struct DiskTier {
    dir: PathBuf,
    identity: Digest,
    max_bytes: u64,
    index: Index,
    /// Writes queued, not yet finished.
    pending: HashSet<Key>,
    writer: Writer,
    prefetcher: Prefetcher,
    stats: Arc<DiskStats>,
    warned: bool,
    /// Shutting down: writes wait for room instead of being dropped.
    closing: bool,
    _lock: File,
}

/// Creates `dir` and holds its lock; `Ok(None)` if that is not possible.
fn lock(dir: &Path) -> Result<Option<File>, CacheError> {
    let opened = std::fs::create_dir_all(dir).and_then(|()| {
        File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join("lock"))
    });
    let file = match opened {
        Ok(f) => f,
        Err(e) => {
            tracing::warn!(dir = %dir.display(), "prefix cache on disk is off: {e}");
            return Ok(None);
        }
    };
    match file.try_lock() {
        Ok(()) => Ok(Some(file)),
        Err(std::fs::TryLockError::WouldBlock) => Err(CacheError::PrefixDirInUse {
            dir: dir.display().to_string(),
        }),
        Err(std::fs::TryLockError::Error(e)) => {
            tracing::warn!(dir = %dir.display(), "prefix cache on disk is off: cannot lock: {e}");
            Ok(None)
        }
    }
}

/// Subdirectories of `root` other than `ours`: caches of other identities.
fn other_identities(root: &Path, ours: &Path) -> usize {
    let Ok(dir) = std::fs::read_dir(root) else {
        return 0;
    };
    dir.flatten()
        .filter(|e| e.path().is_dir() && e.path() != ours)
        .count()
}

impl DiskTier {
    /// Opens `cfg.dir` for the cache `identity`: `Ok(None)` (with a log line) when the
    /// directory cannot be used, an error when another process uses it.
    pub fn open(
        cfg: &DiskConfig,
        identity: Digest,
        stats: Arc<DiskStats>,
    ) -> Result<Option<Self>, CacheError> {
        let Some(lock) = lock(&cfg.dir)? else {
            return Ok(None);
        };
        let dir = cfg.dir.join(&key::hex(&identity)[..16]);
        let opened = std::fs::create_dir_all(&dir)
            .and_then(|()| Index::scan(&dir))
            .and_then(|ix| Writer::spawn(dir.clone()).map(|w| (ix, w)))
            .and_then(|(ix, w)| Prefetcher::spawn().map(|p| (ix, w, p)));
        let ((index, scan), writer, prefetcher) = match opened {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!(dir = %dir.display(), "prefix cache on disk is off: {e}");
                return Ok(None);
            }
        };
        tracing::info!(
            dir = %dir.display(),
            entries = index.len(),
            mib = index.bytes() >> 20,
            torn_writes_removed = scan.torn,
            other_files = scan.foreign,
            "prefix cache on disk"
        );
        let others = other_identities(&cfg.dir, &dir);
        if others > 0 {
            tracing::info!(
                dir = %cfg.dir.display(),
                "prefix cache: {others} other subdirectories hold entries of other checkpoints, \
                 numerics or block sizes; they are left alone (and not counted in the bound)"
            );
        }
        let mut tier = Self {
            dir,
            identity,
            max_bytes: cfg.max_bytes,
            index,
            pending: HashSet::new(),
            writer,
            prefetcher,
            stats,
            warned: false,
            closing: false,
            _lock: lock,
        };
        tier.poll();
        Ok(Some(tier))
    }

    /// The hash the first block of every chain follows.
    pub fn root(&self) -> &Digest {
        &self.identity
    }

    pub fn has(&self, chain: &Digest, kind: Kind) -> bool {
        self.index.contains(&(*chain, kind))
    }

    /// Whether the entry is on disk or on its way there.
    pub fn knows(&self, chain: &Digest, kind: Kind) -> bool {
        self.has(chain, kind) || self.pending.contains(&(*chain, kind))
    }

    pub fn stats(&self) -> &DiskStats {
        &self.stats
    }

    /// Queues an entry unless the disk has it or is getting it; a full queue drops it.
    pub fn store(&mut self, head: &Head, floats: &[&[f32]]) {
        let key = (*head.chain, head.kind);
        if self.knows(&key.0, key.1) {
            return;
        }
        let parent = (head.kind == Kind::Block).then_some(*head.parent);
        let op = Op::Write {
            key,
            parent,
            bytes: entry::encode(head, floats),
        };
        if self.send(op) {
            self.pending.insert(key);
        } else {
            add(&self.stats.dropped_writes, 1);
        }
    }

    /// Waits until every queued write is done, and takes them in.
    pub fn flush(&mut self) {
        let (tx, rx) = std::sync::mpsc::channel();
        self.writer.push(Op::Flush(tx));
        let _ = rx.recv();
        self.poll();
    }

    /// Reads the entries `keys` names (those the index has) into the page cache, on the
    /// read-ahead thread; `None` if there is nothing to read.
    pub fn prefetch(&self, keys: impl Iterator<Item = (Digest, Kind)>) -> Option<ReadAhead> {
        let paths: Vec<PathBuf> = keys
            .filter(|k| self.index.contains(k))
            .map(|k| self.dir.join(file_name(&k)))
            .collect();
        (!paths.is_empty()).then(|| self.prefetcher.offer(paths))
    }

    /// From now on, [`Self::store`] waits for room in the queue instead of dropping.
    pub fn close(&mut self) {
        self.closing = true;
    }

    pub fn max_bytes(&self) -> u64 {
        self.max_bytes
    }

    /// The bytes of an entry the index has, marked used; `None` (logged, forgotten) if the
    /// file cannot be read.
    pub fn read(&mut self, chain: &Digest, kind: Kind) -> Option<Vec<u8>> {
        let key = (*chain, kind);
        match std::fs::read(self.dir.join(file_name(&key))) {
            Ok(bytes) => {
                add(&self.stats.read_bytes, bytes.len() as u64);
                self.mark_used(chain, kind);
                Some(bytes)
            }
            Err(e) => {
                self.reject(chain, kind, &e);
                None
            }
        }
    }

    /// Marks an entry the index has as just used (in the index, and in its file's time for
    /// the next start); writes queued for it land later and count as used then.
    pub fn mark_used(&mut self, chain: &Digest, kind: Kind) {
        let key = (*chain, kind);
        if !self.index.contains(&key) {
            return;
        }
        self.index.touch(&key);
        self.send(Op::Touch(key));
    }

    /// Queues `op` for the writer: dropped (false) when the queue is full, unless shutting
    /// down, when it waits for room.
    fn send(&self, op: Op) -> bool {
        if self.closing {
            self.writer.push(op);
            true
        } else {
            self.writer.offer(op)
        }
    }

    /// Checks `bytes` as the entry `kind` of `chain`; a bad one is rejected.
    pub fn check<'a>(&mut self, bytes: &'a [u8], chain: &Digest, kind: Kind) -> Option<Entry<'a>> {
        match entry::decode(bytes, kind, &self.identity, chain) {
            Ok(e) => Some(e),
            Err(e) => {
                self.reject(chain, kind, &e);
                None
            }
        }
    }

    /// Forgets and removes an entry that is not what its name says.
    pub fn reject(&mut self, chain: &Digest, kind: Kind, why: &dyn std::fmt::Display) {
        let key = (*chain, kind);
        let path = self.dir.join(file_name(&key));
        tracing::warn!(file = %path.display(), "prefix cache entry ignored and removed: {why}");
        add(&self.stats.errors, 1);
        self.index.remove(&key);
        let _ = std::fs::remove_file(path);
        self.gauges();
    }

    /// Takes in the writes finished since the last call and keeps the directory within its
    /// bound (down to nine tenths, so that eviction runs now and then, not per write).
    pub fn poll(&mut self) {
        let done: Vec<Done> = self.writer.finished().collect();
        for d in done {
            match d {
                Done::Written { key, parent, bytes } => {
                    self.pending.remove(&key);
                    self.index.insert(key, bytes, parent);
                    add(&self.stats.written_bytes, bytes);
                }
                Done::Failed { key, error } => {
                    self.pending.remove(&key);
                    add(&self.stats.errors, 1);
                    if !std::mem::replace(&mut self.warned, true) {
                        tracing::warn!(
                            dir = %self.dir.display(),
                            "prefix cache: a write to disk failed ({error}); entries stay in \
                             memory only until writes succeed again"
                        );
                    }
                }
            }
        }
        if self.index.bytes() > self.max_bytes {
            for key in self.index.shrink_to(self.max_bytes / 10 * 9) {
                let _ = std::fs::remove_file(self.dir.join(file_name(&key)));
            }
        }
        self.gauges();
    }

    fn gauges(&self) {
        let s = &self.stats;
        s.entries.store(self.index.len() as u64, Ordering::Relaxed);
        s.bytes.store(self.index.bytes(), Ordering::Relaxed);
    }

    /// Removes every entry of this identity; returns how many.
    pub fn clear(&mut self) -> usize {
        self.poll();
        let n = self.index.len();
        if let Ok(dir) = std::fs::read_dir(&self.dir) {
            for e in dir.flatten() {
                if index::key_of(&e.file_name().to_string_lossy()).is_some() {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
        self.index.clear();
        self.gauges();
        n
    }
}

impl std::fmt::Debug for DiskTier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiskTier")
            .field("dir", &self.dir)
            .field("entries", &self.index.len())
            .finish_non_exhaustive()
    }
}
