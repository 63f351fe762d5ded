//! The chat loop: a prompt, then a command or an answer, until the input ends.

use super::answer::{AnswerText, Stats};
use super::display::Display;
use super::events::{Event, EventSink};
use super::history::History;
use super::input::{Command, Entry, Input, HELP};
use super::ChatArgs;
use anyhow::{bail, Result};
use deepinfer_engine::engine::{EngineError, EngineHandle};
use deepinfer_engine::request::{FinishReason, RequestId};
use deepinfer_engine::sampling_params::SamplingParams;
use deepinfer_server::chat::ChatDelta;
use deepinfer_server::chat::ChatFormat;
use deepinfer_server::tokenizer::Tokenizer;
use std::collections::VecDeque;
use std::io::{IsTerminal, Stdout};
use std::sync::mpsc::{Receiver, Sender};

pub(super) fn on_off(on: bool) -> &'static str {
    if on {
        "on"
    } else {
        "off"
    }
}

/// How an answer ended.
enum Ending {
    Finished(FinishReason),
    /// Ctrl-C stopped it.
    Interrupted,
}

pub(super) struct Chat {
    engine: EngineHandle,
    tokenizer: Tokenizer,
    history: History,
    params: SamplingParams,
    seed: Option<u64>,
    display: Display<Stdout>,
    /// Prompts are shown only to someone typing (not to a pipe).
    interactive: bool,
    input: Input,
    events: Receiver<Event>,
    tx: Sender<Event>,
    /// Input that arrived while an answer streamed, taken before new events.
    pending: VecDeque<Event>,
    /// Answers asked for so far (numbers each answer's events and seed).
    turns: u64,
}

impl Chat {
    pub fn new(
        engine: EngineHandle,
        tokenizer: Tokenizer,
        format: ChatFormat,
        args: &ChatArgs,
        tx: Sender<Event>,
        events: Receiver<Event>,
    ) -> Self {
        Self {
            engine,
            tokenizer,
            history: History::new(format, !args.no_think),
            params: args.params(),
            seed: args.seed,
            display: Display::new(std::io::stdout(), std::io::stdout().is_terminal()),
            interactive: std::io::stdin().is_terminal(),
            input: Input::default(),
            events,
            tx,
            pending: VecDeque::new(),
            turns: 0,
        }
    }

    pub fn thinking(&self) -> bool {
        self.history.thinking()
    }

    /// Runs until `/exit` or the end of input.
    pub fn run(&mut self) -> Result<()> {
        loop {
            if self.interactive {
                let prompt = if self.input.continuing() {
                    "... "
                } else {
                    ">>> "
                };
                self.display.prompt(prompt)?;
            }
            match self.next_event() {
                Event::Line(line) => {
                    let go_on = match self.input.push(&line) {
                        None => true,
                        Some(Entry::Command(c)) => self.command(c)?,
                        Some(Entry::Message(text)) => {
                            self.ask(text)?;
                            true
                        }
                    };
                    if !go_on {
                        return Ok(());
                    }
                }
                Event::Eof => {
                    self.display.end()?;
                    return Ok(());
                }
                Event::Interrupt => {
                    // Ctrl-C at the prompt drops what was typed; only Ctrl-D or /exit leave.
                    self.input.clear();
                    self.display.after_echo();
                    self.display.note("(Ctrl-D or /exit to leave)")?;
                }
                // `next_event` never returns these.
                Event::Output(..) | Event::Closed(_) => {}
            }
        }
    }

    /// The next input event: what arrived during the last answer first, and never a late
    /// event of an answer already over (the sink's drop after its last delta).
    fn next_event(&mut self) -> Event {
        if let Some(e) = self.pending.pop_front() {
            return e;
        }
        loop {
            // The sender in `self.tx` keeps the channel open.
            match self.events.recv().expect("the chat holds a sender") {
                Event::Output(..) | Event::Closed(_) => continue,
                e => return e,
            }
        }
    }

