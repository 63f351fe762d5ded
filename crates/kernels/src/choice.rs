//! Which instruction the products use on this CPU where detection alone cannot say: chosen by
//! measuring it ([`crate::roofline`]) against the f32 FMAs, once per process.

use crate::cpu::bf16_dots_detected;
use std::sync::OnceLock;

/// Whether the fused FP4 kernels multiply bf16 pairs (`vdpbf16ps`) where the activations
/// are exact in bf16 (official numerics' expert inputs): the AVX-512 family is in use with
/// AVX-512 BF16 and VBMI, `DEEPINFER_ISA` names no family (`avx512` keeps the f32 FMAs), and
/// on this core the instruction does at least 1.5 times the flops of an f32 FMA, measured
/// once on one thread (about 10 ms): twice on Zen 4, under half on the Intel Xeon of
/// PERFORMANCE.md. Results are the same bits either way (`linear::x86::avx512::Fp4Dots`).
pub fn bf16_dots() -> bool {
    static DOTS: OnceLock<bool> = OnceLock::new();
    *DOTS.get_or_init(|| {
        let named = matches!(
            std::env::var("DEEPINFER_ISA").as_deref(),
            Ok("scalar" | "avx2" | "avx512")
        );
        !named && bf16_dots_detected() && bf16_dot_gain() >= 1.5
    })
}

/// What [`bf16_dots`] decides by: how many times an f32 FMA's flops `vdpbf16ps` does on
/// this core ([`crate::roofline::bf16_dot_gain`]), measured once per process, so that what
/// a benchmark prints is the figure the kernels were chosen by.
pub fn bf16_dot_gain() -> f64 {
    static GAIN: OnceLock<f64> = OnceLock::new();
    *GAIN.get_or_init(crate::roofline::bf16_dot_gain)
}
