use deepinfer_kernels::linear::matmul;
use deepinfer_kernels::matrix::QMatrix;
use std::time::Instant;
fn main() {
    let daz = std::env::args().nth(1).is_some();
    if daz {
        #[allow(deprecated)]
        unsafe {
            std::arch::x86_64::_mm_setcsr(std::arch::x86_64::_mm_getcsr() | 0x8040)
        };
    }
    let (rows, cols) = (64, 2048);
    let mut s = 1u64;
    let packed: Vec<u8> = (0..rows * cols / 2)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1);
            (s >> 56) as u8
        })
        .collect();
    let w4 = QMatrix::fp4(rows, cols, &packed, &vec![120u8; rows * cols / 32], 32).unwrap();
    let w8 = QMatrix::fp8(
        rows,
        cols,
        &[packed.clone(), packed.clone()].concat(),
        vec![0.01; 16],
        16,
        128,
        128,
    )
    .unwrap();
    let x = vec![0.5f32; cols];
    let mut y = vec![0.0f32; rows];
    for (name, w) in [("fp4", &w4), ("fp8", &w8)] {
        let n = 20000;
        let t = Instant::now();
        for _ in 0..n {
            matmul(w, &x, 1, &mut y);
        }
        let secs = t.elapsed().as_secs_f64();
        println!(
            "{name} daz={daz}: {:.2} G weights/s (1 thread, L2)",
            (rows * cols * n) as f64 / secs / 1e9
        );
    }
}
