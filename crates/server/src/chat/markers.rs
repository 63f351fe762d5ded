//! The markers the output parser looks for, with the misspellings models produce, and the two
//! queries a streaming scanner needs: where is the first marker, and how much of the buffer's
//! tail could still grow into one (and so must not be emitted yet).
//!
//! Each family's spellings come from its [`Dsml`] (the block names it tolerates, either bar
//! of `｜DSML｜` written as ASCII `|`).

use super::tokens::Dsml;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Marker {
    ThinkStart,
    ThinkEnd,
    /// `<｜DSML｜tool_calls>` and variants.
    ToolsStart,
    /// `</｜DSML｜tool_calls>` and variants.
    ToolsEnd,
    /// `<｜DSML｜invoke` — the tag continues with attributes up to `>`.
    InvokeStart,
    /// `</｜DSML｜invoke>`.
    InvokeEnd,
}

pub(crate) const BARS: [&str; 2] = ["｜", "|"];

/// Every literal spelling of every marker of `dsml`'s family.
fn literals(dsml: &Dsml) -> &[(Marker, String)] {
    dsml.literals.get_or_init(|| {
        let mut v = vec![
            (Marker::ThinkStart, "<think>".to_owned()),
            (Marker::ThinkEnd, "</think>".to_owned()),
        ];
        for a in BARS {
            for b in BARS {
                let tag = format!("{a}DSML{b}");
                for name in dsml.parsed_blocks {
                    v.push((Marker::ToolsStart, format!("<{tag}{name}>")));
                    v.push((Marker::ToolsEnd, format!("</{tag}{name}>")));
                }
                v.push((Marker::InvokeStart, format!("<{tag}{}", dsml.invoke)));
                v.push((Marker::InvokeEnd, format!("</{tag}{}>", dsml.invoke)));
            }
        }
        v
    })
}

/// A found marker: byte range in the searched text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Found {
    pub marker: Marker,
    pub start: usize,
    pub end: usize,
}

/// The earliest marker of the `wanted` kinds in `text[from..]` (the longest spelling wins a
/// tie). `from` must be a char boundary.
pub(crate) fn find_first(dsml: &Dsml, text: &str, from: usize, wanted: &[Marker]) -> Option<Found> {
    let hay = text.get(from..)?;
    // Every literal starts with '<': only look where one is.
    for (rel, _) in hay.match_indices('<') {
        let rest = &hay[rel..];
        let best = literals(dsml)
            .iter()
            .filter(|(m, lit)| wanted.contains(m) && rest.starts_with(lit.as_str()))
            .max_by_key(|(_, lit)| lit.len());
        if let Some((marker, lit)) = best {
            let start = from + rel;
            return Some(Found {
                marker: *marker,
                start,
                end: start + lit.len(),
            });
        }
    }
    None
}

/// Length of the longest tail of `text` that is a proper prefix of a `wanted` literal — text
/// that may still become a marker when more output arrives.
pub(crate) fn held_tail(dsml: &Dsml, text: &str, wanted: &[Marker]) -> usize {
    const MAX_LITERAL: usize = 32; // longest spelling is 26 bytes
    let window_start = text.len().saturating_sub(MAX_LITERAL);
    for (p, _) in text.match_indices('<').filter(|(p, _)| *p >= window_start) {
        let tail = &text[p..];
        let can_grow = literals(dsml)
            .iter()
            .any(|(m, lit)| wanted.contains(m) && lit.len() > tail.len() && lit.starts_with(tail));
        if can_grow {
            return text.len() - p;
        }
    }
    0
}

#[cfg(test)]
mod tests {
    use super::super::tokens::{DSML_V4, DSML_V41};
    use super::*;
    use Marker::*;

    #[test]
    fn finds_earliest_and_holds_prefixes() {
        let all = [
            ThinkStart,
            ThinkEnd,
            ToolsStart,
            ToolsEnd,
            InvokeStart,
            InvokeEnd,
        ];
        let f = find_first(&DSML_V4, "ab</think>c<｜DSML｜toolcalls>", 0, &all).unwrap();
        assert_eq!((f.marker, f.start, f.end), (ThinkEnd, 2, 10));
        let f = find_first(&DSML_V4, "ab</think>c<|DSML|tool_calls>", 3, &all).unwrap();
        assert_eq!((f.marker, f.start), (ToolsStart, 11));
        assert_eq!(find_first(&DSML_V4, "a<b <thin", 0, &all), None);
        assert_eq!(held_tail(&DSML_V4, "hello <thi", &all), 4);
        assert_eq!(held_tail(&DSML_V4, "hello <｜DS", &all), "<｜DS".len());
        assert_eq!(held_tail(&DSML_V4, "hello <｜DSML｜x", &all), 0);
        assert_eq!(held_tail(&DSML_V4, "x<", &all), 1);
        assert_eq!(held_tail(&DSML_V4, "x</think", &[ThinkStart]), 0);
        assert_eq!(held_tail(&DSML_V4, "x<think>", &all), 0); // complete, not a proper prefix
        for dsml in [&DSML_V4, &DSML_V41] {
            assert!(literals(dsml).iter().all(|(_, l)| l.len() <= 32));
        }
        // V4.1's spaced spelling is its own; V4's is not V4.1's.
        let f = find_first(&DSML_V41, "a<｜DSML｜ calls>", 0, &all).unwrap();
        assert_eq!((f.marker, f.start), (ToolsStart, 1));
        assert_eq!(
            find_first(&DSML_V41, "a<｜DSML｜tool_calls>", 0, &all),
            None
        );
        assert_eq!(find_first(&DSML_V4, "a<｜DSML｜ calls>", 0, &all), None);
        let f = find_first(&DSML_V41, "x</|DSML| invoke>", 0, &all).unwrap();
        assert_eq!(f.marker, InvokeEnd);
        assert_eq!(
            held_tail(&DSML_V41, "x<｜DSML｜ inv", &all),
            "<｜DSML｜ inv".len()
        );
    }
}
