//! A forced tool call (`tool_choice` `required` or a named function; Anthropic's `any` and
//! `tool`) as a grammar over the model family's DSML call format ([`Dsml`]), the arguments held to each
//! tool's schema: a parameter whose schema is a string is written `string="true"` as raw
//! text (one of its `enum` when it has one; within its `minLength`/`maxLength`; up to the
//! closing tag, which it cannot contain), any other `string="false"` as JSON matching its
//! schema (llguidance's `%json`), in the schema's property order, the required ones always.
//! This is what `render::encode_calls` writes and the chat parser reads back.

use super::grammar::{bounded_whitespace, Requested, Spec};
use crate::chat::tokens::{Dsml, DSML};
use crate::chat::{Json, ToolDef};
use crate::openai::ApiError;
use serde_json::Value;

/// Which calls the answer must make: at least one call of any offered tool (one only without
/// parallel calls), or exactly one call of the named one.
#[derive(Clone, Debug, PartialEq)]
pub enum Forced {
    Any { parallel: bool },
    Named(String),
}

/// The constraint of a forced call in `dsml`'s markup, named by `field` (the request's
/// `tool_choice`): a 400 when there are no tools, or none of the name asked for.
pub fn forced_call(
    tools: &[ToolDef],
    forced: &Forced,
    dsml: &Dsml,
    field: &str,
) -> Result<Requested, ApiError> {
    if tools.is_empty() {
        return Err(ApiError::invalid(
            field,
            "a tool call is forced, but the request offers no tools",
        ));
    }
    let spec = tool_call_grammar(tools, forced, dsml).ok_or_else(|| {
        let names: Vec<&str> = tools.iter().map(|t| t.function.name.as_str()).collect();
        ApiError::invalid(
            field,
            format!(
                "no offered tool has that name (the tools: {})",
                names.join(", ")
            ),
        )
    })?;
    Ok(Requested {
        spec,
        field: field.to_owned(),
    })
}

/// The grammar of a forced call; `None` names a tool that was not offered.
pub fn tool_call_grammar(tools: &[ToolDef], forced: &Forced, dsml: &Dsml) -> Option<Spec> {
    let Dsml {
        block,
        invoke,
        parameter,
        ..
    } = dsml;
    let lit = |s: &str| serde_json::to_string(s).expect("strings serialise");
    let mut rules = Vec::new();
    let mut invokes = Vec::new();
    for (i, t) in tools.iter().enumerate() {
        if let Forced::Named(n) = forced {
            if t.function.name != *n {
                continue;
            }
        }
        let params = parameters(t, i, parameter, &lit, &mut rules);
        let open = lit(&format!("<{DSML}{invoke} name=\"{}\">\n", t.function.name));
        let close = lit(&format!("</{DSML}{invoke}>"));
        rules.push(format!("invoke_{i}: {open} {params} {close}"));
        invokes.push(format!("invoke_{i}"));
    }
    if invokes.is_empty() {
        return None;
    }
    // Each call ends with its newline, so no literal is a prefix of another (the lexer
    // would otherwise have to choose between "\n" and "\n</…" before seeing the rest).
    let calls = match forced {
        Forced::Any { parallel: true } => "call+",
        _ => "call",
    };
    let start = lit(&format!("\n\n<{DSML}{block}>\n"));
    let end = lit(&format!("</{DSML}{block}>"));
    let mut lark = vec![
        format!("start: {start} {calls} {end}"),
        format!("call: ({}) \"\\n\"", invokes.join(" | ")),
    ];
    lark.extend(rules);
    Some(Spec::Lark(lark.join("\n")))
}

/// The parameter sequence of tool `i` (rules for each parameter appended to `rules`).
fn parameters(
    t: &ToolDef,
    i: usize,
    parameter: &str,
    lit: &dyn Fn(&str) -> String,
    rules: &mut Vec<String>,
) -> String {
    let schema = t.function.parameters.as_ref().map(Json::to_python_json);
    let schema: Value = schema
        .and_then(|s| serde_json::from_str(&s).ok())
        .unwrap_or(Value::Null);
    let props = schema.get("properties").and_then(Value::as_object);
    // The properties in the order the client sent them (the Json keeps it; a Value does not).
    let order: Vec<String> = match &t.function.parameters {
        Some(Json::Object(entries)) => entries
            .iter()
            .find(|(k, _)| k == "properties")
            .and_then(|(_, v)| match v {
                Json::Object(p) => Some(p.iter().map(|(k, _)| k.clone()).collect()),
                _ => None,
            })
            .unwrap_or_default(),
        _ => Vec::new(),
    };
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let mut seq = Vec::new();
    for (j, name) in order.iter().enumerate() {
        let Some(prop) = props.and_then(|p| p.get(name)) else {
            continue;
        };
        let rule = format!("p_{i}_{j}");
        let is_string = prop.get("type").and_then(Value::as_str) == Some("string");
        let open = lit(&format!(
            "<{DSML}{parameter} name=\"{name}\" string=\"{is_string}\">"
        ));
        let close = lit(&format!("</{DSML}{parameter}>"));
        // A string's text runs to the closing tag (the rule's stop, which it consumes).
        let body = if !is_string {
            format!("%json {} {close}", bounded_whitespace(prop))
        } else if let Some(choices) = prop.get("enum").and_then(Value::as_array) {
            let alts: Vec<String> = choices.iter().filter_map(Value::as_str).map(lit).collect();
            format!("({}) {close}", alts.join(" | "))
        } else {
            // Its length bounds, when the schema gives them, bound the text.
            let len = |k: &str| prop.get(k).and_then(Value::as_u64);
            let body = match (len("minLength"), len("maxLength")) {
                (None, None) => "*".to_owned(),
                (min, max) => format!(
                    "{{{},{}}}",
                    min.unwrap_or(0),
                    max.map_or(String::new(), |m| m.to_string())
                ),
            };
            let text = format!("t_{i}_{j}");
            rules.push(format!("{text}[suffix={close}]: /(?s:.{body})/"));
            text
        };
        rules.push(format!("{rule}: {open} {body} \"\\n\""));
        let optional = !required.contains(&name.as_str());
        seq.push(if optional { format!("{rule}?") } else { rule });
    }
    // Each parameter ends with a newline, so optional ones drop out cleanly (none: nothing).
    seq.join(" ")
}
