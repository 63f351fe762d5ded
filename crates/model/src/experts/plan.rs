//! The memory plan chosen at load: every weight resident when it fits the budget, else the
//! routed experts streamed through a cache of what the dense part leaves.

use std::path::{Path, PathBuf};

use crate::checkpoint::Checkpoint;
use crate::config::ModelConfig;
use crate::parallel::share;

/// What the operator asked for (`--memory-budget-mib`, `--expert-cache-mib`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryPlan {
    /// Bytes the weights may take (dense part plus expert cache); `None`: no limit.
    pub budget: Option<usize>,
    /// Stream the experts through a cache of this many bytes, whatever fits.
    pub expert_cache: Option<usize>,
}

/// How the routed experts of the main layers are held.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExpertPlan {
    Resident,
    Streamed { cache_bytes: usize },
}

/// The stored bytes of the checkpoint split into the routed experts of the main layers and
/// the rest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoredBytes {
    pub dense: u64,
    /// Of `dense`, what tensor parallelism splits (the main layers' `wq_b`, `wo_a`, `wo_b`
    /// and shared experts, and the head).
    pub split: u64,
    /// Of `dense`, a DSpark drafter's routed experts: resident always, split by id over
    /// ranks.
    pub draft_experts: u64,
    pub experts: u64,
}

impl StoredBytes {
    pub fn of(ck: &Checkpoint) -> Self {
        let (mut dense, mut split, mut draft_experts, mut experts) = (0, 0, 0, 0);
        // A DSpark drafter's stages (`mtp.i`, beside its `main_proj`; V4's MTP block, also
        // `mtp.0`, keeps its experts whole on rank 0).
        let drafter = ck.contains("mtp.0.main_proj.weight");
        for (name, bytes) in ck.stored_sizes() {
            let bytes = bytes as u64;
            if is_routed_expert(name) {
                experts += bytes;
                continue;
            }
            dense += bytes;
            if is_tensor_split(name) {
                split += bytes;
            }
            if drafter && is_stage_expert(name) {
                draft_experts += bytes;
            }
        }
        Self {
            dense,
            split,
            draft_experts,
            experts,
        }
    }

    /// What rank `rank` of `size` loads of a model split over the ranks: its share of the
    /// routed experts (of their ids when `by_id`, else of every one's width); the dense part
    /// on rank 0 only, or (`tensor`) its share of the split tensors plus, on rank 0, the
    /// rest.
    pub fn share(
        self,
        c: &ModelConfig,
        (rank, size): (usize, usize),
        tensor: bool,
        by_id: bool,
    ) -> Self {
        let n = c.n_routed_experts;
        let held = match by_id {
            true => share(n, rank, size).len() as u64,
            false => {
                let inter = c.moe_intermediate_size;
                share(inter, rank, size).len() as u64 * n as u64 / inter.max(1) as u64
            }
        };
        let rest = if rank == 0 {
            self.dense - self.split - self.draft_experts
        } else {
            0
        };
        let split = match tensor {
            true => self.split / size.max(1) as u64,
            false if rank == 0 => self.split,
            false => 0,
        };
        let drafts = c.dspark.as_ref().map_or(1, |dc| dc.n_routed_experts);
        let draft_experts =
            self.draft_experts * share(drafts, rank, size).len() as u64 / drafts.max(1) as u64;
        Self {
            dense: rest + split + draft_experts,
            split,
            draft_experts,
            experts: self.experts * held / n.max(1) as u64,
        }
    }
}

/// A stored tensor that tensor parallelism splits over the ranks, in either naming layout.
fn is_tensor_split(stored: &str) -> bool {
    const OFFICIAL: [&str; 4] = [
        ".attn.wq_b.",
        ".attn.wo_a.",
        ".attn.wo_b.",
        ".ffn.shared_experts.",
    ];
    const HF: [&str; 4] = [
        ".self_attn.q_b_proj.",
        ".self_attn.o_a_proj.",
        ".self_attn.o_b_proj.",
        ".mlp.shared_experts.",
    ];
    // DeepSeek's inner names, alone or (as transformers saves them) under `model.`.
    let inner = stored.strip_prefix("model.").unwrap_or(stored);
    let official = inner.starts_with("layers.") && OFFICIAL.iter().any(|p| inner.contains(p));
    let hf = stored.starts_with("model.layers.") && HF.iter().any(|p| stored.contains(p));
    // llama.cpp's names in a GGUF file.
    const GGUF: [&str; 4] = [
        ".attn_q_b.",
        ".attn_output_a.",
        ".attn_output_b.",
        "_shexp.",
    ];
    let gguf = stored.starts_with("blk.") && GGUF.iter().any(|p| stored.contains(p));
    let head = ["head.weight", "lm_head.weight", "output.weight"].contains(&stored);
    official || hf || gguf || head
}

