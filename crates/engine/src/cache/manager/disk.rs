//! The manager's side of the disk tier: attaching it under the cache's identity.

use std::sync::Arc;

use deepinfer_model::config::ModelConfig;

use super::CacheManager;
use crate::cache::disk::{self, DiskConfig, DiskStats, DiskTier, ReadAhead};
use crate::cache::layout::CacheLayout;
use crate::cache::CacheError;

/// What an entry's bytes mean: the checkpoint, the numerics and the kernel family that
/// computed them, the shape of the pools' blocks and of the snapshots, and the entry
/// format. Two caches with equal identities give equal bits for equal prefixes; any
/// difference is another directory.
fn identity(model: &ModelConfig, layout: &CacheLayout, cfg: &DiskConfig) -> disk::Digest {
    let pools: Vec<_> = layout
        .pools
        .iter()
        .map(|p| (p.name, p.width, p.ratio, p.block_entries, &p.layers))
        .collect();
    let parts: Vec<_> = layout
        .snapshot
        .parts
        .iter()
        .map(|p| (p.layer, p.what, p.rows, p.ring.width, p.offset))
        .collect();
    let geometry = format!(
        "block_tokens {} pools {pools:?} snapshot {} {parts:?}",
        layout.block_tokens, layout.snapshot.floats
    );
    let numerics = format!("{:?}", model.numerics);
    disk::of_parts([
        b"deepinfer prefix cache".as_slice(),
        &disk::FORMAT_VERSION.to_le_bytes(),
        &cfg.checkpoint,
        numerics.as_bytes(),
        cfg.kernels.as_bytes(),
        geometry.as_bytes(),
    ])
}

impl CacheManager {
    /// Backs the prefix cache with `cfg`'s directory. False (logged) if the directory cannot
    /// be used, and the cache stays in memory; an error if another process uses it. Call it
    /// before the first sequence is added.
    pub fn attach_disk(
        &mut self,
        model: &ModelConfig,
        cfg: &DiskConfig,
        stats: Arc<DiskStats>,
    ) -> Result<bool, CacheError> {
        let Some(prefix) = &mut self.prefix else {
            return Err(CacheError::InvalidConfig {
                field: "prefix_cache_dir",
                value: cfg.dir.display().to_string(),
                reason: "a disk tier needs prefix caching on",
            });
        };
        let id = identity(model, &self.layout, cfg);
        match DiskTier::open(cfg, id, stats)? {
            Some(tier) => {
                prefix.set_disk(tier);
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// Waits for the disk tier's queued writes (benchmarks and tests that restart on the
    /// directory, or look up what was just written).
    pub fn flush_disk(&mut self) {
        if let Some(d) = self.prefix.as_mut().and_then(|p| p.disk_mut()) {
            d.flush();
        }
    }

    /// Reads ahead, on the disk tier's own thread, the entries that admitting a request of
    /// `len` tokens (`token(i)`) would read from disk (call it when the request arrives);
    /// `None` if it would read nothing.
    pub fn prefetch(&mut self, len: usize, token: &dyn Fn(usize) -> u32) -> Option<ReadAhead> {
        self.prefix.as_mut()?.prefetch(len, token)
    }

    /// Takes in the disk tier's finished writes (and keeps it within its bound).
    pub fn poll_disk(&mut self) {
        if let Some(d) = self.prefix.as_mut().and_then(|p| p.disk_mut()) {
            d.poll();
        }
    }

    /// The disk tier's counters, if there is one.
    pub fn disk_stats(&self) -> Option<&DiskStats> {
        self.prefix.as_ref()?.disk().map(DiskTier::stats)
    }
}
