//! Routed experts served from the checkpoint on disk through a bounded cache, for models
//! larger than memory.
//!
//! The dense weights stay resident; a streamed layer keeps only where each expert's bytes
//! lie ([`ExpertSource`]). The MoE asks the [`ExpertStore`] for the experts its router chose;
//! cached ones are lent at once, missing ones are read by a pool of I/O threads into
//! fixed slabs (one whole expert each) while the shared expert computes, and the layer
//! waits only for what it has not got yet. A lent expert is pinned (its `Arc` is held) and
//! is never evicted under the products using it; otherwise eviction picks the slab with the
//! oldest use, each doubling of an expert's use count worth one more step of age.

mod expert;
mod plan;
mod reader;
mod routed;
mod slots;

use std::ops::Range;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Instant;

use deepinfer_kernels::buffer::Slab;

use crate::checkpoint::{Checkpoint, CheckpointError, MatrixSource};
pub use expert::ExpertWeights;
pub use plan::{available_memory, BudgetTooSmall, ExpertPlan, MemoryPlan, StoredBytes};
pub use reader::file_read_bandwidth;
use reader::{read_rate, Bounce, Reader};
pub use routed::RoutedExperts;
pub(crate) use routed::{expert_store, layer_experts, resident_experts, Holding};
use slots::{Claim, Slots};

/// Threads reading experts: enough requests in flight to keep an NVMe device's queue busy.
const IO_THREADS: usize = 8;

#[derive(Clone, Debug, thiserror::Error, PartialEq)]
pub enum ExpertError {
    #[error("reading expert weights from {}: {reason}", path.display())]
    Io { path: PathBuf, reason: String },
    #[error("{} is truncated: an expert's bytes end at {needed} but the file has {actual}", path.display())]
    Truncated {
        path: PathBuf,
        needed: u64,
        actual: u64,
    },
    #[error("{} changed since the model was loaded ({len_then} bytes then, {len_now} now): restart to load it again", path.display())]
    Changed {
        path: PathBuf,
        len_then: u64,
        len_now: u64,
    },
    #[error("expert weights read from disk are invalid: {reason}")]
    Invalid { reason: String },
    #[error("cannot map {bytes} bytes for an expert read")]
    OutOfMemory { bytes: usize },
    #[error("an expert slab was still lent out when it was refilled (a bug)")]
    Busy,
    #[error("the expert cache holds {slots} experts; one pass needs {needed}")]
    TooFew { slots: usize, needed: usize },
    #[error("ranks {ranks:?} could not compute their experts (each one's own message says why)")]
    OtherRanks { ranks: Vec<usize> },
}

/// One routed expert's three matrices (`w1`, `w2`, `w3`), where they lie.
#[derive(Clone, Debug)]
pub struct ExpertSource {
    pub parts: [MatrixSource; 3],
}

/// Counters for `bench model` and the metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ExpertStats {
    /// Experts a router chose that were cached or already on their way (read ahead).
    pub hits: u64,
    /// Experts a router chose that had to be read then.
    pub misses: u64,
    /// Experts read from disk (on demand or ahead), and their bytes.
    pub reads: u64,
    pub bytes_read: u64,
    /// Time the forward pass spent waiting for reads.
    pub wait_secs: f64,
}

impl ExpertStats {
    pub fn hit_rate(&self) -> f64 {
        let all = self.hits + self.misses;
        if all == 0 {
            1.0
        } else {
            self.hits as f64 / all as f64
        }
    }

    /// `self − earlier`: the counts of one interval.
    pub fn since(&self, earlier: &ExpertStats) -> ExpertStats {
        ExpertStats {
            hits: self.hits - earlier.hits,
            misses: self.misses - earlier.misses,
            reads: self.reads - earlier.reads,
            bytes_read: self.bytes_read - earlier.bytes_read,
            wait_secs: self.wait_secs - earlier.wait_secs,
        }
    }
}

#[derive(Default)]
struct Counters {
    hits: AtomicU64,
    misses: AtomicU64,
    reads: AtomicU64,
    bytes_read: AtomicU64,
    wait_ns: AtomicU64,
}

/// A read for an I/O thread: expert `key` into slot `slot`'s slab.
struct Job {
    slot: usize,
    key: usize,
    slab: Slab,
}

/// What the I/O threads and the forward pass share.
struct Shared {
    sources: Vec<ExpertSource>,
    reader: Reader,
    slots: Mutex<Slots>,
    changed: Condvar,
    counters: Counters,
}

/// The streamed experts of every layer, and the cache they are served from.
pub struct ExpertStore {
    shared: Arc<Shared>,
    /// The experts of each layer this store holds (a rank of a split model holds a share).
    experts: Range<usize>,
    jobs: Option<Sender<Job>>,
    threads: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for ExpertStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ExpertStore({} experts, {} slots)",
            self.shared.sources.len(),
            self.capacity()
        )
    }
}

