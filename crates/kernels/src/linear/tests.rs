//! Every kernel against an f64 product of the exactly dequantised weights, over shapes that
//! hit every tail (rows, activation groups, chunk remainders) and every scale layout.

use super::*;
use crate::formats::{f32_to_bf16, f32_to_e4m3};

/// A small deterministic generator (no test-only dependency needed).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> f32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    fn byte(&mut self) -> u8 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 56) as u8
    }
}

/// `(n, k)` matrices in every format, with scales of the given kind.
fn matrices(n: usize, k: usize, rng: &mut Lcg) -> Vec<(String, QMatrix)> {
    let mut out = Vec::new();
    let vals: Vec<f32> = (0..n * k).map(|_| rng.next()).collect();
    out.push(("f32".into(), QMatrix::from_f32(n, k, &vals).unwrap()));
    let bf: Vec<u8> = vals
        .iter()
        .flat_map(|&v| f32_to_bf16(v).to_le_bytes())
        .collect();
    out.push(("bf16".into(), QMatrix::bf16_from_bytes(n, k, &bf).unwrap()));
    // Every byte except the NaN codes, so subnormals and ±448 are covered.
    let codes: Vec<u8> = (0..n * k)
        .map(|_| {
            let b = rng.byte();
            if b & 0x7F == 0x7F {
                f32_to_e4m3(rng.next() * 448.0)
            } else {
                b
            }
        })
        .collect();
    for (br, bc, pow2) in [
        (128, 128, true),
        (32, 32, true),
        (32, 32, false),
        (64, 256, true),
        (1, 128, false),
    ] {
        let grid = n.div_ceil(br) * k.div_ceil(bc);
        let scales: Vec<f32> = (0..grid)
            .map(|_| {
                let e = (rng.byte() % 16) as i32 - 12;
                if pow2 {
                    2f32.powi(e)
                } else {
                    2f32.powi(e) * (1.0 + rng.next().abs())
                }
            })
            .collect();
        out.push((
            format!(
                "fp8 {br}x{bc}{}",
                if pow2 {
                    ""
                } else {
                    " (scales not powers of two)"
                }
            ),
            QMatrix::fp8(n, k, &codes, scales, k.div_ceil(bc), br, bc).unwrap(),
        ));
    }
    if k.is_multiple_of(32) {
        out.extend(ggml_matrices(n, k, rng));
    }
    if k.is_multiple_of(2) {
        let packed: Vec<u8> = (0..n * k / 2).map(|_| rng.byte()).collect();
        for group in [32, 64] {
            let scales: Vec<u8> = (0..n * k.div_ceil(group))
                .map(|_| 127 - 14 + rng.byte() % 20)
                .collect();
            out.push((
                format!("fp4 /{group}"),
                QMatrix::fp4(n, k, &packed, &scales, group).unwrap(),
            ));
        }
    }
    out
}

/// `(n, k)` matrices in the GGUF block formats whose blocks divide `k`, scales as
/// checkpoints have them (codes and sub-block scales random).
fn ggml_matrices(n: usize, k: usize, rng: &mut Lcg) -> Vec<(String, QMatrix)> {
    use crate::ggml::Block;
    Block::ALL
        .into_iter()
        .filter(|b| k.is_multiple_of(b.elems()))
        .map(|block| {
            let mut bytes = Vec::with_capacity(n * block.row_bytes(k));
            for _ in 0..n * k / block.elems() {
                let at = bytes.len();
                bytes.extend((0..block.bytes()).map(|_| rng.byte()));
                let b = &mut bytes[at..];
                block.set_scales(b, half::f16::from_f32(rng.next() * 0.02).to_bits());
                if block == Block::Mxfp4 {
                    b[0] = 127 - 10 + rng.byte() % 12;
                }
            }
            let w = QMatrix::ggml_in(n, k, block, crate::buffer::WeightBytes::copy_from(&bytes));
            (block.name().to_string(), w.unwrap())
        })
        .collect()
}

