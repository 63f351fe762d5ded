//! Streaming safetensors output: the whole tensor plan is laid out first (so every shard's
//! header, which must list all offsets, can be written before its data), then each tensor is
//! generated in row chunks and written as it is produced. Peak memory is a few chunks per
//! core, whatever the checkpoint's size.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::ops::Range;
use std::path::Path;

use rayon::prelude::*;
use serde_json::{json, Map, Value};

use super::generate::{chunk_rows, encode_rows, TensorRng};
use super::plan::{tensor_plan, Init, PlannedTensor};
use super::{SynthError, SynthSpec};

/// Shard size of the written checkpoint: big enough to keep the file count small, small
/// enough for filesystems and tools that dislike multi-GB files.
pub const SHARD_BYTES: u64 = 1 << 30;

const TOKENIZER_JSON: &[u8] = include_bytes!("../../../../assets/tokenizer/tokenizer.json");
const TOKENIZER_CONFIG: &[u8] =
    include_bytes!("../../../../assets/tokenizer/tokenizer_config.json");

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> SynthError + '_ {
    move |source| SynthError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Tensor index ranges that must stay together: a quantised weight and its scale, since the
/// scale is only known once the weight has been drawn.
fn groups(plan: &[PlannedTensor]) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < plan.len() {
        let paired = plan.get(i + 1).is_some_and(|n| n.init == Init::Scale);
        let end = if paired { i + 2 } else { i + 1 };
        out.push(i..end);
        i = end;
    }
    out
}

/// Consecutive groups packed into shards of at most `limit` data bytes (a group larger than
/// that gets a shard of its own).
fn shards(plan: &[PlannedTensor], limit: u64) -> Vec<Range<usize>> {
    let mut out: Vec<Range<usize>> = Vec::new();
    let mut size = 0u64;
    for g in groups(plan) {
        let bytes: u64 = plan[g.clone()].iter().map(PlannedTensor::byte_len).sum();
        match out.last_mut() {
            Some(last) if size + bytes <= limit => {
                last.end = g.end;
                size += bytes;
            }
            _ => {
                out.push(g);
                size = bytes;
            }
        }
    }
    out
}

/// The safetensors header for `tensors`, laid out in order, padded with spaces so the data
/// starts 8-byte aligned.
fn header(tensors: &[PlannedTensor]) -> Vec<u8> {
    let mut map = Map::new();
    let mut offset = 0u64;
    for t in tensors {
        let end = offset + t.byte_len();
        let dtype = serde_json::to_value(t.dtype).expect("a dtype serialises to a string");
        map.insert(
            t.name.clone(),
            json!({ "dtype": dtype, "shape": t.shape, "data_offsets": [offset, end] }),
        );
        offset = end;
    }
    map.insert("__metadata__".into(), json!({ "format": "pt" }));
    let mut bytes = serde_json::to_vec(&Value::Object(map)).expect("a JSON map serialises");
    bytes.resize(bytes.len().next_multiple_of(8), b' ');
    bytes
}

/// One unit of generation work: rows `rows` of the group's first tensor.
struct Task {
    group: Range<usize>,
    rows: Range<usize>,
    /// Whether this is the group's last task, after which its scale is complete.
    last: bool,
}

fn tasks(tensors: &[PlannedTensor]) -> Vec<Task> {
    let mut out = Vec::new();
    for group in groups(tensors) {
        let t = &tensors[group.start];
        let (rows, _) = t.logical_rows_cols();
        let step = chunk_rows(t);
        let mut r = 0;
        while r < rows {
            let end = (r + step).min(rows);
            out.push(Task {
                group: group.clone(),
                rows: r..end,
                last: end == rows,
            });
            r = end;
        }
    }
    out
}

/// Writes the data of `tensors` in order. Tasks run a batch at a time across all cores
/// (batches span tensors, so thousands of small experts parallelise as well as one
/// embedding); results are written in plan order, each scale once its weight is complete.
fn write_data(
    w: &mut impl Write,
    tensors: &[PlannedTensor],
    seed: u64,
    on_bytes: &mut dyn FnMut(u64),
) -> std::io::Result<()> {
    let all = tasks(tensors);
    let batch = 4 * rayon::current_num_threads();
    let (mut scales, mut written) = (Vec::new(), 0u64);
    for part in all.chunks(batch) {
        let encoded: Vec<(Vec<u8>, Vec<u8>)> = part
            .par_iter()
            .map(|task| {
                let t = &tensors[task.group.start];
                encode_rows(t, &TensorRng::new(seed, &t.name), task.rows.clone())
            })
            .collect();
        for (task, (bytes, s)) in part.iter().zip(encoded) {
            w.write_all(&bytes)?;
            on_bytes(bytes.len() as u64);
            scales.extend_from_slice(&s);
            written += bytes.len() as u64;
            if task.last {
                if task.group.len() == 2 {
                    let scale = &tensors[task.group.start + 1];
                    assert_eq!(
                        scales.len() as u64,
                        scale.byte_len(),
                        "synth made the wrong number of scales for {}",
                        scale.name
                    );
                    w.write_all(&scales)?;
                    on_bytes(scales.len() as u64);
                    written += scales.len() as u64;
                }
                scales.clear();
            }
        }
    }
    let planned: u64 = tensors.iter().map(PlannedTensor::byte_len).sum();
    assert_eq!(written, planned, "synth wrote the wrong amount of data");
    Ok(())
}

