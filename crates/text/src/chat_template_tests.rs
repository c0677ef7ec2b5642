//! Tests for chat templates. Expected outputs were produced by Python's jinja2 in the
//! environment Hugging Face's `apply_chat_template` uses (sandboxed, `trim_blocks`,
//! `lstrip_blocks`, loop controls, `json.dumps`-based `tojson`).

use super::*;
use serde_json::json;

/// Llama-3-style: system message extraction, role alternation check with `raise_exception`,
/// `{%- ... %}` whitespace control and the `trim` filter.
const LLAMA3: &str = r#"{{- bos_token }}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{{- "Cutting Knowledge Date: December 2023\n\n" }}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- for message in messages %}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}
    {%- endif %}
    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
"#;

/// Python string methods (`strip`, `startswith`, `endswith`, `split`, `upper`) and plain
/// `{% %}` blocks, relying on `trim_blocks` / `lstrip_blocks` for layout.
const PYSTR: &str = r#"{% for message in messages %}
    {% if message.role == 'system' %}
System: {{ message.content.strip() }}
    {% elif message.content.startswith('/cmd') %}
Command: {{ message.content.split(' ')[1:] | join(',') }}
    {% else %}
{{ message.role.upper() }}: {{ message.content.strip() }}{% if message.content.endswith('?') %} (question){% endif %}

    {% endif %}
{% endfor %}
{% if add_generation_prompt %}
ASSISTANT:
{% endif %}
"#;

/// `namespace`, `continue`, `break`, `loop.last`, `loop.index`, `tojson`, `tools is not none`
/// and `{%- -%}` on both sides.
const LOOPS: &str = r#"{%- set ns = namespace(count=0) -%}
{%- for m in messages -%}
  {%- if m.role == 'tool' -%}{%- continue -%}{%- endif -%}
  {%- set ns.count = ns.count + 1 -%}
  [{{ m.role }}] {{ m.content }}{% if not loop.last %} | {% endif %}
  {%- if ns.count >= 3 -%}{%- break -%}{%- endif -%}
{%- endfor -%}
{%- if tools is not none %}

Tools: {{ tools | tojson }}
{%- for t in tools %}
{{ loop.index }}. {{ t.name }}{{ ',' if not loop.last else '.' }}
{%- endfor %}
{%- endif %}
{%- if add_generation_prompt %} => {{ eos_token }}{% endif -%}
"#;

fn msgs(pairs: &[(&str, &str)]) -> Vec<ChatMessage> {
    pairs.iter().map(|(r, c)| ChatMessage::new(*r, *c)).collect()
}

#[test]
fn llama3_style_template() {
    let t = ChatTemplate::new(LLAMA3, Some("<|begin_of_text|>"), Some("<|eot_id|>")).unwrap();
    let messages = msgs(&[
        ("system", "  Be brief.  "),
        ("user", "Hi there\n"),
        ("assistant", " Hello! "),
        ("user", "Bye"),
    ]);
    assert_eq!(
        t.render(&messages, true).unwrap(),
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n\nBe brief.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
    );
    assert_eq!(
        t.render(&msgs(&[("user", "a")]), false).unwrap(),
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n\n<|eot_id|><|start_header_id|>user<|end_header_id|>\n\na<|eot_id|>"
    );
}

#[test]
fn raise_exception_gives_typed_error_with_message() {
    let t = ChatTemplate::new(LLAMA3, Some("<|begin_of_text|>"), None).unwrap();
    let err = t.render(&msgs(&[("user", "a"), ("user", "b")]), true).unwrap_err();
    match err {
        ChatTemplateError::Raised(message) => {
            assert_eq!(message, "Conversation roles must alternate user/assistant/user/assistant/...")
        }
        other => panic!("expected Raised, got {other:?}"),
    }
}

#[test]
fn python_string_methods_and_block_trimming() {
    let t = ChatTemplate::new(PYSTR, None, None).unwrap();
    let messages = msgs(&[
        ("system", "  sys  \n"),
        ("user", "/cmd run fast now"),
        ("user", " how are you? "),
        ("assistant", "fine"),
    ]);
    assert_eq!(
        t.render(&messages, true).unwrap(),
        "System: sys\nCommand: run,fast,now\nUSER: how are you?\nASSISTANT: fine\nASSISTANT:\n"
    );
    assert_eq!(t.render(&msgs(&[("user", "x")]), false).unwrap(), "USER: x\n");
}

#[test]
fn loop_controls_namespace_and_loop_last() {
    let t = ChatTemplate::new(LOOPS, None, Some("</s>")).unwrap();
    let messages = msgs(&[
        ("user", "one"),
        ("tool", "skip"),
        ("assistant", "two"),
        ("user", "three"),
        ("assistant", "four"),
    ]);
    assert_eq!(t.render(&messages, true).unwrap(), "[user] one | [assistant] two | [user] three |  => </s>");
}

