//! The expert cache's slots: which expert each slab holds, which are being read, and which
//! to evict next.

use std::collections::HashMap;
use std::sync::Arc;

use deepinfer_kernels::buffer::Slab;

use super::ExpertError;
use crate::experts::ExpertWeights;

enum State {
    Empty,
    /// An I/O thread holds the slab.
    Loading,
    Ready(Arc<ExpertWeights>),
    Failed(ExpertError),
}

struct Slot {
    key: Option<usize>,
    state: State,
    slab: Option<Slab>,
    last_use: u64,
    uses: u32,
}

/// A slot to read an expert into, with its slab.
pub(super) enum Claim {
    Slot(usize, Slab),
    /// Every slot is being read or lent out.
    None,
}

pub(super) struct Slots {
    slots: Vec<Slot>,
    index: HashMap<usize, usize>,
    slab_bytes: usize,
    /// Advances once per request for experts.
    now: u64,
    /// How much a doubling of an expert's uses delays its eviction, in requests: about one
    /// decode step (one request per layer).
    use_weight: u64,
}

impl Slots {
    pub fn new(slabs: Vec<Slab>, requests_per_step: usize) -> Self {
        let slab_bytes = slabs.first().map_or(0, Slab::capacity);
        Self {
            index: HashMap::with_capacity(slabs.len()),
            slots: slabs
                .into_iter()
                .map(|slab| Slot {
                    key: None,
                    state: State::Empty,
                    slab: Some(slab),
                    last_use: 0,
                    uses: 0,
                })
                .collect(),
            slab_bytes,
            now: 0,
            use_weight: requests_per_step.max(1) as u64,
        }
    }

    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    pub fn slab_bytes(&self) -> usize {
        self.slab_bytes
    }

    pub fn tick(&mut self) {
        self.now += 1;
    }

    /// Whether `key` is cached, being read, or failed (not yet reported).
    pub fn contains(&self, key: usize) -> bool {
        self.index.contains_key(&key)
    }

    /// `key`'s weights if they are ready (counted as a use); its read's error once.
    pub fn take_ready(&mut self, key: usize) -> Result<Option<Arc<ExpertWeights>>, ExpertError> {
        let Some(&i) = self.index.get(&key) else {
            return Ok(None);
        };
        let now = self.now;
        let slot = &mut self.slots[i];
        match &slot.state {
            State::Ready(w) => {
                slot.last_use = now;
                slot.uses = slot.uses.saturating_add(1);
                Ok(Some(Arc::clone(w)))
            }
            State::Failed(e) => {
                let e = e.clone();
                slot.state = State::Empty;
                slot.key = None;
                self.index.remove(&key);
                Err(e)
            }
            State::Empty | State::Loading => Ok(None),
        }
    }

    /// A slot for `key`: an empty one, else the unpinned one whose use lies furthest back.
    pub fn claim(&mut self, key: usize) -> Claim {
        let weight = self.use_weight;
        let score = |s: &Slot| s.last_use + weight * u64::from(s.uses.saturating_add(1).ilog2());
        let victim = self
            .slots
            .iter()
            .enumerate()
            .filter(|(_, s)| match &s.state {
                State::Empty | State::Failed(_) => true,
                State::Ready(w) => Arc::strong_count(w) == 1,
                State::Loading => false,
            })
            .min_by_key(|(_, s)| match s.state {
                State::Empty => (0, 0),
                _ => (1, score(s)),
            })
            .map(|(i, _)| i);
        let Some(i) = victim else {
            return Claim::None;
        };
        let now = self.now;
        let slot = &mut self.slots[i];
        if let Some(old) = slot.key.take() {
            self.index.remove(&old);
        }
        // Dropping the weights ends the slab's last views.
        slot.state = State::Loading;
        slot.key = Some(key);
        slot.last_use = now;
        slot.uses = 0;
        self.index.insert(key, i);
        match slot.slab.take() {
            Some(slab) => Claim::Slot(i, slab),
            None => Claim::None,
        }
    }

    /// A read's end: the slab comes back with the weights over it, or the error.
    pub fn finish(
        &mut self,
        i: usize,
        slab: Slab,
        result: Result<Arc<ExpertWeights>, ExpertError>,
    ) {
        let slot = &mut self.slots[i];
        slot.slab = Some(slab);
        slot.state = match result {
            Ok(w) => State::Ready(w),
            Err(e) => State::Failed(e),
        };
    }
}
