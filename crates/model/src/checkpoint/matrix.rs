//! 2-D weights as [`QMatrix`]: the stored bytes with their scales, not dequantised.

use super::names::ExpertPart;
use super::{
    blocks_for, check_scale_dtype, decode, describe, shape_err, Checkpoint, CheckpointError,
    Located, Shard, TensorInfo,
};
use deepinfer_kernels::buffer::WeightBytes;
use deepinfer_kernels::formats::f32_to_e8m0;
use deepinfer_kernels::matrix::{MatrixError, QMatrix};
use deepinfer_kernels::sub_matrix::SubMatrix;
use safetensors::Dtype;
use std::ops::Range;

impl Checkpoint {
    /// Load a 2-D weight `[out, in]` by its OFFICIAL name in its stored format: F32/BF16 as
    /// is (F16 widened to f32, which no V4 checkpoint ships), F8_E4M3 with its block scale,
    /// packed FP4 (I8/U8 `[out, in/2]`) with its group scale; HF's stacked experts are cut
    /// out of their `[E, …]` tensors. Shapes and scale grids are checked as in
    /// [`Checkpoint::tensor_f32`].
    pub fn matrix(&self, official_name: &str, shape: &[usize]) -> Result<QMatrix, CheckpointError> {
        self.matrix_in(official_name, shape, WeightBytes::copy_from)
    }

    /// `rows × cols` of [`Self::matrix`] (see [`QMatrix::sub_matrix`]): only the part is
    /// kept — the whole is built in memory that is given back at once.
    pub fn matrix_part(
        &self,
        official_name: &str,
        shape: &[usize],
        rows: Range<usize>,
        cols: Range<usize>,
    ) -> Result<SubMatrix, CheckpointError> {
        let whole = self.matrix_in(official_name, shape, WeightBytes::transient)?;
        Ok(whole.sub_matrix(rows, cols))
    }

    /// [`Self::matrix`], the stored codes copied by `copy` where they are used as stored.
    fn matrix_in(
        &self,
        official_name: &str,
        shape: &[usize],
        copy: fn(&[u8]) -> WeightBytes,
    ) -> Result<QMatrix, CheckpointError> {
        let located = self.locate(official_name)?;
        if let Some(src) = self.source_at(official_name, &located, shape)? {
            let scales = match src.scales {
                Some(r) => self.range_bytes(r)?,
                None => &[],
            };
            return src.build(copy(self.range_bytes(src.codes)?), scales);
        }
        // What remains converts at load: F16, FP4 scales that are not per-row E8M0, HF's
        // stacked FP8 experts.
        match located {
            Located::Whole {
                stored,
                shard,
                info,
            } => self.whole_matrix(official_name, stored, shard, info, shape),
            Located::Expert {
                stored,
                shard,
                info,
                expert,
                part,
            } => self.expert_matrix(official_name, stored, (shard, info), (expert, part), shape),
        }
    }

