//! Structured outputs: a request's JSON schema, regex, choice list or grammar ([`grammar`])
//! compiled by llguidance (the library vLLM and llama.cpp use) against the served tokenizer,
//! and run per sequence as the engine's [`deepinfer_engine::constraint::Constraint`]
//! ([`constraint`]): masks computed while the forward pass runs, drafts checked against the
//! grammar, constrained and free requests in one batch.

mod constraint;
mod grammar;
mod tok_env;
mod tools;

pub use constraint::GrammarConstraint;
pub use grammar::{
    flat_format, one_of, openai_format, Requested, Spec, VllmFields, MAX_SPEC_BYTES,
};
pub use tools::{forced_call, tool_call_grammar, Forced};

use crate::chat::tokens::THINK_END;
use crate::openai::ApiError;
use crate::tokenizer::Tokenizer;
use deepinfer_engine::constraint::Constraint;
use llguidance::toktrie::InferenceCapabilities;
use llguidance::{Matcher, ParserFactory, TokenParser};

/// The compiler of every request's grammar: the tokenizer's trie, built once.
pub struct Structured {
    factory: ParserFactory,
    think_end: Option<u32>,
    eos: u32,
}

/// A compiled grammar: each choice of a request runs its own copy.
#[derive(Clone)]
pub struct Grammar {
    parser: TokenParser,
    think_end: Option<u32>,
    eos: u32,
}

impl Structured {
    /// `eos` is the model's end-of-sequence id (what a finished grammar allows).
    pub fn new(tok: &Tokenizer, eos: u32) -> Result<Self, String> {
        let env = tok_env::tok_env(tok, eos);
        let mut factory = ParserFactory::new(
            &env,
            InferenceCapabilities::default(),
            &llguidance::earley::SlicedBiasComputer::general_slices(),
        )
        .map_err(|e| format!("cannot set up structured outputs for this tokenizer: {e}"))?;
        // Quiet: a refused grammar is the client's 400, not a server log line.
        factory.set_stderr_log_level(0);
        Ok(Self {
            factory,
            think_end: tok.token_to_id(THINK_END),
            eos,
        })
    }

    /// Compiles `r` (CPU-bound: call it through `routes::blocking`). A spec over
    /// [`MAX_SPEC_BYTES`] or one llguidance refuses (bad syntax, past its limits) is a 400
    /// naming the field.
    pub fn compile(&self, r: &Requested) -> Result<Grammar, ApiError> {
        let size = r.spec.size();
        if size > MAX_SPEC_BYTES {
            return Err(ApiError::invalid(
                r.field.clone(),
                format!("the constraint is {size} bytes, more than the {MAX_SPEC_BYTES} allowed"),
            ));
        }
        let parser = self.factory.create_parser(r.spec.grammar()).map_err(|e| {
            ApiError::invalid(
                r.field.clone(),
                format!("the constraint cannot be compiled: {e}"),
            )
        })?;
        Ok(Grammar {
            parser,
            think_end: self.think_end,
            eos: self.eos,
        })
    }
}

impl Grammar {
    /// A fresh constraint for one choice; with `thinking` it starts after `</think>`.
    pub fn constraint(&self, thinking: bool) -> Box<dyn Constraint> {
        let matcher = Matcher::new(Ok(self.parser.deep_clone()));
        let gate = if thinking { self.think_end } else { None };
        Box::new(GrammarConstraint::new(matcher, gate, self.eos))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use deepinfer_engine::constraint::TokenMask;
    use serde_json::json;

    fn setup() -> (Tokenizer, Structured) {
        let tok = Tokenizer::from_dir(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../assets/tokenizer"
        ))
        .unwrap();
        let s = Structured::new(&tok, tok.eos_id().unwrap()).unwrap();
        (tok, s)
    }

    fn req(spec: Spec) -> Requested {
        Requested {
            spec,
            field: "response_format".into(),
        }
    }

    fn mask(c: &mut dyn Constraint, vocab: usize) -> TokenMask {
        let mut m = TokenMask::new(vocab);
        c.fill_mask(&mut m);
        m
    }

