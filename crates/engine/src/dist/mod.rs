//! Several processes (ranks) running one model, started by `mpirun`: rank 0 runs the
//! server, the engine and the sampler; the others serve their share of the model
//! ([`deepinfer_model::parallel`]). The transport is MPI, through the `mpi` crate, when the
//! binary is built with the `mpi` feature (off by default: it needs a system MPI library and
//! libclang to build, which a single-process user should not have to install).
//!
//! A process not started by a launcher never touches MPI: it runs as a single process.

pub mod context;
#[cfg(feature = "mpi")]
mod mpi_comm;

use deepinfer_model::parallel::Collectives;
use std::sync::Arc;

#[derive(Debug, thiserror::Error)]
pub enum DistError {
    #[error(
        "started as one of {0} processes (by mpirun or another launcher), but this binary was \
         built without MPI support: build it with `cargo build --release -p deepinfer-cli \
         --features mpi` (that needs an MPI library and libclang, e.g. `apt-get install \
         openmpi-bin libopenmpi-dev libclang-dev`), or run it as a single process"
    )]
    NoMpi(usize),
    #[error("MPI: {0}")]
    Mpi(String),
}

/// The number of processes a launcher (`mpirun`, `mpiexec`, `srun`) started this one among,
/// read from the variables Open MPI, MPICH and PMIx set; `None` when not launched.
pub fn launched_size() -> Option<usize> {
    first_count(&["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"])
}

/// Processes started on this machine (the same variables' local counterparts); 1 when the
/// launcher does not say.
pub fn local_size() -> usize {
    first_count(&[
        "OMPI_COMM_WORLD_LOCAL_SIZE",
        "MPI_LOCALNRANKS",
        "PMIX_LOCAL_SIZE",
    ])
    .unwrap_or(1)
    .max(1)
}

/// The first of the environment variables `vars` that holds a count.
fn first_count(vars: &[&str]) -> Option<usize> {
    vars.iter()
        .find_map(|v| std::env::var(v).ok()?.parse().ok())
}

/// Joins the job this process was launched into: `None` for a single process (not
/// launched, or launched alone), else the job's collectives. Call [`finalize`] before the
/// process ends.
pub fn init() -> Result<Option<Arc<dyn Collectives>>, DistError> {
    match launched_size() {
        None | Some(0) | Some(1) => Ok(None),
        Some(n) => join(n),
    }
}

#[cfg(feature = "mpi")]
fn join(_: usize) -> Result<Option<Arc<dyn Collectives>>, DistError> {
    Ok(Some(Arc::new(mpi_comm::MpiComm::init()?)))
}

#[cfg(not(feature = "mpi"))]
fn join(n: usize) -> Result<Option<Arc<dyn Collectives>>, DistError> {
    Err(DistError::NoMpi(n))
}

/// Leaves the job (MPI's finalize) when [`init`] joined one; a no-op otherwise. No
/// collective may run after it.
pub fn finalize() {
    #[cfg(feature = "mpi")]
    mpi_comm::finalize();
}