fn reference(w: &QMatrix, rows: Range<usize>, x: &[f32], m: usize) -> (Vec<f64>, Vec<f64>) {
    let (k, n) = (w.cols, rows.len());
    let d = w.dequantize();
    let mut y = vec![0.0f64; m * n];
    let mut mag = vec![0.0f64; m * n];
    for i in 0..m {
        for (j, r) in rows.clone().enumerate() {
            for t in 0..k {
                let p = d[r * k + t] as f64 * x[i * k + t] as f64;
                y[i * n + j] += p;
                mag[i * n + j] += p.abs();
            }
        }
    }
    (y, mag)
}

fn check(label: &str, got: &[f32], want: &[f64], mag: &[f64]) {
    for (idx, ((&g, &w), &a)) in got.iter().zip(want).zip(mag).enumerate() {
        let tol = 2e-6 * a + 1e-30;
        assert!(
            (g as f64 - w).abs() <= tol,
            "{label}: element {idx}: got {g}, want {w} (tolerance {tol:e})"
        );
    }
}

use crate::cpu::families;

#[test]
fn every_format_matches_the_reference_on_ragged_shapes() {
    let mut rng = Lcg(7);
    let shapes = [
        (1, 1, 2),
        (1, 3, 30),
        (2, 5, 32),
        (3, 2, 64),
        (4, 7, 66),
        (5, 65, 96),
        (9, 130, 192),
        (17, 64, 200),
        (1, 300, 512),
        (6, 129, 1088),
        // the GEMM path: one and two vectors of columns, partial strips, a tail (AVX-512
        // from 5 rows, with strips of 8)
        (7, 30, 256),
        (12, 50, 130),
        (16, 40, 256),
        (20, 13, 64),
        (64, 64, 256),
        (70, 100, 192),
        (131, 33, 600),
    ];
    for &(m, n, k) in &shapes {
        let x: Vec<f32> = (0..m * k).map(|_| rng.next() * 3.0).collect();
        for (name, w) in matrices(n, k, &mut rng) {
            let (want, mag) = reference(&w, 0..n, &x, m);
            for (isa, invariant) in families().into_iter().flat_map(|f| [(f, true), (f, false)]) {
                set_batch_invariant(invariant);
                let mut y = vec![f32::NAN; m * n];
                matmuls_on(&mut [Matmul::new(&w, &x, m, &mut y)], isa);
                set_batch_invariant(true);
                check(
                    &format!("{name} {isa:?} invariant {invariant} m={m} n={n} k={k}"),
                    &y,
                    &want,
                    &mag,
                );
            }
        }
    }
}

#[test]
fn row_ranges_and_several_products_in_one_pass() {
    let mut rng = Lcg(11);
    let (m, k) = (3, 256);
    let x: Vec<f32> = (0..m * k).map(|_| rng.next()).collect();
    let mats = matrices(300, k, &mut rng);
    let ranges = [0..300, 37..200, 128..256, 5..6];
    let mut ys: Vec<Vec<f32>> = Vec::new();
    let mut jobs = Vec::new();
    for ((_, w), r) in mats.iter().zip(ranges.iter().cycle()) {
        ys.push(vec![f32::NAN; m * r.len()]);
        let _ = w;
    }
    for (((_, w), r), y) in mats.iter().zip(ranges.iter().cycle()).zip(ys.iter_mut()) {
        jobs.push(Matmul {
            w,
            rows: r.clone(),
            x: &x,
            m,
            y,
            inputs: Inputs::F32,
        });
    }
    matmuls(&mut jobs);
    drop(jobs);
    for (((name, w), r), y) in mats.iter().zip(ranges.iter().cycle()).zip(&ys) {
        let (want, mag) = reference(w, r.clone(), &x, m);
        check(&format!("{name} rows {r:?}"), y, &want, &mag);
    }
}

