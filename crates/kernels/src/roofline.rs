//! This machine's roofs, measured: how fast memory streams into the cores (the decode roof:
//! at batch 1 every weight byte is read once per token) and how many f32 FMAs the cores
//! retire (the prefill roof). Benchmarks report their speed as a share of these.

use std::time::Instant;

/// `f` as probe thread `i` runs it: seated where compute thread `i` sits (a probe spawned
/// from a pinned thread would otherwise inherit that one thread's cores).
fn seated<R>(i: usize, f: impl FnOnce() -> R) -> impl FnOnce() -> R {
    move || {
        crate::numa::pool::sit_as(i);
        f()
    }
}

/// Read bandwidth in GB/s (1e9 bytes/s): `threads` threads each stream their share of a
/// `bytes`-sized buffer (choose it well above the last-level cache), best of `reps` passes.
///
/// A roof must be the most this machine gives, or every percentage measured against it
/// flatters: the buffer sits on transparent huge pages, as the weights do, and each pass
/// reads it with the widest vector loads the CPU has, once as one plain stream per thread
/// and once with software prefetch into L2 ahead of it (which of the two the memory system
/// rewards varies between machines and from minute to minute on a shared one); the faster
/// counts.
pub fn read_bandwidth(bytes: usize, threads: usize, reps: usize) -> f64 {
    let threads = threads.max(1);
    let len = bytes.max(threads * 4096).next_multiple_of(threads * 4096);
    let Some(mut buf) = HugeBuf::new(len) else {
        return 0.0;
    };
    for (i, b) in buf.as_mut().iter_mut().enumerate() {
        *b = i as u8;
    }
    let buf = buf.as_ref();
    let chunk = len / threads;
    let mut best = f64::INFINITY;
    let mut sink = 0u64;
    for _ in 0..reps.max(1) {
        for prefetch in [false, true] {
            let t = Instant::now();
            let sums: Vec<u64> = std::thread::scope(|s| {
                let handles: Vec<_> = buf
                    .chunks(chunk)
                    .enumerate()
                    .map(|(i, part)| s.spawn(seated(i, move || sum_bytes(part, prefetch))))
                    .collect();
                handles
                    .into_iter()
                    .map(|h| h.join().expect("reader"))
                    .collect()
            });
            best = best.min(t.elapsed().as_secs_f64());
            sink = sums.iter().fold(sink, |a, &b| a.wrapping_add(b));
        }
    }
    std::hint::black_box(sink);
    len as f64 / best / 1e9
}

/// An anonymous mapping on transparent huge pages, 2 MiB aligned.
struct HugeBuf {
    map: memmap2::MmapMut,
    offset: usize,
    len: usize,
}

impl HugeBuf {
    fn new(len: usize) -> Option<Self> {
        const HUGE: usize = 2 << 20;
        let mut map = memmap2::MmapOptions::new()
            .len(len + HUGE)
            .map_anon()
            .ok()?;
        let addr = map.as_mut_ptr() as usize;
        let offset = addr.next_multiple_of(HUGE) - addr;
        #[cfg(target_os = "linux")]
        {
            // Advice only: without THP the buffer still works, with 4 KiB pages.
            let _ = map.advise_range(memmap2::Advice::HugePage, offset, len);
        }
        Some(Self { map, offset, len })
    }

    fn as_mut(&mut self) -> &mut [u8] {
        &mut self.map[self.offset..self.offset + self.len]
    }

    fn as_ref(&self) -> &[u8] {
        &self.map[self.offset..self.offset + self.len]
    }
}

/// Sums `part` (a multiple of 4 KiB) as 64-bit words with the widest loads the CPU has,
/// prefetching into L2 ahead of the loads if asked.
fn sum_bytes(part: &[u8], prefetch: bool) -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        use crate::cpu::{isa, Isa};
        match isa() {
            // SAFETY: `isa()` only reports a family the CPU supports.
            Isa::Avx512 => return unsafe { sum_avx512(part, prefetch) },
            // SAFETY: as above.
            Isa::Avx2 => return unsafe { sum_avx2(part, prefetch) },
            Isa::Scalar => {}
        }
    }
    let _ = prefetch;
    sum_words(part)
}

