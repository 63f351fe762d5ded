//! Owned weight bytes, placed where decode reads them fastest.
//!
//! Weights are copied once at load out of the checkpoint's page-cache mapping (always 4 KiB
//! pages) into anonymous memory aligned to 2 MiB and advised as transparent huge pages: a
//! matrix-vector product streams every byte once per token, and fewer TLB misses measurably
//! raise the read bandwidth one core reaches. The bytes are the stored format, unchanged.

use memmap2::{MmapMut, MmapOptions};

/// Below this a heap allocation is used: huge pages only pay for big matrices.
const HUGE_MIN: usize = 4 << 20;
const HUGE_ALIGN: usize = 2 << 20;

enum Store {
    /// 8-byte aligned, so `u16`/`f32` views are always valid.
    Heap(Vec<u64>),
    /// `offset` is where the 2 MiB-aligned region starts inside the mapping.
    Mapped { map: MmapMut, offset: usize },
}

/// A read-only byte buffer (after construction) with `u16` and `f32` views.
pub struct WeightBytes {
    store: Store,
    len: usize,
}

impl std::fmt::Debug for WeightBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self.store {
            Store::Heap(_) => "heap",
            Store::Mapped { .. } => "huge-page mapping",
        };
        write!(f, "WeightBytes({} bytes, {kind})", self.len)
    }
}

impl WeightBytes {
    /// A zeroed buffer of `len` bytes.
    pub fn zeroed(len: usize) -> Self {
        if len >= HUGE_MIN {
            if let Ok(mut map) = MmapOptions::new().len(len + HUGE_ALIGN).map_anon() {
                let addr = map.as_mut_ptr() as usize;
                let offset = addr.next_multiple_of(HUGE_ALIGN) - addr;
                #[cfg(target_os = "linux")]
                {
                    // Advice only: without THP the buffer still works, with 4 KiB pages.
                    let _ = map.advise_range(memmap2::Advice::HugePage, offset, len);
                }
                return Self {
                    store: Store::Mapped { map, offset },
                    len,
                };
            }
        }
        Self {
            store: Store::Heap(vec![0u64; len.div_ceil(8)]),
            len,
        }
    }

    pub fn copy_from(bytes: &[u8]) -> Self {
        let mut b = Self::zeroed(bytes.len());
        b.as_mut_bytes().copy_from_slice(bytes);
        b
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn as_bytes(&self) -> &[u8] {
        match &self.store {
            Store::Heap(v) => &bytemuck::cast_slice(v)[..self.len],
            Store::Mapped { map, offset } => &map[*offset..*offset + self.len],
        }
    }

    pub fn as_mut_bytes(&mut self) -> &mut [u8] {
        match &mut self.store {
            Store::Heap(v) => &mut bytemuck::cast_slice_mut(v)[..self.len],
            Store::Mapped { map, offset } => &mut map[*offset..*offset + self.len],
        }
    }

    /// The bytes as little-endian `u16`s (BF16 weights). Panics if the length is odd.
    pub fn as_u16(&self) -> &[u16] {
        bytemuck::cast_slice(self.as_bytes())
    }

    /// The bytes as `f32`s. Panics if the length is not a multiple of 4.
    pub fn as_f32(&self) -> &[f32] {
        bytemuck::cast_slice(self.as_bytes())
    }

    pub fn as_mut_f32(&mut self) -> &mut [f32] {
        bytemuck::cast_slice_mut(self.as_mut_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_and_huge_buffers_hold_their_bytes() {
        for len in [0usize, 3, 64, HUGE_MIN + 12] {
            let src: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
            let b = WeightBytes::copy_from(&src);
            assert_eq!(b.as_bytes(), &src[..]);
            assert_eq!(b.len(), len);
            if len >= HUGE_MIN {
                assert_eq!(b.as_bytes().as_ptr() as usize % HUGE_ALIGN, 0);
            }
        }
        let mut f = WeightBytes::zeroed(16);
        f.as_mut_f32().copy_from_slice(&[1.0, 2.0, 3.0, 4.0]);
        assert_eq!(f.as_f32(), &[1.0, 2.0, 3.0, 4.0]);
    }
}
