//! Some of a job's ranks as a job of their own: how context parallelism composes with the
//! tensor and expert split. Ranks = CP × TP: the ranks `g·TP .. (g+1)·TP` form group g, one
//! replica of the model split over them as a job of TP ranks would split it, and the
//! groups' first ranks form the context-parallel job that hands state from range to range.
//!
//! A group's collectives are its members' point-to-point messages over the whole job:
//! communicators of MPI's own (`MPI_Comm_split`) would be handles the `mpi` crate cannot
//! move between threads. Every pair of ranks talks within one group only (a group's
//! members with their first rank, the first ranks with each other), so their messages
//! never cross.

use super::{CollectiveStats, Collectives, Counters};
use std::sync::{Arc, Mutex};

/// The ranks `members` (ranks of `parent`, the first one the group's root) as a job.
pub struct Group {
    parent: Arc<dyn Collectives>,
    members: Vec<usize>,
    rank: usize,
    /// The root's receive buffer of a reduction.
    scratch: Mutex<Vec<f32>>,
    counters: Counters,
}

/// This rank's groups when `world`'s ranks are `cp` context-parallel groups: its own group
/// (`tensor`, the model's split), and, on a group's first rank, the groups' first ranks
/// (`context`).
pub struct Grid {
    pub tensor: Arc<dyn Collectives>,
    pub context: Option<Arc<dyn Collectives>>,
}

impl Grid {
    /// `world`'s ranks in `cp` groups of `world.size() / cp` consecutive ranks (`cp` divides
    /// the size: the caller checks). An axis spanning the whole job is `world` itself, its
    /// own collectives.
    pub fn new(world: &Arc<dyn Collectives>, cp: usize) -> Self {
        let (rank, size) = (world.rank(), world.size());
        let tp = size / cp;
        let first = rank - rank % tp;
        let group = |members: Vec<usize>| -> Arc<dyn Collectives> {
            match members.len() == size {
                true => Arc::clone(world),
                false => Arc::new(Group::new(world, members)),
            }
        };
        Self {
            tensor: group((first..first + tp).collect()),
            context: (rank == first).then(|| group((0..cp).map(|g| g * tp).collect())),
        }
    }
}

impl Group {
    /// `members` must hold `parent`'s rank.
    pub fn new(parent: &Arc<dyn Collectives>, members: Vec<usize>) -> Self {
        let me = parent.rank();
        let rank = members
            .iter()
            .position(|&m| m == me)
            .expect("a group is made on its members");
        Self {
            parent: Arc::clone(parent),
            members,
            rank,
            scratch: Mutex::new(Vec::new()),
            counters: Counters::default(),
        }
    }

    fn counted(&self, bytes: usize, f: impl FnOnce()) {
        self.counters.counted(bytes, f)
    }

    fn others(&self) -> impl Iterator<Item = usize> + '_ {
        self.members[1..].iter().copied()
    }
}

impl Collectives for Group {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.members.len()
    }

    fn broadcast_f32(&self, buf: &mut [f32]) {
        self.counted(buf.len() * 4, || match self.rank {
            0 => self.others().for_each(|m| self.parent.send_f32(m, buf)),
            _ => self.parent.recv_f32(self.members[0], buf),
        });
    }

    fn broadcast_u64(&self, buf: &mut [u64]) {
        self.counted(buf.len() * 8, || match self.rank {
            0 => self.others().for_each(|m| self.parent.send_u64(m, buf)),
            _ => self.parent.recv_u64(self.members[0], buf),
        });
    }

    fn reduce_sum(&self, buf: &mut [f32]) {
        self.counted(buf.len() * 4, || {
            if self.rank != 0 {
                return self.parent.send_f32(self.members[0], buf);
            }
            let mut part = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
            part.resize(buf.len(), 0.0);
            for m in self.others() {
                self.parent.recv_f32(m, &mut part);
                buf.iter_mut().zip(part.iter()).for_each(|(s, &p)| *s += p);
            }
        });
    }

    fn gather_f32(&self, part: &[f32], counts: &[usize], out: &mut [f32]) {
        self.counted(Counters::gather_bytes(self.rank, part, out), || {
            if self.rank != 0 {
                return self.parent.send_f32(self.members[0], part);
            }
            out[..part.len()].copy_from_slice(part);
            let mut at = counts[0];
            for (m, &n) in self.others().zip(&counts[1..]) {
                self.parent.recv_f32(m, &mut out[at..at + n]);
                at += n;
            }
        });
    }

    fn send_f32(&self, to: usize, buf: &[f32]) {
        self.counted(buf.len() * 4, || {
            self.parent.send_f32(self.members[to], buf)
        });
    }

    fn recv_f32(&self, from: usize, buf: &mut [f32]) {
        self.counted(buf.len() * 4, || {
            self.parent.recv_f32(self.members[from], buf)
        });
    }

    fn send_u64(&self, to: usize, buf: &[u64]) {
        self.counted(buf.len() * 8, || {
            self.parent.send_u64(self.members[to], buf)
        });
    }

    fn recv_u64(&self, from: usize, buf: &mut [u64]) {
        self.counted(buf.len() * 8, || {
            self.parent.recv_u64(self.members[from], buf)
        });
    }

    fn abort(&self, why: &str) -> ! {
        self.parent.abort(why)
    }

    fn stats(&self) -> CollectiveStats {
        self.counters.stats()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parallel::threads::job;

    #[test]
    fn a_grid_of_groups_runs_each_collective_among_its_members() {
        // Six ranks as 3 context-parallel groups of 2: the tensor groups {0,1} {2,3} {4,5}
        // and the first ranks {0,2,4}.
        let got = job(6, |world| {
            let r = world.rank() as f32;
            let grid = Grid::new(&world, 3);
            let t = &grid.tensor;
            let mut header = [world.rank() as u64 * 10, 7];
            t.broadcast_u64(&mut header);
            let mut sum = [r, 1.0];
            t.reduce_sum(&mut sum);
            let part = vec![r; 1 + t.rank()];
            let mut gathered = vec![0.0; 3];
            t.gather_f32(&part, &[1, 2], &mut gathered);
            let mut from_first = [-1.0];
            if let Some(c) = &grid.context {
                match c.rank() {
                    0 => c.send_f32(2, &[r + 0.5]),
                    2 => c.recv_f32(0, &mut from_first),
                    _ => {}
                }
                assert_eq!(c.size(), 3);
            }
            (
                header,
                (t.rank() == 0).then_some((sum, gathered)),
                from_first[0],
            )
        });
        for (rank, (header, root, from_first)) in got.into_iter().enumerate() {
            let first = rank - rank % 2;
            assert_eq!(
                header,
                [first as u64 * 10, 7],
                "rank {rank}: its group's header"
            );
            if let Some((sum, gathered)) = root {
                let f = first as f32;
                assert_eq!(sum, [2.0 * f + 1.0, 2.0]);
                assert_eq!(gathered, [f, f + 1.0, f + 1.0]);
            }
            let want = if rank == 4 { 0.5 } else { -1.0 };
            assert_eq!(from_first, want, "rank {rank}");
        }
    }

    #[test]
    fn an_axis_over_the_whole_job_is_the_job_itself() {
        let sizes = job(2, |world| {
            let (one, two) = (Grid::new(&world, 1), Grid::new(&world, 2));
            assert!(Arc::ptr_eq(&one.tensor, &world));
            assert!(two.context.as_ref().is_some_and(|c| Arc::ptr_eq(c, &world)));
            (one.tensor.size(), two.tensor.size())
        });
        assert_eq!(sizes, [(2, 1), (2, 1)]);
    }
}
