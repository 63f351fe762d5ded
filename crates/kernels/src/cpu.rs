//! Which instruction set the kernels run on, decided once per process at run time.
//!
//! Binaries are built for the baseline x86-64 (or any other) target so one build runs
//! everywhere; the fast kernels are compiled with `#[target_feature]` and chosen here.
//! `DEEPINFER_ISA=scalar` forces the portable path, which is how benchmarks compare the
//! two and how a suspected SIMD bug is ruled out.

use std::sync::OnceLock;

/// The kernel family in use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    /// Plain Rust, auto-vectorised for the build target only.
    Scalar,
    /// x86-64 with AVX2, FMA and F16C.
    Avx2,
}

impl Isa {
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2+fma",
        }
    }
}

/// The best kernel family this CPU supports (AVX2 needs AVX2, FMA and F16C).
pub fn detected() -> Isa {
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
        {
            return Isa::Avx2;
        }
    }
    Isa::Scalar
}

/// The kernel family in use: [`detected`] unless `DEEPINFER_ISA=scalar`.
pub fn isa() -> Isa {
    static ISA: OnceLock<Isa> = OnceLock::new();
    *ISA.get_or_init(|| match std::env::var("DEEPINFER_ISA").as_deref() {
        Ok("scalar") => Isa::Scalar,
        _ => detected(),
    })
}
