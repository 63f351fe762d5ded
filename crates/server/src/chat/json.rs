//! An order-preserving JSON value with Python-compatible serialisation.
//!
//! The DeepSeek-V4 prompt embeds JSON written by Python's `json.dumps(v, ensure_ascii=False)`:
//! tool schemas in the "## Tools" section and non-string tool-call arguments. For the prompt to
//! be byte-identical to the reference encoder we must (a) keep object keys in the order the
//! client sent them — `serde_json::Value` sorts them unless the workspace-wide `preserve_order`
//! feature is on — and (b) print the way Python does: `", "` / `": "` separators, floats as
//! `repr(float)` (`1.0`, `1e-07`, `1e+16`), integers exactly, non-ASCII characters unescaped.
//! The same printer builds the arguments JSON of parsed tool calls, as vLLM does.

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use std::fmt::{self, Write as _};

/// Nesting deeper than this is rejected (the parser is recursive; client input is arbitrary).
const MAX_DEPTH: usize = 256;

/// A JSON value that remembers object key order and the exact digits of integers.
#[derive(Debug, Clone, PartialEq)]
pub enum Json {
    Null,
    Bool(bool),
    /// An integer literal (Python `int`): optional `-` and decimal digits, no leading zeros.
    Int(String),
    /// A number with a fraction or exponent (Python `float`).
    Float(f64),
    Str(String),
    Array(Vec<Json>),
    /// Entries in document order; a repeated key keeps its first position and its last value.
    Object(Vec<(String, Json)>),
}

impl Json {
    /// Parses one JSON document (surrounding whitespace allowed), as Python's `json.loads`
    /// would, except that `NaN`/`Infinity` literals and lone surrogate escapes are rejected.
    pub fn parse(text: &str) -> Result<Json, String> {
        let mut p = Parser {
            s: text.as_bytes(),
            text,
            pos: 0,
        };
        p.skip_ws();
        let v = p.value(0)?;
        p.skip_ws();
        if p.pos != p.s.len() {
            return Err(format!("trailing characters at offset {}", p.pos));
        }
        Ok(v)
    }

    /// `json.dumps(self, ensure_ascii=False)`.
    pub fn to_python_json(&self) -> String {
        let mut out = String::new();
        self.write_python(&mut out);
        out
    }

    fn write_python(&self, out: &mut String) {
        match self {
            Json::Null => out.push_str("null"),
            Json::Bool(true) => out.push_str("true"),
            Json::Bool(false) => out.push_str("false"),
            Json::Int(digits) => out.push_str(digits),
            Json::Float(x) => out.push_str(&python_float_repr(*x)),
            Json::Str(s) => write_python_str(s, out),
            Json::Array(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    item.write_python(out);
                }
                out.push(']');
            }
            Json::Object(entries) => write_python_object(entries.iter().map(|(k, v)| (k, v)), out),
        }
    }
}

/// Writes `{"k": v, ...}` in Python style.
pub(crate) fn write_python_object<'a>(
    entries: impl Iterator<Item = (&'a String, &'a Json)>,
    out: &mut String,
) {
    out.push('{');
    for (i, (k, v)) in entries.enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        write_python_str(k, out);
        out.push_str(": ");
        v.write_python(out);
    }
    out.push('}');
}

/// Inserts like a Python dict: a repeated key keeps its first position and takes the new value.
pub(crate) fn dict_insert(entries: &mut Vec<(String, Json)>, key: String, value: Json) {
    match entries.iter_mut().find(|(k, _)| *k == key) {
        Some(slot) => slot.1 = value,
        None => entries.push((key, value)),
    }
}

