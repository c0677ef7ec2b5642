//! Grammars deep enough to hurt the compiler (issue 63): a `$ref` chain of a thousand
//! definitions, in each place a schema can come from (chat `response_format`, vLLM's fields,
//! the Responses API's `text.format`, Anthropic's `output_config.format`, a forced tool's
//! `parameters`), schemas nested past the bound, Lark grammars whose rules chain a thousand deep,
//! deeply nested parentheses, and a `$ref` to itself. Each is a 400 naming the field, in a short
//! message that says what is wrong, and the server answers the next request; grammars within the
//! bounds (a 300-link chain, recursive schemas) still compile and generate. Every server here is
//! a child process, so a stack overflow fails these tests and nothing else.

use std::process::Child;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use serde_json::{json, Map, Value};

use crate::harness::{assert_error_shape, post_json};
use crate::shutdown::{pagoda_serve, spawn_ready};

/// A small `pagoda serve` child, killed when dropped.
struct Child0 {
    child: Child,
    addr: String,
}

impl Drop for Child0 {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Child0 {
    fn start() -> Result<Child0> {
        let extra = ["--kv-cache-memory", "64MiB", "--max-model-len", "1024", "--served-model-name", "smol"];
        let (child, addr, _log) = spawn_ready(pagoda_serve(&extra))?;
        Ok(Child0 { child, addr })
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// POSTs `body` to `path`; a connection error says whether the server is gone.
    async fn post(&mut self, c: &reqwest::Client, path: &str, body: &Value) -> Result<(u16, Value)> {
        match post_json(c, &self.url(path), body).await {
            Ok(answer) => Ok(answer),
            Err(e) => {
                // A dying process closes its sockets a moment before it can be reaped.
                tokio::time::sleep(Duration::from_millis(500)).await;
                match self.child.try_wait()? {
                    Some(status) => bail!("the server died ({status}) on {path}: {e:#}"),
                    None => Err(e),
                }
            }
        }
    }

    /// A plain chat request still gets its answer.
    async fn answers(&mut self, c: &reqwest::Client, after: &str) -> Result<()> {
        let body = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2});
        let (status, resp) =
            self.post(c, "/v1/chat/completions", &body).await.with_context(|| format!("after {after}"))?;
        anyhow::ensure!(status == 200, "after {after}: {status} {resp}");
        Ok(())
    }

    /// `body` to `path` is a 400 naming `param` (`None`: the API has no `param`, or the request
    /// never parsed), in a short message without llguidance's internals; then the server answers.
    async fn refused(
        &mut self,
        c: &reqwest::Client,
        what: &str,
        path: &str,
        body: &Value,
        param: Option<&str>,
    ) -> Result<String> {
        let (status, resp) = self.post(c, path, body).await.with_context(|| what.to_owned())?;
        anyhow::ensure!(status == 400, "{what}: {status} {}", excerpt(&resp));
        let message = if path == "/v1/messages" {
            resp["error"]["message"].as_str().context("an Anthropic error")?.to_owned()
        } else {
            let err = assert_error_shape(&resp);
            if let Some(param) = param {
                anyhow::ensure!(
                    err["param"] == param,
                    "{what}: param {} in {}",
                    err["param"],
                    excerpt(&resp)
                );
            }
            err["message"].as_str().unwrap_or_default().to_owned()
        };
        short_and_plain(what, &message)?;
        self.answers(c, what).await?;
        Ok(message)
    }
}

fn excerpt(v: &Value) -> String {
    let text = v.to_string();
    text.chars().take(600).collect()
}

/// One line, a few hundred characters at most, none of llguidance's internals.
fn short_and_plain(what: &str, message: &str) -> Result<()> {
    let internals = ["Earley", "lexer", "stack", "state", "\n", "backtrace", "/src/", ".rs:"];
    anyhow::ensure!(message.len() <= 300, "{what}: {} bytes: {message}", message.len());
    for word in internals {
        anyhow::ensure!(!message.contains(word), "{what}: {word:?} in {message}");
    }
    Ok(())
}

fn client() -> reqwest::Client {
    reqwest::Client::builder().timeout(Duration::from_secs(120)).build().expect("a client")
}

