//! Where the compute threads run (`--threads`, `--cpu-affinity`, `--numa`), decided once
//! before the weights load so that they load where those threads read them.

use anyhow::{Context, Result};
use clap::Args;
use deepinfer_model::kernels::numa::{self, plan, topology};

#[derive(Args, Debug, Clone, Default)]
pub struct ThreadArgs {
    /// Compute threads (llama.cpp's -t; default: the cores this process may use, as its
    /// CPU affinity mask and cgroup CPU quota allow).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Pin compute thread i to the i-th CPU of this list (such as 0-15,32-47; taskset's
    /// syntax). Without it threads are not pinned, except to their node under --numa
    /// distribute.
    #[arg(long, value_parser = parse_list)]
    pub cpu_affinity: Option<CpuList>,
    /// `distribute`: on a machine of several NUMA nodes, the weights are spread over the
    /// nodes' memory — a large matrix's rows split between them, small matrices whole on
    /// each in turn — and each part is computed by its node's threads (the default when the
    /// cores in use span several nodes). `off`: placed as on one node.
    #[arg(long)]
    pub numa: Option<plan::Numa>,
}

/// A list of CPUs, in the order given.
#[derive(Debug, Clone)]
pub struct CpuList(Vec<usize>);

fn parse_list(s: &str) -> Result<CpuList, String> {
    match topology::parse_cpu_list(s) {
        Some(v) if !v.is_empty() => Ok(CpuList(v)),
        _ => Err(format!("{s:?} is not a CPU list such as 0-3,8,10-11")),
    }
}

impl ThreadArgs {
    /// Reads the topology, makes the plan and installs it for this process; one stderr line
    /// says what it chose when there is a choice to see (pinning, several nodes).
    pub fn install(&self) -> Result<&'static plan::Plan> {
        // Once per process: the first install pins this thread, which changes the affinity
        // mask a second reading would start from.
        if let Some(done) = numa::installed() {
            return Ok(done);
        }
        let plan = self.plan()?;
        if plan.shares.nodes() > 1 || plan.seats.iter().any(|s| !s.cpus.is_empty()) {
            eprintln!("{}", describe(&plan, self.cpu_affinity.is_some()));
        }
        numa::install(plan).map_err(|_| anyhow::anyhow!("a thread placement was installed already"))
    }

    fn plan(&self) -> Result<plan::Plan> {
        let root = numa::sysfs_root();
        let allowed = topology::allowed_cpus();
        let cap = std::thread::available_parallelism().map_or(1, |n| n.get());
        let topo = match topology::Topology::read(&root, allowed.as_deref()) {
            Ok(t) => t,
            Err(e) if std::env::var_os("DEEPINFER_TOPOLOGY").is_some() => {
                return Err(e).context("DEEPINFER_TOPOLOGY")
            }
            // No sysfs (some containers, other systems): one node of the cores std sees.
            Err(e) => {
                tracing::debug!("no NUMA topology ({e}); one node");
                let cpus = allowed.unwrap_or_else(|| (0..cap).collect());
                topology::Topology {
                    nodes: vec![topology::Node { id: 0, cpus }],
                }
            }
        };
        let numa = self.numa.unwrap_or(plan::Numa::Distribute);
        Ok(plan::Plan::new(
            &topo,
            self.threads,
            self.cpu_affinity.as_ref().map(|l| l.0.as_slice()),
            numa,
            cap,
        )?)
    }
}

/// The plan in one line.
fn describe(plan: &plan::Plan, listed: bool) -> String {
    let n = plan.shares.nodes();
    let per_node: Vec<String> = (0..n)
        .map(|i| {
            let t = plan.seats.iter().filter(|s| s.node == i).count();
            format!("node {}: {t}", plan.shares.node_ids[i])
        })
        .collect();
    let pinned = if listed {
        "each pinned to a core"
    } else if n > 1 {
        "each kept to its node's cores"
    } else {
        "not pinned"
    };
    format!(
        "threads: {} compute threads ({}), {pinned}{}",
        plan.seats.len(),
        per_node.join(", "),
        if n > 1 {
            "; weights spread over the nodes by thread count"
        } else {
            ""
        }
    )
}
