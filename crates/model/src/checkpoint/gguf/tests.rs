//! The GGUF reader on files written here byte by byte (the layout of gguf-py's `GGUFWriter`):
//! what it reads back, and a clear error for every truncation and corruption.

use super::read::{parse, Value};
use crate::checkpoint::{Checkpoint, CheckpointError};

fn string(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

/// A GGUF v3 file: `kv` metadata, then `(name, ne, type id, data)` tensors aligned to 32.
fn gguf(kv: &[(&str, u32, Vec<u8>)], tensors: &[(&str, &[u64], u32, Vec<u8>)]) -> Vec<u8> {
    let mut out = b"GGUF".to_vec();
    out.extend(3u32.to_le_bytes());
    out.extend((tensors.len() as u64).to_le_bytes());
    out.extend((kv.len() as u64).to_le_bytes());
    for (k, ty, v) in kv {
        string(&mut out, k);
        out.extend(ty.to_le_bytes());
        out.extend(v);
    }
    let mut offset = 0u64;
    for (name, ne, ty, data) in tensors {
        string(&mut out, name);
        out.extend((ne.len() as u32).to_le_bytes());
        for d in *ne {
            out.extend(d.to_le_bytes());
        }
        out.extend(ty.to_le_bytes());
        out.extend(offset.to_le_bytes());
        offset += (data.len() as u64).next_multiple_of(32);
    }
    out.resize(out.len().next_multiple_of(32), 0);
    for (_, _, _, data) in tensors {
        out.extend(data);
        out.resize(out.len().next_multiple_of(32), 0);
    }
    out
}

fn str_value(s: &str) -> Vec<u8> {
    let mut v = Vec::new();
    string(&mut v, s);
    v
}

fn sample() -> Vec<u8> {
    let mut arr = 4u32.to_le_bytes().to_vec(); // u32 elements
    arr.extend(3u64.to_le_bytes());
    for x in [0u32, 4, 128] {
        arr.extend(x.to_le_bytes());
    }
    let q8: Vec<u8> = [0x00, 0x3C].into_iter().chain(0..32u8).collect(); // d = 1
    let f32s: Vec<u8> = [1.5f32, -2.0]
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect();
    gguf(
        &[
            ("general.architecture", 8, str_value("deepseek4")),
            ("deepseek4.block_count", 4, 6u32.to_le_bytes().to_vec()),
            ("deepseek4.attention.compress_ratios", 9, arr),
            ("deepseek4.expert_weights_norm", 7, vec![1]),
        ],
        &[
            ("blk.0.attn_q_a.weight", &[32, 1], 8, q8),
            ("output_norm.weight", &[2], 0, f32s),
        ],
    )
}

#[test]
fn reads_metadata_and_tensor_ranges() {
    let bytes = sample();
    let h = parse(&bytes).unwrap();
    assert_eq!(h.meta["general.architecture"].as_str(), Some("deepseek4"));
    assert_eq!(h.meta["deepseek4.block_count"].as_u64(), Some(6));
    assert_eq!(h.meta["deepseek4.expert_weights_norm"], Value::Bool(true));
    let ratios: Vec<u64> = h.meta["deepseek4.attention.compress_ratios"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    assert_eq!(ratios, [0, 4, 128]);
    let t = &h.tensors[0];
    assert_eq!((t.ty.name(), t.ne.as_slice()), ("Q8_0", &[32u64, 1][..]));
    assert_eq!(t.end - t.start, 34);
    assert_eq!(&bytes[t.start..t.start + 2], &[0x00, 0x3C]);
    let n = &h.tensors[1];
    assert_eq!(
        &bytes[n.start..n.end],
        &1.5f32
            .to_le_bytes()
            .into_iter()
            .chain((-2.0f32).to_le_bytes())
            .collect::<Vec<_>>()[..]
    );
}

#[test]
fn every_truncation_is_an_error_naming_where() {
    let bytes = sample();
    for cut in 0..bytes.len() - 1 {
        // The last tensor's padding is not data: a cut there still reads.
        let Err(e) = parse(&bytes[..cut]) else {
            let h = parse(&bytes[..cut]).unwrap();
            assert!(h.tensors.iter().all(|t| t.end <= cut), "cut at {cut}");
            continue;
        };
        assert!(e.offset as usize <= cut, "cut {cut}: {e:?}");
        assert!(e.reason.contains("truncated"), "cut {cut}: {}", e.reason);
    }
}

#[test]
fn corrupt_headers_are_refused_without_allocating_their_claims() {
    let good = sample();
    let with = |at: usize, patch: &[u8]| {
        let mut b = good.clone();
        b[at..at + patch.len()].copy_from_slice(patch);
        parse(&b).unwrap_err().reason
    };
    assert!(with(0, b"GGML").contains("not a GGUF file"));
    assert!(with(4, &9u32.to_le_bytes()).contains("version 9"));
    assert!(with(8, &u64::MAX.to_le_bytes()).contains("tensors"));
    // The first key's length, then an array's element count, made absurd.
    assert!(with(24, &(1u64 << 60).to_le_bytes()).contains("claims"));
    let arr_len = good
        .windows(4)
        .position(|w| w == 4u32.to_le_bytes())
        .map(|p| p + 4);
    let at = arr_len.unwrap();
    assert!(with(at, &(1u64 << 62).to_le_bytes()).contains("claims"));
}

#[test]
fn a_truncated_file_fails_to_open_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.gguf");
    let bytes = sample();
    std::fs::write(&path, &bytes[..bytes.len() - 40]).unwrap();
    let err = Checkpoint::open(&path).unwrap_err();
    assert!(matches!(err, CheckpointError::Gguf { .. }), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("model.gguf") && msg.contains("truncated"),
        "{msg}"
    );
}

#[test]
fn types_it_cannot_compute_on_are_refused_naming_the_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tq2.gguf");
    let tq2_0 = vec![0u8; 66];
    std::fs::write(
        &path,
        gguf(&[], &[("blk.0.attn_kv.weight", &[256, 1], 35, tq2_0)]),
    )
    .unwrap();
    let msg = Checkpoint::open(&path).unwrap_err().to_string();
    assert!(
        msg.contains("blk.0.attn_kv.weight") && msg.contains("TQ2_0") && msg.contains("IQ1_M"),
        "{msg}"
    );
}

