//! The job this process runs in when `mpirun` started it (see `deepinfer_engine::dist`):
//! joined once at start, read where the model loads.

use deepinfer_model::parallel::Collectives;
use std::sync::{Arc, OnceLock};

static WORLD: OnceLock<Arc<dyn Collectives>> = OnceLock::new();
static AXES: OnceLock<Vec<Axis>> = OnceLock::new();

/// One way rank 0's model is split over ranks, and the ranks it talks to for it.
#[derive(Clone)]
pub struct Axis {
    /// `tensor/expert` or `context`.
    pub name: &'static str,
    pub comm: Arc<dyn Collectives>,
}

/// Joins the job when launched among several processes; `None` for a single process.
pub fn join() -> anyhow::Result<Option<Arc<dyn Collectives>>> {
    let world = deepinfer_engine::dist::init()?;
    if let Some(w) = &world {
        let _ = WORLD.set(Arc::clone(w));
    }
    Ok(world)
}

/// The job's collectives, when this process is one of several.
pub fn world() -> Option<Arc<dyn Collectives>> {
    WORLD.get().cloned()
}

/// Rank 0, once its model is loaded: the axes it is split along (what `bench model`
/// reports each of).
pub fn set_axes(axes: Vec<Axis>) {
    let _ = AXES.set(axes);
}

/// The axes rank 0's model is split along; none for one process.
pub fn axes() -> &'static [Axis] {
    AXES.get().map_or(&[], Vec::as_slice)
}

/// Says on stderr what this rank holds in memory once its weights are loaded: anonymous
/// resident memory (`RssAnon`), the weights' own copies, without the checkpoint's page
/// cache, which the kernel may drop).
pub fn report_memory(world: &dyn Collectives) {
    if let Some(mib) = crate::memory::process_status_mib("RssAnon") {
        eprintln!(
            "rank {} of {}: {mib} MiB resident after loading (anonymous memory)",
            world.rank(),
            world.size(),
        );
    }
}
