//! Which instruction set the kernels run on, decided once per process at run time.
//!
//! Binaries are built for the baseline x86-64 (or any other) target so one build runs
//! everywhere; the fast kernels are compiled with `#[target_feature]` and chosen here.
//! `DEEPINFER_ISA=scalar|avx2` caps the choice, which is how benchmarks compare the
//! families and how a suspected SIMD bug is ruled out.

use std::sync::OnceLock;

/// The kernel family in use; each implies the ones before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Isa {
    /// Plain Rust, auto-vectorised for the build target only.
    Scalar,
    /// x86-64 with AVX2, FMA and F16C (Haswell, Zen and later).
    Avx2,
    /// AVX2 plus AVX-512 F, BW and VL (512-bit registers, 16-bit lane shifts, 32 registers
    /// for 256-bit work too): twice the work
    /// per instruction where the cores execute 512 bits at once (Zen 5, Intel server parts).
    Avx512,
}

impl Isa {
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2+fma",
            Isa::Avx512 => "avx512",
        }
    }

    /// Whether the 256-bit kernels may run (true for every family that implies AVX2).
    pub fn has_avx2(self) -> bool {
        self >= Isa::Avx2
    }
}

/// The best kernel family this CPU supports.
pub fn detected() -> Isa {
    #[cfg(target_arch = "x86_64")]
    {
        let avx2 = is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c");
        if avx2
            && is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vl")
        {
            return Isa::Avx512;
        }
        if avx2 {
            return Isa::Avx2;
        }
    }
    Isa::Scalar
}

/// The kernel family in use: [`detected`], capped by `DEEPINFER_ISA` if set.
pub fn isa() -> Isa {
    static ISA: OnceLock<Isa> = OnceLock::new();
    let family = *ISA.get_or_init(|| {
        let cap = match std::env::var("DEEPINFER_ISA").as_deref() {
            Ok("scalar") => Isa::Scalar,
            Ok("avx2") => Isa::Avx2,
            _ => Isa::Avx512,
        };
        detected().min(cap)
    });
    #[cfg(test)]
    if let Some(cap) = TEST_CAP.get() {
        return family.min(cap);
    }
    family
}

#[cfg(test)]
thread_local! {
    /// This thread's cap on [`isa`] while a test runs under [`with_isa`].
    static TEST_CAP: std::cell::Cell<Option<Isa>> = const { std::cell::Cell::new(None) };
}

/// Every kernel family this CPU can run.
#[cfg(test)]
pub(crate) fn families() -> Vec<Isa> {
    [Isa::Scalar, Isa::Avx2, Isa::Avx512]
        .into_iter()
        .filter(|&f| f <= detected())
        .collect()
}

/// Runs `f` with [`isa`] capped at `family` on this thread: how the tests run the
/// single-threaded kernels (attention, vector primitives) on every family the CPU has.
#[cfg(test)]
pub(crate) fn with_isa<R>(family: Isa, f: impl FnOnce() -> R) -> R {
    let before = TEST_CAP.replace(Some(family));
    let out = f();
    TEST_CAP.set(before);
    out
}
