//! [`Collectives`] over MPI's world communicator.
//!
//! A rank waiting for rank 0 tests its request instead of blocking in MPI: MPI's blocking
//! calls spin a core at 100 %, which on a machine whose cores the ranks share (or a server
//! waiting for requests) takes the core from the rank with work. It spins briefly (a
//! decode step's messages come close together), then yields, then sleeps.

use super::DistError;
use deepinfer_model::parallel::{CollectiveStats, Collectives, Counters};
use mpi::collective::SystemOperation;
use mpi::datatype::PartitionMut;
use mpi::environment::Universe;
use mpi::request::{LocalScope, Request};
use mpi::topology::{Communicator, SimpleCommunicator};
use mpi::traits::{Destination, Equivalence, Root, Source};
use mpi::{Count, Threading};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Held until [`finalize`]: dropping it is MPI's finalize.
static UNIVERSE: Mutex<Option<Universe>> = Mutex::new(None);

/// Spin this long on a request before yielding the core.
const SPIN: Duration = Duration::from_micros(200);
/// Then yield for this long before sleeping between tests.
const YIELD: Duration = Duration::from_millis(5);
const NAP: Duration = Duration::from_micros(100);

pub struct MpiComm {
    rank: usize,
    size: usize,
    /// Rank 0's send buffer of a reduction (MPI reduces from one buffer into another).
    send: Mutex<Vec<f32>>,
    counters: Counters,
}

impl MpiComm {
    pub fn init() -> Result<Self, DistError> {
        // The engine's thread runs the collectives, not the thread that initialised MPI.
        let (universe, threading) = mpi::initialize_with_threading(Threading::Serialized)
            .ok_or_else(|| DistError::Mpi("MPI was initialised twice".into()))?;
        if threading < Threading::Serialized {
            return Err(DistError::Mpi(format!(
                "the MPI library offers {threading:?} threading; one thread at a time \
                 (Serialized) is needed"
            )));
        }
        let world = universe.world();
        let comm = Self {
            rank: world.rank() as usize,
            size: world.size() as usize,
            send: Mutex::new(Vec::new()),
            counters: Counters::default(),
        };
        *lock(&UNIVERSE) = Some(universe);
        Ok(comm)
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

pub fn finalize() {
    drop(lock(&UNIVERSE).take());
}

fn world() -> SimpleCommunicator {
    SimpleCommunicator::world()
}

/// Waits for `req` without holding a core for long (see the module's comment).
fn wait<'a, D: ?Sized>(mut req: Request<'a, D, &LocalScope<'a>>) {
    let start = Instant::now();
    loop {
        match req.test() {
            Ok(_) => return,
            Err(r) => req = r,
        }
        let waited = start.elapsed();
        if waited < SPIN {
            std::hint::spin_loop();
        } else if waited < YIELD {
            std::thread::yield_now();
        } else {
            std::thread::sleep(NAP);
        }
    }
}

fn broadcast<T: Equivalence>(buf: &mut [T]) {
    let world = world();
    let root = world.process_at_rank(0);
    mpi::request::scope(|scope| wait(root.immediate_broadcast_into(scope, buf)));
}

fn send<T: Equivalence>(to: usize, buf: &[T]) {
    let world = world();
    let peer = world.process_at_rank(to as i32);
    mpi::request::scope(|scope| wait(peer.immediate_send(scope, buf)));
}

fn recv<T: Equivalence>(from: usize, buf: &mut [T]) {
    let world = world();
    let peer = world.process_at_rank(from as i32);
    mpi::request::scope(|scope| wait(peer.immediate_receive_into(scope, buf)));
}

impl Collectives for MpiComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn broadcast_f32(&self, buf: &mut [f32]) {
        self.counted(buf.len() * 4, || broadcast(buf));
    }

    fn broadcast_u64(&self, buf: &mut [u64]) {
        self.counted(buf.len() * 8, || broadcast(buf));
    }

    fn reduce_sum(&self, buf: &mut [f32]) {
        self.counted(buf.len() * 4, || self.reduce(buf));
    }

    fn gather_f32(&self, part: &[f32], counts: &[usize], out: &mut [f32]) {
        let bytes = Counters::gather_bytes(self.rank, part, out);
        self.counted(bytes, || self.gather(part, counts, out));
    }

    fn send_f32(&self, to: usize, buf: &[f32]) {
        self.counted(buf.len() * 4, || send(to, buf));
    }

    fn recv_f32(&self, from: usize, buf: &mut [f32]) {
        self.counted(buf.len() * 4, || recv(from, buf));
    }

    fn send_u64(&self, to: usize, buf: &[u64]) {
        self.counted(buf.len() * 8, || send(to, buf));
    }

    fn recv_u64(&self, from: usize, buf: &mut [u64]) {
        self.counted(buf.len() * 8, || recv(from, buf));
    }

    fn abort(&self, why: &str) -> ! {
        // One write, so the ranks' lines do not interleave.
        let line = format!("rank {} of {}: {why}\n", self.rank, self.size);
        let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
        world().abort(1)
    }

    fn stats(&self) -> CollectiveStats {
        self.counters.stats()
    }
}

impl MpiComm {
    fn counted<R>(&self, bytes: usize, f: impl FnOnce() -> R) -> R {
        self.counters.counted(bytes, f)
    }

    fn reduce(&self, buf: &mut [f32]) {
        let world = world();
        let root = world.process_at_rank(0);
        let sum = SystemOperation::sum();
        if self.rank == 0 {
            let mut send = lock(&self.send);
            send.clear();
            send.extend_from_slice(buf);
            mpi::request::scope(|scope| {
                wait(root.immediate_reduce_into_root(scope, &send[..], buf, sum))
            });
        } else {
            mpi::request::scope(|scope| wait(root.immediate_reduce_into(scope, &buf[..], sum)));
        }
    }

    fn gather(&self, part: &[f32], counts: &[usize], out: &mut [f32]) {
        let world = world();
        let root = world.process_at_rank(0);
        if self.rank != 0 {
            mpi::request::scope(|scope| wait(root.immediate_gather_varcount_into(scope, part)));
            return;
        }
        let counts: Vec<Count> = counts.iter().map(|&c| c as Count).collect();
        let displs: Vec<Count> = counts
            .iter()
            .scan(0, |at, &c| {
                let d = *at;
                *at += c;
                Some(d)
            })
            .collect();
        let mut recv = PartitionMut::new(out, &counts[..], &displs[..]);
        mpi::request::scope(|scope| {
            wait(root.immediate_gather_varcount_into_root(scope, part, &mut recv))
        });
    }
}
