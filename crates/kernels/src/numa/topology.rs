//! The machine's NUMA nodes and their cores, read from Linux's sysfs.
//!
//! `sys/devices/system/node/node<N>/cpulist` names each node's cores and
//! `sys/devices/system/cpu/online` the cores that are up; both are read under a root
//! directory, `/` on a real machine and a fake tree in tests (or, through
//! `DEEPINFER_TOPOLOGY`, to run this machine as if it had another topology). A kernel built
//! without NUMA has no `node` directory: then the online cores form one node.

use std::path::Path;

/// One node: its sysfs number and the cores of it this process may use, ascending.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Node {
    pub id: usize,
    pub cpus: Vec<usize>,
}

/// The nodes that have at least one core this process may use, by node number. Nodes with
/// memory and no usable core (offline or outside the affinity mask, or memory-only nodes)
/// are left out: no thread runs there, so no weight is placed there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Topology {
    pub nodes: Vec<Node>,
}

#[derive(Debug, thiserror::Error)]
pub enum TopologyError {
    #[error("reading {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: {text:?} is not a CPU list such as 0-3,8,10-11")]
    List { path: String, text: String },
    #[error("none of the CPUs this process may run on ({allowed:?}) is online in {root}")]
    NoCpu { root: String, allowed: Vec<usize> },
}

/// The highest CPU number a list may name; beyond it a list is corrupt, not a machine.
const MAX_CPU: usize = 1 << 16;

impl Topology {
    /// Reads the tree under `root`, keeping only the cores in `allowed` (this process's
    /// affinity mask, [`allowed_cpus`]; `None`: all).
    pub fn read(root: &Path, allowed: Option<&[usize]>) -> Result<Self, TopologyError> {
        let online = read_list(&root.join("sys/devices/system/cpu/online"))?;
        let usable = |cpus: Vec<usize>| -> Vec<usize> {
            cpus.into_iter()
                .filter(|c| online.contains(c) && allowed.is_none_or(|a| a.contains(c)))
                .collect()
        };
        let node_dir = root.join("sys/devices/system/node");
        let mut nodes = Vec::new();
        if let Ok(entries) = std::fs::read_dir(&node_dir) {
            for entry in entries.flatten() {
                let name = entry.file_name();
                let Some(id) = name.to_str().and_then(|n| n.strip_prefix("node")) else {
                    continue;
                };
                let Ok(id) = id.parse::<usize>() else {
                    continue;
                };
                let cpus = usable(read_list(&entry.path().join("cpulist"))?);
                if !cpus.is_empty() {
                    nodes.push(Node { id, cpus });
                }
            }
        }
        if nodes.is_empty() && !node_dir.exists() {
            nodes.push(Node {
                id: 0,
                cpus: usable(online.clone()),
            });
            nodes.retain(|n| !n.cpus.is_empty());
        }
        if nodes.is_empty() {
            return Err(TopologyError::NoCpu {
                root: root.display().to_string(),
                allowed: allowed.map(<[usize]>::to_vec).unwrap_or_default(),
            });
        }
        nodes.sort_by_key(|n| n.id);
        Ok(Self { nodes })
    }

    /// Every usable core, node by node.
    pub fn cpus(&self) -> impl Iterator<Item = usize> + '_ {
        self.nodes.iter().flat_map(|n| n.cpus.iter().copied())
    }

    /// The index in [`Self::nodes`] of the node holding `cpu`.
    pub fn node_of(&self, cpu: usize) -> Option<usize> {
        self.nodes.iter().position(|n| n.cpus.contains(&cpu))
    }
}

/// The cores this process may run on (its affinity mask), or `None` where that cannot be
/// read (then every online core is taken to be allowed).
pub fn allowed_cpus() -> Option<Vec<usize>> {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: a zeroed cpu_set_t is a valid empty set; sched_getaffinity writes at most
        // size_of::<cpu_set_t>() bytes into it, and CPU_ISSET reads inside it.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
                return None;
            }
            let max = 8 * std::mem::size_of::<libc::cpu_set_t>();
            Some((0..max).filter(|&c| libc::CPU_ISSET(c, &set)).collect())
        }
    }
    #[cfg(not(target_os = "linux"))]
    None
}

fn read_list(path: &Path) -> Result<Vec<usize>, TopologyError> {
    let text = std::fs::read_to_string(path).map_err(|source| TopologyError::Read {
        path: path.display().to_string(),
        source,
    })?;
    parse_cpu_list(&text).ok_or_else(|| TopologyError::List {
        path: path.display().to_string(),
        text: text.trim().to_string(),
    })
}

/// Parses a Linux CPU list (`0-3,8,10-11`; empty for none), as sysfs writes it and as
/// `--cpu-affinity` takes it. `None` when malformed or naming a CPU beyond 65 535.
pub fn parse_cpu_list(text: &str) -> Option<Vec<usize>> {
    let mut cpus = Vec::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        let (a, b): (usize, usize) = match part.split_once('-') {
            Some((a, b)) => (a.trim().parse().ok()?, b.trim().parse().ok()?),
            None => {
                let c = part.trim().parse().ok()?;
                (c, c)
            }
        };
        if a > b || b >= MAX_CPU {
            return None;
        }
        cpus.extend(a..=b);
    }
    Some(cpus)
}