/// Bytes ahead of the loads that the prefetching pass asks for: the weight streams' own.
#[cfg(target_arch = "x86_64")]
use crate::linear::PREFETCH;

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn sum_avx512(part: &[u8], prefetch: bool) -> u64 {
    use std::arch::x86_64::*;
    let mut acc = [_mm512_setzero_si512(); 4];
    let p = part.as_ptr();
    for i in (0..part.len() / 256).map(|i| i * 256) {
        if prefetch {
            for l in 0..4 {
                _mm_prefetch(p.wrapping_add(i + PREFETCH + 64 * l).cast(), _MM_HINT_T2);
            }
        }
        for (l, a) in acc.iter_mut().enumerate() {
            // SAFETY: i + 256 <= part.len().
            *a = _mm512_add_epi64(*a, unsafe { _mm512_loadu_si512(p.add(i + 64 * l).cast()) });
        }
    }
    let s = _mm512_add_epi64(
        _mm512_add_epi64(acc[0], acc[1]),
        _mm512_add_epi64(acc[2], acc[3]),
    );
    _mm512_reduce_add_epi64(s) as u64
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn sum_avx2(part: &[u8], prefetch: bool) -> u64 {
    use std::arch::x86_64::*;
    let mut acc = [_mm256_setzero_si256(); 4];
    let p = part.as_ptr();
    for i in (0..part.len() / 128).map(|i| i * 128) {
        if prefetch {
            for l in 0..2 {
                _mm_prefetch(p.wrapping_add(i + PREFETCH + 64 * l).cast(), _MM_HINT_T2);
            }
        }
        for (l, a) in acc.iter_mut().enumerate() {
            // SAFETY: i + 128 <= part.len().
            *a = _mm256_add_epi64(*a, unsafe { _mm256_loadu_si256(p.add(i + 32 * l).cast()) });
        }
    }
    let s = _mm256_add_epi64(
        _mm256_add_epi64(acc[0], acc[1]),
        _mm256_add_epi64(acc[2], acc[3]),
    );
    let mut lanes = [0u64; 4];
    // SAFETY: `lanes` holds 32 bytes.
    unsafe { _mm256_storeu_si256(lanes.as_mut_ptr().cast(), s) };
    lanes.iter().fold(0u64, |a, &b| a.wrapping_add(b))
}

/// The portable pass: 64-bit words in two independent streams (the two halves).
fn sum_words(part: &[u8]) -> u64 {
    let (a, b) = part.split_at(part.len() / 2);
    let k = a.len() / 32 * 32;
    let mut acc = [0u64; 8];
    for (ca, cb) in a[..k].chunks_exact(32).zip(b[..k].chunks_exact(32)) {
        for i in 0..4 {
            let w = |c: &[u8]| u64::from_le_bytes(c[8 * i..8 * i + 8].try_into().expect("8 bytes"));
            acc[i] = acc[i].wrapping_add(w(ca));
            acc[4 + i] = acc[4 + i].wrapping_add(w(cb));
        }
    }
    let tail = a[k..]
        .iter()
        .chain(&b[k..])
        .fold(0u64, |x, &y| x.wrapping_add(y as u64));
    acc.iter().fold(tail, |x, &y| x.wrapping_add(y))
}

/// f32 FMA throughput in GFLOP/s (2 flops per FMA lane) with `threads` threads, best of
/// `reps` runs of about 50 ms each, at the width of the kernel family in use
/// ([`crate::cpu::isa`]: 512-bit with AVX-512, 256-bit with AVX2, else a scalar loop — a
/// much lower roof, honestly reported), so kernels are always measured against the peak of
/// the instructions they use.
pub fn fma_peak(threads: usize, reps: usize) -> f64 {
    best_rate(threads, reps, || fma_loop(20_000_000))
}

/// GFLOP/s of `work` (which returns the flops it did) on `threads` threads at once, best of
/// `reps` runs.
fn best_rate(threads: usize, reps: usize, work: impl Fn() -> f64 + Sync) -> f64 {
    let mut best = f64::INFINITY;
    let mut flops = 0.0;
    for _ in 0..reps.max(1) {
        let t = Instant::now();
        let work = &work;
        let per_thread: Vec<f64> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..threads.max(1))
                .map(|i| s.spawn(seated(i, work)))
                .collect();
            hs.into_iter().map(|h| h.join().expect("peak")).collect()
        });
        best = best.min(t.elapsed().as_secs_f64());
        flops = per_thread.iter().sum();
    }
    flops / best / 1e9
}

/// Throughput of AVX-512 BF16's `vdpbf16ps` (512-bit) in GFLOP/s (4 flops per lane: two
/// products and their sums), measured as [`fma_peak`] is, or `None` where the CPU lacks it.
/// It says on this machine whether kernels multiplying bf16 pairs could beat the f32 FMA
/// ones: the instruction does twice the products of an FMA, but its issue rate varies by
/// core (a quarter of the FMA's on the Intel Xeon of PERFORMANCE.md's official-numerics
/// section, so half the flops).
pub fn bf16_dot_peak(threads: usize, reps: usize) -> Option<f64> {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512bf16") {
        // SAFETY: the CPU has AVX-512 BF16 (checked above).
        return Some(best_rate(threads, reps, || unsafe {
            bf16_dot_loop(10_000_000)
        }));
    }
    let _ = (threads, reps);
    None
}

