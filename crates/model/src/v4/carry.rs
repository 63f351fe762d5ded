//! What V4.1's layers hand on to later layers within one forward (docs/MODEL.md §8.1, §8.5): the
//! collapse weights of the last sublayer (shifted mHC), the index picks of the last index
//! source, and the candidate source's blocks. V4 carries nothing; one owner — the forward
//! pass — keeps it from layer to layer.

use super::workspace::Workspace;

#[derive(Default)]
pub struct Carry {
    /// `[N, hc]`: the previous sublayer's `pre`; `None` before the first.
    pub pre: Option<Vec<f32>>,
    /// `[N, topk]` picks of the last index source, and how many each row has.
    pub picks: Vec<usize>,
    pub n_picks: Vec<usize>,
    /// `[N, topk_blocks]` candidate blocks of the candidate source, and how many each row has.
    pub blocks: Vec<usize>,
    pub n_blocks: Vec<usize>,
}

impl Carry {
    /// Hands `pre` on as the next sublayer's collapse weights, giving back the old ones.
    pub fn shift(&mut self, pre: Vec<f32>, ws: &mut Workspace) {
        if let Some(old) = self.pre.replace(pre) {
            ws.give(old);
        }
    }

    pub fn recycle(self, ws: &mut Workspace) {
        if let Some(p) = self.pre {
            ws.give(p);
        }
        for v in [self.picks, self.n_picks, self.blocks, self.n_blocks] {
            ws.give_idx(v);
        }
    }
}
