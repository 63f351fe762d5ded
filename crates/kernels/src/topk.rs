//! Top-k selection with a deterministic tie rule (lower index wins), so that equal scores
//! never make the result depend on the batch or the thread count.

/// Indices of the `k` largest values, best first; NaN-free input assumed (NaN sorts last).
pub fn topk_indices(values: &[f32], k: usize) -> Vec<usize> {
    let mut idx = Vec::new();
    topk_into(values, k, &mut idx);
    idx
}

/// [`topk_indices`] into a reused buffer (`idx` ends up holding exactly the `k` picks).
pub fn topk_into(values: &[f32], k: usize, idx: &mut Vec<usize>) {
    let k = k.min(values.len());
    idx.clear();
    idx.extend(0..values.len());
    let cmp = |a: &usize, b: &usize| {
        values[*b]
            .partial_cmp(&values[*a])
            .unwrap_or_else(|| values[*a].is_nan().cmp(&values[*b].is_nan()))
            .then(a.cmp(b))
    };
    if k < idx.len() && k > 0 {
        idx.select_nth_unstable_by(k - 1, cmp);
    }
    idx.truncate(k);
    // The order is total (ties broken by index), so the unstable sort is exact and, unlike
    // the stable one, allocates nothing.
    idx.sort_unstable_by(cmp);
}

/// Index of the largest value, lowest index on ties (greedy decoding's argmax).
pub fn argmax(values: &[f32]) -> usize {
    let mut best = 0;
    for (i, v) in values.iter().enumerate() {
        if *v > values[best] {
            best = i;
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ties_prefer_lower_index() {
        let v = [1.0, 3.0, 3.0, 2.0, 3.0];
        assert_eq!(topk_indices(&v, 2), vec![1, 2]);
        assert_eq!(topk_indices(&v, 4), vec![1, 2, 4, 3]);
        assert_eq!(topk_indices(&v, 9).len(), 5);
        assert_eq!(argmax(&v), 1);
        assert!(topk_indices(&v, 0).is_empty());
    }
}
