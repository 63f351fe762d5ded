//! Safetensors checkpoints in either naming layout, addressed by official tensor names.
//!
//! Files are memory-mapped, so opening even a multi-hundred-gigabyte checkpoint only reads
//! headers; a tensor's bytes are touched when it is loaded. Loading dequantises to f32 because
//! every stored format decodes exactly into f32 (docs/MODEL.md §2), which makes the f32 copy a faithful
//! reference for the quantised kernels that will later consume the stored bytes directly.

mod decode;
mod error;
pub mod gguf;
mod identity;
mod matrix;
mod names;
mod shard;
mod source;
mod table;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::{Path, PathBuf};

use safetensors::Dtype;

pub use error::CheckpointError;
use names::{ExpertPart, HfName};
use shard::{Shard, TensorInfo};
pub use source::{FileRange, MatrixSource, SourceFormat};
pub use table::TableRows;

/// Which naming scheme the checkpoint's tensors use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NameLayout {
    /// DeepSeek's own names (`layers.N.attn.wq_a.weight`), as shipped.
    Official,
    /// HF `DeepseekV4ForCausalLM` names (`model.layers.N.self_attn.q_a_proj.weight`), as
    /// written by `save_pretrained`.
    Hf,
    /// DeepSeek's names under HF's `model.` prefix (`model.layers.N.attn.wq_a.weight`,
    /// `head.weight`, `model.embed_tokens.weight`): what transformers' `save_pretrained`
    /// writes back from a checkpoint it loaded in DeepSeek's layout with the FP8/FP4 weights
    /// kept as stored (what a user fine-tuning with transformers ends up with).
    SavedOfficial,
    /// llama.cpp's names in a GGUF file (`blk.N.attn_q_a.weight`), experts stacked per
    /// matrix.
    Gguf,
}

/// An opened checkpoint: memory-mapped shards and an index of every tensor they hold.
pub struct Checkpoint {
    shards: Vec<Shard>,
    index: HashMap<String, (usize, TensorInfo)>,
    layout: NameLayout,
    /// A GGUF file's metadata (the first shard's), which holds its config and tokenizer.
    gguf: Option<gguf::Metadata>,
}

impl fmt::Debug for Checkpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Checkpoint")
            .field("layout", &self.layout)
            .field(
                "shards",
                &self.shards.iter().map(|s| &s.path).collect::<Vec<_>>(),
            )
            .field("tensors", &self.index.len())
            .finish()
    }
}

/// Where an official name resolved to.
enum Located<'a> {
    Whole {
        stored: &'a str,
        shard: &'a Shard,
        info: &'a TensorInfo,
    },
    /// One expert's matrix inside HF's stacked `[E, rows, cols]` tensor.
    Expert {
        stored: &'a str,
        shard: &'a Shard,
        info: &'a TensorInfo,
        expert: usize,
        part: ExpertPart,
    },
}

/// The name to put in messages: the official name, plus the stored one when they differ.
fn describe(official: &str, stored: &str) -> String {
    if official == stored {
        format!("`{official}`")
    } else {
        format!("`{official}` (stored as `{stored}`)")
    }
}

fn shape_err(
    tensor: String,
    expected: &[usize],
    found: &[usize],
    detail: impl Into<String>,
) -> CheckpointError {
    CheckpointError::Shape {
        tensor,
        expected: expected.to_vec(),
        found: found.to_vec(),
        detail: detail.into(),
    }
}

