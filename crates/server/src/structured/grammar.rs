//! What a request asks its output to follow, in every API family's words, and its grammar.
//!
//! * OpenAI: `response_format` `{"type": "json_object"}` or `{"type": "json_schema",
//!   "json_schema": {"schema": …}}`; vLLM's `structured_outputs` (`json`, `regex`, `choice`,
//!   `grammar`, `json_object`) and its older `guided_json` / `guided_regex` /
//!   `guided_choice` / `guided_grammar` fields.
//! * Responses: `text.format` `{"type": "json_schema", "schema": …}` or `json_object`.
//! * Anthropic: `output_config.format` (or the beta's `output_format`) `{"type":
//!   "json_schema", "schema": …}`.
//!
//! A grammar (vLLM's `guided_grammar`) is llguidance's Lark dialect. Every spec is bounded:
//! its text at most [`MAX_SPEC_BYTES`], its compilation by llguidance's fuel limits; what
//! the library refuses is a 400 naming the field.

use crate::openai::ApiError;
use serde::Deserialize;
use serde_json::{json, Value};

/// The largest schema, regex, choice list or grammar a request may give (its JSON text).
pub const MAX_SPEC_BYTES: usize = 256 << 10;

/// The most choices a `choice` constraint may list.
pub const MAX_CHOICES: usize = 1024;

/// What the output must be.
#[derive(Debug, Clone, PartialEq)]
pub enum Spec {
    /// A JSON value matching the schema (`{"type": "object"}` for `json_object`).
    JsonSchema(Value),
    Regex(String),
    /// Exactly one of these strings.
    Choice(Vec<String>),
    /// A grammar in llguidance's Lark dialect.
    Lark(String),
}

/// A spec and the request field it came from (named in errors).
#[derive(Debug, Clone, PartialEq)]
pub struct Requested {
    pub spec: Spec,
    pub field: String,
}

/// vLLM's structured-output fields (on Chat Completions and Completions).
#[derive(Deserialize, Debug, Default)]
pub struct VllmFields {
    pub structured_outputs: Option<Value>,
    pub guided_json: Option<Value>,
    pub guided_regex: Option<Value>,
    pub guided_choice: Option<Value>,
    pub guided_grammar: Option<Value>,
    pub response_format: Option<Value>,
}

impl VllmFields {
    /// The one constraint these fields ask for, if any (two at once are refused).
    pub fn requested(&self) -> Result<Option<Requested>, ApiError> {
        let mut found: Vec<Requested> = Vec::new();
        if let Some(rf) = &self.response_format {
            found.extend(openai_format(rf, "response_format")?);
        }
        let legacy = [
            ("guided_json", &self.guided_json),
            ("guided_regex", &self.guided_regex),
            ("guided_choice", &self.guided_choice),
            ("guided_grammar", &self.guided_grammar),
        ];
        for (field, v) in legacy {
            if let Some(v) = v.as_ref().filter(|v| !v.is_null()) {
                let kind = field.trim_start_matches("guided_");
                found.push(vllm_spec(kind, v, field)?);
            }
        }
        if let Some(so) = self.structured_outputs.as_ref().filter(|v| !v.is_null()) {
            let Some(map) = so.as_object() else {
                return Err(ApiError::invalid(
                    "structured_outputs",
                    "`structured_outputs` must be an object",
                ));
            };
            for (kind, v) in map
                .iter()
                .filter(|(_, v)| !v.is_null() && **v != json!(false))
            {
                let field = format!("structured_outputs.{kind}");
                match kind.as_str() {
                    "json" | "regex" | "choice" | "grammar" => found.push(vllm_spec(kind, v, &field)?),
                    "json_object" => found.push(Requested {
                        spec: Spec::JsonSchema(json!({"type": "object"})),
                        field,
                    }),
                    // Settings of vLLM's backends, not constraints.
                    "disable_any_whitespace" | "disable_additional_properties" | "whitespace_pattern"
                    | "backend" | "disable_fallback" => {}
                    _ => {
                        return Err(ApiError::invalid(
                            field,
                            "unknown structured output kind (json, regex, choice, grammar or json_object)",
                        ))
                    }
                }
            }
        }
        one_of(found)
    }
}

/// At most one constraint per request.
pub fn one_of(found: Vec<Requested>) -> Result<Option<Requested>, ApiError> {
    if found.len() > 1 {
        let names: Vec<&str> = found.iter().map(|r| r.field.as_str()).collect();
        return Err(ApiError::invalid(
            found[1].field.clone(),
            format!(
                "only one structured output constraint may be given, got {}",
                names.join(" and ")
            ),
        ));
    }
    Ok(found.into_iter().next())
}

