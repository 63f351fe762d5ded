//! Which core each compute thread runs on, and which node's memory holds which rows.
//!
//! Decode reads every weight byte once a token, so on a machine of several nodes the
//! bandwidth that counts is each node's own: a thread reading another node's memory goes
//! through the socket link at a fraction of it. Under `distribute` the nodes get shares
//! sized by their thread counts: a large matrix is cut by rows into one share per node,
//! and the arenas of small matrices go to the nodes in turn in the same proportion
//! (`buffer`, [`super::bind`]); each part is computed by its node's threads (the products'
//! per-node queues in `linear`). Which thread computes a row never changes its bits, so the
//! placement cannot change a result.

use super::topology::Topology;
use std::ops::Range;

/// How the weights are placed over the nodes (`--numa`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Numa {
    /// One node, as if the machine had one: no binding, one queue.
    Off,
    /// The weights spread over the nodes by thread count (large matrices by rows, small
    /// ones whole), each part in its node's memory and computed by its threads (the
    /// default on a machine of several nodes).
    Distribute,
}

impl std::str::FromStr for Numa {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "off" => Ok(Numa::Off),
            "distribute" => Ok(Numa::Distribute),
            _ => Err(format!("{s:?} is not a NUMA mode: off or distribute")),
        }
    }
}

/// The row shares of the nodes: node `n` owns rows `R·cum[n]/T .. R·cum[n+1]/T` of a matrix
/// of `R` rows, `T` being the thread count and `cum` the running sum of threads per node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shares {
    cum: Vec<usize>,
    /// The sysfs number of each node (what `mbind` takes).
    pub node_ids: Vec<usize>,
}

impl Shares {
    /// One node holding everything.
    pub fn single() -> Self {
        Self {
            cum: vec![0, 1],
            node_ids: vec![0],
        }
    }

    pub fn nodes(&self) -> usize {
        self.node_ids.len()
    }

    /// The part of `0..len` (rows, or bytes of a row-major buffer) node `n` owns.
    pub fn range(&self, n: usize, len: usize) -> Range<usize> {
        let t = self.cum[self.nodes()];
        len * self.cum[n] / t..len * self.cum[n + 1] / t
    }

    /// The compute threads of node `n`.
    pub fn threads(&self, n: usize) -> usize {
        self.cum[n + 1] - self.cum[n]
    }

    /// The node owning row `row` of `rows`.
    pub fn owner(&self, row: usize, rows: usize) -> usize {
        (0..self.nodes())
            .rev()
            .find(|&n| self.range(n, rows).start <= row)
            .unwrap_or(0)
    }
}

/// Where one compute thread runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seat {
    /// The cores it is pinned to; empty: wherever the OS puts it.
    pub cpus: Vec<usize>,
    /// Its node, an index into [`Shares::node_ids`].
    pub node: usize,
}

/// The compute threads' seats and the nodes' row shares.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    pub seats: Vec<Seat>,
    pub shares: Shares,
    /// Usable cores no compute thread is pinned to: room for the HTTP runtime.
    pub spare: Vec<usize>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PlanError {
    #[error("--threads 0: give at least 1 (default: the {0} cores this process may use)")]
    NoThreads(usize),
    #[error("--threads {0}: more than {MAX_THREADS} compute threads; give at most the cores this process may use ({1})")]
    TooMany(usize, usize),
    #[error("--cpu-affinity: CPU {0} is not one this process may run on (online and in its affinity mask: {1})")]
    NotUsable(usize, String),
    #[error("--cpu-affinity: CPU {0} is named twice")]
    Twice(usize),
    #[error("--cpu-affinity names {0} CPUs for {1} threads: name at least one per thread, or leave --threads out")]
    TooFewCpus(usize, usize),
}

/// Past this a thread count is a typo: the largest machines have a few hundred cores.
pub const MAX_THREADS: usize = 4096;

