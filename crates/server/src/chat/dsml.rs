//! DSML, DeepSeek's XML-like tool-call markup, in both directions (V4's spelling shown;
//! V4.1's has a space after `｜DSML｜` and `calls` for the block: [`Dsml`]).
//!
//! ```text
//! <｜DSML｜tool_calls>
//! <｜DSML｜invoke name="get_weather">
//! <｜DSML｜parameter name="city" string="true">杭州</｜DSML｜parameter>
//! <｜DSML｜parameter name="days" string="false">3</｜DSML｜parameter>
//! </｜DSML｜invoke>
//! </｜DSML｜tool_calls>
//! ```
//!
//! A string argument is written raw with `string="true"`; any other JSON value is written as
//! Python's `json.dumps` text with `string="false"`. Decoding turns an invoke body back into
//! an arguments JSON object (key order kept), tolerating what models get wrong: a missing
//! `string` attribute (JSON if it parses, else a string), a missing `</…parameter>` (the value
//! runs to the next parameter or the end of the invoke), ASCII `|` instead of `｜`.

use super::conversation::Call;
use super::json::{dict_insert, write_python_object, Json};
use super::markers::BARS;
use super::tokens::{Dsml, DSML, THINK_END, THINK_START};
use super::tools_prompt::TOOLS_TEMPLATE;
use super::ToolDef;

/// `"\n\n<｜DSML｜tool_calls>\n…\n</｜DSML｜tool_calls>"`, appended to an assistant turn's content.
pub(crate) fn encode_calls(calls: &[Call], dsml: &Dsml) -> String {
    let Dsml {
        block,
        invoke,
        parameter,
        ..
    } = dsml;
    let invokes: Vec<String> = calls
        .iter()
        .map(|call| {
            let params: Vec<String> = call
                .arguments
                .iter()
                .map(|(key, value)| {
                    let (is_str, text) = match value {
                        Json::Str(s) => ("true", s.clone()),
                        other => ("false", other.to_python_json()),
                    };
                    format!(
                        "<{DSML}{parameter} name=\"{key}\" string=\"{is_str}\">{text}</{DSML}{parameter}>"
                    )
                })
                .collect();
            format!(
                "<{DSML}{invoke} name=\"{}\">\n{}\n</{DSML}{invoke}>",
                call.name,
                params.join("\n")
            )
        })
        .collect();
    format!(
        "\n\n<{DSML}{block}>\n{}\n</{DSML}{block}>",
        invokes.join("\n")
    )
}

/// The "## Tools" section of the system prompt: instructions plus one JSON line per function,
/// serialised like vLLM's `FunctionDefinition.model_dump()`.
pub(crate) fn tools_section(tools: &[ToolDef], dsml: &Dsml) -> String {
    let schemas: Vec<String> = tools
        .iter()
        .map(|t| {
            let f = &t.function;
            let mut entries = vec![
                ("name".to_owned(), Json::Str(f.name.clone())),
                (
                    "description".to_owned(),
                    f.description.clone().map_or(Json::Null, Json::Str),
                ),
                (
                    "parameters".to_owned(),
                    f.parameters.clone().unwrap_or(Json::Null),
                ),
            ];
            if let Some(strict) = f.strict {
                entries.push(("strict".to_owned(), Json::Bool(strict)));
            }
            let mut out = String::new();
            write_python_object(entries.iter().map(|(k, v)| (k, v)), &mut out);
            out
        })
        .collect();
    TOOLS_TEMPLATE
        .replace("{dsml}", DSML)
        .replace("{block}", dsml.block)
        .replace("{invoke}", dsml.invoke)
        .replace("{parameter}", dsml.parameter)
        .replace("{think_start}", THINK_START)
        .replace("{think_end}", THINK_END)
        .replace("{tool_schemas}", &schemas.join("\n"))
}

/// Finds the earliest `<｜DSML｜{name}` / `</｜DSML｜{name}` (any bar spelling) at or after
/// `from`; returns (start, end) byte offsets of the match.
fn find_tag(text: &str, from: usize, closing: bool, name: &str) -> Option<(usize, usize)> {
    let open = if closing { "</" } else { "<" };
    let mut best: Option<(usize, usize)> = None;
    for a in BARS {
        for b in BARS {
            let lit = format!("{open}{a}DSML{b}{name}");
            if let Some(p) = text.get(from..).and_then(|t| t.find(&lit)) {
                let m = (from + p, from + p + lit.len());
                if best.is_none_or(|(s, _)| m.0 < s) {
                    best = Some(m);
                }
            }
        }
    }
    best
}

/// The value of attribute `key` in a tag's attribute text (`name="x" string="true"`), quoted
/// with `"`, `'` or curly quotes, or bare up to whitespace.
pub(crate) fn tag_attr(attrs: &str, key: &str) -> Option<String> {
    let mut search = 0;
    while let Some(p) = attrs.get(search..).and_then(|t| t.find(key)) {
        let start = search + p;
        search = start + key.len();
        let before_ok = attrs[..start]
            .chars()
            .next_back()
            .is_none_or(|c| c.is_whitespace());
        let rest = attrs[search..].trim_start();
        let Some(rest) = rest.strip_prefix('=').filter(|_| before_ok) else {
            continue;
        };
        let rest = rest.trim_start();
        let mut chars = rest.chars();
        return Some(match chars.next() {
            Some(q @ ('"' | '\'' | '“' | '”')) => {
                let close = if q == '“' { '”' } else { q };
                let body = chars.as_str();
                body.find(close).map_or(body, |e| &body[..e]).to_owned()
            }
            _ => rest
                .split(char::is_whitespace)
                .next()
                .unwrap_or("")
                .to_owned(),
        });
    }
    None
}