#[test]
fn scales_outside_the_fast_range_fall_back_exactly() {
    let (n, k) = (4, 64);
    let codes = vec![0x38u8; n * k]; // 1.0
    let big = QMatrix::fp8(n, k, &codes, vec![2f32.powi(80)], 1, 128, 128).unwrap();
    assert!(!fast_path(&big));
    let x = vec![2f32.powi(-70); k];
    let mut y = vec![0.0; n];
    matmul(&big, &x, 1, &mut y);
    assert_eq!(y, vec![64.0 * 2f32.powi(10); n]);
    let tiny = QMatrix::fp4(1, 64, &[0x22; 32], &[7; 2], 32).unwrap();
    assert!(!fast_path(&tiny));
    let mut y = vec![0.0; 1];
    matmul(&tiny, &vec![1.0; 64], 1, &mut y);
    assert_eq!(y[0], 64.0 * 2f32.powi(-120));
}

#[test]
fn shipped_layouts_take_the_fast_path() {
    let mut rng = Lcg(3);
    for (name, w) in matrices(256, 4096, &mut rng) {
        if matches!(w.format(), Format::Ggml(_)) {
            continue; // their own path (`ggml`)
        }
        assert!(fast_path(&w), "{name} should run the fused kernel");
    }
}

/// Every row gets exactly what it gets alone, on the fused path and on the GEMM path alike
/// (power-of-two FP8 block scales, as V4 checkpoints have: with others the two paths round
/// the block scale at different points).
#[test]
fn a_row_does_not_depend_on_the_rest_of_the_batch() {
    let mut rng = Lcg(5);
    // k spans several of the fused kernels' inner blocks at the larger batches; 40 rows take
    // the GEMM with a partial strip, 260 with whole tiles' panels packed stream by stream
    // (more than three strips in each half of the activations).
    let (n, k) = (70, 1088);
    let most = 260;
    let x: Vec<f32> = (0..most * k).map(|_| rng.next()).collect();
    let pow2 = |name: &str| !name.contains("not powers of two");
    for (name, w) in matrices(n, k, &mut rng) {
        if !pow2(&name) {
            continue;
        }
        for isa in families() {
            let mut solo = vec![0.0; most * n];
            for i in 0..most {
                let y = &mut solo[i * n..(i + 1) * n];
                matmuls_on(&mut [Matmul::new(&w, &x[i * k..(i + 1) * k], 1, y)], isa);
            }
            for m in [2, 3, 4, 5, 9, 15, 16, 17, 24, 33, 40, 260] {
                let mut y = vec![0.0; m * n];
                matmuls_on(&mut [Matmul::new(&w, &x[..m * k], m, &mut y)], isa);
                for (i, (got, want)) in y.chunks(n).zip(solo.chunks(n)).enumerate() {
                    let same = got
                        .iter()
                        .zip(want)
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same, "{name} {isa:?}: row {i} of a batch of {m}");
                }
            }
        }
    }
}

