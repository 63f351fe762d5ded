//! Threads as the ranks of a job, for tests: point-to-point messages through shared
//! mailboxes, which is all a [`super::Group`] and the split rounding use of a job.

use super::{CollectiveStats, Collectives};
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex};

/// The messages sent and not yet received, by `(from, to)`.
type Queues = HashMap<(usize, usize), VecDeque<Vec<u64>>>;

/// Threads as ranks with point-to-point messages only (all a group uses of its parent).
#[derive(Default)]
struct Mailboxes {
    queues: Mutex<Queues>,
    arrived: Condvar,
}

struct Wire {
    rank: usize,
    size: usize,
    boxes: Arc<Mailboxes>,
}

impl Wire {
    fn post(&self, to: usize, words: Vec<u64>) {
        let mut q = self.boxes.queues.lock().unwrap();
        q.entry((self.rank, to)).or_default().push_back(words);
        self.boxes.arrived.notify_all();
    }

    fn take(&self, from: usize) -> Vec<u64> {
        let mut q = self.boxes.queues.lock().unwrap();
        loop {
            if let Some(m) = q.get_mut(&(from, self.rank)).and_then(VecDeque::pop_front) {
                return m;
            }
            q = self.boxes.arrived.wait(q).unwrap();
        }
    }
}

impl Collectives for Wire {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.size
    }
    fn broadcast_f32(&self, _: &mut [f32]) {
        unreachable!("a group sends point to point")
    }
    fn broadcast_u64(&self, _: &mut [u64]) {
        unreachable!("a group sends point to point")
    }
    fn reduce_sum(&self, _: &mut [f32]) {
        unreachable!("a group sends point to point")
    }
    fn gather_f32(&self, _: &[f32], _: &[usize], _: &mut [f32]) {
        unreachable!("a group sends point to point")
    }
    fn send_f32(&self, to: usize, buf: &[f32]) {
        self.post(to, buf.iter().map(|v| u64::from(v.to_bits())).collect());
    }
    fn recv_f32(&self, from: usize, buf: &mut [f32]) {
        let m = self.take(from);
        assert_eq!(m.len(), buf.len(), "message length");
        buf.iter_mut()
            .zip(m)
            .for_each(|(o, w)| *o = f32::from_bits(w as u32));
    }
    fn send_u64(&self, to: usize, buf: &[u64]) {
        self.post(to, buf.to_vec());
    }
    fn recv_u64(&self, from: usize, buf: &mut [u64]) {
        buf.copy_from_slice(&self.take(from));
    }
    fn abort(&self, why: &str) -> ! {
        panic!("{why}")
    }
    fn stats(&self) -> CollectiveStats {
        CollectiveStats::default()
    }
}

/// `f` on each rank of a job of `size` threads; their results in rank order.
pub(crate) fn job<R: Send>(size: usize, f: impl Fn(Arc<dyn Collectives>) -> R + Sync) -> Vec<R> {
    let boxes = Arc::new(Mailboxes::default());
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..size)
            .map(|rank| {
                let wire: Arc<dyn Collectives> = Arc::new(Wire {
                    rank,
                    size,
                    boxes: Arc::clone(&boxes),
                });
                let f = &f;
                s.spawn(move || f(wire))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}