/// [`super::write_checkpoint`] with a chosen shard size (tests use a small one to get
/// several shards out of a small model).
pub fn write_checkpoint_sharded(
    spec: &SynthSpec,
    out: &Path,
    seed: u64,
    shard_bytes: u64,
    mut progress: impl FnMut(u64, u64),
) -> Result<(), SynthError> {
    spec.validate()?;
    std::fs::create_dir_all(out).map_err(io_err(out))?;
    let plan = tensor_plan(spec);
    let layout = shards(&plan, shard_bytes);
    let headers: Vec<Vec<u8>> = layout.iter().map(|r| header(&plan[r.clone()])).collect();
    let data: u64 = plan.iter().map(PlannedTensor::byte_len).sum();
    let total = data + headers.iter().map(|h| 8 + h.len() as u64).sum::<u64>();
    let mut done = 0u64;
    progress(done, total);

    let n = layout.len();
    let mut weight_map = Map::new();
    for (i, (range, head)) in layout.iter().zip(&headers).enumerate() {
        let file = format!("model-{:05}-of-{n:05}.safetensors", i + 1);
        let path = out.join(&file);
        let mut w = BufWriter::with_capacity(8 << 20, File::create(&path).map_err(io_err(&path))?);
        let mut write = || -> std::io::Result<()> {
            w.write_all(&(head.len() as u64).to_le_bytes())?;
            w.write_all(head)?;
            done += 8 + head.len() as u64;
            progress(done, total);
            write_data(&mut w, &plan[range.clone()], seed, &mut |b| {
                done += b;
                progress(done, total);
            })?;
            w.flush()
        };
        write().map_err(io_err(&path))?;
        for t in &plan[range.clone()] {
            weight_map.insert(t.name.clone(), Value::String(file.clone()));
        }
    }

    let index = json!({ "metadata": { "total_size": data }, "weight_map": weight_map });
    let config = &spec.config_json();
    for (name, bytes) in [
        ("model.safetensors.index.json", pretty(&index)),
        ("config.json", pretty(config)),
        ("tokenizer.json", tokenizer_json(spec.config.v41.is_some())),
        ("tokenizer_config.json", TOKENIZER_CONFIG.to_vec()),
    ] {
        let path = out.join(name);
        std::fs::write(&path, bytes).map_err(io_err(&path))?;
    }
    Ok(())
}

/// The `tokenizer.json` a synthetic checkpoint ships: V4's, and for V4.1 V4's with id 128799
/// named `<｜System｜>` as V4.1's tokenizer names it (a placeholder in V4's), so V4.1's chat
/// format tokenizes as it does on a real V4.1 checkpoint. It is flagged non-special like the
/// other role markers: decoding with `skip_special_tokens` keeps it, as it keeps `<｜User｜>`.
pub fn tokenizer_json(v41: bool) -> Vec<u8> {
    const V4_ENTRY: &str = "\"content\": \"<｜place▁holder▁no▁799｜>\",\n      \"single_word\": false,\n      \"lstrip\": false,\n      \"rstrip\": false,\n      \"normalized\": false,\n      \"special\": true";
    const V41_ENTRY: &str = "\"content\": \"<｜System｜>\",\n      \"single_word\": false,\n      \"lstrip\": false,\n      \"rstrip\": false,\n      \"normalized\": false,\n      \"special\": false";
    let text = std::str::from_utf8(TOKENIZER_JSON).expect("the tokenizer is UTF-8");
    if !v41 {
        return TOKENIZER_JSON.to_vec();
    }
    assert_eq!(
        text.matches(V4_ENTRY).count(),
        1,
        "the V4 tokenizer's id 128799 entry moved"
    );
    text.replacen(V4_ENTRY, V41_ENTRY, 1).into_bytes()
}

fn pretty(v: &Value) -> Vec<u8> {
    let mut s = serde_json::to_vec_pretty(v).expect("a JSON value serialises");
    s.push(b'\n');
    s
}
