//! Structured outputs end to end on the synthetic tiny model, whose random weights never
//! write JSON unaided: sampled answers under a JSON schema all parse and validate, regex and
//! choice constraints hold, on every API family; greedy output under a grammar is the same
//! with MTP speculation on; constrained and free requests share a batch without changing the
//! free one; a repeated constrained prompt is served from the prefix cache.

mod support;

use serde_json::{json, Value};
use support::{metric, post_json as post, Server};

fn schema() -> Value {
    json!({"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "ok": {"type": "boolean"},
        "colour": {"enum": ["red", "green", "blue"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 3}},
        "required": ["name", "age", "ok", "colour"], "additionalProperties": false})
}

/// Checks `text` against [`schema`] by hand (an independent check of what the grammar let
/// through).
fn check(text: &str) {
    let v: Value =
        serde_json::from_str(text).unwrap_or_else(|e| panic!("{text:?} is not JSON: {e}"));
    let o = v
        .as_object()
        .unwrap_or_else(|| panic!("{text:?} is not an object"));
    for k in o.keys() {
        assert!(
            ["name", "age", "ok", "colour", "tags"].contains(&k.as_str()),
            "{text}: {k}"
        );
    }
    assert!(
        o["name"].as_str().is_some_and(|s| s.chars().count() <= 12),
        "{text}"
    );
    assert!(o["age"].as_u64().is_some_and(|a| a <= 150), "{text}");
    assert!(o["ok"].is_boolean(), "{text}");
    assert!(
        ["red", "green", "blue"].contains(&o["colour"].as_str().unwrap_or("")),
        "{text}"
    );
    if let Some(t) = o.get("tags") {
        let t = t.as_array().unwrap_or_else(|| panic!("{text}"));
        assert!(
            t.len() <= 3
                && t.iter()
                    .all(|s| s.as_str().is_some_and(|s| s.chars().count() <= 6)),
            "{text}"
        );
    }
}

fn chat(format: Value, n: usize, temperature: f64) -> Value {
    json!({"messages": [{"role": "user", "content": "Describe a person as JSON."}],
           "max_tokens": 200, "temperature": temperature, "seed": 11, "n": n,
           "chat_template_kwargs": {"thinking": false}, "response_format": format})
}

fn contents(v: &Value) -> Vec<String> {
    v["choices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            assert_eq!(c["finish_reason"], "stop", "{c}");
            c["message"]["content"]
                .as_str()
                .or(c["text"].as_str())
                .unwrap()
                .to_owned()
        })
        .collect()
}

#[tokio::test]
async fn sampled_answers_under_a_schema_all_validate() {
    let server = Server::start(&[]);
    let format = json!({"type": "json_schema", "json_schema": {"name": "person", "schema": schema(), "strict": true}});
    let (status, v) = post(&server, "/v1/chat/completions", &chat(format, 20, 1.0)).await;
    assert_eq!(status, 200, "{v}");
    let answers = contents(&v);
    assert_eq!(answers.len(), 20);
    answers.iter().for_each(|a| check(a));
    // They are samples, not one answer twenty times.
    let distinct: std::collections::HashSet<&String> = answers.iter().collect();
    assert!(distinct.len() > 10, "{answers:?}");
    // json_object: any object. Its keys and strings are free, so a random model may still
    // be inside one when the budget runs out; what finished is an object, the rest starts one.
    let body = chat(json!({"type": "json_object"}), 8, 1.0);
    let (_, v) = post(&server, "/v1/chat/completions", &body).await;
    for c in v["choices"].as_array().unwrap() {
        let a = c["message"]["content"].as_str().unwrap();
        match c["finish_reason"].as_str() {
            Some("stop") => assert!(serde_json::from_str::<Value>(a).unwrap().is_object(), "{a}"),
            _ => assert!(a.trim_start().starts_with('{'), "{a}"),
        }
    }
    let m = server.wait_idle().await;
    assert!(
        metric(&m, "deepinfer:structured_output_masks_total", &[]).unwrap() > 100.0,
        "{m}"
    );
}