/// A main layer's routed expert tensor, in any naming layout (the MTP block's experts
/// stay resident with the dense part).
fn is_routed_expert(stored: &str) -> bool {
    let inner = stored.strip_prefix("model.").unwrap_or(stored);
    let official = inner.starts_with("layers.") && inner.contains(".ffn.experts.");
    let hf = stored.starts_with("model.layers.") && stored.contains(".mlp.experts.");
    // llama.cpp stacks each expert matrix of a layer: `blk.N.ffn_gate_exps.weight`.
    let gguf = stored.starts_with("blk.") && stored.contains("_exps.");
    official || hf || gguf
}

/// A stored tensor of a routed expert of an `mtp.i` block, in either naming layout.
fn is_stage_expert(stored: &str) -> bool {
    let inner = stored.strip_prefix("model.").unwrap_or(stored);
    inner.starts_with("mtp.")
        && (inner.contains(".ffn.experts.") || inner.contains(".mlp.experts."))
}

/// The weights do not fit the memory budget even with their experts streamed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "the weights need at least {} MiB (the dense part {} MiB, the smallest expert cache {} \
     MiB), but their memory budget is {} MiB",
    (self.dense + self.least_cache) >> 20, self.dense >> 20, self.least_cache.div_ceil(1 << 20),
    self.budget >> 20
)]
pub struct BudgetTooSmall {
    pub budget: u64,
    pub dense: u64,
    pub least_cache: u64,
}

impl StoredBytes {
    /// The smallest expert cache the store runs with: 2 × num_experts_per_tok experts (one
    /// token's pass of a layer, and the next one's reads), or every expert if that is less.
    pub fn least_expert_cache(&self, c: &ModelConfig) -> u64 {
        let per_expert = self.experts / (c.num_hidden_layers * c.n_routed_experts).max(1) as u64;
        (2 * c.num_experts_per_tok as u64 * per_expert).min(self.experts)
    }
}

impl MemoryPlan {
    /// The plan for a checkpoint of `bytes`, and the sentence that says why.
    pub fn choose(
        &self,
        bytes: StoredBytes,
        c: &ModelConfig,
    ) -> Result<(ExpertPlan, String), BudgetTooSmall> {
        let mib = |b: u64| b >> 20;
        if let Some(cache) = self.expert_cache {
            return Ok((
                ExpertPlan::Streamed { cache_bytes: cache },
                format!(
                    "routed experts ({} MiB) streamed from disk through a {} MiB cache, as \
                     --expert-cache-mib asks",
                    mib(bytes.experts),
                    mib(cache as u64)
                ),
            ));
        }
        let Some(budget) = self.budget else {
            return Ok((ExpertPlan::Resident, "every weight resident".into()));
        };
        let budget = budget as u64;
        if bytes.dense + bytes.experts <= budget || bytes.experts == 0 {
            return Ok((
                ExpertPlan::Resident,
                format!(
                    "every weight resident: {} MiB fit the {} MiB budget",
                    mib(bytes.dense + bytes.experts),
                    mib(budget)
                ),
            ));
        }
        let least_cache = bytes.least_expert_cache(c);
        let left = budget.saturating_sub(bytes.dense);
        if left < least_cache {
            return Err(BudgetTooSmall {
                budget,
                dense: bytes.dense,
                least_cache,
            });
        }
        Ok((
            ExpertPlan::Streamed {
                cache_bytes: left as usize,
            },
            format!(
                "routed experts ({} MiB) streamed from disk: with the dense part ({} MiB) they \
                 exceed the {} MiB budget; the expert cache gets the {} MiB left ({:.0}% of \
                 the experts)",
                mib(bytes.experts),
                mib(bytes.dense),
                mib(budget),
                mib(left),
                100.0 * left as f64 / bytes.experts as f64
            ),
        ))
    }
}

/// Memory this process can still take, in bytes: the machine's `MemAvailable`, or less
/// where the process's memory cgroup (a container's limit) leaves less. `None` where
/// neither can be read.
pub fn available_memory() -> Option<usize> {
    let machine = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| meminfo_field(&t, "MemAvailable:"));
    let cgroup = std::fs::read_to_string("/proc/self/cgroup")
        .ok()
        .and_then(|t| cgroup_room(&t, Path::new("/sys/fs/cgroup")));
    match (machine, cgroup) {
        (Some(m), Some(c)) => Some(m.min(c)),
        (m, c) => m.or(c),
    }
}