/// The AMX tiles, where the CPU has them (products whose activations are exact in bf16):
/// every FP8 layout with power-of-two scales and every FP4 one against the reference,
/// whole and for a range of rows, each row the same bits alone as in any batch; what the
/// tiles cannot run exactly (FP8 scales that are not powers of two) stays on the vector
/// kernels.
#[test]
fn amx_tiles_match_the_reference_and_keep_rows_independent() {
    fn exact<'a>(w: &'a QMatrix, x: &'a [f32], m: usize, y: &'a mut [f32]) -> Matmul<'a> {
        Matmul::new(w, x, m, y).with_inputs(Inputs::Bf16Exact)
    }
    if !crate::cpu::amx_detected() {
        eprintln!("this CPU has no AMX tiles: nothing to test");
        return;
    }
    let mut rng = Lcg(17);
    for (n, k) in [(70, 1024), (33, 256), (130, 2048)] {
        let most = 40;
        // Exact in bf16, as official numerics' FP8-rounded inputs are.
        let x: Vec<f32> = (0..most * k)
            .map(|_| crate::formats::bf16_to_f32(f32_to_bf16(rng.next() * 3.0)))
            .collect();
        for (name, w) in matrices(n, k, &mut rng) {
            let runs =
                name.starts_with("fp4") || name.contains("128x128") || name.contains("64x256");
            assert_eq!(
                on_amx(&exact(&w, &x[..k], 1, &mut [0.0; 0][..]), Isa::Avx512, true),
                runs,
                "{name}: AMX path"
            );
            if !runs {
                continue;
            }
            let mut solo = vec![0.0; most * n];
            for i in 0..most {
                let y = &mut solo[i * n..(i + 1) * n];
                matmuls_with(
                    &mut [exact(&w, &x[i * k..(i + 1) * k], 1, y)],
                    Isa::Avx512,
                    true,
                    false,
                );
            }
            for m in [1, 2, 5, 15, 16, 17, 31, 33, 40] {
                let mut y = vec![f32::NAN; m * n];
                matmuls_with(
                    &mut [exact(&w, &x[..m * k], m, &mut y)],
                    Isa::Avx512,
                    true,
                    false,
                );
                let (want, mag) = reference(&w, 0..n, &x[..m * k], m);
                check(&format!("{name} AMX m={m} n={n} k={k}"), &y, &want, &mag);
                for (i, (got, want)) in y.chunks(n).zip(solo.chunks(n)).enumerate() {
                    let same = got
                        .iter()
                        .zip(want)
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same, "{name} AMX: row {i} of a batch of {m}");
                }
            }
            let (rows, m) = (n / 3..n - 1, 17);
            let mut y = vec![f32::NAN; m * rows.len()];
            let mut ranged = exact(&w, &x[..m * k], m, &mut y);
            ranged.rows = rows.clone();
            matmuls_with(&mut [ranged], Isa::Avx512, true, false);
            let (want, mag) = reference(&w, rows.clone(), &x[..m * k], m);
            check(&format!("{name} AMX rows {rows:?}"), &y, &want, &mag);
        }
    }
}

/// The FP4 and BF16 kernels on bf16 dot products give the f32 kernels' bits (the same sums
/// in the same order), and so those of the GEMM path from 16 rows on, whatever the batch,
/// ragged and ranged rows; activations not fit for them (not exact in bf16, or tiny) take
/// the f32 kernels, fused at any batch size.
#[test]
fn bf16_dot_products_give_the_f32_kernels_bits() {
    if !crate::cpu::bf16_dots_detected() {
        eprintln!("this CPU has no AVX-512 BF16 and VBMI: nothing to test");
        return;
    }
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let mut rng = Lcg(23);
    for (n, k) in [(70, 1024), (33, 2176), (21, 1040), (130, 4096)] {
        // Exact in bf16, as official numerics' FP8-rounded inputs are.
        let mut x: Vec<f32> = (0..40 * k)
            .map(|_| crate::formats::bf16_to_f32(f32_to_bf16(rng.next() * 3.0)))
            .collect();
        for (name, w) in matrices(n, k, &mut rng) {
            let fp8 = name == "fp8 128x128" || name == "fp8 64x256";
            if !(name.starts_with("fp4") || name == "bf16" || fp8) {
                continue;
            }
            assert!(w.dots_ok, "{name}: weights in the dot-product range");
            // Past 15 rows against the GEMM path.
            for m in (1..=17).chain([40]) {
                fn exact<'a>(
                    w: &'a QMatrix,
                    x: &'a [f32],
                    m: usize,
                    y: &'a mut [f32],
                ) -> Matmul<'a> {
                    Matmul::new(w, x, m, y).with_inputs(Inputs::Bf16Exact)
                }
                let xm = &x[..m * k];
                let (mut dots, mut fmas) = (vec![f32::NAN; m * n], vec![f32::NAN; m * n]);
                assert!(
                    on_dots(&exact(&w, xm, m, &mut dots), Isa::Avx512, true),
                    "{name} m={m}"
                );
                let runs = || super::x86::FP8_DOTS_RUNS.load(std::sync::atomic::Ordering::Relaxed);
                let before = runs();
                matmuls_with(&mut [exact(&w, xm, m, &mut dots)], Isa::Avx512, false, true);
                // Other tests run beside this one, so only growth is telling. FP8 takes them
                // between 8 rows and the GEMM.
                let window = (super::FP8_DOTS_FROM..gemm_from(Isa::Avx512)).contains(&m);
                assert!(
                    !fp8 || !window || runs() > before,
                    "{name} m={m}: FP8 on the dots"
                );
                matmuls_with(
                    &mut [exact(&w, xm, m, &mut fmas)],
                    Isa::Avx512,
                    false,
                    false,
                );
                assert_eq!(bits(&dots), bits(&fmas), "{name} n={n} k={k} m={m}");
            }
            let (rows, m) = (n / 3..n - 1, 5);
            let (mut dots, mut fmas) = (vec![0.0; m * rows.len()], vec![0.0; m * rows.len()]);
            for (y, on) in [(&mut dots, true), (&mut fmas, false)] {
                let mut j = Matmul::new(&w, &x[..m * k], m, y).with_inputs(Inputs::Bf16Exact);
                j.rows = rows.clone();
                matmuls_with(&mut [j], Isa::Avx512, false, on);
            }
            assert_eq!(bits(&dots), bits(&fmas), "{name} rows {rows:?}");
        }
        // One activation off the bf16 grid, one too small: packing refuses, the f32 kernels
        // run, and the results stay the reference's.
        for bad in [1.0 + f32::EPSILON, 1e-30] {
            x[k + 3] = bad;
            let w = &matrices(n, k, &mut rng).pop().unwrap().1;
            for m in [2, 20] {
                let mut y = vec![f32::NAN; m * n];
                let j = Matmul::new(w, &x[..m * k], m, &mut y).with_inputs(Inputs::Bf16Exact);
                matmuls_with(&mut [j], Isa::Avx512, false, true);
                let (want, mag) = reference(w, 0..n, &x[..m * k], m);
                check(&format!("fp4 dots with {bad}, m={m}"), &y, &want, &mag);
            }
        }
    }
}