impl ExpertStore {
    /// A store for `sources` (`layer · experts.len() + expert − experts.start`) read from
    /// `ck`'s shards, with a cache of `cache_bytes` (at least `min_slots` experts).
    pub fn new(
        ck: &Checkpoint,
        sources: Vec<ExpertSource>,
        experts: Range<usize>,
        cache_bytes: usize,
        min_slots: usize,
    ) -> Result<Self, CheckpointError> {
        let reader =
            Reader::open(&ck.shard_paths()).map_err(|e| CheckpointError::InvalidValue {
                name: "expert cache".into(),
                reason: e.to_string(),
            })?;
        let slab_bytes = sources.iter().map(Reader::slab_bytes).max().unwrap_or(0);
        let n_slots = (cache_bytes / slab_bytes.max(1))
            .max(min_slots)
            .min(sources.len().max(1));
        let slabs =
            Slab::carve(n_slots, slab_bytes).ok_or_else(|| CheckpointError::InvalidValue {
                name: "expert cache".into(),
                reason: format!("cannot map {n_slots} slabs of {slab_bytes} bytes"),
            })?;
        let layers = sources.len() / experts.len().max(1);
        let shared = Arc::new(Shared {
            sources,
            reader,
            slots: Mutex::new(Slots::new(slabs, layers)),
            changed: Condvar::new(),
            counters: Counters::default(),
        });
        let (tx, rx) = channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        let threads = (0..IO_THREADS)
            .map(|i| {
                let (shared, rx) = (Arc::clone(&shared), Arc::clone(&rx));
                std::thread::Builder::new()
                    .name(format!("expert-io-{i}"))
                    .spawn(move || io_thread(&shared, &rx))
                    .map_err(|e| CheckpointError::InvalidValue {
                        name: "expert cache".into(),
                        reason: format!("cannot start an I/O thread: {e}"),
                    })
            })
            .collect::<Result<Vec<_>, _>>()?;
        tracing::info!(
            slots = n_slots,
            slab_mib = slab_bytes >> 20,
            direct = shared.reader.direct(),
            "expert cache ready"
        );
        Ok(Self {
            shared,
            experts,
            jobs: Some(tx),
            threads,
        })
    }

    /// The experts of each layer this store holds.
    pub fn experts(&self) -> Range<usize> {
        self.experts.clone()
    }

    /// Experts the cache holds at once.
    pub fn capacity(&self) -> usize {
        self.lock().capacity()
    }

    /// Bytes of the cache's slabs.
    pub fn cache_bytes(&self) -> usize {
        let slots = self.lock();
        slots.slab_bytes() * slots.capacity()
    }

    pub fn stats(&self) -> ExpertStats {
        let c = &self.shared.counters;
        ExpertStats {
            hits: c.hits.load(Ordering::Relaxed),
            misses: c.misses.load(Ordering::Relaxed),
            reads: c.reads.load(Ordering::Relaxed),
            bytes_read: c.bytes_read.load(Ordering::Relaxed),
            wait_secs: c.wait_ns.load(Ordering::Relaxed) as f64 * 1e-9,
        }
    }

    /// The disk's read bandwidth for this model's expert reads, in GB/s: `reads` experts at
    /// spread-out keys read as the cache reads them ([`IO_THREADS`] in flight), into
    /// buffers of their own (the cache is not touched).
    pub fn expert_read_bandwidth(&self, reads: usize) -> Result<f64, ExpertError> {
        let sources = &self.shared.sources;
        let slab_bytes = self.lock().slab_bytes();
        let init = || {
            let slab =
                Slab::new(slab_bytes).ok_or(ExpertError::OutOfMemory { bytes: slab_bytes })?;
            Ok((slab, Bounce::default()))
        };
        read_rate(IO_THREADS, reads as u64, init, |(slab, bounce), i| {
            let key = (i as usize).wrapping_mul(0x9E37_79B9) % sources.len().max(1);
            let (_, n) = self.shared.reader.read(&sources[key], slab, bounce)?;
            Ok(n)
        })
    }

    fn lock(&self) -> MutexGuard<'_, Slots> {
        self.shared.slots.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn key(&self, layer: usize, expert: usize) -> usize {
        layer * self.experts.len() + expert - self.experts.start
    }

