//! The marker strings of the DeepSeek-V4 chat format.
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
/// Wrapper tag name of a tool-call block (`<｜DSML｜tool_calls>`).
pub const TOOL_CALLS_BLOCK: &str = "tool_calls";
pub const TOOL_RESULT_START: &str = "<tool_result>";
pub const TOOL_RESULT_END: &str = "</tool_result>";
/// Where an image part's span goes (vLLM's `IMAGE_PLACEHOLDER` for DeepSeek's vision
/// models). Never tokenized: the prompt text is cut at it and the image's span put between
/// the pieces, so a tokenizer without this token works too.
pub const IMAGE_PLACEHOLDER: &str = "<｜deepseek_image｜>";
