//! A Responses request → the chat request the V4 renderer takes, following vLLM's translation
//! (`entrypoints/openai/responses/utils.py`): `instructions` as the system message (never
//! carried over from a previous response), the previous response's conversation, then the
//! input items; a reasoning item, a message and function calls of one assistant turn merge
//! into one assistant message; `function_call_output` items are tool messages. Function tools
//! in a `namespace` (Codex sends them) are offered as `namespace__name`, vLLM's flat name,
//! and their calls answered with the namespace apart. Built-in tools (`web_search`, …) run on
//! OpenAI's side and are left out, as vLLM does.

use super::request::{Content, Input, Item, ResponsesRequest, Tool};
use crate::chat::{
    ChatMessage, ContentPart, FunctionCall, FunctionDef, MessageContent, RenderOptions, ToolCall,
    ToolDef, TypedPart,
};
use crate::openai::ApiError;
use crate::structured::Forced;

/// What a Responses request renders as.
#[derive(Debug)]
pub struct Conversation {
    /// Without the system message: what a later response continues from.
    pub history: Vec<ChatMessage>,
    pub instructions: Option<String>,
    pub tools: Vec<ToolDef>,
    /// Each offered tool's flat name → its namespace and own name.
    pub names: Vec<(String, Option<String>, String)>,
    pub opts: RenderOptions,
    pub parse_tools: bool,
    /// `parallel_tool_calls: false`: only the first call is returned.
    pub single_tool_call: bool,
    /// A call the answer must make (`tool_choice` `required` or a named function).
    pub forced: Option<Forced>,
}

impl Conversation {
    /// The messages to render: the instructions, then the conversation.
    pub fn messages(&self) -> Vec<ChatMessage> {
        let system = self.instructions.iter().map(|i| ChatMessage {
            role: "system".into(),
            content: Some(MessageContent::Text(i.clone())),
            ..Default::default()
        });
        system.chain(self.history.iter().cloned()).collect()
    }
}

/// `previous` is the stored conversation the request continues (its own system message
/// already left out).
pub fn conversation(
    req: &ResponsesRequest,
    previous: Vec<ChatMessage>,
) -> Result<Conversation, ApiError> {
    if req.background == Some(true) {
        return Err(ApiError::invalid(
            "background",
            "background responses are not supported; leave `background` unset",
        ));
    }
    let (tools, names) = tools(req.tools.as_deref().unwrap_or_default())?;
    let parallel = req.parallel_tool_calls != Some(false);
    let (parse_tools, forced) =
        crate::openai::tool_choice(req.tool_choice.as_ref(), parallel, "name")?;
    // Codex's namespaced tools are offered by their flat name.
    let forced = forced.map(|f| match f {
        Forced::Named(name) => Forced::Named(
            names
                .iter()
                .find(|(flat, ns, own)| *flat == name || (ns.is_some() && *own == name))
                .map_or(name, |(flat, ..)| flat.clone()),
        ),
        any => any,
    });
    let parse_tools = parse_tools && !tools.is_empty();
    let mut history = previous;
    match &req.input {
        Input::Text(s) => history.push(text_message("user", s.clone())),
        Input::Items(items) => {
            for (i, item) in items.iter().enumerate() {
                push_item(item, &format!("input[{i}]"), &names, &mut history)?;
            }
        }
    }
    if history.is_empty() {
        return Err(ApiError::invalid("input", "`input` must not be empty"));
    }
    Ok(Conversation {
        history,
        instructions: req.instructions.clone(),
        tools,
        names,
        opts: render_options(req)?,
        parse_tools,
        single_tool_call: req.parallel_tool_calls == Some(false),
        forced,
    })
}

/// `reasoning.effort` as Chat Completions' `reasoning_effort` (`none` is chat mode; thinking
/// is on otherwise, V4's default); vLLM's `chat_template_kwargs` apply as there.
fn render_options(req: &ResponsesRequest) -> Result<RenderOptions, ApiError> {
    let effort = req.reasoning.as_ref().and_then(|r| r.effort.as_deref());
    crate::openai::render_options(
        effort.map(|e| (e, "reasoning.effort")),
        req.chat_template_kwargs.as_ref(),
    )
}

