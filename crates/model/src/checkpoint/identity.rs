//! What a checkpoint is, in 32 bytes: the key under which caches that outlive the process
//! (the prefix cache on disk) keep what they computed from it.

use sha2::{Digest, Sha256};

use super::Checkpoint;

/// Bytes read from each shard's tensor data, at its start, middle and end.
const SAMPLE: usize = 4096;

impl Checkpoint {
    /// SHA-256 over `config` (the config.json bytes), the tensor index (every name, dtype and
    /// shape, in name order) and a sample of each shard's tensor data. The index alone does
    /// not tell a fine-tune from its base (same names and shapes); a fine-tune changes every
    /// weight, so a few pages of each shard do. Reading all the weights would cost minutes on
    /// a large checkpoint; this reads a few KiB per shard.
    pub fn identity(&self, config: &[u8]) -> [u8; 32] {
        let mut h = Sha256::new();
        h.update((config.len() as u64).to_le_bytes());
        h.update(config);
        let mut names: Vec<&String> = self.index.keys().collect();
        names.sort();
        for name in names {
            let (_, info) = &self.index[name];
            match info.block {
                None => h.update(format!("{name} {:?} {:?}\n", info.dtype, info.shape)),
                Some(b) => h.update(format!("{name} {} {:?}\n", b.name(), info.shape)),
            }
        }
        for (shard, (lo, hi)) in self.shards.iter().zip(self.data_spans()) {
            if lo >= hi {
                continue;
            }
            let mid = lo + (hi - lo) / 2;
            let starts = [
                lo,
                mid.saturating_sub(SAMPLE / 2),
                hi.saturating_sub(SAMPLE),
            ];
            for at in starts.map(|a| a.max(lo)) {
                let end = (at + SAMPLE).min(hi);
                h.update(shard.range(at, end).unwrap_or_default());
            }
        }
        h.finalize().into()
    }

    /// Per shard, the bytes its tensors occupy (empty if it has none), in one pass over the
    /// index.
    fn data_spans(&self) -> Vec<(usize, usize)> {
        let mut spans = vec![(usize::MAX, 0); self.shards.len()];
        for (shard, info) in self.index.values() {
            let span = &mut spans[*shard];
            *span = (span.0.min(info.start), span.1.max(info.end));
        }
        spans
    }
}

#[cfg(test)]
mod tests {
    use crate::checkpoint::Checkpoint;

    fn write(dir: &std::path::Path, value: f32) {
        let data: Vec<u8> = [value, 2.0, 3.0, 4.0]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        let view = safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![2, 2], &data);
        safetensors::serialize_to_file(
            [("w", view.unwrap())],
            None,
            &dir.join("model.safetensors"),
        )
        .unwrap();
    }

    #[test]
    fn equal_checkpoints_agree_and_a_changed_weight_or_config_does_not() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        write(a.path(), 1.0);
        write(b.path(), 1.0);
        let id =
            |d: &tempfile::TempDir, cfg: &[u8]| Checkpoint::open(d.path()).unwrap().identity(cfg);
        assert_eq!(id(&a, b"{}"), id(&b, b"{}"));
        assert_ne!(id(&a, b"{}"), id(&a, b"{ }"));
        write(b.path(), 1.5);
        assert_ne!(id(&a, b"{}"), id(&b, b"{}"), "same index, other weights");
    }
}