/// A JSON string literal as Python's encoder writes it with `ensure_ascii=False`.
pub(crate) fn write_python_str(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Python's `repr(float)`: the shortest round-trip digits, fixed notation for decimal
/// exponents in [-4, 16), otherwise `d.ddde±XX`; `Infinity`/`NaN` as `json.dumps` writes them.
pub fn python_float_repr(x: f64) -> String {
    if x.is_nan() {
        return "NaN".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    // Rust's `{:e}` is the shortest round-trip form too: "-1.2345e-7", "0e0".
    let sci = format!("{x:e}");
    let (negative, sci) = match sci.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, sci.as_str()),
    };
    let (mantissa, exp) = sci.split_once('e').unwrap_or((sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let mut out = String::new();
    if negative {
        out.push('-');
    }
    if !(-4..16).contains(&exp) {
        out.push_str(&digits[..1]);
        if digits.len() > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        let sign = if exp < 0 { '-' } else { '+' };
        let _ = write!(out, "e{sign}{:02}", exp.unsigned_abs());
    } else if exp >= 0 {
        let int_len = exp as usize + 1;
        if digits.len() <= int_len {
            out.push_str(&digits);
            out.extend(std::iter::repeat_n('0', int_len - digits.len()));
            out.push_str(".0");
        } else {
            out.push_str(&digits[..int_len]);
            out.push('.');
            out.push_str(&digits[int_len..]);
        }
    } else {
        out.push_str("0.");
        out.extend(std::iter::repeat_n('0', (-exp - 1) as usize));
        out.push_str(&digits);
    }
    out
}

struct Parser<'a> {
    s: &'a [u8],
    text: &'a str,
    pos: usize,
}

impl Parser<'_> {
    fn skip_ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.s.get(self.pos) {
            self.pos += 1;
        }
    }

    fn err<T>(&self, what: &str) -> Result<T, String> {
        Err(format!("{what} at offset {}", self.pos))
    }

    fn eat(&mut self, lit: &str) -> bool {
        if self.s[self.pos..].starts_with(lit.as_bytes()) {
            self.pos += lit.len();
            true
        } else {
            false
        }
    }

    fn value(&mut self, depth: usize) -> Result<Json, String> {
        if depth > MAX_DEPTH {
            return self.err("nesting too deep");
        }
        match self.s.get(self.pos) {
            None => self.err("unexpected end of input"),
            Some(b'{') => self.object(depth),
            Some(b'[') => self.array(depth),
            Some(b'"') => Ok(Json::Str(self.string()?)),
            Some(b'-' | b'0'..=b'9') => self.number(),
            Some(_) if self.eat("null") => Ok(Json::Null),
            Some(_) if self.eat("true") => Ok(Json::Bool(true)),
            Some(_) if self.eat("false") => Ok(Json::Bool(false)),
            Some(_) => self.err("expected a value"),
        }
    }

    fn object(&mut self, depth: usize) -> Result<Json, String> {
        self.pos += 1;
        let mut entries = Vec::new();
        self.skip_ws();
        if self.eat("}") {
            return Ok(Json::Object(entries));
        }
        loop {
            self.skip_ws();
            if self.s.get(self.pos) != Some(&b'"') {
                return self.err("expected a string key");
            }
            let key = self.string()?;
            self.skip_ws();
            if !self.eat(":") {
                return self.err("expected ':'");
            }
            self.skip_ws();
            let value = self.value(depth + 1)?;
            dict_insert(&mut entries, key, value);
            self.skip_ws();
            if self.eat("}") {
                return Ok(Json::Object(entries));
            }
            if !self.eat(",") {
                return self.err("expected ',' or '}'");
            }
        }
    }

    fn array(&mut self, depth: usize) -> Result<Json, String> {
        self.pos += 1;
        let mut items = Vec::new();
        self.skip_ws();
        if self.eat("]") {
            return Ok(Json::Array(items));
        }
        loop {
            self.skip_ws();
            items.push(self.value(depth + 1)?);
            self.skip_ws();
            if self.eat("]") {
                return Ok(Json::Array(items));
            }
            if !self.eat(",") {
                return self.err("expected ',' or ']'");
            }
        }
    }

    fn number(&mut self) -> Result<Json, String> {
        let start = self.pos;
        let digits = |p: &mut Self| {
            let from = p.pos;
            while let Some(b'0'..=b'9') = p.s.get(p.pos) {
                p.pos += 1;
            }
            p.pos - from
        };
        self.eat("-");
        let int_start = self.pos;
        let n = digits(self);
        if n == 0 || (n > 1 && self.s[int_start] == b'0') {
            return self.err("invalid number");
        }
        let mut is_float = false;
        if self.eat(".") {
            is_float = true;
            if digits(self) == 0 {
                return self.err("invalid number");
            }
        }
        if let Some(b'e' | b'E') = self.s.get(self.pos) {
            is_float = true;
            self.pos += 1;
            if let Some(b'+' | b'-') = self.s.get(self.pos) {
                self.pos += 1;
            }
            if digits(self) == 0 {
                return self.err("invalid number");
            }
        }
        let lit = &self.text[start..self.pos];
        if is_float {
            lit.parse::<f64>()
                .map(Json::Float)
                .or_else(|_| self.err("invalid number"))
        } else if lit.trim_start_matches('-').bytes().all(|b| b == b'0') {
            Ok(Json::Int("0".into())) // Python: int("-0") == 0
        } else {
            Ok(Json::Int(lit.to_owned()))
        }
    }

    fn hex4(&mut self) -> Result<u32, String> {
        let hex = self.s.get(self.pos..self.pos + 4).unwrap_or_default();
        let text = std::str::from_utf8(hex).unwrap_or("");
        match (text.len(), u32::from_str_radix(text, 16)) {
            (4, Ok(v)) if text.bytes().all(|b| b.is_ascii_hexdigit()) => {
                self.pos += 4;
                Ok(v)
            }
            _ => self.err("invalid \\u escape"),
        }
    }

    fn string(&mut self) -> Result<String, String> {
        self.pos += 1; // opening quote
        let mut out = String::new();
        loop {
            let run_start = self.pos;
            while let Some(&b) = self.s.get(self.pos) {
                if b == b'"' || b == b'\\' || b < 0x20 {
                    break;
                }
                self.pos += 1;
            }
            // Breaks only at ASCII bytes, so the run is on char boundaries.
            out.push_str(&self.text[run_start..self.pos]);
            match self.s.get(self.pos) {
                None => return self.err("unterminated string"),
                Some(b'"') => {
                    self.pos += 1;
                    return Ok(out);
                }
                Some(b'\\') => {
                    self.pos += 1;
                    let esc = self.s.get(self.pos).copied();
                    self.pos += 1;
                    match esc {
                        Some(b'"') => out.push('"'),
                        Some(b'\\') => out.push('\\'),
                        Some(b'/') => out.push('/'),
                        Some(b'b') => out.push('\u{08}'),
                        Some(b'f') => out.push('\u{0c}'),
                        Some(b'n') => out.push('\n'),
                        Some(b'r') => out.push('\r'),
                        Some(b't') => out.push('\t'),
                        Some(b'u') => {
                            let hi = self.hex4()?;
                            let code = if (0xD800..0xDC00).contains(&hi) {
                                if !self.eat("\\u") {
                                    return self.err("lone surrogate");
                                }
                                let lo = self.hex4()?;
                                if !(0xDC00..0xE000).contains(&lo) {
                                    return self.err("lone surrogate");
                                }
                                0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00)
                            } else {
                                hi
                            };
                            match char::from_u32(code) {
                                Some(c) => out.push(c),
                                None => return self.err("lone surrogate"),
                            }
                        }
                        _ => {
                            self.pos -= 1;
                            return self.err("invalid escape");
                        }
                    }
                }
                Some(_) => return self.err("control character in string"),
            }
        }
    }
}