#[test]
fn block_matrices_load_as_stored() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.gguf");
    std::fs::write(&path, sample()).unwrap();
    let ck = Checkpoint::open(&path).unwrap();
    let m = ck.matrix("layers.0.attn.wq_a.weight", &[1, 32]).unwrap();
    assert_eq!(m.format().name(), "q8_0");
    let want: Vec<f32> = (0..32).map(|j| j as f32).collect();
    assert_eq!(m.dequantize(), want);
    assert_eq!(ck.vector("norm.weight", 2).unwrap(), [1.5, -2.0]);
    let err = ck
        .matrix("layers.0.attn.wq_a.weight", &[2, 16])
        .unwrap_err();
    assert!(err.to_string().contains("blk.0.attn_q_a.weight"), "{err}");
}

#[test]
fn split_files_open_from_their_first_shard_and_strangers_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let f32s = |v: f32| v.to_le_bytes().to_vec();
    let arch = [("general.architecture", 8, str_value("deepseek4"))];
    let one = gguf(&arch, &[("output_norm.weight", &[1], 0, f32s(1.0))]);
    let two = gguf(&[], &[("blk.0.attn_norm.weight", &[1], 0, f32s(2.0))]);
    std::fs::write(dir.path().join("m-00001-of-00002.gguf"), &one).unwrap();
    std::fs::write(dir.path().join("m-00002-of-00002.gguf"), &two).unwrap();
    for path in [
        dir.path().join("m-00001-of-00002.gguf"),
        dir.path().to_path_buf(),
    ] {
        let ck = Checkpoint::open(&path).unwrap();
        assert_eq!(ck.vector("norm.weight", 1).unwrap(), [1.0]);
        assert_eq!(ck.vector("layers.0.attn_norm.weight", 1).unwrap(), [2.0]);
        let arch = ck.gguf_metadata().unwrap()["general.architecture"].as_str();
        assert_eq!(arch, Some("deepseek4"));
    }
    std::fs::write(dir.path().join("mtp-m.gguf"), &two).unwrap();
    let msg = Checkpoint::open(dir.path()).unwrap_err().to_string();
    assert!(
        msg.contains("mtp-m.gguf") && msg.contains("--model"),
        "{msg}"
    );
}
