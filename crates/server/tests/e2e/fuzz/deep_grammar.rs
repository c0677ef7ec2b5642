//! The fuzz suite's deep-grammar family (issue 63): one case in [`EVERY`] asks for structured
//! output with a grammar shaped to exhaust the compiler's stack: a `$ref` chain through
//! `$defs`, arrays nested in arrays, a Lark grammar whose rules each name the next, nested
//! groups in a pattern, a `$ref` to itself. Each goes where a request can carry a grammar
//! (chat's `response_format`, `structured_outputs` and `guided_*` fields, completions, the
//! Responses API's `text.format`, Anthropic's `output_config.format`, a forced tool's schema).
//! Past the bounds of `pagoda_structured::limits` it is a 400; within them it compiles and
//! answers. A stack overflow anywhere would kill the server, and every later case would fail.

use serde_json::{json, Map, Value};

use super::gen::{maybe_model, text, Case, Endpoint, Expect, Rng, MODEL};

/// One case in this many is of the family.
pub const EVERY: usize = 40;
/// Which case of each [`EVERY`] (the huge-`n` family takes the last).
const SLOT: usize = 19;

/// `#/$defs/d0` -> `d1` -> ... -> `{"type": "string"}`, `links` references long.
fn ref_chain(links: usize) -> Value {
    let mut defs = Map::new();
    for i in 0..links {
        defs.insert(format!("d{i}"), json!({"$ref": format!("#/$defs/d{}", i + 1)}));
    }
    defs.insert(format!("d{links}"), json!({"type": "string"}));
    json!({"$defs": defs, "$ref": "#/$defs/d0"})
}

fn nested_arrays(levels: usize) -> Value {
    (0..levels).fold(json!({"type": "integer"}), |s, _| json!({"type": "array", "items": s, "maxItems": 1}))
}

fn rule_chain(rules: usize) -> String {
    let mut g = String::from("start: r0\n");
    for i in 0..rules {
        g.push_str(&format!("r{i}: r{}\n", i + 1));
    }
    g + &format!("r{rules}: \"x\"\n")
}

/// A JSON schema and whether it is within the bounds (and matches something).
fn schema(rng: &mut Rng) -> (Value, bool, String) {
    match rng.below(5) {
        0 | 1 => {
            let links = *rng.pick(&[40usize, 300, 520, 900]);
            (ref_chain(links), links <= 500, format!("a {links}-link $ref chain"))
        }
        2 => {
            let levels = *rng.pick(&[10usize, 60, 65, 100]);
            (nested_arrays(levels), levels <= 64, format!("arrays nested {levels} deep"))
        }
        3 => {
            let itself = json!({"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"});
            (itself, false, "a $ref to itself".into())
        }
        _ => {
            let tree = json!({"type": "object", "properties": {"v": {"type": "integer"},
                "kids": {"type": "array", "items": {"$ref": "#"}, "maxItems": 1}}, "required": ["v"]});
            (tree, true, "a recursive schema".into())
        }
    }
}

/// A Lark grammar or a regex (`true`: a regex), and whether it is within the bounds.
fn grammar(rng: &mut Rng) -> (String, bool, bool, String) {
    match rng.below(3) {
        0 | 1 => {
            let rules = *rng.pick(&[40usize, 300, 520, 1000]);
            (rule_chain(rules), false, rules <= 500, format!("a {rules}-rule chain"))
        }
        _ => {
            let depth = *rng.pick(&[20usize, 1000]);
            let regex = rng.chance(50);
            let groups = format!("{}x{}", "(".repeat(depth), ")".repeat(depth));
            let text = if regex { groups } else { format!("start: /{groups}/\n") };
            (text, regex, depth <= 20, format!("{depth} nested groups"))
        }
    }
}

/// Tool parameters whose argument `x` is `schema`; its `$defs` move to the parameters' root,
/// where its references point.
fn tool(mut schema: Value) -> Value {
    let defs = schema.as_object_mut().and_then(|s| s.remove("$defs"));
    let mut parameters = json!({"type": "object", "properties": {"x": schema}, "required": ["x"]});
    if let Some(defs) = defs {
        parameters["$defs"] = defs;
    }
    parameters
}