impl Checkpoint {
    /// `path` is a directory holding `model.safetensors.index.json` (+ shards) or
    /// `*.safetensors` files, or a path to one .safetensors file.
    ///
    /// A directory without an index is opened as one checkpoint sharded across all of its
    /// `.safetensors` files (`model.safetensors` plus, say, an `mtp.safetensors` with the
    /// draft block); a tensor present in two files is an error, which also catches
    /// model-parallel splits that cannot simply be merged. A path to an `*.index.json` file
    /// opens that index.
    pub fn open(path: &Path) -> Result<Self, CheckpointError> {
        let io = |source| CheckpointError::Io {
            path: path.to_path_buf(),
            source,
        };
        let meta = std::fs::metadata(path).map_err(io)?;
        if !meta.is_dir() && gguf::is_gguf(path) {
            return Self::from_gguf(&gguf::names::shard_set(path));
        }
        if !meta.is_dir() {
            let is_index = path
                .file_name()
                .is_some_and(|n| n.to_string_lossy().ends_with(".index.json"));
            return if is_index {
                Self::from_index(path)
            } else {
                Self::from_files(&[path.to_path_buf()])
            };
        }
        let index = path.join("model.safetensors.index.json");
        if index.is_file() {
            return Self::from_index(&index);
        }
        let mut files = Vec::new();
        for entry in std::fs::read_dir(path).map_err(io)? {
            let p = entry.map_err(io)?.path();
            if p.extension().is_some_and(|e| e == "safetensors") && p.is_file() {
                files.push(p);
            }
        }
        if files.is_empty() {
            let ggufs = gguf_files(path).map_err(io)?;
            if ggufs.len() > 1 && !gguf::names::split_shards(&ggufs) {
                let names: Vec<String> = ggufs
                    .iter()
                    .filter_map(|p| Some(p.file_name()?.to_string_lossy().into_owned()))
                    .collect();
                return Err(CheckpointError::GgufChoice {
                    dir: path.to_path_buf(),
                    files: names.join(", "),
                });
            }
            if !ggufs.is_empty() {
                return Self::from_gguf(&ggufs);
            }
            return Err(CheckpointError::NoSafetensors {
                dir: path.to_path_buf(),
            });
        }
        files.sort();
        Self::from_files(&files)
    }

