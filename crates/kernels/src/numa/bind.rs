//! Binding ranges of memory to nodes (`mbind`), before their first touch.
//!
//! A page is placed when first written; binding a range first makes that write, by
//! whichever thread loads the weights, land in the chosen node's memory. Policies are
//! "preferred", not strict: a full node spills to another instead of failing the load.
//! Ranges are rounded inward to whole huge pages (2 MiB): the weights live in huge pages
//! (`buffer`), and a policy boundary inside one would split it into small pages, which
//! costs decode measurably (TLB misses). The pages a boundary cuts stay where first touched.

use std::sync::atomic::{AtomicBool, Ordering};

const HUGE: usize = 2 << 20;
const MPOL_PREFERRED: libc::c_int = 1;
const MPOL_INTERLEAVE: libc::c_int = 3;

/// Binds the pages of `start..start + len` (addresses) to prefer node `node`.
pub fn prefer(start: usize, len: usize, node: usize) {
    policy(start, len, MPOL_PREFERRED, &[node]);
}

/// Interleaves the pages of `start..start + len` over `nodes`, one huge page each in turn.
pub fn interleave(start: usize, len: usize, nodes: &[usize]) {
    policy(start, len, MPOL_INTERLEAVE, nodes);
}

/// Whether a failed bind was already reported (one line a process: with a simulated
/// topology every bind to a node the machine lacks fails, and the run goes on unplaced).
static WARNED: AtomicBool = AtomicBool::new(false);

fn policy(start: usize, len: usize, mode: libc::c_int, nodes: &[usize]) {
    let (a, b) = (start.next_multiple_of(HUGE), (start + len) / HUGE * HUGE);
    if a >= b || nodes.is_empty() {
        return;
    }
    if let Err(e) = mbind(a, b - a, mode, nodes) {
        if !WARNED.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                "placing weights on NUMA nodes {nodes:?}: mbind: {e}; they stay where first touched"
            );
        }
    }
}

#[cfg(target_os = "linux")]
fn mbind(addr: usize, len: usize, mode: libc::c_int, nodes: &[usize]) -> std::io::Result<()> {
    const BITS: usize = 8 * std::mem::size_of::<libc::c_ulong>();
    let max = nodes.iter().max().copied().unwrap_or(0);
    let mut mask = vec![0 as libc::c_ulong; max / BITS + 1];
    for &n in nodes {
        mask[n / BITS] |= 1 << (n % BITS);
    }
    // SAFETY: mbind only changes the placement policy of pages in `addr..addr + len`
    // (page-aligned, inside a mapping the caller owns) and reads `mask`, whose length in
    // bits is passed as maxnode; it touches no memory contents.
    let r = unsafe {
        libc::syscall(
            libc::SYS_mbind,
            addr as *mut libc::c_void,
            len as libc::c_ulong,
            mode as libc::c_ulong,
            mask.as_ptr(),
            (mask.len() * BITS + 1) as libc::c_ulong,
            0 as libc::c_ulong,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(not(target_os = "linux"))]
fn mbind(_: usize, _: usize, _: libc::c_int, _: &[usize]) -> std::io::Result<()> {
    Ok(())
}
