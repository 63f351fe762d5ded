//! Owned weight bytes, placed where decode reads them fastest.
//!
//! Weights are copied once at load out of the checkpoint's page-cache mapping (always 4 KiB
//! pages) into anonymous memory aligned to 2 MiB and advised as transparent huge pages: a
//! matrix-vector product streams every byte once per token, and TLB misses measurably lower
//! the read bandwidth a core reaches (twice the speed for the FP4 experts of the bench
//! preset, whose matrices are under 1 MiB each). Matrices are packed back to back into
//! shared 64 MiB arenas, so small ones share huge pages instead of each wasting most of one.
//! The bytes are the stored format, unchanged.

use memmap2::{MmapMut, MmapOptions};
use std::sync::{Arc, Mutex, Weak};

/// Below this a plain heap allocation is used (norm gains, scales, tiny test matrices).
const ARENA_MIN: usize = 64 << 10;
/// Arena size; larger requests get an arena of their own.
const ARENA_BYTES: usize = 64 << 20;
const HUGE_ALIGN: usize = 2 << 20;
/// Start of every buffer inside an arena (a cache line).
const ALIGN: usize = 64;

/// One 2 MiB-aligned anonymous mapping, filled front to back.
struct Arena {
    _map: MmapMut,
    base: *mut u8,
    cap: usize,
    /// The node (an index into the installed plan's shares) whose memory holds the whole
    /// arena; `None` when the arena is one buffer split over the nodes by rows, or there is
    /// one node.
    home: Option<usize>,
}

// SAFETY: the mapping lives as long as the arena; every byte range is handed out once and
// written only before its `WeightBytes` exists, after which it is read-only.
unsafe impl Send for Arena {}
unsafe impl Sync for Arena {}

impl Arena {
    fn new(cap: usize, home: Option<usize>) -> Option<Self> {
        let mut map = MmapOptions::new().len(cap + HUGE_ALIGN).map_anon().ok()?;
        let addr = map.as_mut_ptr() as usize;
        let offset = addr.next_multiple_of(HUGE_ALIGN) - addr;
        #[cfg(target_os = "linux")]
        {
            // Advice only: without THP the memory still works, with 4 KiB pages.
            let _ = map.advise_range(memmap2::Advice::HugePage, offset, cap);
        }
        // SAFETY: offset + cap is inside the mapping of cap + HUGE_ALIGN bytes.
        let base = unsafe { map.as_mut_ptr().add(offset) };
        Some(Self {
            _map: map,
            base,
            cap,
            home,
        })
    }
}

/// The arena being filled and how far.
static CURRENT: Mutex<(Weak<Arena>, usize)> = Mutex::new((Weak::new(), 0));

enum Store {
    /// 8-byte aligned, so `u16`/`f32` views are always valid.
    Heap(Vec<u64>),
    /// `offset..offset + len` of an arena.
    Arena { arena: Arc<Arena>, offset: usize },
    /// `offset..offset + len` of a slab's region.
    Slab { region: Arc<Region>, offset: usize },
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
            Store::Arena { .. } => "huge-page arena",
            Store::Slab { .. } => "slab",
        };
        write!(f, "WeightBytes({} bytes, {kind})", self.len)
    }
}

/// Reserves `len` bytes in an arena: the current one if it has room, else a new one.
fn reserve(len: usize) -> Option<(Arc<Arena>, usize)> {
    if len >= ARENA_BYTES / 4 {
        // A large matrix has an arena of its own, its rows split over the nodes.
        let arena = Arena::new(len.next_multiple_of(HUGE_ALIGN), None)?;
        crate::numa::place_rows(arena.base, len);
        return Some((Arc::new(arena), 0));
    }
    let mut cur = CURRENT.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(arena) = cur.0.upgrade() {
        let offset = cur.1.next_multiple_of(ALIGN);
        if offset + len <= arena.cap {
            cur.1 = offset + len;
            return Some((arena, offset));
        }
    }
    // Small matrices share arenas, each arena whole on one node, the nodes in turn: binding
    // every small matrix's rows apart would cost the kernel a mapping per node and matrix
    // (V4-Flash has ~33 000 expert matrices; a process may hold 65 530 mappings) and split
    // the huge pages they share. Their products run on the arena's node.
    let home = crate::numa::next_home();
    let arena = Arena::new(ARENA_BYTES, home)?;
    if let Some(node) = home {
        crate::numa::place_on(arena.base, arena.cap, node);
    }
    let arena = Arc::new(arena);
    *cur = (Arc::downgrade(&arena), len);
    Some((arena, 0))
}