#[tokio::test]
async fn regex_choice_and_grammar_constraints_hold_on_completions() {
    let server = Server::start(&[]);
    let base =
        json!({"prompt": "The code is", "max_tokens": 40, "temperature": 1.0, "seed": 5, "n": 8});
    let cases = [
        (
            json!({"guided_regex": "[0-9]{3}-[A-Z]{2}"}),
            r"^[0-9]{3}-[A-Z]{2}$",
        ),
        (
            json!({"structured_outputs": {"choice": ["alpha", "beta (b)", "gamma"]}}),
            r"^(alpha|beta \(b\)|gamma)$",
        ),
        (
            json!({"guided_grammar": "start: \"x\" (\"y\" | \"z\")+"}),
            r"^x[yz]+$",
        ),
    ];
    for (extra, pattern) in cases {
        let mut body = base.clone();
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let (status, v) = post(&server, "/v1/completions", &body).await;
        assert_eq!(status, 200, "{v}");
        for text in contents(&v) {
            assert!(
                regex_lite_match(pattern, &text),
                "{text:?} against {pattern}"
            );
        }
    }
}

/// A tiny matcher for the three patterns above (anchored; no regex crate in the tests).
fn regex_lite_match(pattern: &str, text: &str) -> bool {
    match pattern {
        r"^[0-9]{3}-[A-Z]{2}$" => {
            let b = text.as_bytes();
            b.len() == 6
                && b[..3].iter().all(u8::is_ascii_digit)
                && b[3] == b'-'
                && b[4..].iter().all(u8::is_ascii_uppercase)
        }
        r"^(alpha|beta \(b\)|gamma)$" => ["alpha", "beta (b)", "gamma"].contains(&text),
        r"^x[yz]+$" => {
            text.len() > 1
                && text.starts_with('x')
                && text[1..].chars().all(|c| c == 'y' || c == 'z')
        }
        _ => unreachable!(),
    }
}

/// The Responses and Messages APIs take their own format fields.
#[tokio::test]
async fn responses_and_messages_take_their_formats() {
    let server = Server::start(&[]);
    let (status, r) = post(&server, "/v1/responses", &json!({
        "input": "Describe a person.", "max_output_tokens": 200, "reasoning": {"effort": "none"},
        "text": {"format": {"type": "json_schema", "name": "person", "schema": schema(), "strict": true}}})).await;
    assert_eq!(status, 200, "{r}");
    let text = r["output"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["type"] == "message")
        .map(|o| o["content"][0]["text"].as_str().unwrap())
        .unwrap();
    check(text);
    let (status, m) = post(
        &server,
        "/v1/messages",
        &json!({
        "messages": [{"role": "user", "content": "Describe a person."}], "max_tokens": 200,
        "output_config": {"format": {"type": "json_schema", "schema": schema()}}}),
    )
    .await;
    assert_eq!(status, 200, "{m}");
    check(m["content"][0]["text"].as_str().unwrap());
}

