//! This machine's roofs, measured: how fast memory streams into the cores (the decode roof:
//! at batch 1 every weight byte is read once per token) and how many f32 FMAs the cores
//! retire (the prefill roof). Benchmarks report their speed as a share of these.

use std::time::Instant;

/// Read bandwidth in GB/s (1e9 bytes/s): `threads` threads each sum their share of a
/// `bytes`-sized buffer (choose it well above the last-level cache), best of `reps` passes.
pub fn read_bandwidth(bytes: usize, threads: usize, reps: usize) -> f64 {
    let words = (bytes / 8).max(threads * 64);
    let buf: Vec<u64> = (0..words as u64).collect();
    let chunk = words.div_ceil(threads.max(1));
    let mut best = f64::INFINITY;
    let mut sink = 0u64;
    for _ in 0..reps.max(1) {
        let t = Instant::now();
        let sums: Vec<u64> = std::thread::scope(|s| {
            let handles: Vec<_> = buf
                .chunks(chunk)
                .map(|part| s.spawn(move || sum_words(part)))
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("reader"))
                .collect()
        });
        best = best.min(t.elapsed().as_secs_f64());
        sink = sums.iter().fold(sink, |a, &b| a.wrapping_add(b));
    }
    std::hint::black_box(sink);
    (words * 8) as f64 / best / 1e9
}

/// Sums words with two independent streams (the two halves), which is what keeps a Zen 2
/// core's loads in flight; integer adds let the compiler vectorise without reassociation
/// concerns.
fn sum_words(part: &[u64]) -> u64 {
    let (a, b) = part.split_at(part.len() / 2);
    // `b` is as long as `a` or one longer; both are walked in step up to `k`.
    let k = a.len() / 4 * 4;
    let mut acc = [0u64; 8];
    for (ca, cb) in a[..k].chunks_exact(4).zip(b[..k].chunks_exact(4)) {
        for i in 0..4 {
            acc[i] = acc[i].wrapping_add(ca[i]);
            acc[4 + i] = acc[4 + i].wrapping_add(cb[i]);
        }
    }
    let tail = a[k..]
        .iter()
        .chain(&b[k..])
        .fold(0u64, |x, &y| x.wrapping_add(y));
    acc.iter().fold(tail, |x, &y| x.wrapping_add(y))
}

/// f32 FMA throughput in GFLOP/s (2 flops per FMA lane) with `threads` threads, best of
/// `reps` runs of about 50 ms each, at the width of the kernel family in use
/// ([`crate::cpu::isa`]: 512-bit with AVX-512, 256-bit with AVX2, else a scalar loop — a
/// much lower roof, honestly reported), so kernels are always measured against the peak of
/// the instructions they use.
pub fn fma_peak(threads: usize, reps: usize) -> f64 {
    const ITERS: u64 = 20_000_000;
    let mut best = f64::INFINITY;
    let mut flops = 0.0;
    for _ in 0..reps.max(1) {
        let t = Instant::now();
        let per_thread: Vec<f64> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..threads.max(1))
                .map(|_| s.spawn(|| fma_loop(ITERS)))
                .collect();
            hs.into_iter().map(|h| h.join().expect("fma")).collect()
        });
        best = best.min(t.elapsed().as_secs_f64());
        flops = per_thread.iter().sum();
    }
    flops / best / 1e9
}

/// Runs `iters` rounds of independent FMA chains; returns the flops done.
fn fma_loop(iters: u64) -> f64 {
    #[cfg(target_arch = "x86_64")]
    {
        use crate::cpu::{isa, Isa};
        match isa() {
            // SAFETY: `isa()` only reports a family the CPU supports.
            Isa::Avx512 => return unsafe { fma_loop_avx512(iters / 2) },
            // SAFETY: as above.
            Isa::Avx2 => return unsafe { fma_loop_avx2(iters) },
            Isa::Scalar => {}
        }
    }
    fma_loop_scalar(iters / 16)
}

fn fma_loop_scalar(iters: u64) -> f64 {
    let mut acc = [1.0f32; 8];
    let (a, b) = (
        std::hint::black_box(0.999_999f32),
        std::hint::black_box(1e-7f32),
    );
    for _ in 0..iters {
        for x in &mut acc {
            *x = x.mul_add(a, b);
        }
    }
    std::hint::black_box(acc);
    (iters * 8 * 2) as f64
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn fma_loop_avx2(iters: u64) -> f64 {
    use std::arch::x86_64::*;
    // 12 independent chains cover the FMA latency (4-5 cycles) on two pipes.
    let a = _mm256_set1_ps(std::hint::black_box(0.999_999));
    let b = _mm256_set1_ps(std::hint::black_box(1e-7));
    let mut acc = [_mm256_set1_ps(1.0); 12];
    for _ in 0..iters {
        for x in &mut acc {
            *x = _mm256_fmadd_ps(*x, a, b);
        }
    }
    let mut total = _mm256_setzero_ps();
    for x in acc {
        total = _mm256_add_ps(total, x);
    }
    std::hint::black_box(total);
    (iters * 12 * 8 * 2) as f64
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn fma_loop_avx512(iters: u64) -> f64 {
    use std::arch::x86_64::*;
    let a = _mm512_set1_ps(std::hint::black_box(0.999_999));
    let b = _mm512_set1_ps(std::hint::black_box(1e-7));
    let mut acc = [_mm512_set1_ps(1.0); 12];
    for _ in 0..iters {
        for x in &mut acc {
            *x = _mm512_fmadd_ps(*x, a, b);
        }
    }
    let mut total = _mm512_setzero_ps();
    for x in acc {
        total = _mm512_add_ps(total, x);
    }
    std::hint::black_box(total);
    (iters * 12 * 16 * 2) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_every_word() {
        for n in [0usize, 1, 7, 8, 9, 63, 64, 1001] {
            let v: Vec<u64> = (1..=n as u64).collect();
            assert_eq!(sum_words(&v), v.iter().sum::<u64>(), "n={n}");
        }
    }

    #[test]
    fn measures_positive_finite_roofs() {
        let bw = read_bandwidth(1 << 20, 2, 1);
        assert!(bw.is_finite() && bw > 0.0);
        let f = fma_peak(1, 1);
        assert!(f.is_finite() && f > 0.0);
    }
}