    fn whole_matrix(
        &self,
        official: &str,
        stored: &str,
        shard: &Shard,
        info: &TensorInfo,
        shape: &[usize],
    ) -> Result<QMatrix, CheckpointError> {
        let name = describe(official, stored);
        let two_d = |what: &str| {
            if shape.len() == 2 {
                Ok((shape[0], shape[1]))
            } else {
                Err(shape_err(name.clone(), shape, &info.shape, what))
            }
        };
        match info.dtype {
            Dtype::F16 => {
                if info.shape != shape {
                    return Err(shape_err(name, shape, &info.shape, ""));
                }
                let (rows, cols) = two_d("; a weight matrix is 2-D [out, in]")?;
                float_matrix(info.dtype, rows, cols, shard.bytes(info)?).map_err(|e| invalid(&name, e))
            }
            Dtype::I8 | Dtype::U8 => {
                check_fp4_shape(&name, shape, &info.shape)?;
                let scale = self.scale_for(official, &name)?;
                let (br, bc) = blocks_for(&name, shape, &scale.shape, &scale.name)?;
                let (rows, cols, groups) = (shape[0], shape[1], scale.shape[1]);
                // One scale row per weight row, as E8M0 bytes (shipped: already so).
                let per_row: Option<Vec<u8>> = match scale.dtype {
                    Dtype::F8_E8M0 if br == 1 => Some(scale.bytes.to_vec()),
                    _ => {
                        let s = scale.decoded();
                        (0..rows * groups)
                            .map(|i| f32_to_e8m0(s[(i / groups / br) * groups + i % groups]))
                            .collect()
                    }
                };
                let bytes = shard.bytes(info)?;
                match per_row {
                    Some(sc) => QMatrix::fp4(rows, cols, bytes, &sc, bc),
                    None => {
                        // Scales that are not powers of two: exact in f32, just not packed.
                        tracing::warn!("{name}: FP4 scales are not E8M0 values; kept in f32");
                        let s = scale.decoded();
                        let mut vals = vec![0.0f32; rows * cols];
                        for (r, row) in vals.chunks_exact_mut(cols.max(1)).enumerate() {
                            let prow = &bytes[r * cols / 2..(r + 1) * cols / 2];
                            deepinfer_kernels::formats::unpack_fp4_row(prow, row);
                            for (j, v) in row.iter_mut().enumerate() {
                                *v *= s[(r / br) * groups + j / bc];
                            }
                        }
                        QMatrix::from_f32(rows, cols, &vals)
                    }
                }
                .map_err(|e| invalid(&name, e))
            }
            other => Err(CheckpointError::Dtype {
                tensor: name,
                found: format!("{other:?}"),
                expected: "F32, BF16, F16, F8_E4M3 (with a block scale) or I8/U8 (packed FP4 with a block scale)".into(),
            }),
        }
    }

    /// Expert `expert`'s `part` of HF's stacked tensor `stored` (in `shard`, described by
    /// `info`), as the official matrix `official` of `shape`.
    fn expert_matrix(
        &self,
        official: &str,
        stored: &str,
        (shard, info): (&Shard, &TensorInfo),
        (expert, part): (usize, ExpertPart),
        shape: &[usize],
    ) -> Result<QMatrix, CheckpointError> {
        let name = describe(official, &format!("{stored}[{expert}]"));
        let (rows_total, row0, first) =
            stacked_cut(&name, info, expert, part, shape, official, stored)?;
        let (rows, cols) = (shape[0], shape[1]);
        let d = &info.shape;
        let n_experts = d[0];
        let n = rows * cols;

        let bytes = shard.bytes(info)?;
        match info.dtype {
            Dtype::F32 | Dtype::BF16 | Dtype::F16 => {
                let w = info.dtype.bitsize() / 8;
                float_matrix(info.dtype, rows, cols, &bytes[first * w..(first + n) * w])
            }
            Dtype::F8_E4M3 => {
                let scale_stored = format!("{stored}_scale_inv");
                let (_, sshard, sinfo) =
                    self.stored(&scale_stored)
                        .ok_or_else(|| CheckpointError::MissingScale {
                            weight: name.clone(),
                            scale: format!("`{scale_stored}`"),
                        })?;
                let scale_name = format!("`{scale_stored}`");
                check_scale_dtype(&scale_name, sinfo.dtype)?;
                let s = &sinfo.shape;
                if s.len() != 3 || s[0] != n_experts {
                    return Err(CheckpointError::ScaleShape {
                        weight: name,
                        weight_shape: d.clone(),
                        scale: scale_name,
                        scale_shape: s.clone(),
                    });
                }
                // Decode only this expert's scale grid, not all E of them.
                let per = s[1] * s[2] * (sinfo.dtype.bitsize() / 8);
                let all = sshard.bytes(sinfo)?;
                let mine = decode::scales(sinfo.dtype, &all[expert * per..(expert + 1) * per]);
                let (br, bc) = blocks_for(&name, &[rows_total, cols], &s[1..], &scale_name)?;
                let sc = s[2];
                // A part that starts mid-block (up half of gate_up with I % br != 0) gets a
                // scale row per weight row.
                let (scales, br) = if row0.is_multiple_of(br) {
                    let rb0 = row0 / br;
                    (mine[rb0 * sc..(rb0 + rows.div_ceil(br)) * sc].to_vec(), br)
                } else {
                    let grid = (0..rows)
                        .flat_map(|r| {
                            mine[((row0 + r) / br) * sc..((row0 + r) / br + 1) * sc]
                                .iter()
                                .copied()
                        })
                        .collect();
                    (grid, 1)
                };
                QMatrix::fp8(rows, cols, &bytes[first..first + n], scales, sc, br, bc)
            }
            other => {
                return Err(CheckpointError::Dtype {
                    tensor: name,
                    found: format!("{other:?}"),
                    expected: "F32, BF16, F16 or F8_E4M3 for stacked experts".into(),
                })
            }
        }
        .map_err(|e| invalid(&name, e))
    }
}