    /// Carries out a command; false for `/exit`.
    fn command(&mut self, command: Command) -> Result<bool> {
        let note = match command {
            Command::Exit => return Ok(false),
            Command::Reset => {
                self.history.reset();
                "conversation reset".to_string()
            }
            Command::Think => {
                let on = self.history.toggle_thinking();
                format!("thinking {}", on_off(on))
            }
            Command::Help => HELP.to_string(),
            Command::Unknown(name) => format!("unknown command /{name}; /help lists them"),
        };
        self.display.note(&note)?;
        Ok(true)
    }

    /// Answers `text` after the conversation so far and keeps both in it.
    fn ask(&mut self, text: String) -> Result<()> {
        self.history.push_user(text);
        let prompt = self.history.prompt_ids(&self.tokenizer)?;
        self.turns += 1;
        let turn = self.turns;
        let params = SamplingParams {
            seed: self.seed.map(|s| s.wrapping_add(turn - 1)),
            ..self.params.clone()
        };
        let sink = Box::new(EventSink {
            turn,
            tx: self.tx.clone(),
        });
        let id = match self.engine.add_request_to(prompt.clone(), params, sink) {
            Ok(id) => id,
            Err(EngineError::Stopped) => bail!("the engine has stopped"),
            // A conversation grown past the context, or ids the model lacks: this message
            // is refused, the chat goes on.
            Err(e) => {
                self.history.pop_user();
                let hint = match e {
                    EngineError::PromptTooLong { .. } => "; /reset starts over",
                    _ => "",
                };
                self.display.note(&format!("{e}{hint}"))?;
                return Ok(());
            }
        };
        let format = self.history.format();
        let mut text = AnswerText::new(&self.tokenizer, &prompt, format, self.history.thinking());
        let mut stats = Stats::new(prompt.len());
        let ending = self.stream(turn, id, &mut text, &mut stats)?;
        self.display.end()?;
        self.keep(ending, text, &stats)
    }

    /// Puts a finished answer into the conversation and shows its numbers.
    fn keep(&mut self, ending: Ending, text: AnswerText, stats: &Stats) -> Result<()> {
        let mut line = stats.line();
        match ending {
            Ending::Finished(reason) => {
                let (reasoning, content) = text.take();
                self.history.push_answer(reasoning, content);
                if reason == FinishReason::Length {
                    line.push_str(if stats.generated >= self.params.max_tokens {
                        " (cut off by --max-tokens)"
                    } else {
                        " (cut off: the context is full; /reset starts over)"
                    });
                }
            }
            Ending::Interrupted => {
                // A stopped answer is left out of the conversation, and so is its question:
                // kept alone, the format would join it with the next question into one user
                // turn, as if both were asked at once. The user can ask it again.
                self.history.pop_user();
                line.push_str(" (stopped; left out of the conversation)");
            }
        }
        Ok(self.display.note(&line)?)
    }

    /// Shows answer `turn` (engine request `id`) as it streams, until it ends.
    fn stream(
        &mut self,
        turn: u64,
        id: RequestId,
        text: &mut AnswerText,
        stats: &mut Stats,
    ) -> Result<Ending> {
        let mut interrupted = false;
        loop {
            match self.events.recv().expect("the chat holds a sender") {
                Event::Output(t, out) if t == turn => {
                    stats.add(out.new_token_ids.len(), out.num_cached_tokens);
                    let last = out.finish_reason.is_some();
                    for delta in text.push(&out.new_token_ids, last) {
                        match delta {
                            ChatDelta::Reasoning(r) => self.display.reasoning(&r)?,
                            ChatDelta::Content(c) => self.display.content(&c)?,
                            ChatDelta::ToolCall { .. } => {}
                        }
                    }
                    match out.finish_reason {
                        Some(_) if interrupted => return Ok(Ending::Interrupted),
                        Some(reason) => return Ok(Ending::Finished(reason)),
                        None => {}
                    }
                }
                Event::Closed(t) if t == turn => bail!("the engine stopped during the answer"),
                // The engine ends the stream with an abort delta, which ends the loop.
                Event::Interrupt => {
                    interrupted = true;
                    self.engine.abort(id);
                }
                e @ (Event::Line(_) | Event::Eof) => self.pending.push_back(e),
                Event::Output(..) | Event::Closed(_) => {}
            }
        }
    }
}
