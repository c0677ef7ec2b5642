//! Tests of turning Anthropic requests into chat messages, tools and tool choices.

use super::*;

const IGNORE: HostedToolsPolicy = HostedToolsPolicy::Ignore;

#[test]
fn tool_uses_and_results_become_calls_and_tool_messages() {
    let turns = vec![
        json!({"role": "user", "content": "weather?"}),
        json!({"role": "assistant", "content": [
            {"type": "thinking", "thinking": "hmm", "signature": "s"},
            {"type": "text", "text": "Let me look."},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Oslo"}}]}),
        json!({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "rain"}], "is_error": true},
            {"type": "text", "text": "and tomorrow?"}]}),
    ];
    let out = messages(
        Some(&json!([{"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}}])),
        &turns,
    )
    .unwrap();
    let roles: Vec<&str> = out.iter().map(|m| m.role.as_str()).collect();
    assert_eq!(roles, ["system", "user", "assistant", "tool", "user"]);
    assert_eq!(out[2].content, "Let me look.");
    let calls = out[2].tool_calls.as_ref().unwrap();
    assert_eq!(calls[0]["function"]["arguments"], json!({"city": "Oslo"}));
    assert_eq!((out[3].content.as_str(), out[3].name.as_deref()), ("Error: rain", Some("get_weather")));
    assert_eq!(out[3].tool_call_id.as_deref(), Some("toolu_1"));
}

#[test]
fn bad_blocks_are_named() {
    let p = |turns: Vec<Value>| messages(None, &turns).unwrap_err().param.unwrap();
    assert_eq!(p(vec![]), "messages");
    let image = json!({"role": "user", "content": [{"type": "image", "source": {}}]});
    assert_eq!(p(vec![image]), "messages[0].content[0]");
    let orphan = json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_x", "content": "1"}]});
    assert_eq!(p(vec![orphan]), "messages[0].content[0].tool_use_id");
    assert_eq!(p(vec![json!({"role": "tool", "content": "x"})]), "messages[0].role");
    assert_eq!(p(vec![json!(["user", "hi"])]), "messages[0]");
    assert_eq!(p(vec![json!({"role": "user", "content": "x", "name": "n"})]), "messages[0].name");
    let use_in_user =
        json!({"role": "user", "content": [{"type": "tool_use", "id": "a", "name": "b", "input": {}}]});
    assert_eq!(p(vec![use_in_user]), "messages[0].content[0]");
}

#[test]
fn tools_and_choices_translate() {
    let t = json!([{"name": "get_weather", "description": "w", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}]);
    let any = tools(Some(&t), Some(&json!({"type": "any", "disable_parallel_tool_use": true})), IGNORE)
        .unwrap()
        .unwrap();
    assert_eq!(any.choice, crate::tools::ToolChoice::Required);
    assert!(!any.parallel);
    let named =
        tools(Some(&t), Some(&json!({"type": "tool", "name": "get_weather"})), IGNORE).unwrap().unwrap();
    assert_eq!(named.choice, crate::tools::ToolChoice::Named("get_weather".into()));
    assert!(tools(Some(&t), Some(&json!({"type": "none"})), IGNORE).unwrap().is_none());
    let err = tools(Some(&json!([{"name": "f", "input_schema": "x"}])), None, IGNORE).unwrap_err();
    assert_eq!(err.param.as_deref(), Some("tools[0].input_schema"));
    let search = json!([{"type": "web_search_20250305", "name": "web_search"}]);
    let err = tools(Some(&search), None, HostedToolsPolicy::Reject).unwrap_err();
    assert_eq!(err.param.as_deref(), Some("tools[0].type"));
    let err = tools(Some(&json!([{"type": "bash_20250124", "name": "bash"}])), None, IGNORE).unwrap_err();
    assert_eq!(err.param.as_deref(), Some("tools[0].type"));
    let err = tools(Some(&t), Some(&json!({"type": "tool", "name": "nope"})), IGNORE).unwrap_err();
    assert_eq!(err.param.as_deref(), Some("tool_choice"));
    let deferred = json!([{"name": "later", "input_schema": {"type": "object"}, "defer_loading": true}]);
    assert!(tools(Some(&deferred), None, IGNORE).unwrap().is_none());
    let err = tools(Some(&json!([{"name": "f", "input_schema": {}, "defer_loading": 1}])), None, IGNORE)
        .unwrap_err();
    assert_eq!(err.param.as_deref(), Some("tools[0].defer_loading"));
}
