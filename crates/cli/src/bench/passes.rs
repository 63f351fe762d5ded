//! What one parallel pass costs beyond its work, against thread count and node layout: a
//! decode step is a few hundred passes, so this is what many threads must keep small
//! (docs/PERFORMANCE.md models it for 64–192 threads from these figures).

use deepinfer_model::kernels::awake::with_workers_awake;
use deepinfer_model::kernels::linear::pass_cost;
use deepinfer_model::kernels::numa::{plan, pool, topology};

/// Passes timed per configuration (the median of five runs of this many).
const PASSES: usize = 2000;
/// Work per tile, µs: about what a decode product's tile takes (a few hundred KB of weights
/// a thread at tens of GB/s).
const TILE_US: f64 = 5.0;

/// A pool of `threads` threads laid out over `nodes` simulated nodes (unpinned: the cores
/// here are not the simulated ones), or one node.
fn layout(threads: usize, nodes: usize) -> plan::Plan {
    if nodes == 1 {
        return plan::Plan::unplaced(threads);
    }
    let topo = topology::Topology {
        nodes: (0..nodes)
            .map(|id| topology::Node { id, cpus: vec![id] })
            .collect(),
    };
    let mut p = plan::Plan::new(&topo, Some(threads), None, plan::Numa::Distribute, threads)
        .expect("a plan of simulated nodes");
    p.seats.iter_mut().for_each(|s| s.cpus.clear());
    p
}

/// µs a pass of `2 × threads` tiles costs beyond its work in a pool laid out by `p`,
/// workers kept awake as in a forward pass (median of five runs).
fn measure(p: plan::Plan) -> f64 {
    std::thread::spawn(move || {
        let pool = pool::build(&p).expect("compute pool");
        let tiles = 2 * p.seats.len();
        pool.install(|| {
            with_workers_awake(|| {
                let mut runs: Vec<f64> =
                    (0..5).map(|_| pass_cost(tiles, TILE_US, PASSES)).collect();
                runs.sort_by(f64::total_cmp);
                runs[2]
            })
        })
    })
    .join()
    .expect("pass-cost thread")
}

/// Prints the table: threads 1..=`all`, one node and two simulated ones.
pub fn print(all: usize) {
    println!(
        "parallel pass hand-off (µs a pass of 2 × threads tiles of {TILE_US} µs costs beyond its \
         work, workers awake):"
    );
    println!(
        "  {:>7} {:>10} {:>16}",
        "threads", "one node", "two nodes (sim.)"
    );
    for threads in 1..=all {
        let one = measure(layout(threads, 1));
        let two = if threads >= 2 {
            format!("{:.2}", measure(layout(threads, 2)))
        } else {
            "-".into()
        };
        println!("  {threads:>7} {one:>10.2} {two:>16}");
    }
}