    fn from_index(index_path: &Path) -> Result<Self, CheckpointError> {
        let bad = |reason: String| CheckpointError::Index {
            path: index_path.to_path_buf(),
            reason,
        };
        let text = std::fs::read_to_string(index_path).map_err(|source| CheckpointError::Io {
            path: index_path.to_path_buf(),
            source,
        })?;
        let v: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| bad(format!("not valid JSON: {e}")))?;
        let map = v
            .get("weight_map")
            .and_then(|m| m.as_object())
            .ok_or_else(|| bad("no `weight_map` object".into()))?;
        let dir = index_path.parent().unwrap_or(Path::new("."));
        // Shard file -> first tensor the index assigns to it (for the error message).
        let mut wanted: BTreeMap<&str, &str> = BTreeMap::new();
        for (tensor, shard) in map {
            let shard = shard.as_str().ok_or_else(|| {
                bad(format!(
                    "weight_map entry for `{tensor}` is not a file name: {shard}"
                ))
            })?;
            wanted.entry(shard).or_insert(tensor);
        }
        let mut paths = Vec::with_capacity(wanted.len());
        for (shard, tensor) in &wanted {
            let p = dir.join(shard);
            if !p.is_file() {
                return Err(CheckpointError::MissingShard {
                    index: index_path.to_path_buf(),
                    shard: shard.to_string(),
                    tensor: tensor.to_string(),
                    path: p,
                });
            }
            paths.push(p);
        }
        let ck = Self::from_files(&paths)?;
        // A tensor the index does not list would be loaded or not depending on how it is
        // looked up: the index is incomplete, or the shard is not the one it describes.
        let mut unlisted: Vec<&String> =
            ck.index.keys().filter(|t| !map.contains_key(*t)).collect();
        unlisted.sort();
        if let Some(tensor) = unlisted.first() {
            let (i, _) = &ck.index[*tensor];
            return Err(bad(format!(
                "{} holds `{tensor}` (and {} more tensors) that the index does not list",
                ck.shards[*i].path.display(),
                unlisted.len() - 1
            )));
        }
        for (tensor, shard) in map {
            let want = dir.join(shard.as_str().unwrap_or_default());
            match ck.index.get(tensor) {
                Some((i, _)) if ck.shards[*i].path == want => {}
                Some((i, _)) => {
                    return Err(bad(format!(
                        "lists `{tensor}` in {} but it is in {}",
                        want.display(),
                        ck.shards[*i].path.display()
                    )))
                }
                None => {
                    return Err(bad(format!(
                        "lists `{tensor}` in {} but that file has no such tensor",
                        want.display()
                    )))
                }
            }
        }
        Ok(ck)
    }

    fn from_files(paths: &[PathBuf]) -> Result<Self, CheckpointError> {
        let (shards, index, _) = index_shards(paths, |p| {
            let (shard, tensors) = shard::open(p)?;
            Ok((shard, tensors, ()))
        })?;
        let hf = index
            .keys()
            .any(|k| k.starts_with("model.") || k.starts_with("lm_head."));
        let layout = match (hf, index.keys().any(|k| names::is_saved_official(k))) {
            (true, true) => NameLayout::SavedOfficial,
            (true, false) => NameLayout::Hf,
            (false, _) => NameLayout::Official,
        };
        Ok(Self {
            shards,
            index,
            layout,
            gguf: None,
        })
    }

    /// One GGUF file, or the shards of a split one (`…-00001-of-0000N.gguf`, the metadata
    /// the first one's).
    fn from_gguf(paths: &[PathBuf]) -> Result<Self, CheckpointError> {
        let (shards, index, metas) = index_shards(paths, gguf::open)?;
        Ok(Self {
            shards,
            index,
            layout: NameLayout::Gguf,
            gguf: metas.into_iter().next(),
        })
    }

    /// The metadata of a GGUF checkpoint (`None` for safetensors).
    pub fn gguf_metadata(&self) -> Option<&gguf::Metadata> {
        self.gguf.as_ref()
    }

    /// Detected from the names: HF if any name starts with `model.` or `lm_head.`, and of
    /// those the saved-official layout if a main layer's tensor keeps DeepSeek's inner names.
    pub fn layout(&self) -> NameLayout {
        self.layout
    }

    /// Every tensor name as stored, sorted (for inspection tools; lookups take official names).
    pub fn stored_names(&self) -> Vec<&str> {
        let mut v: Vec<&str> = self.index.keys().map(String::as_str).collect();
        v.sort_unstable();
        v
    }

    /// The highest main-layer index any stored tensor belongs to (`layers.N.…`, or
    /// `model.layers.N.…` in HF's layout), with one such tensor's name.
    pub fn last_layer(&self) -> Option<(usize, &str)> {
        if self.layout == NameLayout::Gguf {
            return gguf::names::last_block(self.index.keys());
        }
        self.index
            .keys()
            .filter_map(|name| {
                let rest = name
                    .strip_prefix("layers.")
                    .or_else(|| name.strip_prefix("model.layers."))?;
                let n: usize = rest.split('.').next()?.parse().ok()?;
                Some((n, name.as_str()))
            })
            .max()
    }

    /// Whether `official_name` resolves to a stored tensor (for HF stacked experts: whether the
    /// stacked tensor exists and holds that expert).
    pub fn contains(&self, official_name: &str) -> bool {
        match self.locate(official_name) {
            Ok(Located::Whole { .. }) => true,
            Ok(Located::Expert { info, expert, .. }) => {
                info.shape.first().is_some_and(|&e| expert < e)
            }
            Err(_) => false,
        }
    }

    /// Every stored tensor's name and byte length.
    pub fn stored_sizes(&self) -> impl Iterator<Item = (&str, usize)> {
        self.index
            .iter()
            .map(|(name, (_, info))| (name.as_str(), info.end - info.start))
    }

    fn stored(&self, name: &str) -> Option<(&str, &Shard, &TensorInfo)> {
        let (key, (i, info)) = self.index.get_key_value(name)?;
        Some((key.as_str(), &self.shards[*i], info))
    }

    /// The stored tensor `name`, or else `alias`; `Err`: what was looked for.
    fn whole_or_alias(
        &self,
        name: &str,
        alias: Option<String>,
    ) -> Result<(&str, &Shard, &TensorInfo), String> {
        if let Some(hit) = self.stored(name) {
            return Ok(hit);
        }
        match alias {
            Some(alias) => self
                .stored(&alias)
                .ok_or_else(|| format!("`{name}` and `{alias}`")),
            None => Err(format!("`{name}`")),
        }
    }

    fn locate(&self, official: &str) -> Result<Located<'_>, CheckpointError> {
        let whole = |(stored, shard, info)| Located::Whole {
            stored,
            shard,
            info,
        };
        let missing = |looked_for: String| CheckpointError::Missing {
            tensor: official.to_string(),
            looked_for,
        };
        match self.layout {
            NameLayout::Official | NameLayout::SavedOfficial => {
                let name = match self.layout {
                    NameLayout::SavedOfficial => names::official_to_saved(official),
                    _ => official.to_string(),
                };
                self.whole_or_alias(&name, names::official_alias(&name))
                    .map(whole)
                    .map_err(missing)
            }
            NameLayout::Gguf => match gguf::names::official_to_gguf(official) {
                None => Err(missing(format!(
                    "`{official}` (a GGUF file has no name for it)"
                ))),
                Some(gguf::names::GgufName::Plain(g)) => self
                    .stored(&g)
                    .map(whole)
                    .ok_or_else(|| missing(format!("`{g}`"))),
                // Each of an expert's matrices is stacked on its own, `[E, rows, cols]`: the
                // whole of `[expert]`, as HF's down_proj.
                Some(gguf::names::GgufName::Expert { stacked, expert }) => {
                    let (stored, shard, info) = self
                        .stored(&stacked)
                        .ok_or_else(|| missing(format!("`{stacked}`")))?;
                    Ok(Located::Expert {
                        stored,
                        shard,
                        info,
                        expert,
                        part: ExpertPart::Down,
                    })
                }
            },
            NameLayout::Hf => match names::official_to_hf(official) {
                // Tensors HF has no name for (the MTP block, which HF drops) keep their
                // official names when a checkpoint in HF's layout carries them.
                None => self.stored(official).map(whole).ok_or_else(|| {
                    missing(format!(
                        "`{official}` (HF checkpoints have no other name for it)"
                    ))
                }),
                Some(HfName::Plain(h)) => self
                    .whole_or_alias(&h, names::hf_alias(&h))
                    .map(whole)
                    .map_err(missing),
                Some(HfName::Expert {
                    stacked,
                    expert,
                    part,
                    scale,
                }) => {
                    let name = if scale {
                        format!("{stacked}_scale_inv")
                    } else {
                        stacked
                    };
                    let (stored, shard, info) = self
                        .stored(&name)
                        .ok_or_else(|| missing(format!("`{name}`")))?;
                    Ok(Located::Expert {
                        stored,
                        shard,
                        info,
                        expert,
                        part,
                    })
                }
            },
        }
    }

    /// Whether two whole tensors are stored identically (dtype, shape and bytes), without
    /// copying either: how duplicated tensors (the MTP block's copies of the embedding and
    /// head) are recognised.
    pub fn same_stored_tensor(&self, a: &str, b: &str) -> Result<bool, CheckpointError> {
        let whole = |name: &str| match self.locate(name)? {
            Located::Whole { shard, info, .. } => Ok((info, shard.bytes(info)?)),
            Located::Expert { stored, .. } => Err(CheckpointError::Dtype {
                tensor: describe(name, stored),
                found: "a stacked expert weight".into(),
                expected: "a whole tensor".into(),
            }),
        };
        let ((ia, ba), (ib, bb)) = (whole(a)?, whole(b)?);
        let same_type = ia.dtype == ib.dtype && ia.block == ib.block;
        Ok(same_type && ia.shape == ib.shape && ba == bb)
    }

    /// A 1-D tensor of `n` values, widened to f32 (norm gains, biases, sinks).
    pub fn vector(&self, official_name: &str, n: usize) -> Result<Vec<f32>, CheckpointError> {
        self.tensor_f32(official_name, &[n])
    }

    /// Load a tensor by its OFFICIAL name (docs/MODEL.md §4.1) as f32 with the given logical shape,
    /// dequantising: F32/BF16/F16 as is; F8_E4M3 with its block scale (official `.scale`, HF
    /// `.weight_scale_inv`; E8M0, F32 or BF16; block size inferred from the two shapes); packed
    /// FP4 (I8/U8 `[out, in/2]`) with its scale (`[out, in/32]` when shipped) → `[out, in]`.
    /// The engine loads weights with [`Checkpoint::matrix`] instead, which keeps them stored.
    pub fn tensor_f32(
        &self,
        official_name: &str,
        shape: &[usize],
    ) -> Result<Vec<f32>, CheckpointError> {
        match self.locate(official_name)? {
            Located::Whole {
                stored,
                shard,
                info,
            } if matches!(info.dtype, Dtype::F32 | Dtype::BF16 | Dtype::F16) => {
                let name = describe(official_name, stored);
                if info.shape != shape {
                    return Err(shape_err(name, shape, &info.shape, ""));
                }
                let mut out = vec![0.0; info.shape.iter().product()];
                decode::floats(info.dtype, shard.bytes(info)?, &mut out);
                Ok(out)
            }
            _ => Ok(self.matrix(official_name, shape)?.dequantize()),
        }
    }

    /// I64 or I32 tensor (`tid2eid`) as i64.
    pub fn tensor_i64(
        &self,
        official_name: &str,
        shape: &[usize],
    ) -> Result<Vec<i64>, CheckpointError> {
        let (stored, shard, info) = match self.locate(official_name)? {
            Located::Whole {
                stored,
                shard,
                info,
            } => (stored, shard, info),
            Located::Expert { stored, info, .. } => {
                return Err(CheckpointError::Dtype {
                    tensor: describe(official_name, stored),
                    found: format!("{:?} (stacked expert weight)", info.dtype),
                    expected: "I64 or I32".into(),
                })
            }
        };
        let name = describe(official_name, stored);
        if info.shape != shape {
            return Err(shape_err(name, shape, &info.shape, ""));
        }
        if let Some(b) = info.block {
            return Err(CheckpointError::Dtype {
                tensor: name,
                found: b.name().to_string(),
                expected: "I64 or I32".into(),
            });
        }
        let bytes = shard.bytes(info)?;
        match info.dtype {
            Dtype::I64 => Ok(bytes
                .chunks_exact(8)
                .map(|c| i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
                .collect()),
            Dtype::I32 => Ok(bytes
                .chunks_exact(4)
                .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as i64)
                .collect()),
            other => Err(CheckpointError::Dtype {
                tensor: name,
                found: format!("{other:?}"),
                expected: "I64 or I32".into(),
            }),
        }
    }

    /// The block scale of an FP8/FP4 weight as stored, with its shape and display name.
    fn scale_for(&self, official: &str, weight: &str) -> Result<Scale<'_>, CheckpointError> {
        let scale_official = match official.strip_suffix(".weight") {
            Some(stem) => format!("{stem}.scale"),
            None => format!("{official}.scale"),
        };
        let (stored, shard, info) = match self.locate(&scale_official) {
            Ok(Located::Whole {
                stored,
                shard,
                info,
            }) => (stored, shard, info),
            Ok(Located::Expert { stored, .. }) => {
                return Err(CheckpointError::MissingScale {
                    weight: weight.to_string(),
                    scale: format!("a 2-D scale, not the stacked `{stored}`"),
                })
            }
            Err(CheckpointError::Missing { looked_for, .. }) => {
                return Err(CheckpointError::MissingScale {
                    weight: weight.to_string(),
                    scale: looked_for,
                })
            }
            Err(e) => return Err(e),
        };
        let name = describe(&scale_official, stored);
        check_scale_dtype(&name, info.dtype)?;
        Ok(Scale {
            dtype: info.dtype,
            bytes: shard.bytes(info)?,
            shape: info.shape.clone(),
            name,
            range: self.file_range(shard, info),
        })
    }
}

