//! Which instruction set the kernels run on, decided once per process at run time.
//!
//! Binaries are built for the baseline x86-64 (or any other) target so one build runs
//! everywhere; the fast kernels are compiled with `#[target_feature]` and chosen here.
//! `DEEPINFER_ISA=scalar|avx2` caps the choice, which is how benchmarks compare the families
//! and how a suspected SIMD bug is ruled out; `DEEPINFER_ISA=amx` adds the AMX-BF16 tiles
//! to AVX-512 for the products whose activations are exact in bf16 (official numerics),
//! which prefill faster and decode small batches slower (PERFORMANCE.md), hence a choice.

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

/// Whether the AMX-BF16 tiles run (the products whose activations are exact in bf16 use
/// them, beside the AVX-512 family): `DEEPINFER_ISA=amx` asks for them and
/// [`amx_detected`].
pub fn amx() -> bool {
    static AMX: OnceLock<bool> = OnceLock::new();
    *AMX.get_or_init(|| std::env::var("DEEPINFER_ISA").as_deref() == Ok("amx") && amx_detected())
}

/// Whether this process can run AMX-BF16: the CPU has it, the OS saves the tile state
/// (XCR0 bits 17–18) and Linux granted this process the tile data (`arch_prctl`).
#[cfg(target_arch = "x86_64")]
pub fn amx_detected() -> bool {
    static DETECTED: OnceLock<bool> = OnceLock::new();
    *DETECTED.get_or_init(amx_probe)
}

#[cfg(target_arch = "x86_64")]
fn amx_probe() -> bool {
    use std::arch::x86_64::{__cpuid_count, _xgetbv};
    let (leaf1, leaf7) = (__cpuid_count(1, 0), __cpuid_count(7, 0));
    let osxsave = leaf1.ecx & (1 << 27) != 0;
    let (bf16, tile) = (leaf7.edx & (1 << 22) != 0, leaf7.edx & (1 << 24) != 0);
    if !(osxsave && bf16 && tile) || detected() < Isa::Avx512 {
        return false;
    }
    // SAFETY: XGETBV with ECX = 0 is valid once the OS has set OSXSAVE.
    if unsafe { _xgetbv(0) } & (0b11 << 17) != 0b11 << 17 {
        return false;
    }
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: a system call with integer arguments only.
    unsafe {
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA,
        ) == 0
    }
}

#[cfg(not(target_arch = "x86_64"))]
pub fn amx_detected() -> bool {
    false
}

/// Whether the CPU can run the bf16 dot-product kernels (beside the AVX-512 family).
pub fn bf16_dots_detected() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        detected() == Isa::Avx512
            && is_x86_feature_detected!("avx512bf16")
            && is_x86_feature_detected!("avx512vbmi")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Whether the CPU can run the AVX-512 VNNI kernels (beside the AVX-512 family): the
/// K-quant GEMM's `vpdpwssd` ([`crate::ggml::kgemm::sb4_avx512`]).
pub fn vnni_detected() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        detected() == Isa::Avx512 && is_x86_feature_detected!("avx512vnni")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// The first core's L1 data cache, in bytes, from sysfs (`None` where it cannot be read).
pub fn l1d_bytes() -> Option<usize> {
    let dir = std::path::Path::new("/sys/devices/system/cpu/cpu0/cache");
    (0..8).find_map(|i| {
        let read = |f: &str| std::fs::read_to_string(dir.join(format!("index{i}/{f}"))).ok();
        if read("level")?.trim() != "1" || read("type")?.trim() != "Data" {
            return None;
        }
        let size = read("size")?;
        let kib: usize = size.trim().strip_suffix('K')?.parse().ok()?;
        Some(kib << 10)
    })
}

/// The kernels that compute this process's products, as a name: the family ([`isa`]) and
/// whether the AMX tiles join it ([`amx`]). Families agree within the tolerance the kernel
/// tests state, not bit for bit (each sums in the order its registers pay for), so what one
/// computed is not another's bits: the disk prefix cache keeps them apart by this name.
/// (`vdpbf16ps` where chosen gives the f32 FMAs' bits, so it is no part of it.)
pub fn family() -> &'static str {
    match (isa(), amx()) {
        (Isa::Avx512, true) => "avx512+amx",
        (family, _) => family.name(),
    }
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