impl Plan {
    /// The plan for `threads` compute threads (default: every usable core, at most
    /// `default_cap`, the cores the process's cgroup quota allows), pinned one to a core of
    /// `affinity` where given, under `numa`.
    pub fn new(
        topo: &Topology,
        threads: Option<usize>,
        affinity: Option<&[usize]>,
        numa: Numa,
        default_cap: usize,
    ) -> Result<Self, PlanError> {
        let cpus = match affinity {
            Some(list) => checked_affinity(topo, list)?,
            None => topo.cpus().collect(),
        };
        let threads = match threads {
            None => cpus.len().min(default_cap.max(1)),
            Some(0) => return Err(PlanError::NoThreads(cpus.len())),
            Some(t) if t > MAX_THREADS => return Err(PlanError::TooMany(t, cpus.len())),
            Some(t) if affinity.is_some() && t > cpus.len() => {
                return Err(PlanError::TooFewCpus(cpus.len(), t))
            }
            Some(t) => t,
        };
        // The nodes the chosen cores lie on, and those cores node by node.
        let mut by_node: Vec<(usize, Vec<usize>)> = Vec::new();
        for &c in &cpus {
            let id = topo.nodes[topo.node_of(c).expect("checked usable")].id;
            match by_node.iter_mut().find(|(n, _)| *n == id) {
                Some((_, v)) => v.push(c),
                None => by_node.push((id, vec![c])),
            }
        }
        by_node.sort_by_key(|(id, _)| *id);
        if numa == Numa::Off || by_node.len() == 1 {
            return Ok(Self::single(&cpus, threads, affinity.is_some()));
        }
        Ok(Self::distributed(
            &by_node,
            threads,
            affinity.is_some(),
            &cpus,
        ))
    }

    /// `threads` threads on one node, wherever the OS puts them (no topology read).
    pub fn unplaced(threads: usize) -> Self {
        Self::single(&[], threads, false)
    }

    /// One node: threads pinned one to a core where `pin`, else left to the OS.
    fn single(cpus: &[usize], threads: usize, pin: bool) -> Self {
        let seat = |i: usize| Seat {
            cpus: if pin { vec![cpus[i]] } else { Vec::new() },
            node: 0,
        };
        Self {
            seats: (0..threads).map(seat).collect(),
            shares: Shares::single(),
            spare: if pin {
                cpus[threads..].to_vec()
            } else {
                Vec::new()
            },
        }
    }

    /// Threads dealt to the nodes in proportion to their cores (largest remainder; a node
    /// dealt none owns no rows), each pinned to one core where `pin`, else to
    /// its node's cores.
    fn distributed(
        by_node: &[(usize, Vec<usize>)],
        threads: usize,
        pin: bool,
        all: &[usize],
    ) -> Self {
        let counts = deal(
            threads,
            &by_node.iter().map(|(_, c)| c.len()).collect::<Vec<_>>(),
        );
        let mut seats = Vec::with_capacity(threads);
        let mut used = Vec::new();
        let (mut cum, mut node_ids) = (vec![0], Vec::new());
        for ((id, cores), &count) in by_node.iter().zip(&counts).filter(|(_, &c)| c > 0) {
            let node = node_ids.len();
            for i in 0..count {
                let cpus = if pin {
                    vec![cores[i % cores.len()]]
                } else {
                    cores.clone()
                };
                used.extend(&cpus);
                seats.push(Seat { cpus, node });
            }
            node_ids.push(*id);
            cum.push(cum.last().unwrap() + count);
        }
        let spare = if pin {
            all.iter().copied().filter(|c| !used.contains(c)).collect()
        } else {
            Vec::new()
        };
        Self {
            seats,
            shares: Shares { cum, node_ids },
            spare,
        }
    }
}

/// `--cpu-affinity`'s list, each CPU usable and named once.
fn checked_affinity(topo: &Topology, list: &[usize]) -> Result<Vec<usize>, PlanError> {
    for (i, &c) in list.iter().enumerate() {
        if topo.node_of(c).is_none() {
            let usable: Vec<String> = topo.cpus().map(|c| c.to_string()).collect();
            return Err(PlanError::NotUsable(c, usable.join(",")));
        }
        if list[..i].contains(&c) {
            return Err(PlanError::Twice(c));
        }
    }
    Ok(list.to_vec())
}

/// `threads` dealt over nodes of `cores` cores each, in proportion (largest remainder).
fn deal(threads: usize, cores: &[usize]) -> Vec<usize> {
    let total: usize = cores.iter().sum();
    let mut counts: Vec<usize> = cores.iter().map(|&c| threads * c / total).collect();
    let mut rest: Vec<usize> = (0..cores.len()).collect();
    // Largest remainder first; ties to the lower node.
    rest.sort_by_key(|&n| std::cmp::Reverse(threads * cores[n] % total));
    let left = threads - counts.iter().sum::<usize>();
    for &n in rest.iter().take(left) {
        counts[n] += 1;
    }
    counts
}