    /// The router's choice for `layer`: counts each expert as a hit (cached, or on its way
    /// from a read started ahead) or a miss, starts reading the misses, and says which
    /// were hits.
    pub fn request(&self, layer: usize, experts: &[usize]) -> Vec<bool> {
        let mut slots = self.lock();
        let cached: Vec<bool> = experts
            .iter()
            .map(|&e| slots.contains(self.key(layer, e)))
            .collect();
        let hits = cached.iter().filter(|&&c| c).count() as u64;
        let c = &self.shared.counters;
        c.hits.fetch_add(hits, Ordering::Relaxed);
        c.misses
            .fetch_add(experts.len() as u64 - hits, Ordering::Relaxed);
        self.start_reads(&mut slots, experts.iter().map(|&e| (layer, e)));
        cached
    }

    /// Starts reading the `(layer, expert)`s ahead of their use (not counted as requests);
    /// experts this store does not hold are passed over.
    pub fn prefetch(&self, wanted: impl IntoIterator<Item = (usize, usize)>) {
        let mut slots = self.lock();
        let held = wanted.into_iter().filter(|(_, e)| self.experts.contains(e));
        self.start_reads(&mut slots, held);
    }

    /// Reads of the `(layer, expert)`s neither cached nor on their way, in order, into at
    /// most half the slots (unpinned ones only).
    fn start_reads(&self, slots: &mut Slots, wanted: impl IntoIterator<Item = (usize, usize)>) {
        let budget = slots.capacity() / 2;
        let mut started = 0;
        for (layer, e) in wanted {
            if started >= budget {
                break;
            }
            let key = self.key(layer, e);
            if slots.contains(key) {
                continue;
            }
            match slots.claim(key) {
                Claim::Slot(slot, slab) => {
                    started += 1;
                    self.submit(Job { slot, key, slab });
                }
                Claim::None => break,
            }
        }
    }

    /// The weights of `experts` of `layer`, in that order, read where missing; they stay
    /// pinned in the cache while the returned `Arc`s live. At most [`Self::capacity`]
    /// experts at once.
    pub fn get(
        &self,
        layer: usize,
        experts: &[usize],
    ) -> Result<Vec<Arc<ExpertWeights>>, ExpertError> {
        let mut slots = self.lock();
        if experts.len() > slots.capacity() {
            return Err(ExpertError::TooFew {
                slots: slots.capacity(),
                needed: experts.len(),
            });
        }
        slots.tick();
        let mut out: Vec<Option<Arc<ExpertWeights>>> = vec![None; experts.len()];
        let mut waited = None;
        loop {
            // Pin what is ready before claiming slots for the rest, so no claim evicts an
            // expert this call is about to use.
            for (o, &e) in out.iter_mut().zip(experts) {
                if o.is_none() {
                    *o = slots.take_ready(self.key(layer, e))?;
                }
            }
            let mut pending = false;
            for (o, &e) in out.iter().zip(experts) {
                if o.is_some() {
                    continue;
                }
                pending = true;
                let key = self.key(layer, e);
                if slots.contains(key) {
                    continue;
                }
                if let Claim::Slot(slot, slab) = slots.claim(key) {
                    self.submit(Job { slot, key, slab });
                }
            }
            if !pending {
                break;
            }
            waited.get_or_insert_with(Instant::now);
            slots = self
                .shared
                .changed
                .wait(slots)
                .unwrap_or_else(|e| e.into_inner());
        }
        if let Some(t) = waited {
            let ns = t.elapsed().as_nanos() as u64;
            self.shared
                .counters
                .wait_ns
                .fetch_add(ns, Ordering::Relaxed);
        }
        Ok(out.into_iter().flatten().collect())
    }

    fn submit(&self, job: Job) {
        self.shared.counters.reads.fetch_add(1, Ordering::Relaxed);
        if let Some(tx) = &self.jobs {
            // The threads only stop when the sender is dropped, which is after the last use.
            let _ = tx.send(job);
        }
    }
}

impl Drop for ExpertStore {
    fn drop(&mut self) {
        self.jobs = None;
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn io_thread(shared: &Shared, jobs: &Mutex<Receiver<Job>>) {
    let mut bounce = Bounce::default();
    loop {
        let job = match jobs.lock().unwrap_or_else(|e| e.into_inner()).recv() {
            Ok(job) => job,
            Err(_) => return,
        };
        let Job {
            slot,
            key,
            mut slab,
        } = job;
        let result = shared
            .reader
            .read(&shared.sources[key], &mut slab, &mut bounce);
        if let Ok((_, bytes)) = &result {
            shared
                .counters
                .bytes_read
                .fetch_add(*bytes, Ordering::Relaxed);
        }
        let mut slots = shared.slots.lock().unwrap_or_else(|e| e.into_inner());
        slots.finish(slot, slab, result.map(|(w, _)| Arc::new(w)));
        drop(slots);
        shared.changed.notify_all();
    }
}
