//! Tests for tool-call parsing. Every expectation is checked whole and streamed: for each text,
//! every split into deltas (whole, per character, every two-way cut, seeded random cuts) must give
//! the same content and calls, in the same order, as [`parse_tool_calls`].

use super::*;
use ToolCallFormat::{Generic, Hermes, Llama3Json, Mistral};

/// Ways to cut `text` into deltas (always at character boundaries).
pub(crate) fn delta_splits(text: &str) -> Vec<Vec<&str>> {
    let bounds: Vec<usize> = text.char_indices().map(|(at, _)| at).skip(1).collect();
    let cut = |points: &[usize]| {
        let mut last = 0;
        let mut pieces = Vec::new();
        for &point in points.iter().chain([&text.len()]) {
            pieces.push(&text[last..point]);
            last = point;
        }
        pieces
    };
    let mut splits = vec![vec![text], vec!["", text, ""], cut(&bounds)];
    splits.extend(bounds.iter().map(|&point| cut(&[point])));
    // A fixed-seed LCG keeps the random cuts the same on every run.
    let mut lcg: u64 = 0x9E37_79B9_7F4A_7C15;
    for keep_one_in in [2, 3, 5, 9] {
        for _ in 0..3 {
            let points: Vec<usize> = bounds
                .iter()
                .copied()
                .filter(|_| {
                    lcg = lcg.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
                    (lcg >> 33).is_multiple_of(keep_one_in)
                })
                .collect();
            splits.push(cut(&points));
        }
    }
    splits
}

/// Seeded random strings stitched from markup fragments of every format, to shake out panics and
/// split-dependent decisions.
pub(crate) fn markup_soup() -> Vec<String> {
    #[rustfmt::skip]
    const FRAGMENTS: &[&str] = &[
        "<tool_call>", "</tool_call>", "[TOOL_CALLS]", "[ARGS]", "<|python_tag|>", "<think>", "</think>", "<tool",
        "{", "}", "[", "]", "\"", "\\", "\\u", "d83d", "\\ude00", ":", ";", ", ", " ", "\n", "é", "🎉", "get_x", "{}",
        "\"name\": \"f\"", "\"arguments\": ", "\"parameters\": ", "\"response\": ", "\"tool_calls\": ", "\"tool_call\": ",
        r#"{"name": "f", "arguments": {"a": "}{\""}}"#, r#"{"name": "g", "parameters": {}}"#, r#"{"response": "hi\n"#,
        r#"{"tool_calls": [{"name": "f"}]}"#, r#"[{"name": "h", "arguments": {}}]"#, r#"[TOOL_CALLS]get_y[ARGS]{"k": [1]}"#,
    ];
    let mut lcg: u64 = 42;
    let mut next = |bound: usize| {
        lcg = lcg.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        (lcg >> 33) as usize % bound
    };
    (0..800).map(|_| (0..1 + next(10)).map(|_| FRAGMENTS[next(FRAGMENTS.len())]).collect()).collect()
}

/// Events with content runs merged and each call's argument fragments joined.
#[derive(Debug, PartialEq)]
enum Piece {
    Content(String),
    Call { index: usize, name: String, arguments: String },
}

fn normalize(events: Vec<ToolStreamEvent>) -> Vec<Piece> {
    let mut pieces: Vec<Piece> = Vec::new();
    for event in events {
        match (event, pieces.last_mut()) {
            (ToolStreamEvent::Content(text), Some(Piece::Content(last))) => last.push_str(&text),
            (ToolStreamEvent::Content(text), _) => pieces.push(Piece::Content(text)),
            (ToolStreamEvent::CallStart { index, name }, _) => {
                pieces.push(Piece::Call { index, name, arguments: String::new() })
            }
            (
                ToolStreamEvent::CallArguments { index, fragment },
                Some(Piece::Call { index: open, arguments, .. }),
            ) => {
                assert_eq!(index, *open, "arguments for a call that is not the open one");
                arguments.push_str(&fragment);
            }
            (event, _) => panic!("{event:?} before its CallStart"),
        }
    }
    pieces
}