/// Greedy under a grammar: the same answer with MTP drafts verified against the grammar as
/// without speculation (and sampled answers under it all valid), and the same when a free request shares its batch; a repeat is
/// served from the prefix cache with the same answer.
#[tokio::test]
async fn speculation_batching_and_the_prefix_cache_leave_constrained_output_alone() {
    let format = json!({"type": "json_schema", "json_schema": {"name": "p", "schema": schema()}});
    let mut body = chat(format, 1, 0.0);
    body["messages"][0]["content"] = json!("Describe a person as JSON. ".repeat(30));
    let plain = Server::start(&[]);
    let (_, want) = post(&plain, "/v1/chat/completions", &body).await;
    let want_text = contents(&want).remove(0);
    check(&want_text);
    let spec = r#"{"method": "mtp", "num_speculative_tokens": 3, "adaptive": false}"#;
    let server = Server::start(&["--speculative-config", spec]);
    let free = json!({"prompt": [100, 2000, 30000, 5, 77], "max_tokens": 24, "temperature": 0, "ignore_eos": true});
    let (_, alone) = post(&server, "/v1/completions", &free).await;
    let (a, b) = tokio::join!(
        post(&server, "/v1/chat/completions", &body),
        post(&server, "/v1/completions", &free)
    );
    assert_eq!(contents(&a.1).remove(0), want_text);
    assert_eq!(b.1["choices"][0]["text"], alone["choices"][0]["text"]);
    let (_, again) = post(&server, "/v1/chat/completions", &body).await;
    assert_eq!(contents(&again).remove(0), want_text);
    assert!(
        again["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
            >= 128,
        "{again}"
    );
    // Sampled with drafts: every answer still validates.
    let format = json!({"type": "json_schema", "json_schema": {"name": "p", "schema": schema()}});
    let (_, sampled) = post(&server, "/v1/chat/completions", &chat(format, 8, 1.0)).await;
    contents(&sampled).iter().for_each(|a| check(a));
    let m = server.wait_idle().await;
    assert!(
        metric(&m, "deepinfer:spec_decode_num_draft_tokens_total", &[]).unwrap() > 0.0,
        "{m}"
    );
}

#[tokio::test]
async fn bad_constraints_are_400s_naming_the_field() {
    let server = Server::start(&[]);
    let cases = [
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x"}], "guided_regex": "(oops"}),
            "guided_regex",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x"}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}),
            "response_format.json_schema.schema",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x"}],
            "response_format": {"type": "json_object"}, "guided_regex": "a"}),
            "guided_regex",
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "guided_choice": []}),
            "guided_choice",
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "guided_json": {"type": "object"}, "ignore_eos": true}),
            "ignore_eos",
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "structured_outputs": {"json": {"type": "wat"}}}),
            "structured_outputs.json",
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "guided_regex": "a".repeat(300_000)}),
            "guided_regex",
        ),
        (
            "/v1/responses",
            json!({"input": "x", "text": {"format": {"type": "json_schema"}}}),
            "text.format.schema",
        ),
    ];
    for (path, body, param) in cases {
        let (status, v) = post(&server, path, &body).await;
        assert_eq!(status, 400, "{path} {v}");
        assert_eq!(v["error"]["param"], param, "{v}");
    }
    let (status, v) = post(&server, "/v1/messages", &json!({"messages": [{"role": "user", "content": "x"}],
        "max_tokens": 4, "output_config": {"format": {"type": "json_schema", "schema": {"type": 7}}}})).await;
    assert_eq!(status, 400, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("output_config.format"),
        "{v}"
    );
}

fn weather_tools() -> Value {
    json!([{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {
            "city": {"type": "string", "maxLength": 10},
            "days": {"type": "integer", "minimum": 1, "maximum": 14},
            "unit": {"enum": ["C", "F"], "type": "string"}},
        "required": ["city", "days"]}}},
        {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}}])
}