fn vllm_spec(kind: &str, v: &Value, field: &str) -> Result<Requested, ApiError> {
    let bad = |what: &str| ApiError::invalid(field, format!("`{field}` must be {what}"));
    let spec = match kind {
        // vLLM takes the schema as an object or as its JSON text.
        "json" => match v {
            Value::String(s) => Spec::JsonSchema(serde_json::from_str(s).map_err(|e| {
                ApiError::invalid(field, format!("`{field}` is not a JSON schema: {e}"))
            })?),
            Value::Object(_) | Value::Bool(_) => Spec::JsonSchema(v.clone()),
            _ => return Err(bad("a JSON schema")),
        },
        "regex" => Spec::Regex(v.as_str().ok_or_else(|| bad("a string"))?.to_owned()),
        "grammar" => Spec::Lark(v.as_str().ok_or_else(|| bad("a string"))?.to_owned()),
        "choice" => {
            let items = v.as_array().ok_or_else(|| bad("a list of strings"))?;
            let choices = items
                .iter()
                .map(|c| c.as_str().map(str::to_owned))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| bad("a list of strings"))?;
            if choices.is_empty() || choices.len() > MAX_CHOICES {
                return Err(bad(&format!("a list of 1 to {MAX_CHOICES} strings")));
            }
            Spec::Choice(choices)
        }
        _ => unreachable!("callers pass known kinds"),
    };
    Ok(Requested {
        spec,
        field: field.to_owned(),
    })
}

/// OpenAI's `response_format` (Chat Completions' shape: the schema under `json_schema`).
pub fn openai_format(rf: &Value, field: &str) -> Result<Option<Requested>, ApiError> {
    if rf.is_null() {
        return Ok(None);
    }
    let spec = match rf.get("type").and_then(Value::as_str) {
        Some("text") => return Ok(None),
        Some("json_object") => Spec::JsonSchema(json!({"type": "object"})),
        Some("json_schema") => {
            let schema = rf
                .get("json_schema")
                .and_then(|j| j.get("schema"))
                .filter(|s| s.is_object() || s.is_boolean())
                .ok_or_else(|| {
                    ApiError::invalid(format!("{field}.json_schema.schema"), "a `json_schema` response format needs `json_schema.schema`, a JSON schema object")
                })?;
            Spec::JsonSchema(schema.clone())
        }
        _ => {
            return Err(ApiError::invalid(
                format!("{field}.type"),
                "the response format must be \"text\", \"json_object\" or \"json_schema\"",
            ))
        }
    };
    Ok(Some(Requested {
        spec,
        field: field.to_owned(),
    }))
}

/// A format with the schema beside its type (Responses' `text.format`, Anthropic's
/// `output_config.format`): `{"type": "json_schema", "schema": …}` or `json_object`.
pub fn flat_format(f: &Value, field: &str) -> Result<Option<Requested>, ApiError> {
    let spec = match f.get("type").and_then(Value::as_str) {
        None | Some("text") => return Ok(None),
        Some("json_object") => Spec::JsonSchema(json!({"type": "object"})),
        Some("json_schema") => Spec::JsonSchema(
            f.get("schema")
                .filter(|s| s.is_object() || s.is_boolean())
                .ok_or_else(|| {
                    ApiError::invalid(
                        format!("{field}.schema"),
                        "a `json_schema` format needs `schema`, a JSON schema object",
                    )
                })?
                .clone(),
        ),
        Some(other) => {
            return Err(ApiError::invalid(
                format!("{field}.type"),
                format!(
                    "format type {other:?} is not supported (text, json_object or json_schema)"
                ),
            ))
        }
    };
    Ok(Some(Requested {
        spec,
        field: field.to_owned(),
    }))
}

impl Spec {
    /// The spec's size as a request holds it.
    pub fn size(&self) -> usize {
        match self {
            Spec::JsonSchema(v) => v.to_string().len(),
            Spec::Regex(s) | Spec::Lark(s) => s.len(),
            Spec::Choice(c) => c.iter().map(|s| s.len() + 4).sum(),
        }
    }

    /// llguidance's grammar for it.
    pub fn grammar(&self) -> llguidance::api::TopLevelGrammar {
        use llguidance::api::TopLevelGrammar;
        match self {
            Spec::JsonSchema(v) => TopLevelGrammar::from_json_schema(bounded_whitespace(v)),
            Spec::Regex(r) => TopLevelGrammar::from_regex(r),
            Spec::Lark(g) => TopLevelGrammar::from_lark(g.clone()),
            Spec::Choice(c) => {
                let alternatives: Vec<String> = c.iter().map(|s| regex_literal(s)).collect();
                TopLevelGrammar::from_regex(&alternatives.join("|"))
            }
        }
    }
}

/// Whitespace between JSON tokens as llama.cpp's schema grammars allow it: one space, or a
/// newline and up to 20 spaces or tabs (pretty printing ten levels deep). Unbounded, a model
/// could spend its whole budget on whitespace; a schema's own `x-guidance` options (llguidance's)
/// take precedence.
const JSON_WHITESPACE: &str = r"\x20|\x0A[\x20\x09]{0,20}";

pub(super) fn bounded_whitespace(schema: &Value) -> Value {
    let mut schema = schema.clone();
    if let Some(map) = schema.as_object_mut() {
        if !map.contains_key("x-guidance") {
            let opts = llguidance::JsonCompileOptions {
                whitespace_pattern: Some(JSON_WHITESPACE.into()),
                ..Default::default()
            };
            opts.apply_to(&mut schema);
        }
    }
    schema
}

/// `s` as a regex matching exactly it.
fn regex_literal(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if "\\.+*?()|[]{}^$#&-~".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    format!("({out})")
}