type Names = Vec<(String, Option<String>, String)>;

fn tools(tools: &[Tool]) -> Result<(Vec<ToolDef>, Names), ApiError> {
    let (mut defs, mut names) = (Vec::new(), Vec::new());
    for (i, t) in tools.iter().enumerate() {
        match t.kind.as_str() {
            "function" => {
                let name = function_name(t, &format!("tools[{i}]"))?;
                defs.push(function_def(t, name.clone()));
                names.push((name.clone(), None, name));
            }
            "namespace" => {
                let ns = function_name(t, &format!("tools[{i}]"))?;
                for (j, f) in t.tools.iter().flatten().enumerate() {
                    if f.kind != "function" {
                        continue;
                    }
                    let name = function_name(f, &format!("tools[{i}].tools[{j}]"))?;
                    let flat = format!("{ns}__{name}");
                    defs.push(function_def(f, flat.clone()));
                    names.push((flat, Some(ns.clone()), name));
                }
            }
            _ => {}
        }
    }
    Ok((defs, names))
}

fn function_name(t: &Tool, path: &str) -> Result<String, ApiError> {
    t.name
        .clone()
        .filter(|n| !n.is_empty())
        .ok_or_else(|| ApiError::invalid(format!("{path}.name"), "a tool needs a `name`"))
}

fn function_def(t: &Tool, name: String) -> ToolDef {
    ToolDef {
        r#type: "function".into(),
        function: FunctionDef {
            name,
            description: t.description.clone(),
            parameters: t.parameters.clone(),
            strict: t.strict,
        },
    }
}

fn text_message(role: &str, text: String) -> ChatMessage {
    ChatMessage {
        role: role.into(),
        content: Some(MessageContent::Text(text)),
        ..Default::default()
    }
}

/// The text of content (parts of any text type joined) and its `input_image` parts as image
/// parts (files and audio refused).
fn read_content(content: &Content, path: &str) -> Result<(String, Vec<ContentPart>), ApiError> {
    let parts = match content {
        Content::Text(s) => return Ok((s.clone(), Vec::new())),
        Content::Parts(parts) => parts,
    };
    let (mut text, mut images) = (String::new(), Vec::new());
    for (j, p) in parts.iter().enumerate() {
        let ppath = format!("{path}[{j}]");
        match (p.kind.as_deref(), &p.text) {
            (Some("input_image"), _) => {
                let url = p.image_url.clone().ok_or_else(|| {
                    ApiError::invalid(
                        format!("{ppath}.image_url"),
                        "an input_image needs `image_url` (a data URL); `file_id` is not served",
                    )
                })?;
                images.push(ContentPart::Typed(TypedPart::image(url, ppath)));
            }
            (Some("input_file" | "input_audio"), _) => {
                return Err(ApiError::invalid(
                    format!("{ppath}.type"),
                    "this server takes no files or audio",
                ))
            }
            (_, Some(t)) => text.push_str(t),
            (_, None) => {}
        }
    }
    Ok((text, images))
}

/// A user message of `images` then `text` (where the renderer puts them anyway).
fn user_message(text: String, mut images: Vec<ContentPart>) -> ChatMessage {
    if images.is_empty() {
        return text_message("user", text);
    }
    if !text.is_empty() {
        images.push(ContentPart::Typed(TypedPart::text(&text)));
    }
    ChatMessage {
        role: "user".into(),
        content: Some(MessageContent::Parts(images)),
        ..Default::default()
    }
}

/// The open assistant message an item of the same turn merges into.
fn open_assistant(messages: &mut [ChatMessage]) -> Option<&mut ChatMessage> {
    messages.last_mut().filter(|m| m.role == "assistant")
}

