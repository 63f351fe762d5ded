//! A growable `f32` buffer that starts on a cache line.
//!
//! The kernels load activations 64 bytes at a time; from a buffer that only has `f32`'s
//! alignment, most of those loads straddle two cache lines and cost two. Offsets that are
//! multiples of 16 floats into this buffer stay aligned.

use std::ops::{Deref, DerefMut};

/// One cache line of floats: the buffer's unit of growth and alignment.
#[derive(Clone, Copy, Default)]
#[repr(C, align(64))]
struct Line([f32; 16]);

#[derive(Default)]
pub(crate) struct AlignedVec {
    lines: Vec<Line>,
}

impl AlignedVec {
    pub const fn new() -> Self {
        Self { lines: Vec::new() }
    }

    /// Grows to at least `len` floats (never shrinks); new floats are zero.
    pub fn grow(&mut self, len: usize) {
        if self.len() < len {
            self.lines.resize(len.div_ceil(16), Line::default());
        }
    }
}

impl Deref for AlignedVec {
    type Target = [f32];

    fn deref(&self) -> &[f32] {
        // SAFETY: `Line` is `repr(C)` over 16 floats with no padding, so the lines are
        // `16 · len` initialised floats in a row.
        unsafe { std::slice::from_raw_parts(self.lines.as_ptr().cast(), self.lines.len() * 16) }
    }
}

impl DerefMut for AlignedVec {
    fn deref_mut(&mut self) -> &mut [f32] {
        // SAFETY: as in `deref`, and the borrow is unique.
        unsafe {
            std::slice::from_raw_parts_mut(self.lines.as_mut_ptr().cast(), self.lines.len() * 16)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_zeroed_and_aligned() {
        let mut v = AlignedVec::new();
        assert!(v.is_empty());
        v.grow(20);
        assert_eq!(v.len(), 32);
        assert_eq!(v.as_ptr() as usize % 64, 0);
        v[31] = 1.0;
        v.grow(40);
        assert_eq!(v.len(), 48);
        assert_eq!((v[31], v[40]), (1.0, 0.0));
        v.grow(8);
        assert_eq!(v.len(), 48, "never shrinks");
    }
}
