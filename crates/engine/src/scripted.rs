//! The scripted-output test hook (`deepinfer serve --debug-force-output`, never used to
//! serve): what a model with random weights is made to write, so end-to-end tests see
//! reasoning, answers and tool calls come through the whole serving path. A script can hold
//! a conversation: each turn's text is chosen by how the prompt ends (a tool result, say,
//! gets an answer where a user message gets a tool call), so an agent's tool round trip ends.

/// One scripted text: the tokens every sequence whose prompt matches writes, then EOS.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScriptedTurn {
    /// The turn applies when these tokens end the prompt, give or take the few tokens of
    /// the generation prompt after them ([`OPENER_SLACK`]); `None`: any prompt.
    pub after: Option<Vec<u32>>,
    pub output: Vec<u32>,
}

/// Tokens allowed between a turn's `after` and the prompt's end: the chat format's
/// generation prompt (`<｜Assistant｜><think>` is two).
pub const OPENER_SLACK: usize = 4;

/// The turns of a script, tried in order; a prompt no turn matches is sampled as usual.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScriptedOutput {
    pub turns: Vec<ScriptedTurn>,
}

impl ScriptedOutput {
    /// One text for every prompt.
    pub fn always(output: Vec<u32>) -> Self {
        Self {
            turns: vec![ScriptedTurn {
                after: None,
                output,
            }],
        }
    }

    /// The text a sequence with `prompt` writes.
    pub fn for_prompt(&self, prompt: &[u32]) -> Option<&[u32]> {
        self.turns
            .iter()
            .find(|t| {
                t.after
                    .as_deref()
                    .is_none_or(|after| ends_with(prompt, after))
            })
            .map(|t| t.output.as_slice())
    }

    /// Every token the script writes (checked against the vocabulary at start).
    pub fn tokens(&self) -> impl Iterator<Item = u32> + '_ {
        self.turns.iter().flat_map(|t| t.output.iter().copied())
    }
}

/// Whether `after` occurs in the prompt's last `after.len() + OPENER_SLACK` tokens.
fn ends_with(prompt: &[u32], after: &[u32]) -> bool {
    let tail = &prompt[prompt.len().saturating_sub(after.len() + OPENER_SLACK)..];
    !after.is_empty() && tail.windows(after.len()).any(|w| w == after)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn turns_are_chosen_by_how_the_prompt_ends() {
        let script = ScriptedOutput {
            turns: vec![
                ScriptedTurn {
                    after: Some(vec![7, 8]),
                    output: vec![1],
                },
                ScriptedTurn {
                    after: None,
                    output: vec![2],
                },
            ],
        };
        assert_eq!(script.for_prompt(&[5, 7, 8, 40, 41]), Some(&[1][..]));
        assert_eq!(script.for_prompt(&[7, 8]), Some(&[1][..]));
        // Too far from the end: an earlier turn's result, not this one's.
        assert_eq!(script.for_prompt(&[7, 8, 1, 2, 3, 4, 5]), Some(&[2][..]));
        assert_eq!(script.for_prompt(&[]), Some(&[2][..]));
        let only = ScriptedOutput {
            turns: script.turns[..1].to_vec(),
        };
        assert_eq!(only.for_prompt(&[1, 2]), None);
        assert_eq!(
            ScriptedOutput::always(vec![3]).for_prompt(&[9]),
            Some(&[3][..])
        );
    }
}