#[test]
fn products_dealt_by_node_give_the_one_node_bits() {
    use crate::numa::{plan, pool, topology};
    let node = |id: usize| topology::Node { id, cpus: vec![id] };
    let topo = topology::Topology {
        nodes: vec![node(0), node(1)],
    };
    let mut two = plan::Plan::new(&topo, Some(3), None, plan::Numa::Distribute, 3).unwrap();
    assert_eq!(two.shares.nodes(), 2);
    // Seated anywhere: the test machine's cores are not these.
    two.seats.iter_mut().for_each(|s| s.cpus.clear());
    let one = plan::Plan::new(&topo, Some(3), None, plan::Numa::Off, 3).unwrap();
    let run = |p: &plan::Plan, m: usize, mats: &[(String, QMatrix)], x: &[f32]| {
        // On a thread of its own: the pool takes its builder as worker 0 for good.
        std::thread::scope(|s| {
            s.spawn(|| {
                pool::build(p).unwrap().install(|| {
                    let mut ys: Vec<Vec<f32>> =
                        mats.iter().map(|_| vec![f32::NAN; m * 250]).collect();
                    let mut jobs: Vec<Matmul> = mats
                        .iter()
                        .zip(ys.iter_mut())
                        .map(|((_, w), y)| Matmul {
                            w,
                            rows: 100..350,
                            x,
                            m,
                            y,
                            inputs: Inputs::F32,
                        })
                        .collect();
                    matmuls(&mut jobs);
                    drop(jobs);
                    ys
                })
            })
            .join()
            .unwrap()
        })
    };
    let mut rng = Lcg(17);
    let k = 384;
    let mats = matrices(400, k, &mut rng);
    for m in [1, 4, 40] {
        let x: Vec<f32> = (0..m * k).map(|_| rng.next()).collect();
        let before = by_node::RUNS.load(std::sync::atomic::Ordering::Relaxed);
        let (a, b) = (run(&one, m, &mats, &x), run(&two, m, &mats, &x));
        assert!(by_node::RUNS.load(std::sync::atomic::Ordering::Relaxed) > before);
        for (((name, _), a), b) in mats.iter().zip(&a).zip(&b) {
            let same = a.iter().zip(b).all(|(p, q)| p.to_bits() == q.to_bits());
            assert!(same, "{name}, {m} rows: the two-node pass changed bits");
        }
    }
}