impl WeightBytes {
    /// A copy of `bytes` on the heap, never in an arena: for a matrix that is cut and
    /// dropped while loading (an arena's room is not reused when a buffer in it drops).
    pub fn transient(bytes: &[u8]) -> Self {
        let mut v = vec![0u64; bytes.len().div_ceil(8)];
        bytemuck::cast_slice_mut::<u64, u8>(&mut v)[..bytes.len()].copy_from_slice(bytes);
        Self {
            store: Store::Heap(v),
            len: bytes.len(),
        }
    }

    /// A copy of `bytes`.
    pub fn copy_from(bytes: &[u8]) -> Self {
        let len = bytes.len();
        if len >= ARENA_MIN {
            if let Some((arena, offset)) = reserve(len) {
                // SAFETY: offset..offset+len was reserved for this buffer alone and lies in
                // the arena; nothing reads it before this copy completes.
                unsafe {
                    std::ptr::copy_nonoverlapping(bytes.as_ptr(), arena.base.add(offset), len)
                };
                return Self {
                    store: Store::Arena { arena, offset },
                    len,
                };
            }
        }
        Self::transient(bytes)
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// The node whose memory holds all of this buffer (an index into the installed plan's
    /// shares), if one does; `None`: split over the nodes by rows, or one node.
    pub fn home(&self) -> Option<usize> {
        match &self.store {
            Store::Arena { arena, .. } => arena.home,
            Store::Heap(_) | Store::Slab { .. } => None,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn as_bytes(&self) -> &[u8] {
        match &self.store {
            Store::Heap(v) => &bytemuck::cast_slice(v)[..self.len],
            // SAFETY: the range is inside the arena, initialised by `copy_from`, and the
            // arena outlives `self` (it holds an `Arc`).
            Store::Arena { arena, offset } => unsafe {
                std::slice::from_raw_parts(arena.base.add(*offset), self.len)
            },
            // SAFETY: the range is inside the region (checked by `Slab::view`), the region
            // inside its arena, and no `&mut` to it exists while this view holds the region.
            Store::Slab { region, offset } => unsafe {
                std::slice::from_raw_parts(region.arena.base.add(region.offset + offset), self.len)
            },
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
}

/// A reusable buffer lent out as [`WeightBytes`] views: what an expert cache reads a whole
/// expert into and hands to the kernels, then refills once every view of the previous
/// contents is gone. Slabs are carved page-aligned out of one huge-page mapping, so a cache
/// of many takes the bytes it asks for.
pub struct Slab {
    region: Arc<Region>,
}

/// `offset..offset + cap` of an arena, owned by one slab and its views.
struct Region {
    arena: Arc<Arena>,
    offset: usize,
    cap: usize,
}

impl std::fmt::Debug for Slab {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Slab({} bytes)", self.region.cap)
    }
}

/// Slab starts (direct I/O and pages like 4 KiB).
const SLAB_ALIGN: usize = 4096;

impl Slab {
    /// One slab of `cap` bytes, zeroed (`None` when the mapping fails).
    pub fn new(cap: usize) -> Option<Self> {
        Self::carve(1, cap)?.pop()
    }

    /// `count` slabs of `cap` bytes each, zeroed, from one mapping.
    pub fn carve(count: usize, cap: usize) -> Option<Vec<Self>> {
        let stride = cap.max(1).next_multiple_of(SLAB_ALIGN);
        let total = stride.checked_mul(count)?;
        let arena = Arc::new(Arena::new(total.max(1).next_multiple_of(HUGE_ALIGN), None)?);
        // Any thread may read any slot (which expert a slot holds changes), so the pages
        // alternate between the nodes rather than follow one slot's rows.
        crate::numa::place_interleaved(arena.base, arena.cap);
        Some(
            (0..count)
                .map(|i| Self {
                    region: Arc::new(Region {
                        arena: Arc::clone(&arena),
                        offset: i * stride,
                        cap,
                    }),
                })
                .collect(),
        )
    }

    pub fn capacity(&self) -> usize {
        self.region.cap
    }

    /// The whole buffer, writable, when no view of it is alive (`None` otherwise).
    pub fn bytes_mut(&mut self) -> Option<&mut [u8]> {
        let r = Arc::get_mut(&mut self.region)?;
        // SAFETY: `get_mut` proves no `WeightBytes` view shares the region and `&mut self`
        // that nothing else reaches it; regions of one arena are disjoint and lie inside it.
        Some(unsafe { std::slice::from_raw_parts_mut(r.arena.base.add(r.offset), r.cap) })
    }

    /// Bytes `offset..offset + len` as a read-only view that keeps the slab's memory alive;
    /// `None` when the range is outside the slab or not 64-byte aligned.
    pub fn view(&self, offset: usize, len: usize) -> Option<WeightBytes> {
        let in_range = offset
            .checked_add(len)
            .is_some_and(|end| end <= self.region.cap);
        (in_range && offset.is_multiple_of(ALIGN)).then(|| WeightBytes {
            store: Store::Slab {
                region: Arc::clone(&self.region),
                offset,
            },
            len,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_hold_their_bytes_in_every_store() {
        let lens = [
            0usize,
            3,
            64,
            ARENA_MIN,
            ARENA_MIN + 12,
            ARENA_BYTES / 4 + 1,
        ];
        let bufs: Vec<(Vec<u8>, WeightBytes)> = lens
            .iter()
            .map(|&len| {
                let src: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
                let b = WeightBytes::copy_from(&src);
                (src, b)
            })
            .collect();
        for (src, b) in &bufs {
            assert_eq!(b.as_bytes(), &src[..]);
            assert_eq!(b.len(), src.len());
            assert_eq!(b.as_bytes().as_ptr() as usize % 8, 0);
        }
        let f = WeightBytes::copy_from(bytemuck::cast_slice(&[1.0f32, 2.0, 3.0, 4.0]));
        assert_eq!(f.as_f32(), &[1.0, 2.0, 3.0, 4.0]);
    }

    #[test]
    fn a_slab_is_writable_only_while_no_view_lives() {
        let mut slab = Slab::new(4096).unwrap();
        slab.bytes_mut().unwrap()[64..68].copy_from_slice(&[1, 2, 3, 4]);
        let view = slab.view(64, 4).unwrap();
        assert_eq!(view.as_bytes(), &[1, 2, 3, 4]);
        assert!(slab.bytes_mut().is_none());
        assert!(slab.view(63, 4).is_none());
        assert!(slab.view(slab.capacity() - 60, 64).is_none());
        drop(view);
        slab.bytes_mut().unwrap()[64] = 9;
        assert_eq!(slab.view(64, 1).unwrap().as_bytes(), &[9]);

        // Carved slabs are disjoint: one's writes never show in another.
        let mut many = Slab::carve(3, 5000).unwrap();
        for (i, s) in many.iter_mut().enumerate() {
            s.bytes_mut().unwrap().fill(i as u8 + 1);
        }
        for (i, s) in many.iter().enumerate() {
            let v = s.view(0, 5000).unwrap();
            assert!(v.as_bytes().iter().all(|&b| b == i as u8 + 1));
        }
    }
}