/// Where one expert's matrix starts in HF's stacked `[E, rows_total, cols]` tensor, checked:
/// `(rows_total, first row of the part, first element)`.
pub(super) fn stacked_cut(
    name: &str,
    info: &TensorInfo,
    expert: usize,
    part: ExpertPart,
    shape: &[usize],
    official: &str,
    stored: &str,
) -> Result<(usize, usize, usize), CheckpointError> {
    let layout_hint = "; HF stacks experts as gate_up_proj [E, 2I, D] and down_proj [E, D, I]";
    if shape.len() != 2 {
        return Err(shape_err(
            name.to_string(),
            shape,
            &info.shape,
            "; expert matrices are 2-D",
        ));
    }
    let (rows, cols) = (shape[0], shape[1]);
    let (rows_total, row0) = match part {
        ExpertPart::Gate => (rows.saturating_mul(2), 0),
        ExpertPart::Up => (rows.saturating_mul(2), rows),
        ExpertPart::Down => (rows, 0),
    };
    let d = &info.shape;
    let n_experts = d.first().copied().unwrap_or(0);
    let want = [n_experts, rows_total, cols];
    if d.len() != 3 || d[1..] != want[1..] {
        return Err(shape_err(name.to_string(), &want, d, layout_hint));
    }
    if expert >= n_experts {
        return Err(CheckpointError::Missing {
            tensor: official.to_string(),
            looked_for: format!("expert {expert} in `{stored}`, which stacks {n_experts} experts"),
        });
    }
    Ok((rows_total, row0, (expert * rows_total + row0) * cols))
}

/// A packed FP4 weight is stored `[out, in/2]` for its logical `[out, in]`, `in` even.
pub(super) fn check_fp4_shape(
    name: &str,
    shape: &[usize],
    stored: &[usize],
) -> Result<(), CheckpointError> {
    if shape.len() != 2 || !shape[1].is_multiple_of(2) {
        return Err(shape_err(
            name.to_string(),
            shape,
            stored,
            "; packed FP4 needs a 2-D logical shape [out, in] with even `in`",
        ));
    }
    let packed = [shape[0], shape[1] / 2];
    if stored != packed {
        return Err(shape_err(
            name.to_string(),
            &packed,
            stored,
            format!("; packed FP4 [out, in/2] for logical shape {shape:?}"),
        ));
    }
    Ok(())
}

pub(super) fn invalid(name: &str, e: MatrixError) -> CheckpointError {
    CheckpointError::InvalidValue {
        name: name.to_string(),
        reason: e.to_string(),
    }
}

/// A plain float matrix from its stored bytes (F16 widened to f32).
fn float_matrix(
    dtype: Dtype,
    rows: usize,
    cols: usize,
    bytes: &[u8],
) -> Result<QMatrix, MatrixError> {
    match dtype {
        Dtype::F32 => QMatrix::f32_from_bytes(rows, cols, bytes),
        Dtype::BF16 => QMatrix::bf16_from_bytes(rows, cols, bytes),
        _ => {
            let mut vals = vec![0.0f32; rows * cols];
            decode::floats(dtype, bytes, &mut vals);
            QMatrix::from_f32(rows, cols, &vals)
        }
    }
}