    /// A text the grammar accepts, token by token as the tokenizer splits it, then the end;
    /// the tokens of a text it refuses are masked.
    fn walk(tok: &Tokenizer, c: &mut dyn Constraint, text: &str) {
        let vocab = tok.vocab_size();
        let ids = tok.encode(text, false).unwrap();
        for (k, &id) in ids.iter().enumerate() {
            let m = mask(c, vocab);
            let before = tok.decode(&ids[..k], false);
            let token = tok.decode(&[id], false);
            assert!(m.allows(id), "{token:?} refused after {before:?}");
            c.accept(&[id]);
        }
        assert!(
            mask(c, vocab).allows(tok.eos_id().unwrap()),
            "{text:?} cannot end"
        );
    }

    #[test]
    fn a_schema_allows_its_documents_and_masks_the_rest() {
        let (tok, s) = setup();
        let schema = json!({"type": "object", "properties": {
            "name": {"type": "string"}, "age": {"type": "integer"}}, "required": ["name", "age"],
            "additionalProperties": false});
        let g = s.compile(&req(Spec::JsonSchema(schema))).unwrap();
        walk(
            &tok,
            g.constraint(false).as_mut(),
            r#"{"name": "Ada", "age": 36}"#,
        );
        let mut c = g.constraint(false);
        let open = tok.encode("[", false).unwrap()[0];
        assert!(!mask(c.as_mut(), tok.vocab_size()).allows(open));
        assert!(!mask(c.as_mut(), tok.vocab_size()).allows(tok.eos_id().unwrap()));
        // Whitespace is bounded: a run of 30 spaces is not JSON here.
        let g = s
            .compile(&req(Spec::JsonSchema(json!({"type": "object"}))))
            .unwrap();
        let mut c = g.constraint(false);
        c.accept(&tok.encode("{", false).unwrap());
        let spaces = tok.encode(&" ".repeat(30), false).unwrap();
        let refused = spaces.iter().any(|&id| {
            let ok = mask(c.as_mut(), tok.vocab_size()).allows(id);
            c.accept(&[id]);
            !ok
        });
        assert!(refused, "30 spaces passed");
    }

    #[test]
    fn regex_choice_and_grammar_hold() {
        let (tok, s) = setup();
        let r = s
            .compile(&req(Spec::Regex(r"[0-9]{3}-[a-z]+".into())))
            .unwrap();
        walk(&tok, r.constraint(false).as_mut(), "123-abc");
        let c = s
            .compile(&req(Spec::Choice(vec!["yes".into(), "no (never)".into()])))
            .unwrap();
        walk(&tok, c.constraint(false).as_mut(), "no (never)");
        let mut only = c.constraint(false);
        let m = mask(only.as_mut(), tok.vocab_size());
        assert!(!m.allows(tok.encode("maybe", false).unwrap()[0]));
        let lark = s
            .compile(&req(Spec::Lark("start: \"a\" b\nb: \"b\"+".into())))
            .unwrap();
        walk(&tok, lark.constraint(false).as_mut(), "abbb");
    }

    /// In thinking mode the reasoning is free; the grammar starts after `</think>`, and a
    /// rollback past that token frees the output again.
    #[test]
    fn the_grammar_starts_after_the_reasoning() {
        let (tok, s) = setup();
        let g = s.compile(&req(Spec::Regex("ok".into()))).unwrap();
        let mut c = g.constraint(true);
        let vocab = tok.vocab_size();
        let think_end = tok.token_to_id(THINK_END).unwrap();
        let reasoning = tok.encode("I think [x] {y}", false).unwrap();
        for &id in &reasoning {
            assert!(mask(c.as_mut(), vocab).allows(id));
            c.accept(&[id]);
        }
        c.accept(&[think_end]);
        let ok = tok.encode("ok", false).unwrap();
        assert!(!mask(c.as_mut(), vocab).allows(reasoning[0]));
        c.accept(&ok);
        assert!(mask(c.as_mut(), vocab).allows(tok.eos_id().unwrap()));
        c.rollback(ok.len() + 1);
        assert!(mask(c.as_mut(), vocab).allows(reasoning[0]));
        c.accept(&[think_end]);
        walk(&tok, c.as_mut(), "ok");
    }

    #[test]
    fn what_the_library_refuses_is_a_400_naming_the_field() {
        let (_, s) = setup();
        let bad = [
            Spec::Regex("(unclosed".into()),
            Spec::Lark("start: undefined_rule".into()),
            Spec::JsonSchema(json!({"type": "no-such-type"})),
            Spec::Regex("a".repeat(MAX_SPEC_BYTES + 1)),
        ];
        for spec in bad {
            let e = s
                .compile(&Requested {
                    spec: spec.clone(),
                    field: "guided_regex".into(),
                })
                .err()
                .unwrap_or_else(|| panic!("{spec:?} compiled"));
            assert_eq!(e.param.as_deref(), Some("guided_regex"), "{}", e.message);
        }
    }