/// A block-scale tensor as stored (E8M0, F32 or BF16).
struct Scale<'a> {
    dtype: Dtype,
    bytes: &'a [u8],
    shape: Vec<usize>,
    name: String,
    range: FileRange,
}

impl Scale<'_> {
    fn decoded(&self) -> Vec<f32> {
        decode::scales(self.dtype, self.bytes)
    }
}

fn check_scale_dtype(name: &str, dtype: Dtype) -> Result<(), CheckpointError> {
    match dtype {
        Dtype::F8_E8M0 | Dtype::F32 | Dtype::BF16 => Ok(()),
        other => Err(CheckpointError::Dtype {
            tensor: name.to_string(),
            found: format!("{other:?}"),
            expected: "F8_E8M0, F32 or BF16 for a block scale".into(),
        }),
    }
}

/// The block size `(br, bc)` a `[sr, sc]` scale grid tiles a 2-D weight shape with.
fn blocks_for(
    weight: &str,
    shape: &[usize],
    scale_shape: &[usize],
    scale_name: &str,
) -> Result<(usize, usize), CheckpointError> {
    let tiling = || CheckpointError::ScaleShape {
        weight: weight.to_string(),
        weight_shape: shape.to_vec(),
        scale: scale_name.to_string(),
        scale_shape: scale_shape.to_vec(),
    };
    let [sr, sc] = *scale_shape else {
        return Err(tiling());
    };
    let br = decode::block_size(shape[0], sr).ok_or_else(tiling)?;
    let bc = decode::block_size(shape[1], sc).ok_or_else(tiling)?;
    Ok((br, bc))
}