/// GGUF products on activations rounded to Q8_0 (llama.cpp's numerics) run the integer
/// kernels: the reference's values within rounding, each row the bits it gets alone, the
/// same bits on every family (they share one order of summation), and rows that are not on
/// the Q8_0 grid beside them take the f32 path without changing the others.
#[test]
fn ggml_products_on_q8_0_rows_are_exact_and_batch_invariant() {
    let mut rng = Lcg(47);
    let (n, k) = (37, 1024);
    let most = 260;
    let mut x: Vec<f32> = (0..most * k).map(|_| rng.next() * 2.0).collect();
    crate::ggml::q8::Q8Row::round_trip(&mut x);
    for (name, w) in ggml_matrices(n, k, &mut rng) {
        let (want, mag) = reference(&w, 0..n, &x, most);
        let mut first: Option<Vec<f32>> = None;
        for isa in families() {
            let mut solo = vec![0.0; most * n];
            for i in 0..most {
                let y = &mut solo[i * n..(i + 1) * n];
                matmuls_on(&mut [Matmul::new(&w, &x[i * k..(i + 1) * k], 1, y)], isa);
            }
            check(&format!("{name} {isa:?}"), &solo, &want, &mag);
            for m in [2, 3, 4, 5, 9, 40, 260] {
                let mut y = vec![0.0; m * n];
                matmuls_on(&mut [Matmul::new(&w, &x[..m * k], m, &mut y)], isa);
                let same = y.iter().zip(&solo).all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{name} {isa:?}: a batch of {m}");
            }
            // A row off the grid (reference numerics) between exact ones.
            let mut mixed = x[..3 * k].to_vec();
            mixed[k] += 1e-3;
            let mut y = vec![0.0; 3 * n];
            matmuls_on(&mut [Matmul::new(&w, &mixed, 3, &mut y)], isa);
            assert_eq!(
                y[..n],
                solo[..n],
                "{name} {isa:?}: row 0 beside an inexact row"
            );
            assert_eq!(y[2 * n..], solo[2 * n..3 * n], "{name} {isa:?}: row 2");
            let (want1, mag1) = reference(&w, 0..n, &mixed[k..2 * k], 1);
            check(
                &format!("{name} {isa:?} inexact row"),
                &y[n..2 * n],
                &want1,
                &mag1,
            );
            match &first {
                None => first = Some(solo),
                Some(f) => assert!(
                    f.iter().zip(&solo).all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{name}: {isa:?} differs from the first family"
                ),
            }
        }
    }
}

/// Told to quantise their input ([`Inputs::VecDot`]), GGUF products read it as llama.cpp's
/// do: rounded to their blocks' `vec_dot_type` (Q8_0 or Q8_K), each row alone. On every
/// family, a batch gives each row's bits alone and the values are the reference's on the
/// rounded input; the integer blocks give the same bits on every family, and on Q8_0 rows
/// the bits of a product handed the rounded input.
#[test]
fn ggml_products_quantise_their_own_input_when_told() {
    use crate::ggml::VecDot;
    let mut rng = Lcg(48);
    let (n, k, m) = (19, 512, 9);
    let x: Vec<f32> = (0..m * k).map(|_| rng.next() * 2.0).collect();
    for (name, w) in ggml_matrices(n, k, &mut rng) {
        let Format::Ggml(block) = w.format() else {
            unreachable!()
        };
        let mut rounded = x.clone();
        rounded
            .chunks_exact_mut(k)
            .for_each(|r| block.vec_dot().round_trip(r));
        assert_ne!(rounded, x, "{name}: the input is off the grid");
        let (want, mag) = reference(&w, 0..n, &rounded, m);
        let mut first: Option<Vec<f32>> = None;
        for isa in families() {
            let told = |x: &[f32], rows: usize, inputs: Inputs| {
                let mut y = vec![0.0; rows * n];
                let job = Matmul::new(&w, x, rows, &mut y).with_inputs(inputs);
                matmuls_on(&mut [job], isa);
                y
            };
            let batch = told(&x, m, Inputs::VecDot);
            check(&format!("{name} {isa:?}"), &batch, &want, &mag);
            for i in 0..m {
                let solo = told(&x[i * k..(i + 1) * k], 1, Inputs::VecDot);
                assert_eq!(solo, batch[i * n..(i + 1) * n], "{name} {isa:?}: row {i}");
            }
            if block.has_int_dots() && block.vec_dot() == VecDot::Q8_0 {
                let given = told(&rounded, m, Inputs::F32);
                assert_eq!(given, batch, "{name} {isa:?}: rounded by the caller");
            }
            // The integer products, and F16's fixed-order lanes, give every family's bits.
            if block.has_int_dots() || block == crate::ggml::Block::F16 {
                match &first {
                    None => first = Some(batch),
                    Some(f) => assert_eq!(f, &batch, "{name} {isa:?}: not the first family's"),
                }
            }
        }
    }
}