/// A forced call on a model that never calls tools unaided (its random weights spell the
/// DSML literals in small tokens, so the budgets are large): `required` gives every sampled
/// answer a call whose arguments fit the tool's schema; a named function gives exactly that
/// call; the same through Anthropic's `any` and the Responses API's `required`.
#[tokio::test]
async fn forced_tool_calls_always_come_with_valid_arguments() {
    let server = Server::start(&[]);
    let base = json!({"messages": [{"role": "user", "content": "Weather?"}], "tools": weather_tools(),
                      "max_tokens": 600, "temperature": 1.0, "seed": 3, "n": 10,
                      "chat_template_kwargs": {"thinking": false}});
    let check_call = |name: &str, args: &Value| match name {
        "get_weather" => {
            assert!(
                args["city"]
                    .as_str()
                    .is_some_and(|c| c.chars().count() <= 10),
                "{args}"
            );
            assert!(
                args["days"].as_u64().is_some_and(|d| (1..=14).contains(&d)),
                "{args}"
            );
            assert!(
                args.get("unit").is_none_or(|u| u == "C" || u == "F"),
                "{args}"
            );
        }
        "now" => assert_eq!(args, &json!({})),
        other => panic!("called {other}"),
    };
    let mut body = base.clone();
    body["tool_choice"] = json!("required");
    let (status, v) = post(&server, "/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{v}");
    // The model decides how many calls to make; a budget that ends among them cuts the last
    // (the parser gives back what it has of it, as the finish reason says).
    for c in v["choices"].as_array().unwrap() {
        let calls = c["message"]["tool_calls"].as_array().unwrap();
        assert!(!calls.is_empty(), "{c}");
        let complete = match c["finish_reason"].as_str().unwrap() {
            "tool_calls" => calls.len(),
            "length" => calls.len() - 1,
            other => panic!("{other}: {c}"),
        };
        for call in &calls[..complete] {
            let args: Value =
                serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
            check_call(call["function"]["name"].as_str().unwrap(), &args);
        }
    }
    // One call only: named, or `required` without parallel calls.
    body["tool_choice"] = json!({"type": "function", "function": {"name": "get_weather"}});
    let (_, v) = post(&server, "/v1/chat/completions", &body).await;
    body["tool_choice"] = json!("required");
    body["parallel_tool_calls"] = json!(false);
    let (_, single) = post(&server, "/v1/chat/completions", &body).await;
    for c in single["choices"].as_array().unwrap() {
        assert_eq!(c["finish_reason"], "tool_calls", "{c}");
        assert_eq!(
            c["message"]["tool_calls"].as_array().unwrap().len(),
            1,
            "{c}"
        );
    }
    for c in v["choices"].as_array().unwrap() {
        assert_eq!(c["finish_reason"], "tool_calls", "{c}");
        let calls = c["message"]["tool_calls"].as_array().unwrap();
        assert_eq!(calls.len(), 1, "{c}");
        assert_eq!(calls[0]["function"]["name"], "get_weather");
    }
    let tools: Vec<Value> = weather_tools()
        .as_array()
        .unwrap()
        .iter()
        .map(
            |t| json!({"name": t["function"]["name"], "input_schema": t["function"]["parameters"]}),
        )
        .collect();
    let (status, m) = post(
        &server,
        "/v1/messages",
        &json!({
        "messages": [{"role": "user", "content": "Weather?"}], "tools": tools, "max_tokens": 600,
        "tool_choice": {"type": "any", "disable_parallel_tool_use": true}}),
    )
    .await;
    assert_eq!(status, 200, "{m}");
    assert_eq!(m["stop_reason"], "tool_use", "{m}");
    let uses: Vec<&Value> = m["content"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["type"] == "tool_use")
        .collect();
    assert_eq!(uses.len(), 1, "{m}");
    check_call(uses[0]["name"].as_str().unwrap(), &uses[0]["input"]);
    let rtools: Vec<Value> = weather_tools().as_array().unwrap().iter()
        .map(|t| json!({"type": "function", "name": t["function"]["name"], "parameters": t["function"]["parameters"]})).collect();
    let (status, r) = post(
        &server,
        "/v1/responses",
        &json!({"input": "Weather?", "tools": rtools,
        "tool_choice": "required", "max_output_tokens": 600, "reasoning": {"effort": "none"}}),
    )
    .await;
    assert_eq!(status, 200, "{r}");
    let fc = r["output"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["type"] == "function_call")
        .expect("a call");
    check_call(
        fc["name"].as_str().unwrap(),
        &serde_json::from_str(fc["arguments"].as_str().unwrap()).unwrap(),
    );
}