/// A `/proc/meminfo` line's value (kB) in bytes.
fn meminfo_field(text: &str, key: &str) -> Option<usize> {
    let line = text.lines().find(|l| l.starts_with(key))?;
    let kib: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// What the memory cgroup of `/proc/self/cgroup`'s `text` leaves below its limit, counting
/// inactive page cache as free (the kernel reclaims it first): cgroup v2's `memory.max` /
/// `memory.current`, or v1's `memory.limit_in_bytes` / `memory.usage_in_bytes`.
fn cgroup_room(text: &str, root: &Path) -> Option<usize> {
    text.lines().find_map(|line| line_room(line, root))
}

/// [`cgroup_room`] for one `/proc/self/cgroup` line (`None`: not a memory cgroup, or one
/// without a limit).
fn line_room(line: &str, root: &Path) -> Option<usize> {
    let read = |p: PathBuf| -> Option<String> { std::fs::read_to_string(p).ok() };
    let num = |s: String| -> Option<u64> { s.trim().parse().ok() };
    let stat = |p: PathBuf, key: &str| -> u64 {
        read(p)
            .and_then(|t| {
                t.lines()
                    .find_map(|l| l.strip_prefix(key)?.trim().parse().ok())
            })
            .unwrap_or(0)
    };
    let mut parts = line.splitn(3, ':');
    let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
    let rel = path.trim_start_matches('/');
    let (limit, used, inactive) = if controllers.is_empty() {
        // cgroup v2, mounted at the root or (hybrid hierarchies) at `unified`.
        let dir = [root.join(rel), root.join("unified").join(rel)]
            .into_iter()
            .find(|d| d.join("memory.max").exists())?;
        (
            num(read(dir.join("memory.max"))?)?,
            num(read(dir.join("memory.current"))?)?,
            stat(dir.join("memory.stat"), "inactive_file "),
        )
    } else if controllers.split(',').any(|c| c == "memory") {
        let dir = root.join("memory").join(rel);
        (
            num(read(dir.join("memory.limit_in_bytes"))?)?,
            num(read(dir.join("memory.usage_in_bytes"))?)?,
            stat(dir.join("memory.stat"), "total_inactive_file "),
        )
    } else {
        return None;
    };
    // "No limit" in v1 is a page-rounded i64::MAX ("max" in v2 does not parse).
    if limit >= 1 << 60 {
        return None;
    }
    usize::try_from(limit.saturating_sub(used.saturating_sub(inactive))).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> ModelConfig {
        let mut c = crate::synth::preset("tiny").unwrap().config;
        c.num_hidden_layers = 2;
        c.n_routed_experts = 8;
        c.num_experts_per_tok = 2;
        c
    }

    #[test]
    fn a_rank_counts_what_it_loads() {
        let c = config();
        let bytes = StoredBytes {
            dense: 10 << 20,
            split: 4 << 20,
            draft_experts: 0,
            experts: 16 << 20,
        };
        let n = c.n_routed_experts as u64;
        let half = (16 << 20) * (n / 2) / n;
        let mib = |b: StoredBytes| (b.dense >> 20, b.split >> 20, b.experts);
        // Experts alone: rank 0 keeps the dense part.
        assert_eq!(mib(bytes.share(&c, (0, 2), false, true)), (10, 4, half));
        assert_eq!(mib(bytes.share(&c, (1, 2), false, true)), (0, 0, half));
        // Tensor parallel: half the split part each, the rest on rank 0.
        assert_eq!(mib(bytes.share(&c, (0, 2), true, true)), (8, 2, half));
        assert_eq!(mib(bytes.share(&c, (1, 2), true, true)), (2, 2, half));
        // Every expert split by width: a share of each.
        let width = bytes.share(&c, (1, 2), true, false);
        let inter = c.moe_intermediate_size as u64;
        assert_eq!(width.experts, (16 << 20) * (inter / 2) / inter);
        assert!(is_tensor_split("layers.3.attn.wo_b.scale"));
        assert!(is_tensor_split(
            "model.layers.0.mlp.shared_experts.up_proj.weight"
        ));
        assert!(is_tensor_split("lm_head.weight"));
        // A DSpark drafter's 4 stage experts (2 MiB, of the dense part) split by id; the
        // rest of the dense part stays on rank 0.
        let mut c = c;
        c.dspark = Some(crate::config::DsparkConfig {
            target_layer_ids: vec![1],
            aux_layers: vec![1],
            block_size: 4,
            noise_token_id: 0,
            markov_rank: 2,
            stages: 1,
            n_routed_experts: 4,
            num_experts_per_tok: 1,
        });
        let drafting = StoredBytes {
            dense: 12 << 20,
            draft_experts: 2 << 20,
            ..bytes
        };
        let r0 = drafting.share(&c, (0, 2), false, true);
        let r1 = drafting.share(&c, (1, 2), false, true);
        assert_eq!((r0.dense >> 20, r1.dense >> 20), (11, 1));
        assert_eq!((r0.draft_experts >> 20, r1.draft_experts >> 20), (1, 1));
        assert!(!is_tensor_split("mtp.0.attn.wq_b.weight"));
        assert!(!is_tensor_split("layers.3.attn.indexer.wq_b.weight"));
        assert!(!is_tensor_split("layers.3.attn.wq_a.weight"));
    }

    #[test]
    fn the_plan_streams_only_what_does_not_fit() {
        let c = config();
        // 16 experts of 1 MiB, dense 10 MiB.
        let bytes = StoredBytes {
            dense: 10 << 20,
            split: 4 << 20,
            draft_experts: 0,
            experts: 16 << 20,
        };
        let plan = |budget: Option<usize>, cache: Option<usize>| {
            MemoryPlan {
                budget,
                expert_cache: cache,
            }
            .choose(bytes, &c)
        };
        assert_eq!(plan(None, None).unwrap().0, ExpertPlan::Resident);
        assert_eq!(plan(Some(26 << 20), None).unwrap().0, ExpertPlan::Resident);
        assert_eq!(
            plan(Some(20 << 20), None).unwrap().0,
            ExpertPlan::Streamed {
                cache_bytes: 10 << 20
            }
        );
        assert_eq!(
            plan(Some(100 << 20), Some(1 << 20)).unwrap().0,
            ExpertPlan::Streamed {
                cache_bytes: 1 << 20
            }
        );
        // 4 experts' worth is the least; 3 MiB left is not enough.
        let err = plan(Some(13 << 20), None).unwrap_err().to_string();
        assert_eq!(
            err,
            "the weights need at least 14 MiB (the dense part 10 MiB, the smallest expert cache \
             4 MiB), but their memory budget is 13 MiB"
        );
        assert!(plan(Some(14 << 20), None).is_ok());
    }

    #[test]
    fn routed_experts_are_told_from_the_rest_in_every_layout() {
        assert!(is_routed_expert("layers.3.ffn.experts.17.w1.weight"));
        assert!(is_routed_expert("layers.3.ffn.experts.17.w1.scale"));
        assert!(is_routed_expert("model.layers.0.mlp.experts.gate_up_proj"));
        assert!(is_routed_expert("model.layers.0.ffn.experts.3.w2.scale"));
        assert!(is_tensor_split("model.layers.0.attn.wo_a.weight"));
        assert!(!is_routed_expert("layers.3.ffn.shared_experts.w1.weight"));
        assert!(!is_routed_expert("mtp.0.ffn.experts.1.w1.weight"));
        assert!(!is_routed_expert(
            "model.layers.0.mlp.shared_experts.gate_proj.weight"
        ));
        assert!(is_routed_expert("blk.5.ffn_down_exps.weight"));
        assert!(!is_routed_expert("blk.5.ffn_down_shexp.weight"));
        assert!(!is_routed_expert("blk.0.ffn_gate_tid2eid.weight"));
        assert!(is_tensor_split("blk.5.ffn_up_shexp.weight"));
        assert!(is_tensor_split("blk.2.attn_output_a.weight"));
        assert!(is_tensor_split("output.weight"));
        assert!(!is_tensor_split("blk.2.attn_q_a.weight"));
    }

    #[test]
    fn a_cgroup_limit_lowers_the_memory_available() {
        let root = tempfile::tempdir().unwrap();
        let v1 = root.path().join("memory/box");
        std::fs::create_dir_all(&v1).unwrap();
        std::fs::write(v1.join("memory.limit_in_bytes"), "8589934592\n").unwrap();
        std::fs::write(v1.join("memory.usage_in_bytes"), "3221225472\n").unwrap();
        std::fs::write(
            v1.join("memory.stat"),
            "cache 1\ntotal_inactive_file 1073741824\n",
        )
        .unwrap();
        let text = "5:devices:/\n4:memory:/box\n0::/\n";
        // 8 GiB − (3 GiB used − 1 GiB reclaimable).
        assert_eq!(cgroup_room(text, root.path()), Some(6 << 30));
        std::fs::write(v1.join("memory.limit_in_bytes"), "9223372036854771712\n").unwrap();
        assert_eq!(cgroup_room(text, root.path()), None);

        let v2 = root.path().join("ctr");
        std::fs::create_dir_all(&v2).unwrap();
        std::fs::write(v2.join("memory.max"), "4294967296\n").unwrap();
        std::fs::write(v2.join("memory.current"), "1073741824\n").unwrap();
        std::fs::write(v2.join("memory.stat"), "anon 5\ninactive_file 0\n").unwrap();
        assert_eq!(cgroup_room("0::/ctr\n", root.path()), Some(3 << 30));
        std::fs::write(v2.join("memory.max"), "max\n").unwrap();
        assert_eq!(cgroup_room("0::/ctr\n", root.path()), None);
        assert!(meminfo_field("MemAvailable:   2048 kB\n", "MemAvailable:") == Some(2 << 20));
    }
}