    fn weather_tools() -> Vec<crate::chat::ToolDef> {
        serde_json::from_str(
            r#"[{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
                 "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1},
                                "unit": {"type": "string", "enum": ["C", "F"]}},
                 "required": ["city", "days"]}}},
                {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}}]"#,
        )
        .unwrap()
    }

    /// A forced call's grammar takes what the encoder writes for it (one call, parallel
    /// calls, an optional parameter left out) in each family's markup, and that family's chat
    /// parser reads the calls back; arguments off the schema are masked.
    #[test]
    fn a_forced_call_follows_the_dsml_format_and_the_schema() {
        for format in [crate::chat::ChatFormat::V4, crate::chat::ChatFormat::V41] {
            forced_call_in(format);
        }
    }

    fn forced_call_in(format: crate::chat::ChatFormat) {
        let (tok, s) = setup();
        let d = crate::chat::tokens::DSML;
        let dsml = format.markup();
        let (block_name, invoke, parameter) = (dsml.block, dsml.invoke, dsml.parameter);
        let call = |name: &str, params: &[(&str, bool, &str)]| {
            let p: String = params
                .iter()
                .map(|(k, is_str, v)| {
                    format!(
                        "<{d}{parameter} name=\"{k}\" string=\"{is_str}\">{v}</{d}{parameter}>\n"
                    )
                })
                .collect();
            format!("<{d}{invoke} name=\"{name}\">\n{p}</{d}{invoke}>")
        };
        let block = |calls: &[String]| {
            format!(
                "\n\n<{d}{block_name}>\n{}\n</{d}{block_name}>",
                calls.join("\n")
            )
        };
        let paris = call(
            "get_weather",
            &[
                ("city", true, "Paris <3>"),
                ("days", false, "3"),
                ("unit", true, "C"),
            ],
        );
        let now = call("now", &[]);
        let tools = weather_tools();
        let any = s
            .compile(&req(tool_call_grammar(
                &tools,
                &Forced::Any { parallel: true },
                dsml,
            )
            .unwrap()))
            .unwrap();
        for text in [
            block(std::slice::from_ref(&paris)),
            block(&[paris.clone(), now.clone()]),
            block(&[call(
                "get_weather",
                &[("city", true, ""), ("days", false, "10")],
            )]),
        ] {
            walk(&tok, any.constraint(false).as_mut(), &text);
            let parsed = crate::chat::parse_chat_output(dsml, &text, false, true);
            assert!(
                !parsed.tool_calls.is_empty() && parsed.content.is_empty(),
                "{parsed:?}"
            );
        }
        let parsed =
            crate::chat::parse_chat_output(dsml, &block(std::slice::from_ref(&paris)), false, true);
        assert_eq!(
            parsed.tool_calls[0].arguments,
            r#"{"city": "Paris <3>", "days": 3, "unit": "C"}"#
        );
        // Named: only that tool, once.
        let named = s
            .compile(&req(tool_call_grammar(
                &tools,
                &Forced::Named("now".into()),
                dsml,
            )
            .unwrap()))
            .unwrap();
        walk(
            &tok,
            named.constraint(false).as_mut(),
            &block(std::slice::from_ref(&now)),
        );
        assert!(tool_call_grammar(&tools, &Forced::Named("missing".into()), dsml).is_none());
        // Off the schema: a string where an integer goes, a unit outside the enum, a missing
        // required parameter.
        for bad in [
            call(
                "get_weather",
                &[("city", true, "x"), ("days", false, "\"3\"")],
            ),
            call(
                "get_weather",
                &[
                    ("city", true, "x"),
                    ("days", false, "3"),
                    ("unit", true, "K"),
                ],
            ),
            call("get_weather", &[("days", false, "3")]),
        ] {
            let mut c = any.constraint(false);
            let refused = tok
                .encode(&block(std::slice::from_ref(&bad)), false)
                .unwrap()
                .into_iter()
                .any(|id| {
                    let ok = mask(c.as_mut(), tok.vocab_size()).allows(id);
                    c.accept(&[id]);
                    !ok
                });
            assert!(refused, "{bad}");
        }
    }
}