fn push_item(
    item: &Item,
    path: &str,
    names: &Names,
    out: &mut Vec<ChatMessage>,
) -> Result<(), ApiError> {
    match item.kind.as_deref().unwrap_or("message") {
        "message" => push_message(item, path, out),
        "function_call" => {
            let call = function_call(item, path, names)?;
            match open_assistant(out) {
                Some(m) => m.tool_calls.push(call),
                None => out.push(ChatMessage {
                    role: "assistant".into(),
                    tool_calls: vec![call],
                    ..Default::default()
                }),
            }
            Ok(())
        }
        "function_call_output" => {
            let call_id = item.call_id.clone().ok_or_else(|| {
                ApiError::invalid(format!("{path}.call_id"), "a function_call_output needs `call_id`")
            })?;
            let (text, images) = match &item.output {
                None => Default::default(),
                Some(c) => read_content(c, &format!("{path}.output"))?,
            };
            out.push(ChatMessage {
                tool_call_id: Some(call_id),
                ..text_message("tool", text)
            });
            // Only user messages hold images: an output's follow as one (as vLLM does for
            // Anthropic tool results).
            if !images.is_empty() {
                out.push(user_message(String::new(), images));
            }
            Ok(())
        }
        "reasoning" => {
            let text = reasoning_text(item);
            match open_assistant(out).filter(|m| m.reasoning.is_none()) {
                Some(m) => m.reasoning = Some(text),
                None => out.push(ChatMessage {
                    role: "assistant".into(),
                    reasoning: Some(text),
                    ..Default::default()
                }),
            }
            Ok(())
        }
        other => Err(ApiError::invalid(
            format!("{path}.type"),
            format!("input item type {other:?} is not supported (message, function_call, function_call_output or reasoning)"),
        )),
    }
}

fn push_message(item: &Item, path: &str, out: &mut Vec<ChatMessage>) -> Result<(), ApiError> {
    let role = item.role.as_deref().unwrap_or_default();
    if !matches!(role, "user" | "system" | "developer" | "assistant") {
        return Err(ApiError::invalid(
            format!("{path}.role"),
            format!("unknown role {role:?} (expected user, system, developer or assistant)"),
        ));
    }
    let cpath = format!("{path}.content");
    let (text, images) = match &item.content {
        None => Default::default(),
        Some(c) => read_content(c, &cpath)?,
    };
    if role == "user" {
        out.push(user_message(text, images));
        return Ok(());
    }
    if !images.is_empty() {
        return Err(ApiError::invalid(
            cpath,
            format!(
                "a {role} message holds no images (user messages and function call outputs do)"
            ),
        ));
    }
    if role == "assistant" {
        if let Some(m) = open_assistant(out).filter(|m| m.content.is_none()) {
            m.content = Some(MessageContent::Text(text));
            return Ok(());
        }
    }
    out.push(text_message(role, text));
    Ok(())
}

fn function_call(item: &Item, path: &str, names: &Names) -> Result<ToolCall, ApiError> {
    let name = item
        .name
        .clone()
        .ok_or_else(|| ApiError::invalid(format!("{path}.name"), "a function_call needs `name`"))?;
    let flat = match &item.namespace {
        Some(ns) => names
            .iter()
            .find(|(_, n, own)| n.as_deref() == Some(ns) && *own == name)
            .map_or_else(|| format!("{ns}__{name}"), |(flat, ..)| flat.clone()),
        None => name,
    };
    Ok(ToolCall {
        id: item.call_id.clone(),
        r#type: Some("function".into()),
        function: FunctionCall {
            name: flat,
            arguments: item.arguments.clone().unwrap_or_default(),
        },
    })
}