/// `#/$defs/d0` -> `d1` -> ... -> `d{n-1}` -> `{"type": "string"}`, and the `$defs` alone.
fn chain_defs(n: usize) -> Map<String, Value> {
    let mut defs = Map::new();
    for i in 0..n {
        defs.insert(format!("d{i}"), json!({"$ref": format!("#/$defs/d{}", i + 1)}));
    }
    defs.insert(format!("d{n}"), json!({"type": "string"}));
    defs
}

fn chain(n: usize) -> Value {
    json!({"$defs": chain_defs(n), "$ref": "#/$defs/d0"})
}

/// `{"type": "array", "items": ...}` (or `properties`) `n` deep around a string.
fn nested(n: usize, key: &str) -> Value {
    let mut s = json!({"type": "string"});
    for _ in 0..n {
        s = match key {
            "items" => json!({"type": "array", "items": s}),
            _ => json!({"type": "object", "properties": {"a": s}, "required": ["a"]}),
        };
    }
    s
}

fn lark_chain(n: usize) -> String {
    let mut g = String::from("start: r0\n");
    for i in 0..n {
        g.push_str(&format!("r{i}: r{}\n", i + 1));
    }
    g + &format!("r{n}: \"x\"\n")
}

fn chat(extra: Value) -> Value {
    let mut body = json!({"messages": [{"role": "user", "content": "Answer."}], "max_tokens": 4});
    body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    body
}

fn response_format(schema: &Value) -> Value {
    json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}})
}