/// Products on GGUF blocks against llama.cpp's own (`ggml_vec_dot_<type>_<vec_dot_type>` on
/// the row `quantize_row_<vec_dot_type>` made, tools/make_ggml_block_fixtures.py), every
/// format on every family: within f32 rounding of their sum of magnitudes, plus for Q4_1
/// and Q5_1 what llama.cpp's f16 copy of each activation block's sum (`Q8_1`'s `s`) moves
/// the block's offset term by: at most 2^-11 of `|m · s|`.
#[test]
fn ggml_products_are_llama_cpp_s() {
    use crate::ggml::{Block, VecDot};
    let hex = |h: &str| -> Vec<u8> {
        (0..h.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&h[i..i + 2], 16).unwrap())
            .collect()
    };
    let words = |l: &str, tag: &str| -> Vec<f32> {
        l.strip_prefix(tag)
            .unwrap()
            .split_whitespace()
            .map(|w| f32::from_bits(u32::from_str_radix(w, 16).unwrap()))
            .collect()
    };
    let mut lines = include_str!("../ggml/blocks.txt").lines();
    let mut seen = std::collections::HashSet::new();
    while let Some(line) = lines.next() {
        let Some((name, w_hex)) = line.strip_prefix("dot ").and_then(|r| r.split_once(' ')) else {
            continue;
        };
        let block = Block::from_name(name).unwrap();
        let x = words(lines.next().unwrap(), "x ");
        let want = words(lines.next().unwrap(), "value ")[0];
        let k = x.len();
        let w = QMatrix::ggml_in(
            1,
            k,
            block,
            crate::buffer::WeightBytes::copy_from(&hex(w_hex)),
        );
        let w = w.unwrap();
        let mut rounded = x.clone();
        block.vec_dot().round_trip(&mut rounded);
        let (_, mag) = reference(&w, 0..1, &rounded, 1);
        let offsets: f64 = match block {
            Block::Q4_1 | Block::Q5_1 => hex(w_hex)
                .chunks_exact(block.bytes())
                .zip(rounded.chunks_exact(32))
                .map(|(b, xb)| {
                    let m = half::f16::from_le_bytes([b[2], b[3]]).to_f64();
                    (m * xb.iter().map(|&v| v as f64).sum::<f64>()).abs()
                })
                .sum(),
            _ => 0.0,
        };
        let bound = 1e-6 * mag[0] + offsets * 2f64.powi(-11);
        for isa in families() {
            let mut y = [0.0f32];
            let job = Matmul::new(&w, &x, 1, &mut y).with_inputs(Inputs::VecDot);
            matmuls_on(&mut [job], isa);
            let err = (y[0] - want).abs() as f64;
            assert!(
                err <= bound,
                "{name} {isa:?}: {} vs llama.cpp's {want} (|Δ| {err:e}, Σ|w·x| {:e})",
                y[0],
                mag[0]
            );
        }
        seen.insert(block);
    }
    assert_eq!(seen.len(), Block::ALL.len(), "a product of every format");
    assert_eq!(VecDot::Q8K.elems(), 256);
}