fn streamed(format: ToolCallFormat, deltas: &[&str]) -> Vec<ToolStreamEvent> {
    let mut parser = ToolCallStreamParser::new(format);
    let mut events: Vec<ToolStreamEvent> = deltas.iter().flat_map(|delta| parser.push(delta)).collect();
    events.extend(parser.finish());
    events
}

/// Checks the whole-text result, then that every split streams to the same pieces.
fn check(format: ToolCallFormat, text: &str, content: &str, calls: &[(&str, &str)]) {
    let expected = ParsedOutput {
        content: content.to_owned(),
        tool_calls: calls
            .iter()
            .map(|&(name, arguments)| ParsedToolCall {
                name: name.to_owned(),
                arguments: arguments.to_owned(),
            })
            .collect(),
    };
    assert_eq!(parse_tool_calls(format, text), expected, "{format:?} {text:?}");
    let whole = normalize(streamed(format, &[text]));
    for (index, piece) in whole.iter().filter(|p| matches!(p, Piece::Call { .. })).enumerate() {
        assert!(matches!(piece, Piece::Call { index: i, .. } if *i == index), "call indices run 0, 1, …");
    }
    for deltas in delta_splits(text) {
        assert_eq!(normalize(streamed(format, &deltas)), whole, "{format:?} split as {deltas:?}");
    }
}

/// Malformed or plain text: everything is content, as written (trimmed).
fn check_content(format: ToolCallFormat, text: &str) {
    check(format, text, text.trim(), &[]);
}

#[test]
fn format_names_round_trip() {
    for name in ToolCallFormat::NAMES {
        assert_eq!(ToolCallFormat::from_name(name).map(ToolCallFormat::name), Some(*name));
    }
    assert_eq!(ToolCallFormat::from_name("Hermes"), None);
}

