//! `logit_bias`: a JSON object from token ids (as strings) to biases, read into one entry per
//! token id. `"5"` and `"05"` are the same token: as when a JSON object repeats a key, the
//! later entry wins (vLLM reads the object into a dict keyed by `int(key)`, which does the
//! same). The map is bounded while it is read, so a body of a million keys costs a parse, not
//! a million-entry map per choice.

use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::fmt;

/// Most distinct token ids one `logit_bias` may name. OpenAI documents no number; vLLM
/// checks only that the ids are in the vocabulary. 1024 entries bias or ban a large word
/// list while keeping each request's table small.
pub const MAX_LOGIT_BIAS: usize = 1024;

/// A normalised `logit_bias`: token id → bias, at most [`MAX_LOGIT_BIAS`] entries.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct LogitBias(pub BTreeMap<u32, f32>);

impl<'de> Deserialize<'de> for LogitBias {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(LogitBiasVisitor)
    }
}

struct LogitBiasVisitor;

impl<'de> Visitor<'de> for LogitBiasVisitor {
    type Value = LogitBias;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an object mapping token ids to biases")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<LogitBias, A::Error> {
        let mut out = BTreeMap::new();
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            let id = parse_id(&key).ok_or_else(|| {
                de::Error::custom(format!(
                    "`logit_bias` keys must be token ids, got {:?}",
                    truncated(&key)
                ))
            })?;
            let bias: f32 = map.next_value()?;
            out.insert(id, bias);
            if out.len() > MAX_LOGIT_BIAS {
                return Err(de::Error::custom(format!(
                    "`logit_bias` may name at most {MAX_LOGIT_BIAS} token ids"
                )));
            }
        }
        Ok(LogitBias(out))
    }
}

/// A decimal token id: digits only (leading zeros allowed), within u32.
fn parse_id(key: &str) -> Option<u32> {
    if key.is_empty() || !key.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let digits = key.trim_start_matches('0');
    if digits.is_empty() {
        return Some(0);
    }
    digits.parse().ok()
}

/// A key as quoted in an error: its first 40 characters.
fn truncated(key: &str) -> String {
    match key.char_indices().nth(40) {
        Some((at, _)) => format!("{}…", &key[..at]),
        None => key.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Result<LogitBias, String> {
        serde_json::from_str(json).map_err(|e| e.to_string())
    }

    #[test]
    fn keys_that_spell_one_id_are_one_entry_and_the_last_wins() {
        let b = parse(r#"{"5": 1, "05": 2, "0005": 3, "7": -1}"#).unwrap();
        assert_eq!(b.0, BTreeMap::from([(5, 3.0), (7, -1.0)]));
        assert_eq!(
            parse(r#"{"000": 1}"#).unwrap().0,
            BTreeMap::from([(0, 1.0)])
        );
        let long_zeros = format!(r#"{{"{}9": 1}}"#, "0".repeat(100));
        assert_eq!(parse(&long_zeros).unwrap().0, BTreeMap::from([(9, 1.0)]));
    }

    #[test]
    fn bad_keys_and_too_many_ids_are_refused() {
        for bad in [
            r#"{"x": 1}"#,
            r#"{"-1": 1}"#,
            r#"{"+1": 1}"#,
            r#"{"": 1}"#,
            r#"{"4294967296": 1}"#,
        ] {
            assert!(parse(bad).unwrap_err().contains("token ids"), "{bad}");
        }
        let many: String = (0..=MAX_LOGIT_BIAS)
            .map(|i| format!("\"{i}\": 1"))
            .collect::<Vec<_>>()
            .join(",");
        assert!(parse(&format!("{{{many}}}"))
            .unwrap_err()
            .contains("at most"));
        // Repeats of one id do not count twice.
        let repeats: String = (0..5000)
            .map(|i| format!("\"{}7\": 1", "0".repeat(i % 50)))
            .collect::<Vec<_>>()
            .join(",");
        assert_eq!(parse(&format!("{{{repeats}}}")).unwrap().0.len(), 1);
    }
}
