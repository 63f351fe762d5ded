//! Synthetic checkpoints load, run, and hold exactly what the generator meant; the `bench`
//! inventory matches docs/MODEL.md §4.1 without writing its 3 GB.

mod bench;
mod dense_cache;
mod stored;
mod tiny;