#[test]
fn detects_format_from_chat_template() {
    let qwen = r##"{%- if tools %}{{- "# Tools\n<tools>" }}{%- for tool in tools %}{{- tool | tojson }}{%- endfor %}
{{- "</tools>\nReturn a json object within <tool_call></tool_call> XML tags" }}{%- endif %}"##;
    assert_eq!(ToolCallFormat::detect(qwen), Some(Hermes));
    let mistral =
        "{%- if tools is not none %}[AVAILABLE_TOOLS]{{ tools|tojson }}[/AVAILABLE_TOOLS]{%- endif %}\
                   {%- if message.tool_calls %}[TOOL_CALLS]{{ message.tool_calls|tojson }}{%- endif %}";
    assert_eq!(ToolCallFormat::detect(mistral), Some(Mistral));
    let llama31 = r#"{%- if builtin_tools is defined or tools is not none %}{{- "Environment: ipython\n" }}{%- endif %}
{{- '<|python_tag|>' + tool_call.name + '.call(' }}"#;
    assert_eq!(ToolCallFormat::detect(llama31), Some(Llama3Json));
    let llama32 = r#"{%- if tools is not none and not tools_in_user_message %}
{{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
{%- elif message.role == "ipython" %}{{- "<|start_header_id|>ipython<|end_header_id|>\n\n" }}{{- "<|eot_id|>" }}{%- endif %}"#;
    assert_eq!(ToolCallFormat::detect(llama32), Some(Llama3Json));
    let no_tools = "{% for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{% endfor %}";
    assert_eq!(ToolCallFormat::detect(no_tools), None);
    // `tools` only inside a longer name is no tool support; unknown markup is not guessed.
    assert_eq!(ToolCallFormat::detect("{{ custom_tools }}<tool_call>"), None);
    assert_eq!(ToolCallFormat::detect("{% if tools %}<function_calls>{% endif %}"), None);
}

#[test]
fn hermes_recorded_outputs() {
    let weather = r#"{"city":"Paris","unit":"celsius"}"#;
    check(
        Hermes,
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}\n</tool_call>",
        "",
        &[("get_weather", weather)],
    );
    let two = "I'll check both cities.\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n\
               <tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"東京\"}}\n</tool_call>\n";
    check(
        Hermes,
        two,
        "I'll check both cities.",
        &[("get_weather", r#"{"city":"Paris"}"#), ("get_weather", r#"{"city":"東京"}"#)],
    );
    // Text between and after blocks is content; whitespace only at the ends is trimmed.
    let mixed = "First:\n<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\nthen:\n<tool_call>{\"name\": \"b\"}</tool_call> done.  ";
    check(Hermes, mixed, "First:\n\nthen:\n done.", &[("a", "{}"), ("b", "{}")]);
    // Several objects in one block.
    let shared = "<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n{\"name\": \"b\", \"arguments\": {\"x\": 1}}\n</tool_call>";
    check(Hermes, shared, "", &[("a", "{}"), ("b", r#"{"x":1}"#)]);
    check_content(Hermes, "Paris is sunny today, 22 °C.");
}

#[test]
fn hermes_unterminated_call_counts_when_its_json_is_complete() {
    check(
        Hermes,
        "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": \"CET\"}}",
        "",
        &[("get_time", r#"{"tz":"CET"}"#)],
    );
    check(
        Hermes,
        "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_",
        "</tool_",
        &[("get_time", "{}")],
    );
}

#[test]
fn hermes_malformed_markup_stays_content() {
    check_content(Hermes, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"");
    check_content(Hermes, "<tool_call>not json</tool_call>");
    check_content(Hermes, "<tool_call>{\"city\": \"Paris\"}</tool_call>");
    check_content(Hermes, "<tool_call>{\"name\": 42, \"arguments\": {}}</tool_call>");
    check_content(Hermes, "<tool_call>{\"name\": \"\", \"arguments\": {}}</tool_call>");
    check_content(Hermes, "<tool_call>{\"name\": \"f\", \"arguments\": [1, 2]}</tool_call>");
    check_content(Hermes, "<tool_call>{\"name\": \"f\", \"arguments\": \"not an object\"}</tool_call>");
    check_content(Hermes, "Use the <tool_c");
    check_content(Hermes, "<tool_call>\n");
    check_content(Hermes, "<tool_call>{\"name\": \"f\", \"name\": \"g\"}</tool_call>");
    // The call ends with its JSON; stray text before the end tag is content.
    check(
        Hermes,
        "<tool_call>{\"name\": \"f\", \"arguments\": {}} }</tool_call>",
        "}</tool_call>",
        &[("f", "{}")],
    );
    // A malformed block does not hide a good one after it.
    check(
        Hermes,
        "<tool_call>oops</tool_call><tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>",
        "<tool_call>oops</tool_call>",
        &[("f", "{}")],
    );
}

#[test]
fn arguments_are_compact_json_in_written_order() {
    let text = "<tool_call>{\"arguments\": {\"zeta\": 1, \"alpha\": [1, 2.5, -3e2, true, null, {\"z\": \"y\", \"c\": {}}], \
                \"mid\": \"x\"}, \"name\": \"ordered\"}</tool_call>";
    check(
        Hermes,
        text,
        "",
        &[("ordered", r#"{"zeta":1,"alpha":[1,2.5,-300.0,true,null,{"z":"y","c":{}}],"mid":"x"}"#)],
    );
    // Braces, brackets and quotes inside strings do not end the JSON early.
    let code = r#"<tool_call>{"name": "run_code", "arguments": {"code": "if (a) { b(\"}\"); } else { c[0] = '{'; }", "lang": "c"}}</tool_call>"#;
    check(
        Hermes,
        code,
        "",
        &[("run_code", r#"{"code":"if (a) { b(\"}\"); } else { c[0] = '{'; }","lang":"c"}"#)],
    );
    // Escapes are decoded, and non-ASCII text is written as itself.
    let unicode = r#"<tool_call>{"name": "translate", "arguments": {"text": "caf\u00e9 \ud83c\udf89 日本語\n", "to": "fr"}}</tool_call>"#;
    check(Hermes, unicode, "", &[("translate", "{\"text\":\"café 🎉 日本語\\n\",\"to\":\"fr\"}")]);
    // Arguments given as a string holding an object.
    let stringly = r#"<tool_call>{"name": "f", "arguments": "{\"b\": 2, \"a\": 1}"}</tool_call>"#;
    check(Hermes, stringly, "", &[("f", r#"{"b":2,"a":1}"#)]);
    check(Hermes, r#"<tool_call>{"name": "f", "arguments": null}</tool_call>"#, "", &[("f", "{}")]);
    check(
        Hermes,
        r#"<tool_call>{"name": "f", "parameters": {"q": 1}}</tool_call>"#,
        "",
        &[("f", r#"{"q":1}"#)],
    );
}

#[test]
fn llama3_json_recorded_outputs() {
    let weather = r#"{"city":"Paris"}"#;
    check(
        Llama3Json,
        "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}",
        "",
        &[("get_weather", weather)],
    );
    check(
        Llama3Json,
        "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}",
        "",
        &[("get_weather", weather)],
    );
    check(
        Llama3Json,
        "\n\n{\"type\": \"function\", \"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n",
        "",
        &[("get_weather", weather)],
    );
    let several = "{\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"parameters\": {\"x\": [1]}}\n{\"name\": \"c\", \"parameters\": {}};";
    check(Llama3Json, several, "", &[("a", "{}"), ("b", r#"{"x":[1]}"#), ("c", "{}")]);
    // After the python tag the arguments may be left out.
    check(Llama3Json, "<|python_tag|>{\"name\": \"now\"}", "", &[("now", "{}")]);
}

#[test]
fn llama3_json_counts_only_when_the_whole_output_is_calls() {
    check_content(Llama3Json, "The weather in Paris is sunny.");
    check_content(Llama3Json, "{\"city\": \"Paris\", \"temperature\": 22}");
    check_content(Llama3Json, "{\"name\": \"Bob\", \"age\": 3}");
    check_content(Llama3Json, "{\"name\": \"a\", \"parameters\": {}} and then some text");
    check_content(Llama3Json, "{\"name\": \"a\", \"parameters\": {}}; not json");
    check_content(Llama3Json, "{\"name\": \"a\", \"parameters\": {\"x\": ");
    check_content(Llama3Json, "<|python_tag|>brave_search.call(query=\"weather in Paris\")");
    check_content(Llama3Json, "<|python_tag|>");
    check_content(Llama3Json, "<|python");
    check_content(Llama3Json, "  ");
}

#[test]
fn mistral_recorded_outputs() {
    let array = "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}, {\"name\": \"get_time\", \"arguments\": {\"tz\": \"CET\"}}]";
    let both = [("get_weather", r#"{"city":"Paris"}"#), ("get_time", r#"{"tz":"CET"}"#)];
    check(Mistral, array, "", &both);
    check(
        Mistral,
        "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}[TOOL_CALLS]get_time[ARGS]{\"tz\": \"CET\"}",
        "",
        &both,
    );
    check(Mistral, "[TOOL_CALLS]get_weather{\"city\": \"Paris\"}get_time{\"tz\": \"CET\"}", "", &both);
    check(
        Mistral,
        "[TOOL_CALLS] get_weather[ARGS] {\"city\": \"Paris\"}\n[TOOL_CALLS] get_time[ARGS]{\"tz\": \"CET\"}",
        "",
        &both,
    );
    check(
        Mistral,
        "Let me check.[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"} Done.",
        "Let me check. Done.",
        &[("get_weather", r#"{"city":"Paris"}"#)],
    );
    check(Mistral, "[TOOL_CALLS][]", "", &[]);
}

#[test]
fn mistral_malformed_markup_stays_content() {
    check_content(Mistral, "[TOOL_CALLS][{\"name\": 1, \"arguments\": {}}]");
    check_content(Mistral, "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {}}");
    check_content(Mistral, "[TOOL_CALLS] hello world");
    check_content(Mistral, "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Par");
    check_content(Mistral, "[TOOL_CALLS]f[ARGS][1, 2]");
    check_content(Mistral, "[TOOL_CALLS]f[ARG");
    check_content(Mistral, "[TOOL_CALLS]!");
    check_content(Mistral, "see [TOOL_CALL");
    check(
        Mistral,
        "[TOOL_CALLS]f{}[TOOL_CALLS]g[ARGS]{\"a\": }",
        "[TOOL_CALLS]g[ARGS]{\"a\": }",
        &[("f", "{}")],
    );
}

#[test]
fn generic_recorded_outputs() {
    check(
        Generic,
        "{\"tool_calls\": [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}, {\"name\": \"get_time\", \"arguments\": {}}]}",
        "",
        &[("get_weather", r#"{"city":"Paris"}"#), ("get_time", "{}")],
    );
    check(
        Generic,
        "{\"tool_call\": {\"name\": \"f\", \"arguments\": {\"x\": 1}}}",
        "",
        &[("f", r#"{"x":1}"#)],
    );
    check(Generic, "{\"response\": \"Hello! How can I help?\"}", "Hello! How can I help?", &[]);
    check(Generic, " { \"response\" : \"Hi\" } \n", "Hi", &[]);
    let escapes = r#"{"response": "say \"hi\"\\ \/ tab\there\nline 2 caf\u00e9 \ud83d\ude00 日本"}"#;
    check(Generic, escapes, "say \"hi\"\\ / tab\there\nline 2 café 😀 日本", &[]);
    // Other key orders and extra keys go through the whole-object path.
    check(Generic, "{\"thought\": \"greet\", \"response\": \"Hi\"}", "Hi", &[]);
    check(Generic, "{\"response\": \"Hi\"}\nmore text", "Hi\nmore text", &[]);
}

#[test]
fn generic_other_text_stays_content() {
    check_content(Generic, "Plain answer without JSON.");
    check_content(Generic, "{\"other\": 1}");
    check_content(Generic, "{\"tool_calls\": [{\"name\": 3}]}");
    check_content(Generic, "{\"tool_calls\": [{\"name\": \"f\", \"arguments\": {}}");
    check_content(Generic, "{\"resp");
    check_content(Generic, "{");
    // The response string streams as it comes, so a cut-off one keeps what was decoded.
    check(Generic, "{\"response\": \"Hel", "Hel", &[]);
    check(Generic, "{\"response\": \"Hel\\u00", "Hel\\u00", &[]);
    // A bad escape ends the decoding; the rest is content as written.
    check(Generic, r#"{"response": "a\qb"}"#, r#"a\qb"}"#, &[]);
    check(Generic, r#"{"response": "x\ud83d y"}"#, r#"x\ud83d y"}"#, &[]);
    check(Generic, r#"{"response": "x\udc00"}"#, r#"x\udc00"}"#, &[]);
    check(Generic, r#"{"response": "hi", "extra": 1}"#, r#"hi, "extra": 1}"#, &[]);
}

#[test]
fn streaming_emits_content_early_and_calls_when_complete() {
    let mut parser = ToolCallStreamParser::new(Hermes);
    assert_eq!(parser.push("Let me check. <tool"), [ToolStreamEvent::Content("Let me check.".into())]);
    assert_eq!(parser.push("_call>\n{\"name\": \"f\", "), []);
    assert_eq!(
        parser.push("\"arguments\": {\"a\": 1}}"),
        [
            ToolStreamEvent::CallStart { index: 0, name: "f".into() },
            ToolStreamEvent::CallArguments { index: 0, fragment: r#"{"a":1}"#.into() }
        ]
    );
    assert_eq!(parser.push("\n</tool_call>\n"), []);
    assert_eq!(parser.finish(), []);
    // `finish` resets: the next output starts from scratch, with call indices from 0.
    assert_eq!(parser.push("<tool_call>{\"name\": \"g\"}").len(), 2);

    let mut parser = ToolCallStreamParser::new(Llama3Json);
    assert_eq!(parser.push("The weather"), [ToolStreamEvent::Content("The weather".into())]);
    let mut parser = ToolCallStreamParser::new(Llama3Json);
    assert_eq!(parser.push("{\"name\": \"f\", \"parameters\": {}}"), []);
    assert_eq!(parser.push("; {\"na"), []);
    assert_eq!(
        parser.push("me\": \"g\"} oops"),
        [ToolStreamEvent::Content("{\"name\": \"f\", \"parameters\": {}}; {\"name\": \"g\"} oops".into())]
    );

    let mut parser = ToolCallStreamParser::new(Generic);
    assert_eq!(parser.push("{\"response\": \"Hel"), [ToolStreamEvent::Content("Hel".into())]);
    assert_eq!(parser.push("lo\\"), [ToolStreamEvent::Content("lo".into())]);
    assert_eq!(parser.push("n!\"}"), [ToolStreamEvent::Content("\n!".into())]);
    assert_eq!(parser.finish(), []);
}

#[test]
fn streamed_equals_whole_for_many_outputs() {
    // More mixed samples, each checked against itself over every split.
    let samples = [
        (Hermes, "<think>ignored here</think>\n\nSure.\n<tool_call>\n{\"name\": \"search\", \"arguments\": {\"q\": \"rust <tool_call> tags\"}}\n</tool_call>"),
        (Hermes, "<<tool_call><tool_call>{\"name\": \"f\"}</tool_call</tool_call>"),
        (Mistral, "[[TOOL_CALLS]f{\"a\": {\"b\": [1, {\"c\": \"]}\"}]}}  g.h-i{}tail [TOOL_CALLS]"),
        (Llama3Json, "<|python_tag|> {\"name\": \"f\", \"parameters\": {\"s\": \"};{\"}} ;\n"),
        (Generic, "\n{\"response\": \"multi\\nline \\\"quoted\\\" 🎉\"}  "),
    ];
    for (format, text) in samples {
        let whole = parse_tool_calls(format, text);
        check(
            format,
            text,
            &whole.content,
            &whole.tool_calls.iter().map(|c| (c.name.as_str(), c.arguments.as_str())).collect::<Vec<_>>(),
        );
    }
    assert_eq!(parse_tool_calls(Mistral, samples[2].1).tool_calls.len(), 2);
}

#[test]
fn random_markup_soup_streams_like_whole() {
    let mut calls = [0; 4];
    for text in markup_soup() {
        for format in [Hermes, Llama3Json, Mistral, Generic] {
            let whole = normalize(streamed(format, &[&text]));
            calls[format as usize] += whole.iter().filter(|p| matches!(p, Piece::Call { .. })).count();
            let joined: String =
                whole.iter().map(|p| if let Piece::Content(c) = p { c.as_str() } else { "" }).collect();
            assert_eq!(joined, parse_tool_calls(format, &text).content);
            for deltas in delta_splits(&text) {
                assert_eq!(normalize(streamed(format, &deltas)), whole, "{format:?} split as {deltas:?}");
            }
        }
    }
    assert!(calls.iter().all(|&n| n >= 5), "the soup should hold calls of every format: {calls:?}");
}

#[test]
fn trimmed_stream_drops_only_outer_whitespace() {
    let mut trim = TrimmedStream::new(true);
    let out: String = [" \n", "a", " ", "\n", "b ", " "].iter().map(|piece| trim.push(piece)).collect();
    assert_eq!(out, "a \nb");
    assert_eq!(partial_tag_len("abc<tool", "<tool_call>"), 5);
    assert_eq!(partial_tag_len("<tool_call>", "<tool_call>"), 0);
    assert_eq!(partial_tag_len("é", "<tool_call>"), 0);
}