/// A reasoning item's text: its `reasoning_text` content, else its summary. Encrypted
/// reasoning (from OpenAI's servers) cannot be read here and is left out.
fn reasoning_text(item: &Item) -> String {
    let parts = match &item.content {
        Some(Content::Parts(p)) if !p.is_empty() => p
            .iter()
            .filter_map(|p| p.text.as_deref())
            .collect::<Vec<_>>(),
        Some(Content::Text(s)) => vec![s.as_str()],
        _ => item
            .summary
            .iter()
            .flatten()
            .filter_map(|p| p.text.as_deref())
            .collect(),
    };
    parts.join("\n\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat::ChatFormat;
    use crate::openai::ChatFields;

    fn request(body: &str) -> ResponsesRequest {
        serde_json::from_str(body).unwrap()
    }

    fn rendered(c: &Conversation) -> String {
        ChatFormat::V4
            .render(&c.messages(), &c.tools, &c.opts)
            .unwrap()
    }

    /// The prompt an OpenAI chat request renders: that path is pinned byte for byte to
    /// DeepSeek's encoder (tests/fixtures/chat_cases.json).
    fn rendered_openai(body: &str) -> String {
        let f: ChatFields = serde_json::from_str(body).unwrap();
        let effort = f
            .reasoning_effort
            .as_deref()
            .map(|e| (e, "reasoning_effort"));
        let opts = crate::openai::render_options(effort, None).unwrap();
        ChatFormat::V4
            .render(&f.messages, f.tools.as_deref().unwrap_or_default(), &opts)
            .unwrap()
    }

    /// An agent's second turn as items (Codex's shape: developer messages, a namespace of
    /// tools, the reasoning, message and call of the last turn, the call's output) renders as
    /// the same conversation sent to Chat Completions.
    #[test]
    fn agent_items_render_as_the_same_chat_conversation() {
        let responses = r#"{
            "instructions": "You are an agent.", "reasoning": {"effort": "max"},
            "tools": [{"type": "function", "name": "exec", "description": "Runs a command",
                       "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}},
                      {"type": "namespace", "name": "agents", "description": "Sub-agents", "tools": [
                          {"type": "function", "name": "spawn", "parameters": {"type": "object"}}]},
                      {"type": "web_search", "external_web_access": false}],
            "input": [
                {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Be careful."}]},
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "List files."}]},
                {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "I will run ls."}]},
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Running."}]},
                {"type": "function_call", "call_id": "c1", "name": "exec", "arguments": "{\"cmd\": \"ls\"}"},
                {"type": "function_call", "call_id": "c2", "namespace": "agents", "name": "spawn", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": "a.txt"},
                {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "spawned"}]}
            ]}"#;
        let chat = r#"{
            "reasoning_effort": "max",
            "tools": [{"type": "function", "function": {"name": "exec", "description": "Runs a command",
                       "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}},
                      {"type": "function", "function": {"name": "agents__spawn", "parameters": {"type": "object"}}}],
            "messages": [
                {"role": "system", "content": "You are an agent."},
                {"role": "developer", "content": "Be careful."},
                {"role": "user", "content": "List files."},
                {"role": "assistant", "reasoning_content": "I will run ls.", "content": "Running.", "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "exec", "arguments": "{\"cmd\": \"ls\"}"}},
                    {"id": "c2", "type": "function", "function": {"name": "agents__spawn", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "a.txt"},
                {"role": "tool", "tool_call_id": "c2", "content": "spawned"}
            ]}"#;
        let c = conversation(&request(responses), Vec::new()).unwrap();
        assert_eq!(rendered(&c), rendered_openai(chat));
        assert_eq!(
            c.names,
            [
                ("exec".to_owned(), None, "exec".to_owned()),
                (
                    "agents__spawn".to_owned(),
                    Some("agents".to_owned()),
                    "spawn".to_owned()
                )
            ]
        );
        assert!(c.parse_tools && !c.single_tool_call);
    }

    /// `input_image` parts: a user message's beside its text, a function call output's as a
    /// user message after the tool message; each keeps its Responses path for errors, and
    /// other roles refuse them.
    #[test]
    fn images_render_as_the_chat_conversation_and_keep_their_paths() {
        let responses = r#"{"reasoning": {"effort": "none"}, "input": [
            {"type": "message", "role": "user", "content": [
                {"type": "input_text", "text": "What is this?"},
                {"type": "input_image", "image_url": "data:image/png;base64,AAAA", "detail": "auto"}]},
            {"type": "function_call", "call_id": "c1", "name": "shot", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": [
                {"type": "input_text", "text": "taken"},
                {"type": "input_image", "image_url": "data:image/png;base64,BBBB"}]}
        ]}"#;
        let chat = r#"{"reasoning_effort": "none", "messages": [
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                                         {"type": "text", "text": "What is this?"}]},
            {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "shot", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "taken"},
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,BBBB"}}]}
        ]}"#;
        let c = conversation(&request(responses), Vec::new()).unwrap();
        assert_eq!(rendered(&c), rendered_openai(chat));
        let messages = c.messages();
        let urls = crate::chat::image_urls(&messages);
        assert_eq!(
            urls,
            [
                (
                    "input[0].content[1]".to_owned(),
                    Some("data:image/png;base64,AAAA")
                ),
                (
                    "input[2].output[1]".to_owned(),
                    Some("data:image/png;base64,BBBB")
                ),
            ]
        );
        for (body, param) in [
            (
                r#"{"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}]}"#,
                "input[0].content[0].image_url",
            ),
            (
                r#"{"input": [{"role": "system", "content": [{"type": "input_image", "image_url": "data:,"}]}]}"#,
                "input[0].content",
            ),
            (
                r#"{"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}"#,
                "input[0].content[0].type",
            ),
        ] {
            let e = conversation(&request(body), Vec::new()).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{body}: {}", e.message);
        }
    }

    /// A continuation renders the stored conversation, then the new input; the new request's
    /// instructions replace the old ones.
    #[test]
    fn a_continuation_puts_the_stored_turns_first() {
        let first = conversation(
            &request(r#"{"instructions": "Old.", "input": "Hi"}"#),
            Vec::new(),
        )
        .unwrap();
        let mut stored = first.history.clone();
        stored.push(ChatMessage {
            role: "assistant".into(),
            content: Some(MessageContent::Text("Hello!".into())),
            ..Default::default()
        });
        let next = conversation(
            &request(r#"{"instructions": "New.", "input": "Bye"}"#),
            stored,
        )
        .unwrap();
        let chat = r#"{"messages": [{"role": "system", "content": "New."}, {"role": "user", "content": "Hi"},
                                    {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Bye"}]}"#;
        assert_eq!(rendered(&next), rendered_openai(chat));
    }

    #[test]
    fn what_cannot_be_served_is_refused_with_its_path() {
        let cases = [
            (r#"{"input": []}"#, "input"),
            (
                r#"{"input": [{"role": "robot", "content": "x"}]}"#,
                "input[0].role",
            ),
            (r#"{"input": [{"type": "computer_call"}]}"#, "input[0].type"),
            (
                r#"{"input": [{"role": "user", "content": [{"type": "input_audio"}]}]}"#,
                "input[0].content[0].type",
            ),
            (
                r#"{"input": [{"type": "function_call_output", "output": "x"}]}"#,
                "input[0].call_id",
            ),
            (
                r#"{"input": [{"type": "function_call", "arguments": "{}"}]}"#,
                "input[0].name",
            ),
            (
                r#"{"input": "x", "tools": [{"type": "function"}]}"#,
                "tools[0].name",
            ),
            (
                r#"{"input": "x", "tool_choice": {"type": "function"}}"#,
                "tool_choice.name",
            ),
            (
                r#"{"input": "x", "reasoning": {"effort": "huge"}}"#,
                "reasoning.effort",
            ),
            (r#"{"input": "x", "background": true}"#, "background"),
        ];
        for (body, param) in cases {
            let e = conversation(&request(body), Vec::new()).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{body}: {}", e.message);
        }
    }
}
