//! Read-ahead: the entries a queued request will resume from are read into the page cache
//! by a thread of their own while the request waits for admission, so that admitting it
//! reads them from memory: the disk's latency overlaps the steps that run before it.

use std::fs::File;
use std::io::{self, Read};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;

/// Set once a read-ahead is done (or was dropped): the request it is for may be admitted
/// without its admission reading from the disk.
pub type ReadAhead = Arc<AtomicBool>;

type Job = (Vec<PathBuf>, ReadAhead);

/// Requests' read-aheads waiting at most (more are dropped: they only save time).
const QUEUE: usize = 64;

pub struct Prefetcher {
    tx: Option<SyncSender<Job>>,
    join: Option<JoinHandle<()>>,
}

impl Prefetcher {
    pub fn spawn() -> io::Result<Self> {
        let (tx, rx) = mpsc::sync_channel(QUEUE);
        let join = std::thread::Builder::new()
            .name("deepinfer-prefix-read".into())
            .spawn(move || run(rx))?;
        Ok(Self {
            tx: Some(tx),
            join: Some(join),
        })
    }

    /// Reads `paths` ahead, unless the queue is full; the flag says when it is done.
    pub fn offer(&self, paths: Vec<PathBuf>) -> ReadAhead {
        let done = ReadAhead::default();
        let sent = self
            .tx
            .as_ref()
            .map(|tx| tx.try_send((paths, done.clone())));
        if !matches!(sent, Some(Ok(()))) {
            done.store(true, Ordering::Release);
        }
        done
    }
}

impl Drop for Prefetcher {
    fn drop(&mut self) {
        self.tx.take();
        if let Some(j) = self.join.take() {
            let _ = j.join();
        }
    }
}

fn run(rx: Receiver<Job>) {
    let mut buf = vec![0u8; 1 << 20];
    for (paths, done) in rx {
        for p in paths {
            // A file gone meanwhile (evicted, rejected) is simply not read.
            if let Ok(mut f) = File::open(&p) {
                while f.read(&mut buf).is_ok_and(|n| n > 0) {}
            }
        }
        done.store(true, Ordering::Release);
    }
}