/// A tool whose argument `x` is the chain, for a request that must call it.
fn tool_with_chain(n: usize) -> Value {
    json!({"type": "object", "properties": {"x": {"$ref": "#/$defs/d0"}}, "required": ["x"], "$defs": chain_defs(n)})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deep_schemas_are_400s_naming_the_field() -> Result<()> {
    let mut s = Child0::start()?;
    let c = client();
    let deep = chain(1000);
    let chat_cases = [
        ("chat response_format", response_format(&deep), "response_format.json_schema.schema"),
        ("structured_outputs.json", json!({"structured_outputs": {"json": deep}}), "structured_outputs.json"),
        ("guided_json", json!({"guided_json": deep}), "guided_json"),
        (
            "forced tool",
            json!({"tools": [{"type": "function", "function": {"name": "f", "parameters": tool_with_chain(1000)}}],
                   "tool_choice": "required"}),
            "tools[0].function.parameters",
        ),
        (
            "items nested 100 deep",
            response_format(&nested(100, "items")),
            "response_format.json_schema.schema",
        ),
        (
            "properties nested 60 deep",
            response_format(&nested(60, "properties")),
            "response_format.json_schema.schema",
        ),
        (
            "1000 deep, as JSON text",
            json!({"structured_outputs": {"json": nested(1000, "items").to_string()}}),
            "structured_outputs.json",
        ),
    ];
    for (what, extra, param) in chat_cases {
        s.refused(&c, what, "/v1/chat/completions", &chat(extra), Some(param)).await?;
    }
    let completion = json!({"prompt": "JSON:", "max_tokens": 4, "guided_json": deep});
    s.refused(&c, "completions guided_json", "/v1/completions", &completion, Some("guided_json")).await?;
    let responses = json!({"input": "Answer.", "max_output_tokens": 4,
        "text": {"format": {"type": "json_schema", "name": "x", "schema": deep}}});
    s.refused(&c, "Responses text.format", "/v1/responses", &responses, Some("text.format.schema")).await?;
    let responses_tool = json!({"input": "Answer.", "max_output_tokens": 4, "tool_choice": "required",
        "tools": [{"type": "function", "name": "f", "parameters": tool_with_chain(1000)}]});
    s.refused(&c, "Responses tool", "/v1/responses", &responses_tool, Some("tools[0].parameters")).await?;
    let messages = json!({"model": "smol", "max_tokens": 4, "messages": [{"role": "user", "content": "Answer."}],
        "output_config": {"format": {"type": "json_schema", "schema": deep}}});
    let message = s.refused(&c, "Messages output_config.format", "/v1/messages", &messages, None).await?;
    assert!(message.contains("output_config.format.schema"), "{message}");

    // Deeper than JSON parsing allows at all: the body is refused before any grammar.
    let mut body = chat(json!({})).to_string();
    body.insert_str(body.len() - 1, &format!(",\"guided_json\":{}", nested(1000, "items")));
    let resp = c.post(s.url("/v1/chat/completions")).header("content-type", "application/json").body(body);
    let resp = resp.send().await.context("the 1000-deep body")?;
    assert_eq!(resp.status(), 400);
    s.answers(&c, "a 1000-deep body").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deep_lark_grammars_and_patterns_are_400s_naming_the_field() -> Result<()> {
    let mut s = Child0::start()?;
    let c = client();
    let parens = |n: usize| format!("{}\"x\"{}", "(".repeat(n), ")".repeat(n));
    let tag =
        json!({"structures": [{"begin": "<f>", "schema": chain(1000), "end": "</f>"}], "triggers": ["<f"]});
    let cases = [
        ("a 1000-rule chain", json!({"guided_grammar": lark_chain(1000)}), "guided_grammar"),
        (
            "a 1000-rule chain in structured_outputs",
            json!({"structured_outputs": {"grammar": lark_chain(1000)}}),
            "structured_outputs.grammar",
        ),
        ("a 1000-token chain", json!({"guided_grammar": tokens_chain(1000)}), "guided_grammar"),
        (
            "a $ref chain in %json",
            json!({"guided_grammar": format!("start: %json {}\n", chain(1000))}),
            "guided_grammar",
        ),
        (
            "1000 nested parentheses in Lark",
            json!({"guided_grammar": format!("start: {}\n", parens(1000))}),
            "guided_grammar",
        ),
        (
            "1000 nested groups in a Lark regex",
            json!({"guided_grammar": format!("start: /{}x{}/\n", "(".repeat(1000), ")".repeat(1000))}),
            "guided_grammar",
        ),
        (
            "1000 nested groups in a regex",
            json!({"guided_regex": format!("{}x{}", "(".repeat(1000), ")".repeat(1000))}),
            "guided_regex",
        ),
        (
            "a $ref chain in a structural tag",
            json!({"structured_outputs": {"structural_tag": tag}}),
            "structured_outputs.structural_tag",
        ),
    ];
    for (what, extra, param) in cases {
        s.refused(&c, what, "/v1/chat/completions", &chat(extra), Some(param)).await?;
    }
    Ok(())
}

fn tokens_chain(n: usize) -> String {
    let mut g = String::from("start: T0\n");
    for i in 0..n {
        g.push_str(&format!("T{i}: T{}\n", i + 1));
    }
    g + &format!("T{n}: \"x\"\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_self_referencing_ref_is_a_short_clear_400() -> Result<()> {
    let mut s = Child0::start()?;
    let c = client();
    let itself = json!({"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"});
    let loop2 =
        json!({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"});
    for (what, schema) in [("a $ref to itself", itself), ("two $refs to each other", loop2)] {
        let message = s
            .refused(
                &c,
                what,
                "/v1/chat/completions",
                &chat(response_format(&schema)),
                Some("response_format.json_schema.schema"),
            )
            .await?;
        assert!(message.contains("refer") && message.contains("itself"), "{what}: {message}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grammars_within_the_bounds_compile_and_generate() -> Result<()> {
    let mut s = Child0::start()?;
    let c = client();
    let tree = json!({"type": "object", "properties": {"v": {"type": "integer"},
        "kids": {"type": "array", "items": {"$ref": "#"}, "maxItems": 2}}, "required": ["v"], "additionalProperties": false});
    let cases = [
        ("a 300-link $ref chain", response_format(&chain(300))),
        ("a 500-link $ref chain", response_format(&chain(500))),
        ("a recursive schema", response_format(&tree)),
        ("items nested 60 deep", response_format(&nested(60, "items"))),
        ("a 300-rule chain", json!({"guided_grammar": lark_chain(300)})),
        ("a 500-rule chain", json!({"guided_grammar": lark_chain(500)})),
    ];
    for (what, extra) in cases {
        let body = chat(extra);
        let (status, resp) =
            s.post(&c, "/v1/chat/completions", &body).await.with_context(|| what.to_owned())?;
        assert_eq!(status, 200, "{what}: {}", excerpt(&resp));
        let text = resp["choices"][0]["message"]["content"].as_str().context("content")?;
        if what.contains("rule") {
            assert_eq!(text, "x", "{what}");
        } else {
            assert!(text.starts_with(['"', '{', '[']), "{what}: {text:?}");
        }
    }
    Ok(())
}
