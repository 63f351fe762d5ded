//! Conversation → DeepSeek-V4.1 prompt text: vLLM 0.33's `tokenizers/deepseek_v41.py` (the
//! request handling) and `tokenizers/deepseek_v41_encoding.py` (the encoder), checked against
//! prompts rendered by those files (`tests/fixtures/chat_cases_v41.json`).
//!
//! What differs from V4 ([`super::render`]):
//! * `<｜System｜>` opens the prompt when the first turn is a system turn or an effort preamble
//!   leads (`render_message`, index 0), and every later system turn; a later system turn
//!   counts as a user turn (it opens an assistant turn after it), the first one does not;
//! * the effort preamble is numeric, `Reasoning Effort: N (range 1-100, …)`
//!   ([`effort_budget`]), and goes after `<｜System｜>`, before the system text;
//! * a user turn holding only tool results is not a user turn (`find_last_user_index`);
//! * the tool section and calls use the spaced DSML tags ([`DSML_V41`]);
//! * call arguments that are no JSON object are wrapped, tool parts joined by a blank line,
//!   placeholder text refused ([`V41_RULES`]).

use super::conversation::{build_turns, Block, Turn, V41_RULES};
use super::error::ChatError;
use super::options::{Effort, ReasoningEffort, RenderOptions};
use super::render::{drop_old_reasoning, render_turn};
use super::tokens::{ASSISTANT, BOS, DSML_V41, SYSTEM, THINK_END, THINK_START};
use super::tools_prompt::V41_EFFORT_TEMPLATE;
use super::{ChatMessage, ToolDef};

/// The level V4.1's preamble states: vLLM 0.33's `REASONING_EFFORT_MAPPINGS` (low 50, high 75,
/// xhigh 75, max 100; unset is `high`) or an integer 1–100 (a JSON integer, not a bool or a
/// float: the wrapper's `type(effort) is int`). Anything else is refused, as the wrapper
/// refuses it; `none` never gets here (it is chat mode).
pub fn effort_budget(opts: &RenderOptions) -> Result<u8, ChatError> {
    use ReasoningEffort as R;
    let Some((effort, field)) = &opts.effort else {
        return Ok(75);
    };
    match effort {
        Effort::Named(R::Low) => Ok(50),
        Effort::Named(R::High | R::Xhigh | R::None) => Ok(75),
        Effort::Named(R::Max) => Ok(100),
        Effort::Integer(n) if (1..=100).contains(n) => Ok(*n as u8),
        other => Err(ChatError::InvalidEffort {
            field,
            reason: format!(
                "DeepSeek-V4.1 takes an effort of low, high, xhigh, max or none, or an integer \
                 from 1 to 100 in chat_template_kwargs.reasoning_effort; got {}",
                match other {
                    Effort::Named(n) => format!("{:?}", format!("{n:?}").to_lowercase()),
                    Effort::Unknown(s) => format!("{s:?}"),
                    Effort::Integer(n) => n.to_string(),
                    Effort::Other(json) => json.clone(),
                }
            ),
        }),
    }
}

/// Renders the full V4.1 prompt (BOS included, ending with the generation prompt);
/// `ChatFormat::render` has checked what both families refuse.
pub(crate) fn render_v41(
    messages: &[ChatMessage],
    tools: &[ToolDef],
    opts: &RenderOptions,
) -> Result<String, ChatError> {
    // The wrapper validates the effort in chat mode too.
    let budget = effort_budget(opts)?;
    let turns = build_turns(messages, !tools.is_empty(), &V41_RULES)?;
    let thinking = opts.thinking_mode();
    // The encoder keeps all reasoning as soon as any turn carries tools.
    let drop = opts.drop_thinking && tools.is_empty();
    let turns = if thinking && drop {
        let last_user = last_user(&turns);
        drop_old_reasoning(turns, last_user)
    } else {
        turns
    };
    let last_user = last_user(&turns);
    let mut prompt = String::from(BOS);
    for (index, turn) in turns.iter().enumerate() {
        if index == 0 && (thinking || matches!(turn, Turn::System { .. })) {
            prompt.push_str(SYSTEM);
        }
        if index == 0 && thinking {
            prompt.push_str(&V41_EFFORT_TEMPLATE.replace("{budget}", &budget.to_string()));
        }
        // Reasoning is kept after the last user turn, or everywhere without dropping.
        let keeps_reasoning = !drop || last_user.is_none_or(|u| index > u);
        if index > 0 && matches!(turn, Turn::System { .. }) {
            prompt.push_str(SYSTEM);
        }
        let with_reasoning = thinking && keeps_reasoning;
        render_turn(&mut prompt, turn, tools, with_reasoning, &DSML_V41);
        let next_is_assistant = turns
            .get(index + 1)
            .is_none_or(|n| matches!(n, Turn::Assistant { .. }));
        if next_is_assistant && opens_assistant(index, turn) {
            prompt.push_str(ASSISTANT);
            let open_think = thinking && (!drop || last_user.is_none_or(|u| index >= u));
            prompt.push_str(if open_think { THINK_START } else { THINK_END });
        }
    }
    Ok(prompt)
}

/// Whether the turn at `index` is followed by an assistant header: user and developer turns,
/// and system turns after the first message.
fn opens_assistant(index: usize, turn: &Turn) -> bool {
    match turn {
        Turn::User { .. } | Turn::Developer { .. } => true,
        Turn::System { .. } => index > 0,
        Turn::Assistant { .. } => false,
    }
}

/// V4.1's last user turn (`find_last_user_index`): a user turn with text (not only tool
/// results), a developer turn, or a system turn after the first message.
fn last_user(turns: &[Turn]) -> Option<usize> {
    turns.iter().enumerate().rposition(|(i, t)| match t {
        Turn::User { blocks } => blocks.iter().any(|b| matches!(b, Block::Text(_))),
        Turn::Developer { .. } => true,
        Turn::System { .. } => i > 0,
        Turn::Assistant { .. } => false,
    })
}