/// The `.gguf` files of `dir`, sorted (split shards in order).
fn gguf_files(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let p = entry?.path();
        if p.extension().is_some_and(|e| e == "gguf") && p.is_file() {
            files.push(p);
        }
    }
    files.sort();
    Ok(files)
}

/// What [`index_shards`] gives: the shards, each tensor's `(shard, info)` by stored name, and
/// each shard's extra.
type Indexed<E> = (Vec<Shard>, HashMap<String, (usize, TensorInfo)>, Vec<E>);

/// Every shard `open` reads from `paths`, each tensor's `(shard, info)`, and what else each
/// shard gave (a GGUF file's metadata); a tensor stored in two shards is an error naming
/// both.
fn index_shards<E>(
    paths: &[PathBuf],
    mut open: impl FnMut(&Path) -> Result<(Shard, Vec<(String, TensorInfo)>, E), CheckpointError>,
) -> Result<Indexed<E>, CheckpointError> {
    let mut shards: Vec<Shard> = Vec::with_capacity(paths.len());
    let mut index: HashMap<String, (usize, TensorInfo)> = HashMap::new();
    let mut extras = Vec::with_capacity(paths.len());
    for p in paths {
        let (shard, tensors, extra) = open(p)?;
        for (name, info) in tensors {
            if let Some((j, _)) = index.get(&name) {
                return Err(CheckpointError::Duplicate {
                    tensor: name,
                    first: shards[*j].path.clone(),
                    second: p.clone(),
                });
            }
            index.insert(name, (shards.len(), info));
        }
        shards.push(shard);
        extras.push(extra);
    }
    Ok((shards, index, extras))
}
