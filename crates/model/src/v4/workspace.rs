//! Scratch memory reused from step to step, so a steady stream of same-shaped steps (decode)
//! allocates nothing.
//!
//! The forward pass takes buffers as it needs them and gives them back when done; a buffer
//! is picked best-fit by capacity. The same sequence of requests therefore finds the same
//! buffers every step: only a step larger than any before grows one (and the runner warms
//! the workspace up at start with its largest batch).

/// Pools of `f32` and `usize` buffers.
#[derive(Default)]
pub struct Workspace {
    floats: Vec<Vec<f32>>,
    indices: Vec<Vec<usize>>,
}

fn take_from<T: Clone + Default>(pool: &mut Vec<Vec<T>>, len: usize) -> Vec<T> {
    let best = pool
        .iter()
        .enumerate()
        .filter(|(_, v)| v.capacity() >= len)
        .min_by_key(|(_, v)| v.capacity())
        .map(|(i, _)| i)
        .or_else(|| {
            // None is big enough: grow the biggest rather than add another.
            pool.iter()
                .enumerate()
                .max_by_key(|(_, v)| v.capacity())
                .map(|(i, _)| i)
        });
    let mut v = best.map(|i| pool.swap_remove(i)).unwrap_or_default();
    v.clear();
    v.resize(len, T::default());
    v
}

impl Workspace {
    /// A zeroed buffer of `len` floats.
    pub fn take(&mut self, len: usize) -> Vec<f32> {
        take_from(&mut self.floats, len)
    }

    /// Takes `v` back for reuse. An empty buffer (one never taken, such as a V4 forward's
    /// unused V4.1 carry) is dropped: kept, it would lengthen the pool step after step.
    pub fn give(&mut self, v: Vec<f32>) {
        if v.capacity() > 0 {
            self.floats.push(v);
        }
    }

    /// A zeroed buffer of `len` indices.
    pub fn take_idx(&mut self, len: usize) -> Vec<usize> {
        take_from(&mut self.indices, len)
    }

    pub fn give_idx(&mut self, v: Vec<usize>) {
        if v.capacity() > 0 {
            self.indices.push(v);
        }
    }

    /// Bytes held, for the logs.
    pub fn bytes(&self) -> usize {
        self.floats.iter().map(|v| v.capacity() * 4).sum::<usize>()
            + self.indices.iter().map(|v| v.capacity() * 8).sum::<usize>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_repeated_step_grows_nothing() {
        let mut ws = Workspace::default();
        let step = |ws: &mut Workspace| {
            let a = ws.take(100);
            let b = ws.take(4000);
            let i = ws.take_idx(7);
            ws.give(a);
            let c = ws.take(3);
            assert!(c.iter().all(|&x| x == 0.0) && c.len() == 3);
            ws.give(b);
            ws.give(c);
            ws.give_idx(i);
        };
        step(&mut ws);
        let held = ws.bytes();
        let pools = (ws.floats.len(), ws.indices.len());
        ws.give(Vec::new());
        ws.give_idx(Vec::new());
        assert_eq!(
            (ws.floats.len(), ws.indices.len()),
            pools,
            "empty buffers are not kept"
        );
        for _ in 0..3 {
            step(&mut ws);
            assert_eq!(ws.bytes(), held);
        }
    }
}
