//! Conversation → DeepSeek-V4 prompt text (what vLLM's `deepseek_v4` tokenizer wrapper and
//! encoder produce for an OpenAI request; checked against fixtures from that encoder).
//!
//! Layout: `BOS` + [effort preamble, thinking mode only] + turns, where
//! * system: its text, then `"\n\n"` + the tools section if the request has tools;
//! * developer: `<｜User｜>` + text; user: `<｜User｜>` + blocks joined by `"\n\n"`, a tool
//!   result being `<tool_result>…</tool_result>`;
//! * assistant: [`reasoning</think>`] + content + [`"\n\n"` + DSML tool calls] + EOS;
//! * after a user/developer turn followed by an assistant turn or at the end, and after a
//!   system turn followed by an assistant turn or at the end: `<｜Assistant｜>` + `<think>` or
//!   `</think>`.
//!
//! Old reasoning: in thinking mode with `drop_thinking` (and no tools), turns before the last
//! user/developer turn lose their reasoning — their assistant turns render as `</think>`-less
//! content after an `<｜Assistant｜></think>` opener — and developer turns before it are dropped
//! altogether. With tools, or `drop_thinking` off, every assistant turn keeps
//! `reasoning</think>` and every opener is `<think>`. In chat mode no reasoning is rendered.

use super::conversation::{build_turns, Block, Turn, V4_RULES};
use super::dsml::{encode_calls, tools_section};
use super::error::ChatError;
use super::options::{EncoderEffort, RenderOptions};
use super::tokens::{
    Dsml, ASSISTANT, BOS, DSML_V4, EOS, THINK_END, THINK_START, TOOL_RESULT_END, TOOL_RESULT_START,
    USER,
};
use super::tools_prompt::{EFFORT_HIGH, EFFORT_MAX};
use super::{ChatMessage, ToolDef};

/// Renders the full prompt (BOS included, ending with the generation prompt
/// `<｜Assistant｜><think>` or `<｜Assistant｜></think>`); `ChatFormat::render` has checked
/// what both families refuse.
pub(crate) fn render_v4(
    messages: &[ChatMessage],
    tools: &[ToolDef],
    opts: &RenderOptions,
    preamble: fn(&RenderOptions) -> &'static str,
) -> Result<String, ChatError> {
    let turns = build_turns(messages, !tools.is_empty(), &V4_RULES)?;
    let thinking = opts.thinking_mode();
    // The encoder keeps all reasoning as soon as any turn carries tools.
    let drop = opts.drop_thinking && tools.is_empty();
    let turns = if thinking && drop {
        let last_user = turns.iter().rposition(Turn::is_user_like);
        drop_old_reasoning(turns, last_user)
    } else {
        turns
    };
    let last_user = turns.iter().rposition(Turn::is_user_like);

    let mut prompt = String::from(BOS);
    if thinking {
        prompt.push_str(preamble(opts));
    }
    for (index, turn) in turns.iter().enumerate() {
        // Whether reasoning of / the opener before this position belongs to the current turn.
        let current = last_user.is_none_or(|u| index > u);
        render_turn(
            &mut prompt,
            turn,
            tools,
            thinking && (!drop || current),
            &DSML_V4,
        );
        let next = turns.get(index + 1);
        let opens_assistant = match turn {
            Turn::User { .. } | Turn::Developer { .. } | Turn::System { .. } => {
                next.is_none_or(|n| matches!(n, Turn::Assistant { .. }))
            }
            Turn::Assistant { .. } => false,
        };
        if opens_assistant {
            prompt.push_str(ASSISTANT);
            let open_think = thinking && (!drop || last_user.is_none_or(|u| index >= u));
            prompt.push_str(if open_think { THINK_START } else { THINK_END });
        }
    }
    Ok(prompt)
}

/// The effort preamble of vLLM 0.33's V4 encoder (the 0731 checkpoints' tiers).
pub(crate) fn official_preamble(opts: &RenderOptions) -> &'static str {
    match opts.encoder_effort() {
        EncoderEffort::Low => "",
        EncoderEffort::High => EFFORT_HIGH,
        EncoderEffort::Max => EFFORT_MAX,
    }
}

/// The effort preamble of the preview checkpoints' encoder: only `max` has one, the
/// "Absolute maximum" text (its `REASONING_EFFORT_MAX`).
pub(crate) fn preview_preamble(opts: &RenderOptions) -> &'static str {
    match opts.encoder_effort() {
        EncoderEffort::Max => EFFORT_HIGH,
        EncoderEffort::Low | EncoderEffort::High => "",
    }
}

/// One turn's text, the same in both families but for the markup (V4.1 puts `<｜System｜>`
/// before a later system turn itself).
pub(crate) fn render_turn(
    prompt: &mut String,
    turn: &Turn,
    tools: &[ToolDef],
    with_reasoning: bool,
    dsml: &Dsml,
) {
    match turn {
        Turn::System {
            content,
            with_tools,
        } => {
            prompt.push_str(content);
            if *with_tools {
                prompt.push_str("\n\n");
                prompt.push_str(&tools_section(tools, dsml));
            }
        }
        Turn::Developer { content } => {
            prompt.push_str(USER);
            prompt.push_str(content);
        }
        Turn::User { blocks } => {
            prompt.push_str(USER);
            for (i, block) in blocks.iter().enumerate() {
                if i > 0 {
                    prompt.push_str("\n\n");
                }
                match block {
                    Block::Text(text) => prompt.push_str(text),
                    Block::ToolResult { content, .. } => {
                        prompt.push_str(TOOL_RESULT_START);
                        prompt.push_str(content);
                        prompt.push_str(TOOL_RESULT_END);
                    }
                }
            }
        }
        Turn::Assistant {
            content,
            reasoning,
            calls,
            ..
        } => {
            if with_reasoning {
                prompt.push_str(reasoning.as_deref().unwrap_or(""));
                prompt.push_str(THINK_END);
            }
            prompt.push_str(content);
            if !calls.is_empty() {
                prompt.push_str(&encode_calls(calls, dsml));
            }
            prompt.push_str(EOS);
        }
    }
}

/// Before the last user turn (`last_user`, each family's definition): assistant turns lose
/// their reasoning and developer turns are dropped (the encoders' `drop_thinking`).
pub(crate) fn drop_old_reasoning(turns: Vec<Turn>, last_user: Option<usize>) -> Vec<Turn> {
    let Some(last_user) = last_user else {
        return turns;
    };
    turns
        .into_iter()
        .enumerate()
        .filter_map(|(i, turn)| match turn {
            _ if i >= last_user => Some(turn),
            Turn::Developer { .. } => None,
            Turn::Assistant {
                content,
                calls,
                call_ids,
                ..
            } => Some(Turn::Assistant {
                content,
                reasoning: None,
                calls,
                call_ids,
            }),
            other => Some(other),
        })
        .collect()
}