/// The arguments JSON object text of an invoke body (the text between the invoke tag's `>`
/// and `</…invoke>`). `truncated`: the output ended inside the invoke, so a trailing
/// parameter without its closing tag may be cut short — a non-string one is kept only if it
/// already parses as JSON.
pub(crate) fn invoke_arguments(body: &str, truncated: bool, dsml: &Dsml) -> String {
    let mut entries: Vec<(String, Json)> = Vec::new();
    let mut pos = 0;
    while let Some((_, tag_start)) = find_tag(body, pos, false, dsml.parameter) {
        let Some(gt) = body[tag_start..].find('>') else {
            break; // tag itself cut off
        };
        let attrs = &body[tag_start..tag_start + gt];
        let value_start = tag_start + gt + 1;
        let close = find_tag(body, value_start, true, dsml.parameter);
        let next = find_tag(body, value_start, false, dsml.parameter);
        let (value_end, resume, closed) = match (close, next) {
            (Some((cs, ce)), Some((ns, _))) if cs < ns => (cs, ce, true),
            (Some((cs, ce)), None) => (cs, ce, true),
            (_, Some((ns, _))) => (ns, ns, false),
            (None, None) => (body.len(), body.len(), false),
        };
        pos = resume;
        let Some(name) = tag_attr(attrs, "name") else {
            continue;
        };
        let raw = &body[value_start..value_end];
        let value = if tag_attr(attrs, "string").as_deref() == Some("true") {
            Json::Str(raw.to_owned())
        } else {
            match Json::parse(raw) {
                Ok(v) => v,
                Err(_) if truncated && !closed && resume == body.len() => continue,
                Err(_) => Json::Str(raw.to_owned()),
            }
        };
        dict_insert(&mut entries, name, value);
    }
    let mut out = String::new();
    write_python_object(entries.iter().map(|(k, v)| (k, v)), &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat::tokens::{DSML_V4, DSML_V41};

    #[test]
    fn arguments_from_body() {
        let body = "\n<｜DSML｜parameter name=\"city\" string=\"true\">杭州</｜DSML｜parameter>\n\
                    <｜DSML｜parameter name=\"n\" string=\"false\"> 3 </｜DSML｜parameter>\n\
                    <|DSML|parameter name=\"o\" string=\"false\">{\"b\":1,\"a\":[1.0]}</|DSML|parameter>\n";
        assert_eq!(
            invoke_arguments(body, false, &DSML_V4),
            r#"{"city": "杭州", "n": 3, "o": {"b": 1, "a": [1.0]}}"#
        );
    }

    #[test]
    fn spaced_parameters_of_v41() {
        let body =
            "\n<｜DSML｜ parameter name=\"city\" string=\"true\">杭州</｜DSML｜ parameter>\n\
                    <|DSML| parameter name=\"n\" string=\"false\">[3]</｜DSML｜ parameter>\n";
        assert_eq!(
            invoke_arguments(body, false, &DSML_V41),
            r#"{"city": "杭州", "n": [3]}"#
        );
        // V4's spelling is not a V4.1 parameter.
        let v4 = "<｜DSML｜parameter name=\"a\" string=\"true\">x</｜DSML｜parameter>";
        assert_eq!(invoke_arguments(v4, false, &DSML_V41), "{}");
    }

    #[test]
    fn tolerant_parameters() {
        // No string attribute, unparsable non-string value, missing close tags.
        let body = "<｜DSML｜parameter name=\"a\">[1, 2]</｜DSML｜parameter>\
                    <｜DSML｜parameter name=\"b\" string=\"false\">not json</｜DSML｜parameter>\
                    <｜DSML｜parameter name='c' string=\"true\">x\
                    <｜DSML｜parameter name=\"d\" string=\"true\">y";
        assert_eq!(
            invoke_arguments(body, false, &DSML_V4),
            r#"{"a": [1, 2], "b": "not json", "c": "x", "d": "y"}"#
        );
        let cut = "<｜DSML｜parameter name=\"a\" string=\"false\">[1, 2";
        assert_eq!(invoke_arguments(cut, true, &DSML_V4), "{}");
        assert_eq!(invoke_arguments(cut, false, &DSML_V4), r#"{"a": "[1, 2"}"#);
        assert_eq!(
            invoke_arguments("<｜DSML｜parameter name=\"a", true, &DSML_V4),
            "{}"
        );
    }

    #[test]
    fn attributes() {
        assert_eq!(tag_attr(" name=\"f\"", "name").as_deref(), Some("f"));
        assert_eq!(tag_attr(" name = 'f g'", "name").as_deref(), Some("f g"));
        assert_eq!(tag_attr(" name=“f”", "name").as_deref(), Some("f"));
        assert_eq!(
            tag_attr(" xname=\"f\" name=g", "name").as_deref(),
            Some("g")
        );
        assert_eq!(
            tag_attr(" name=\"unterminated", "name").as_deref(),
            Some("unterminated")
        );
        assert_eq!(tag_attr(" string=\"true\"", "name"), None);
    }
}