/// Deserialises from any serde format while keeping map order (serde hands map entries to the
/// visitor in document order). Integers beyond 64 bits arrive from `serde_json` as floats.
impl<'de> Deserialize<'de> for Json {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(JsonVisitor)
    }
}

struct JsonVisitor;

impl<'de> Visitor<'de> for JsonVisitor {
    type Value = Json;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_unit<E: de::Error>(self) -> Result<Json, E> {
        Ok(Json::Null)
    }
    fn visit_none<E: de::Error>(self) -> Result<Json, E> {
        Ok(Json::Null)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Json, D::Error> {
        Json::deserialize(d)
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Json, E> {
        Ok(Json::Bool(v))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Json, E> {
        Ok(Json::Int(v.to_string()))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Json, E> {
        Ok(Json::Int(v.to_string()))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Json, E> {
        Ok(Json::Float(v))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Json, E> {
        Ok(Json::Str(v.to_owned()))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<Json, E> {
        Ok(Json::Str(v))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Json, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element::<Json>()? {
            items.push(item);
        }
        Ok(Json::Array(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Json, A::Error> {
        let mut entries = Vec::new();
        while let Some((k, v)) = map.next_entry::<String, Json>()? {
            dict_insert(&mut entries, k, v);
        }
        Ok(Json::Object(entries))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn float_repr_matches_python() {
        let cases = [
            (1.0, "1.0"),
            (-0.0, "-0.0"),
            (0.0, "0.0"),
            (1.5, "1.5"),
            (100000.0, "100000.0"),
            (1e15, "1000000000000000.0"),
            (1e16, "1e+16"),
            (1.5e16, "1.5e+16"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (1.5e-7, "1.5e-07"),
            (1e100, "1e+100"),
            (0.1, "0.1"),
            (2.71, "2.71"),
            (-2.5e-5, "-2.5e-05"),
            (123456789.125, "123456789.125"),
        ];
        for (x, want) in cases {
            assert_eq!(python_float_repr(x), want, "{x}");
        }
    }

    #[test]
    fn parse_keeps_order_and_prints_python_style() {
        let v = Json::parse(
            r#" {"b": [1, 2.0, -0, 1e2], "a": {"z": null, "y": true}, "s": "é\n\u0001\"x"} "#,
        )
        .unwrap();
        assert_eq!(
            v.to_python_json(),
            r#"{"b": [1, 2.0, 0, 100.0], "a": {"z": null, "y": true}, "s": "é\n\u0001\"x"}"#
        );
        let big = Json::parse("123456789012345678901234567890").unwrap();
        assert_eq!(big.to_python_json(), "123456789012345678901234567890");
        let dup = Json::parse(r#"{"a": 1, "b": 2, "a": 3}"#).unwrap();
        assert_eq!(dup.to_python_json(), r#"{"a": 3, "b": 2}"#);
        assert_eq!(
            Json::parse(r#""\ud83d\ude00""#).unwrap(),
            Json::Str("😀".into())
        );
    }

    #[test]
    fn parse_rejects_bad_input_without_panicking() {
        for bad in [
            "",
            "{",
            "[1,",
            "01",
            "1.",
            "-",
            "\"abc",
            "{\"a\" 1}",
            "nul",
            "[1]x",
            "\"\\ud800\"",
            "\"\\u12\"",
            "\"\\x\"",
            "NaN",
            "{1: 2}",
            "\"\u{1}\"",
        ] {
            assert!(Json::parse(bad).is_err(), "{bad:?}");
        }
        let deep = "[".repeat(10_000);
        assert!(Json::parse(&deep).is_err());
    }

    #[test]
    fn deserialize_keeps_order() {
        let v: Json = serde_json::from_str(r#"{"z": 1, "a": [1.5, "x"], "m": {}}"#).unwrap();
        assert_eq!(v.to_python_json(), r#"{"z": 1, "a": [1.5, "x"], "m": {}}"#);
    }
}