/// How many times the flops of a 512-bit f32 FMA one `vdpbf16ps` does on this core, on the
/// calling thread, best of three short runs (about 10 ms in all); 0 where the CPU lacks
/// AVX-512 BF16. [`crate::cpu::bf16_dot_gain`] keeps the process's one reading.
pub fn bf16_dot_gain() -> f64 {
    #[cfg(target_arch = "x86_64")]
    if crate::cpu::bf16_dots_detected() {
        let rate = |f: &dyn Fn() -> f64| {
            (0..3)
                .map(|_| {
                    let t = Instant::now();
                    f() / t.elapsed().as_secs_f64()
                })
                .fold(0.0, f64::max)
        };
        // SAFETY (both): the CPU has AVX-512 F and BF16 (checked above).
        let dots = rate(&|| unsafe { bf16_dot_loop(200_000) });
        let fmas = rate(&|| unsafe { fma_loop_avx512(200_000) });
        return dots / fmas;
    }
    0.0
}

/// The AMX-BF16 tiles' rates where the process may use them ([`crate::cpu::amx_detected`]),
/// else `None`: GFLOP/s of `tdpbf16ps` on independent sums and GB/s of tile loads from L1,
/// each summed over `threads` threads running at once, best of `reps`. The first is the
/// tiles' compute roof; the second bounds a product that loads every weight into a tile,
/// as the AMX path does at small batches.
pub fn amx_rates(threads: usize, reps: usize) -> Option<(f64, f64)> {
    #[cfg(target_arch = "x86_64")]
    if crate::cpu::amx_detected() {
        let mut best = (0.0f64, 0.0f64);
        for _ in 0..reps.max(1) {
            let per_thread: Vec<_> = std::thread::scope(|s| {
                let hs: Vec<_> = (0..threads.max(1))
                    // SAFETY: the process may use AMX (checked above).
                    .map(|i| s.spawn(seated(i, || unsafe { crate::linear::amx_probe(200_000) })))
                    .collect();
                hs.into_iter().map(|h| h.join().expect("amx")).collect()
            });
            let compute: f64 = per_thread.iter().map(|&((f, s), _)| f / s).sum();
            let loads: f64 = per_thread.iter().map(|&(_, (b, s))| b / s).sum();
            best = (best.0.max(compute / 1e9), best.1.max(loads / 1e9));
        }
        return Some(best);
    }
    let _ = (threads, reps);
    None
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn bf16_dot_loop(iters: u64) -> f64 {
    use std::arch::x86_64::*;
    // Normal bf16 values (a denormal operand is flushed, never slow, but keep it honest).
    let pair = |bits: u32| -> __m512bh {
        // SAFETY: a vector of 32 bf16 values is a vector of 16 u32 pairs.
        unsafe { std::mem::transmute(_mm512_set1_epi32(std::hint::black_box(bits) as i32)) }
    };
    let (a, b) = (pair(0x3F80_3F80), pair(0x2F80_2F80));
    // 24 chains: more than latency × issue rate on any core we know.
    let mut acc = [_mm512_setzero_ps(); 24];
    for _ in 0..iters {
        for x in &mut acc {
            *x = _mm512_dpbf16_ps(*x, a, b);
        }
    }
    let mut total = _mm512_setzero_ps();
    for x in acc {
        total = _mm512_add_ps(total, x);
    }
    std::hint::black_box(total);
    (iters * 24 * 16 * 4) as f64
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
    fn every_pass_sums_the_same_words() {
        let v: Vec<u8> = (0..8192u32).map(|i| (i * 7 % 251) as u8).collect();
        let words: u64 = v
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
            .fold(0, u64::wrapping_add);
        assert_eq!(sum_words(&v), words);
        for prefetch in [false, true] {
            assert_eq!(sum_bytes(&v, prefetch), words, "prefetch {prefetch}");
        }
    }

    #[test]
    fn measures_positive_finite_roofs() {
        let bw = read_bandwidth(1 << 20, 2, 1);
        assert!(bw.is_finite() && bw > 0.0);
        let f = fma_peak(1, 1);
        if let Some((f, b)) = amx_rates(1, 1) {
            assert!(
                f > 0.0 && b > 0.0 && f.is_finite() && b.is_finite(),
                "amx {f} {b}"
            );
        }
        if let Some(b) = bf16_dot_peak(1, 1) {
            assert!(b.is_finite() && b > 0.0, "bf16 dot peak {b}");
        }
        assert!(f.is_finite() && f > 0.0);
    }
}
