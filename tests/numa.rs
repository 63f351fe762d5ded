//! A model run as on a machine of two NUMA nodes gives the bits of the plain run: every
//! product big enough to go parallel is dealt to the nodes by its rows (the vocabulary head
//! of the synthetic checkpoints, 129 280 × hidden, always is), and which thread computes a
//! row must never change its value. The threads are not pinned here (the test machine's
//! cores are not the simulated ones); `crates/cli/tests/numa.rs` runs the binary on a fake
//! sysfs tree, pinning included.

mod common;

use common::*;
use deepinfer_model::kernels::numa::{plan, pool, topology};
use deepinfer_model::synth::{preset, write_checkpoint};
use deepinfer_model::v4::Model;

/// Two simulated nodes of one core each, three threads (two on node 0): shares of 2/3 and
/// 1/3, so the split falls inside tiles' ranges rather than on a power of two.
fn two_nodes() -> plan::Plan {
    let node = |id| topology::Node { id, cpus: vec![id] };
    let topo = topology::Topology {
        nodes: vec![node(0), node(1)],
    };
    let mut p = plan::Plan::new(&topo, Some(3), None, plan::Numa::Distribute, 3).unwrap();
    p.seats.iter_mut().for_each(|s| s.cpus.clear());
    assert_eq!(p.shares.nodes(), 2);
    p
}

/// Logits of a prompt fed whole (every position), then of four single-token steps, and of
/// a batch of two sequences in one step, in a pool built from `placement`.
fn run(dir: &std::path::Path, placement: plan::Plan) -> Vec<Vec<f32>> {
    std::thread::spawn({
        let dir = dir.to_path_buf();
        move || {
            pool::build(&placement).unwrap().install(|| {
                let mut r = runner(Model::load(&dir).unwrap(), 2, 0);
                let prompt: Vec<u32> = (0..37).map(|i| (i * 7919 % 120_000) as u32).collect();
                let (a, b) = (r.add_sequence().unwrap(), r.add_sequence().unwrap());
                let mut out = vec![feed(&mut r, a, &prompt, true).data];
                for t in [5u32, 77, 1024, 99_999] {
                    out.push(feed(&mut r, a, &[t], false).data);
                }
                let step = r.step(&[
                    Feed {
                        seq: a,
                        tokens: &[3, 4],
                        all_logits: true,
                    },
                    Feed {
                        seq: b,
                        tokens: &prompt[..9],
                        all_logits: true,
                    },
                ]);
                out.push(step.unwrap().data.clone());
                out
            })
        }
    })
    .join()
    .unwrap()
}

#[test]
fn two_nodes_give_the_one_node_bits() {
    for name in ["tiny", "tiny-v41"] {
        let spec = preset(name).unwrap();
        let c = &spec.config;
        assert!(
            c.vocab_size * c.hidden_size >= 1 << 18,
            "{name}: the head goes parallel"
        );
        let dir = tempfile::tempdir().unwrap();
        write_checkpoint(&spec, dir.path(), 3, |_, _| {}).unwrap();
        let plain = run(dir.path(), plan::Plan::unplaced(3));
        let placed = run(dir.path(), two_nodes());
        for (i, (a, b)) in plain.iter().zip(&placed).enumerate() {
            assert!(same_bits(a, b), "{name}: step {i} differs on two nodes");
        }
    }
}
