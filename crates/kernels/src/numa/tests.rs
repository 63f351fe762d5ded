//! Topologies read from fake sysfs trees, and the plans made for them.

use super::plan::{Numa, Plan, PlanError, Seat, Shares};
use super::topology::{parse_cpu_list, Topology};
use std::path::{Path, PathBuf};

/// A fake root, removed when dropped.
struct Tree(PathBuf);

impl std::ops::Deref for Tree {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for Tree {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A fake root: `online` as sys/devices/system/cpu/online, one node directory per entry.
fn tree(name: &str, online: &str, nodes: &[(usize, &str)]) -> Tree {
    let root = std::env::temp_dir().join(format!("deepinfer-topo-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let cpu = root.join("sys/devices/system/cpu");
    std::fs::create_dir_all(&cpu).unwrap();
    std::fs::write(cpu.join("online"), format!("{online}\n")).unwrap();
    for (id, list) in nodes {
        let dir = root.join(format!("sys/devices/system/node/node{id}"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("cpulist"), format!("{list}\n")).unwrap();
    }
    Tree(root)
}

fn all(n: usize) -> Vec<usize> {
    (0..n).collect()
}

fn read(root: &Path, allowed: &[usize]) -> Topology {
    Topology::read(root, Some(allowed)).unwrap()
}

#[test]
fn cpu_lists_parse_as_sysfs_writes_them() {
    assert_eq!(
        parse_cpu_list("0-3,8,10-11\n"),
        Some(vec![0, 1, 2, 3, 8, 10, 11])
    );
    assert_eq!(parse_cpu_list(""), Some(vec![]));
    assert_eq!(parse_cpu_list("5"), Some(vec![5]));
    for bad in ["3-1", "a", "1-", "0-99999999", "1,,x"] {
        assert_eq!(parse_cpu_list(bad), None, "{bad}");
    }
}

#[test]
fn two_sockets_of_32_cores_split_rows_in_halves() {
    let root = tree("2x32", "0-63", &[(0, "0-31"), (1, "32-63")]);
    let topo = read(&root, &all(64));
    assert_eq!(topo.nodes.len(), 2);
    let plan = Plan::new(&topo, None, None, Numa::Distribute, 64).unwrap();
    assert_eq!(plan.seats.len(), 64);
    assert_eq!(plan.shares.node_ids, vec![0, 1]);
    // Unpinned threads keep to their node's cores.
    assert_eq!(plan.seats[0].cpus, all(32));
    assert_eq!(plan.seats[63].node, 1);
    assert_eq!(plan.shares.range(0, 7168), 0..3584);
    assert_eq!(plan.shares.owner(3583, 7168), 0);
    assert_eq!(plan.shares.owner(3584, 7168), 1);
    // A cgroup quota of 16 cores: 8 threads a node.
    let plan = Plan::new(&topo, None, None, Numa::Distribute, 16).unwrap();
    let on1 = plan.seats.iter().filter(|s| s.node == 1).count();
    assert_eq!((plan.seats.len(), on1), (16, 8));
    // Off: one share, no binding, threads wherever the OS puts them.
    let plan = Plan::new(&topo, Some(8), None, Numa::Off, 64).unwrap();
    assert_eq!(plan.shares, Shares::single());
    assert!(plan.seats.iter().all(|s| s
        == &Seat {
            cpus: vec![],
            node: 0
        }));
}

#[test]
fn eight_nodes_with_pinned_threads_leave_the_rest_spare() {
    let nodes: Vec<(usize, String)> = (0..8)
        .map(|n| (n, format!("{}-{}", 8 * n, 8 * n + 7)))
        .collect();
    let nodes: Vec<(usize, &str)> = nodes.iter().map(|(n, l)| (*n, l.as_str())).collect();
    let root = tree("8nodes", "0-63", &nodes);
    let topo = read(&root, &all(64));
    // Two cores of every node, pinned one thread each.
    let list: Vec<usize> = (0..8).flat_map(|n| [8 * n, 8 * n + 1]).collect();
    let plan = Plan::new(&topo, None, Some(&list), Numa::Distribute, 64).unwrap();
    assert_eq!(plan.seats.len(), 16);
    assert_eq!(plan.shares.nodes(), 8);
    for (i, seat) in plan.seats.iter().enumerate() {
        assert_eq!((seat.cpus.clone(), seat.node), (vec![list[i]], i / 2));
    }
    assert_eq!(plan.spare, Vec::<usize>::new());
    // Every row has one owner, and owners rise with the row.
    let owners: Vec<usize> = (0..1000).map(|r| plan.shares.owner(r, 1000)).collect();
    assert!(owners.windows(2).all(|w| w[0] <= w[1]));
    assert_eq!((owners[0], owners[999]), (0, 7));
    assert_eq!(
        (0..8)
            .map(|n| plan.shares.range(n, 1000).len())
            .sum::<usize>(),
        1000
    );
    // Fewer threads than listed cores: the rest are spare (the HTTP runtime's).
    let plan = Plan::new(&topo, Some(4), Some(&list), Numa::Off, 64).unwrap();
    assert_eq!(plan.spare, list[4..].to_vec());
}

#[test]
fn uneven_nodes_get_threads_and_rows_in_proportion() {
    // 24 cores on node 0, 8 on node 2 (node 1 holds memory only: no cores, no threads).
    let root = tree("uneven", "0-31", &[(0, "0-23"), (1, ""), (2, "24-31")]);
    let topo = read(&root, &all(32));
    assert_eq!(
        topo.nodes.iter().map(|n| n.id).collect::<Vec<_>>(),
        vec![0, 2]
    );
    let plan = Plan::new(&topo, Some(8), None, Numa::Distribute, 32).unwrap();
    let on0 = plan.seats.iter().filter(|s| s.node == 0).count();
    assert_eq!(on0, 6);
    assert_eq!(plan.shares.node_ids, vec![0, 2]);
    assert_eq!(plan.shares.range(0, 800), 0..600);
    // One thread: all of it on the larger node, one share.
    let plan = Plan::new(&topo, Some(1), None, Numa::Distribute, 32).unwrap();
    assert_eq!(plan.shares.nodes(), 1);
    assert_eq!(plan.shares.node_ids, vec![0]);
}

#[test]
fn offline_and_disallowed_cores_are_left_out() {
    let root = tree("offline", "0-5,8-13", &[(0, "0-7"), (1, "8-15")]);
    // Cores 6, 7, 14, 15 offline; the affinity mask excludes 0.
    let allowed: Vec<usize> = (1..16).collect();
    let topo = read(&root, &allowed);
    assert_eq!(topo.nodes[0].cpus, vec![1, 2, 3, 4, 5]);
    assert_eq!(topo.nodes[1].cpus, vec![8, 9, 10, 11, 12, 13]);
    let plan = Plan::new(&topo, None, None, Numa::Distribute, 64).unwrap();
    assert_eq!(plan.seats.len(), 11);
    assert_eq!(plan.seats.iter().filter(|s| s.node == 1).count(), 6);
    // A mask entirely on one node: one share, nothing to distribute.
    let topo = read(&root, &[8, 9]);
    let plan = Plan::new(&topo, None, None, Numa::Distribute, 64).unwrap();
    assert_eq!((plan.seats.len(), plan.shares.nodes()), (2, 1));
}

#[test]
fn a_kernel_without_numa_is_one_node() {
    let root = tree("flat", "0-3", &[]);
    let topo = read(&root, &all(4));
    assert_eq!(topo.nodes.len(), 1);
    assert_eq!(topo.nodes[0].cpus, all(4));
}

#[test]
fn bad_trees_and_flags_are_named() {
    let root = tree("corrupt", "0-3", &[(0, "0-x")]);
    let e = Topology::read(&root, Some(&all(4)))
        .unwrap_err()
        .to_string();
    assert!(e.contains("node0/cpulist") && e.contains("0-x"), "{e}");
    let e = Topology::read(Path::new("/nonexistent-root"), None)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("/nonexistent-root/sys/devices/system/cpu/online"),
        "{e}"
    );
    let root = tree("flags", "0-3", &[(0, "0-3")]);
    let topo = read(&root, &all(4));
    let plan = |t, a: Option<&[usize]>| Plan::new(&topo, t, a, Numa::Distribute, 4);
    assert_eq!(plan(Some(0), None).unwrap_err(), PlanError::NoThreads(4));
    assert!(matches!(
        plan(Some(1 << 20), None),
        Err(PlanError::TooMany(..))
    ));
    assert!(matches!(
        plan(None, Some(&[7])),
        Err(PlanError::NotUsable(7, _))
    ));
    assert_eq!(plan(None, Some(&[1, 1])).unwrap_err(), PlanError::Twice(1));
    assert_eq!(
        plan(Some(3), Some(&[0, 1])).unwrap_err(),
        PlanError::TooFewCpus(2, 3)
    );
    // More threads than cores without a list: allowed (oversubscribed), as llama.cpp allows.
    assert_eq!(plan(Some(6), None).unwrap().seats.len(), 6);
    let e = plan(None, Some(&[7])).unwrap_err().to_string();
    assert!(
        e.starts_with("--cpu-affinity") && e.contains("0,1,2,3"),
        "{e}"
    );
}
