//! The marker strings of the DeepSeek-V4 and V4.1 chat formats.
//!
//! In `assets/tokenizer/tokenizer.json` every marker here is a single added token: BOS (id 0)
//! and EOS (id 1) are the only ones flagged `special: true`; `<｜User｜>` (128803),
//! `<｜Assistant｜>` (128804), `<think>` (128821), `</think>` (128822) and `｜DSML｜` (128825)
//! are added tokens with `special: false`. Decoding with `skip_special_tokens` therefore drops
//! only BOS/EOS and keeps the markers the output parser needs. `<tool_result>` is ordinary
//! text. DSML tags are spelled with the `｜DSML｜` token between ASCII `<`, `</`, `>` and
//! words: `<｜DSML｜invoke name="f">` is `<`, `｜DSML｜`, then ordinary tokens.

pub const BOS: &str = "<｜begin▁of▁sentence｜>";
pub const EOS: &str = "<｜end▁of▁sentence｜>";
pub const USER: &str = "<｜User｜>";
pub const ASSISTANT: &str = "<｜Assistant｜>";
pub const THINK_START: &str = "<think>";
pub const THINK_END: &str = "</think>";
/// The DSML namespace token that prefixes every tool-call tag name.
pub const DSML: &str = "｜DSML｜";
/// V4.1's system-turn marker (id 128799 in V4.1's tokenizer, a placeholder in V4's): it opens
/// the prompt when an effort preamble or a system message leads, and every later system turn.
pub const SYSTEM: &str = "<｜System｜>";
pub const TOOL_RESULT_START: &str = "<tool_result>";
pub const TOOL_RESULT_END: &str = "</tool_result>";
/// Where an image part's span goes (vLLM's `IMAGE_PLACEHOLDER` for DeepSeek's vision
/// models). Never tokenized: the prompt text is cut at it and the image's span put between
/// the pieces, so a tokenizer without this token works too.
pub const IMAGE_PLACEHOLDER: &str = "<｜deepseek_image｜>";

/// The tag names of one family's DSML tool-call markup, as written after the `｜DSML｜` token:
/// V4 writes `<｜DSML｜tool_calls>` / `<｜DSML｜invoke …>` / `<｜DSML｜parameter …>`, V4.1 the
/// same with a space after the token and `calls` for the block (vLLM's `deepseek_v41_encoding.py`
/// `tool_calls_block_name` etc.; `parser/deepseek_v41.py` its terminals).
#[derive(Debug)]
pub struct Dsml {
    /// The block's tag name, the one the encoder writes (`tool_calls`, ` calls`).
    pub block: &'static str,
    pub invoke: &'static str,
    pub parameter: &'static str,
    /// Every block name the output parser accepts (models misspell it).
    pub(crate) parsed_blocks: &'static [&'static str],
    /// The parser's marker literals, built on first use.
    pub(crate) literals: std::sync::OnceLock<Vec<(super::markers::Marker, String)>>,
}

/// V4's markup. vLLM accepts `tool_calls`, `toolcalls` and `tool`; we add `tool_call` and
/// V3.2's `function_calls`.
pub static DSML_V4: Dsml = Dsml {
    block: "tool_calls",
    invoke: "invoke",
    parameter: "parameter",
    parsed_blocks: &[
        "tool_calls",
        "toolcalls",
        "tool_call",
        "tool",
        "function_calls",
    ],
    literals: std::sync::OnceLock::new(),
};

/// V4.1's spaced markup (vLLM 0.33 parses only this spelling for V4.1).
pub static DSML_V41: Dsml = Dsml {
    block: " calls",
    invoke: " invoke",
    parameter: " parameter",
    parsed_blocks: &[" calls"],
    literals: std::sync::OnceLock::new(),
};
