//! The thread that writes entries, so the engine thread never waits on the disk.
//!
//! The queue is bounded in entries and bytes; a write that does not fit is dropped, not
//! waited for (the block stays in memory, and a later request simply recomputes what the
//! disk lacks). Each entry becomes visible only whole: written to a temporary file,
//! `fsync`ed, then renamed to its name, so a crash leaves a complete entry or a temporary
//! file that the next start removes.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;

use super::index::{file_name, Key, TMP_PREFIX};
use super::key::Digest;

/// Entries waiting at most.
const QUEUE_ENTRIES: usize = 256;
/// Bytes waiting at most (what the queue may hold in memory).
const QUEUE_BYTES: u64 = 256 << 20;

pub enum Op {
    Write {
        key: Key,
        parent: Option<Digest>,
        bytes: Vec<u8>,
    },
    /// Marks an entry used (its mtime orders the index after a restart).
    Touch(Key),
    /// Replies once every op before it is done.
    Flush(mpsc::Sender<()>),
}

/// What became of a write.
pub enum Done {
    Written {
        key: Key,
        parent: Option<Digest>,
        bytes: u64,
    },
    Failed {
        key: Key,
        error: io::Error,
    },
}

pub struct Writer {
    tx: Option<SyncSender<Op>>,
    done: Receiver<Done>,
    queued: Arc<AtomicU64>,
    join: Option<JoinHandle<()>>,
}

impl Writer {
    pub fn spawn(dir: PathBuf) -> io::Result<Self> {
        let (tx, rx) = mpsc::sync_channel(QUEUE_ENTRIES);
        let (done_tx, done) = mpsc::channel();
        let queued = Arc::new(AtomicU64::new(0));
        let q = queued.clone();
        let join = std::thread::Builder::new()
            .name("deepinfer-prefix-disk".into())
            .spawn(move || run(&dir, rx, done_tx, &q))?;
        Ok(Self {
            tx: Some(tx),
            done,
            queued,
            join: Some(join),
        })
    }

    /// Queues `op`; false if the queue is full (the op is dropped).
    pub fn offer(&self, op: Op) -> bool {
        let bytes = match &op {
            Op::Write { bytes, .. } => bytes.len() as u64,
            _ => 0,
        };
        if self.queued.load(Ordering::Relaxed) + bytes > QUEUE_BYTES {
            return false;
        }
        self.queued.fetch_add(bytes, Ordering::Relaxed);
        let tx = self.tx.as_ref().expect("open until dropped");
        match tx.try_send(op) {
            Ok(()) => true,
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.queued.fetch_sub(bytes, Ordering::Relaxed);
                false
            }
        }
    }

    /// Queues `op`, waiting for room (at shutdown, when nothing else waits on this thread).
    pub fn push(&self, op: Op) {
        if let Op::Write { bytes, .. } = &op {
            self.queued.fetch_add(bytes.len() as u64, Ordering::Relaxed);
        }
        let _ = self.tx.as_ref().expect("open until dropped").send(op);
    }

    /// Writes finished since the last call.
    pub fn finished(&self) -> impl Iterator<Item = Done> + '_ {
        self.done.try_iter()
    }
}

impl Drop for Writer {
    /// Finishes the queued writes (a clean shutdown loses nothing that was queued).
    fn drop(&mut self) {
        self.tx.take();
        if let Some(j) = self.join.take() {
            let _ = j.join();
        }
    }
}

fn run(dir: &Path, rx: Receiver<Op>, done: mpsc::Sender<Done>, queued: &AtomicU64) {
    let mut n = 0u64;
    for op in rx {
        match op {
            Op::Write { key, parent, bytes } => {
                n += 1;
                let len = bytes.len() as u64;
                let result = write_atomically(dir, &format!("{TMP_PREFIX}{n}"), &key, &bytes);
                queued.fetch_sub(len, Ordering::Relaxed);
                let msg = match result {
                    Ok(()) => Done::Written {
                        key,
                        parent,
                        bytes: len,
                    },
                    Err(error) => Done::Failed { key, error },
                };
                let _ = done.send(msg);
            }
            Op::Flush(reply) => {
                let _ = reply.send(());
            }
            Op::Touch(key) => {
                let now = std::time::SystemTime::now();
                if let Ok(f) = File::options().append(true).open(dir.join(file_name(&key))) {
                    let _ = f.set_modified(now);
                }
            }
        }
    }
}

fn write_atomically(dir: &Path, tmp: &str, key: &Key, bytes: &[u8]) -> io::Result<()> {
    let tmp = dir.join(tmp);
    let result = (|| {
        let mut f = File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        fs::rename(&tmp, dir.join(file_name(key)))
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}