#[test]
fn extra_variables_and_tojson() {
    let t = ChatTemplate::new(LOOPS, None, None).unwrap();
    let mut extra = serde_json::Map::new();
    extra.insert(
        "tools".into(),
        json!([
            {"name": "get_weather", "parameters": {"properties": {"city": {"description": "City <name> & 'country'", "type": "string"}}, "required": ["city"], "type": "object"}},
            {"name": "noop", "parameters": {}, "score": 0.5}
        ]),
    );
    let out = t.render_with(&msgs(&[("user", "one"), ("assistant", "two")]), false, &extra).unwrap();
    assert_eq!(
        out,
        "[user] one | [assistant] two\nTools: [{\"name\": \"get_weather\", \"parameters\": {\"properties\": {\"city\": {\"description\": \"City <name> & 'country'\", \"type\": \"string\"}}, \"required\": [\"city\"], \"type\": \"object\"}}, {\"name\": \"noop\", \"parameters\": {}, \"score\": 0.5}]1. get_weather,2. noop."
    );
}

#[test]
fn extra_cannot_override_messages_or_generation_prompt() {
    let t = ChatTemplate::new(
        "{{ messages | length }} {{ add_generation_prompt }} {{ bos_token }} {{ documents is none }}",
        Some("<s>"),
        None,
    )
    .unwrap();
    let mut extra = serde_json::Map::new();
    extra.insert("messages".into(), json!([]));
    extra.insert("add_generation_prompt".into(), json!(false));
    extra.insert("bos_token".into(), json!("[BOS]"));
    let out = t.render_with(&msgs(&[("user", "x")]), true, &extra).unwrap();
    // Python booleans print capitalised, and so do they here.
    assert_eq!(out, "1 True [BOS] True");
}

#[test]
fn missing_special_tokens_render_empty() {
    let t = ChatTemplate::new("[{{ bos_token }}|{{ eos_token }}]", None, None).unwrap();
    assert_eq!(t.render(&[], false).unwrap(), "[|]");
}

#[test]
fn strftime_now_is_todays_date() {
    let t = ChatTemplate::new("{{ strftime_now('%Y-%m-%d') }}", None, None).unwrap();
    let before = crate::template_funcs::strftime_now("%Y-%m-%d");
    let out = t.render(&[], false).unwrap();
    let after = crate::template_funcs::strftime_now("%Y-%m-%d");
    assert!(out == before || out == after, "{out}");
    assert_eq!(out.len(), 10);
    assert!(out.starts_with("20"), "{out}");
}

#[test]
fn syntax_errors_are_reported_at_compile_time() {
    let err = ChatTemplate::new("{% for m in messages %}{{ m.content }}", None, None).unwrap_err();
    assert!(matches!(err, ChatTemplateError::Syntax(_)), "{err:?}");
    let err = ChatTemplate::new("{{ ", None, None).unwrap_err();
    assert!(err.to_string().contains("does not compile"), "{err}");
}

#[test]
fn render_errors_are_typed() {
    let t = ChatTemplate::new("{{ messages[0].content.no_such_method() }}", None, None).unwrap();
    let err = t.render(&msgs(&[("user", "x")]), false).unwrap_err();
    assert!(matches!(err, ChatTemplateError::Render(_)), "{err:?}");
    let t = ChatTemplate::new("{{ 1 + 'a' }}", None, None).unwrap();
    assert!(matches!(t.render(&[], false), Err(ChatTemplateError::Render(_))));
}

#[test]
fn raise_inside_macro_and_include_like_nesting_is_still_raised() {
    let t = ChatTemplate::new(
        "{% macro check(m) %}{% if m.role not in ['user', 'assistant'] %}{{ raise_exception('bad role: ' ~ m.role) }}{% endif %}{% endmacro %}{% for m in messages %}{{ check(m) }}{% endfor %}",
        None,
        None,
    )
    .unwrap();
    let err = t.render(&msgs(&[("user", "a"), ("robot", "b")]), false).unwrap_err();
    assert_eq!(err.to_string(), "bad role: robot");
}

#[test]
fn python_dict_methods_work() {
    let t = ChatTemplate::new(
        "{% for k, v in tools[0].items() %}{{ k }}={{ v }};{% endfor %}{{ tools[0].get('missing', 'dflt') }}",
        None,
        None,
    )
    .unwrap();
    let mut extra = serde_json::Map::new();
    extra.insert("tools".into(), json!([{"a": 1, "b": "x"}]));
    assert_eq!(t.render_with::<ChatMessage>(&[], false, &extra).unwrap(), "a=1;b=x;dflt");
}