/// Case `index` under `seed` when it belongs to the family.
pub fn generate(seed: u64, index: usize) -> Option<Case> {
    if index % EVERY != SLOT {
        return None;
    }
    let mut rng = Rng::for_case(seed ^ 0xDEE9, index);
    let mut m = Map::new();
    let (endpoint, within, what) = match rng.below(10) {
        0..=3 => {
            maybe_model(&mut rng, &mut m);
            m.insert("messages".into(), json!([{"role": "user", "content": text(&mut rng)}]));
            m.insert("max_tokens".into(), json!(rng.range(1, 3)));
            let (within, what) = if rng.chance(60) {
                let (schema, within, what) = schema(&mut rng);
                let (field, value) = match rng.below(4) {
                    0 => (
                        "response_format",
                        json!({"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}),
                    ),
                    1 => ("structured_outputs", json!({"json": schema})),
                    2 => ("guided_json", schema),
                    _ => {
                        m.insert("tool_choice".into(), json!("required"));
                        let function = json!({"name": "f", "parameters": tool(schema)});
                        ("tools", json!([{"type": "function", "function": function}]))
                    }
                };
                let tools = field == "tools";
                m.insert(field.into(), value);
                // A tool's schema is in the prompt too: within the bounds it may not fit.
                (if tools && within { None } else { Some(within) }, format!("{what} in {field}"))
            } else {
                let (text, regex, within, what) = grammar(&mut rng);
                let field = match (regex, rng.chance(50)) {
                    (true, _) => "guided_regex",
                    (false, true) => "guided_grammar",
                    (false, false) => "structured_outputs",
                };
                let value =
                    if field == "structured_outputs" { json!({"grammar": text}) } else { json!(text) };
                m.insert(field.into(), value);
                (Some(within), format!("{what} in {field}"))
            };
            (Endpoint::Chat, within, what)
        }
        4..=5 => {
            maybe_model(&mut rng, &mut m);
            m.insert("prompt".into(), json!("JSON:"));
            m.insert("max_tokens".into(), json!(rng.range(1, 3)));
            let (value, field, within, what) = if rng.chance(50) {
                let (schema, within, what) = schema(&mut rng);
                (schema, "guided_json", within, what)
            } else {
                let (text, regex, within, what) = grammar(&mut rng);
                (json!(text), if regex { "guided_regex" } else { "guided_grammar" }, within, what)
            };
            m.insert(field.into(), value);
            (Endpoint::Completions, Some(within), format!("{what} in {field}"))
        }
        6..=7 => {
            maybe_model(&mut rng, &mut m);
            m.insert("input".into(), text(&mut rng));
            m.insert("max_output_tokens".into(), json!(rng.range(1, 3)));
            let (schema, within, what) = schema(&mut rng);
            if rng.chance(70) {
                m.insert(
                    "text".into(),
                    json!({"format": {"type": "json_schema", "name": "x", "schema": schema}}),
                );
                (Endpoint::Responses, Some(within), format!("{what} in text.format"))
            } else {
                m.insert(
                    "tools".into(),
                    json!([{"type": "function", "name": "f", "parameters": tool(schema)}]),
                );
                m.insert("tool_choice".into(), json!("required"));
                (Endpoint::Responses, if within { None } else { Some(false) }, format!("{what} in a tool"))
            }
        }
        _ => {
            m.insert("model".into(), json!(MODEL));
            m.insert("messages".into(), json!([{"role": "user", "content": text(&mut rng)}]));
            m.insert("max_tokens".into(), json!(rng.range(1, 3)));
            let (schema, within, what) = schema(&mut rng);
            if rng.chance(70) {
                m.insert(
                    "output_config".into(),
                    json!({"format": {"type": "json_schema", "schema": schema}}),
                );
                (Endpoint::Messages, Some(within), format!("{what} in output_config.format"))
            } else {
                m.insert("tools".into(), json!([{"name": "f", "input_schema": tool(schema)}]));
                m.insert("tool_choice".into(), json!({"type": "any"}));
                (Endpoint::Messages, if within { None } else { Some(false) }, format!("{what} in a tool"))
            }
        }
    };
    let expect = match within {
        Some(true) => Expect::Ok,
        Some(false) => Expect::Status(400),
        None => Expect::Any,
    };
    let answered = expect == Expect::Ok;
    let body = serde_json::to_vec(&Value::Object(m)).expect("a JSON value serializes");
    Some(Case {
        what: vec![format!("deep grammar: {what}")],
        stream: answered.then_some(false),
        choices: answered.then_some(1),
        ..Case::post(seed, index, endpoint, body, expect)
    })
}

#[cfg(test)]
mod tests {
    use super::super::gen::BODY_LIMIT;
    use super::*;

    #[test]
    fn the_family_goes_past_the_bounds_and_stays_within_them() {
        let cases: Vec<Case> = (0..8000).filter_map(|i| generate(7, i)).collect();
        assert_eq!(cases.len(), 200);
        let count = |expect: Expect| cases.iter().filter(|c| c.expect == expect).count();
        assert!(count(Expect::Ok) > 40, "{}", count(Expect::Ok));
        assert!(count(Expect::Status(400)) > 60, "{}", count(Expect::Status(400)));
        for endpoint in [Endpoint::Chat, Endpoint::Completions, Endpoint::Responses, Endpoint::Messages] {
            assert!(cases.iter().filter(|c| c.endpoint == endpoint).count() > 15, "{endpoint:?}");
        }
        for what in ["$ref chain", "nested", "rule chain", "to itself", "recursive", "in a tool"] {
            assert!(cases.iter().any(|c| c.what[0].contains(what)), "{what}");
        }
        for c in &cases {
            assert!(c.body.len() <= BODY_LIMIT, "{} is {} bytes", c.what[0], c.body.len());
        }
        assert_eq!(generate(7, 19).unwrap().body, generate(7, 19).unwrap().body);
    }
}
