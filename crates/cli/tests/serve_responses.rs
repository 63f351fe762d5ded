//! OpenAI's Responses API end to end against the running binary: the same answer as Chat
//! Completions (one renderer, one engine, one parser) as output items, whole and streamed
//! with numbered events; the store's bound; errors naming their field.

mod support;

use serde_json::{json, Value};
use support::{post_json as post, read_sse, Server};

/// A streamed response's events, checked to be numbered 0, 1, 2, … and named by their type.
async fn stream(server: &Server, body: &Value) -> Vec<Value> {
    let mut body = body.clone();
    body["stream"] = json!(true);
    let r = reqwest::Client::new()
        .post(server.url("/v1/responses"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let text = read_sse(r).await;
    let events: Vec<Value> = text
        .split("\n\n")
        .filter(|e| !e.trim().is_empty() && !e.starts_with(':'))
        .map(|e| {
            let name = e.lines().find_map(|l| l.strip_prefix("event: ")).expect(e);
            let data = e.lines().find_map(|l| l.strip_prefix("data: ")).expect(e);
            let v: Value = serde_json::from_str(data).unwrap();
            assert_eq!(v["type"], name, "{e}");
            v
        })
        .collect();
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e["sequence_number"], i, "{e}");
    }
    events
}

/// Each output item's type and text, without the ids that differ between answers.
fn item_texts(output: &Value) -> Vec<(String, String)> {
    output
        .as_array()
        .unwrap()
        .iter()
        .map(|o| {
            let text = o["content"].as_array().map_or(String::new(), |c| {
                c.iter().map(|p| p["text"].as_str().unwrap()).collect()
            });
            (o["type"].as_str().unwrap().to_owned(), text)
        })
        .collect()
}

/// At temperature 0 the Responses answer is the Chat Completions answer: its reasoning as a
/// reasoning item, its text as a message, the same token counts; streamed, the lifecycle
/// events frame the items and `response.completed` carries the same output.
#[tokio::test]
async fn responses_answer_as_chat_completions_whole_and_streamed() {
    let server = Server::start(&[]);
    let question = "Tell me about the sea. ".repeat(8);
    let chat = json!({"messages": [{"role": "system", "content": "Be brief."},
                                   {"role": "user", "content": question}],
                      "max_tokens": 12, "temperature": 0});
    let (status, c) = post(&server, "/v1/chat/completions", &chat).await;
    assert_eq!(status, 200, "{c}");
    let body = json!({"instructions": "Be brief.", "input": question, "max_output_tokens": 12,
                      "temperature": 0});
    let (status, r) = post(&server, "/v1/responses", &body).await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["object"], "response");
    assert!(r["id"].as_str().unwrap().starts_with("resp_"));
    let msg = &c["choices"][0]["message"];
    let mut want = Vec::new();
    if let Some(t) = msg["reasoning_content"].as_str() {
        want.push(("reasoning".to_owned(), t.to_owned()));
    }
    if let Some(t) = msg["content"].as_str().filter(|t| !t.is_empty()) {
        want.push(("message".to_owned(), t.to_owned()));
    }
    assert_eq!(item_texts(&r["output"]), want, "{r}");
    let length = c["choices"][0]["finish_reason"] == "length";
    assert_eq!(r["status"], if length { "incomplete" } else { "completed" });
    if length {
        assert_eq!(
            r["incomplete_details"],
            json!({"reason": "max_output_tokens"})
        );
    }
    assert_eq!(r["usage"]["input_tokens"], c["usage"]["prompt_tokens"]);
    assert_eq!(r["usage"]["output_tokens"], c["usage"]["completion_tokens"]);

    let events = stream(&server, &body).await;
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(&kinds[..2], ["response.created", "response.in_progress"]);
    assert_eq!(kinds.last(), Some(&"response.completed"));
    let done = &events.last().unwrap()["response"];
    assert_eq!(done["id"], events[0]["response"]["id"]);
    assert_eq!(item_texts(&done["output"]), want);
    assert_eq!(done["status"], r["status"]);
    // Each item added before its deltas and done after them, in output order.
    let added: Vec<u64> = events
        .iter()
        .filter(|e| e["type"] == "response.output_item.added")
        .map(|e| e["output_index"].as_u64().unwrap())
        .collect();
    let finished: Vec<u64> = events
        .iter()
        .filter(|e| e["type"] == "response.output_item.done")
        .map(|e| e["output_index"].as_u64().unwrap())
        .collect();
    assert_eq!(added, (0..want.len() as u64).collect::<Vec<_>>());
    assert_eq!(finished, added);
    server.wait_idle().await;
}

/// With the store off nothing is kept: retrieving is a 404 and continuing a 400, each naming
/// what to do; bad requests name their field.
#[tokio::test]
async fn the_store_bound_and_bad_requests() {
    let server = Server::start(&["--responses-store-mib", "0"]);
    let (status, r) = post(
        &server,
        "/v1/responses",
        &json!({"input": "Hi", "max_output_tokens": 2}),
    )
    .await;
    assert_eq!(status, 200, "{r}");
    let id = r["id"].as_str().unwrap();
    let got = reqwest::get(server.url(&format!("/v1/responses/{id}")))
        .await
        .unwrap();
    assert_eq!(got.status().as_u16(), 404);
    let v: Value = got.json().await.unwrap();
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("--responses-store-mib"),
        "{v}"
    );
    let cases = [
        (
            json!({"input": "x", "previous_response_id": id}),
            "previous_response_id",
        ),
        (
            json!({"input": "x", "tool_choice": "required"}),
            "tool_choice",
        ),
        (
            // The default model has no vision tower.
            json!({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "data:"}]}]}),
            "input[0].content[0]",
        ),
        (
            json!({"input": "x", "max_output_tokens": 0}),
            "max_output_tokens",
        ),
        (json!({"input": 7}), "input"),
    ];
    for (body, param) in cases {
        let (status, v) = post(&server, "/v1/responses", &body).await;
        assert_eq!(status, 400, "{v}");
        assert_eq!(v["error"]["param"], param, "{v}");
    }
    let deleted = reqwest::Client::new()
        .delete(server.url(&format!("/v1/responses/{id}")))
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status().as_u16(), 404);
}

/// Stored answers are retrieved as they were returned, continue a conversation through the
/// prefix cache, and are deleted once.
#[tokio::test]
async fn stored_responses_are_retrieved_continued_and_deleted() {
    let server = Server::start(&[]);
    let body = json!({"input": "Tell me about the sea. ".repeat(20), "max_output_tokens": 4,
                      "temperature": 0});
    let (_, first) = post(&server, "/v1/responses", &body).await;
    let id = first["id"].as_str().unwrap();
    let got: Value = reqwest::get(server.url(&format!("/v1/responses/{id}")))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(got, first);
    let (status, next) = post(
        &server,
        "/v1/responses",
        &json!({"previous_response_id": id, "input": "And the sky?", "max_output_tokens": 2}),
    )
    .await;
    assert_eq!(status, 200, "{next}");
    assert!(next["usage"]["input_tokens"].as_u64() > first["usage"]["input_tokens"].as_u64());
    assert!(
        next["usage"]["input_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
            >= 128,
        "{next}"
    );
    assert_eq!(next["previous_response_id"], id);
    let c = reqwest::Client::new();
    let url = server.url(&format!("/v1/responses/{id}"));
    let v: Value = c.delete(&url).send().await.unwrap().json().await.unwrap();
    assert_eq!(v, json!({"id": id, "object": "response", "deleted": true}));
    assert_eq!(c.delete(&url).send().await.unwrap().status().as_u16(), 404);
}
