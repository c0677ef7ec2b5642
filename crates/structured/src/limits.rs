//! Bounds on how deep a grammar may go, checked before llguidance sees it. llguidance compiles
//! by recursion: each level of a JSON schema, each `$ref` it follows and each Lark rule that
//! names the next one costs stack, so a `$ref` chain or a rule chain of a thousand links would
//! overflow the compiling thread's stack and take the whole server down. These walks are
//! iterative (an explicit stack, never recursion), so no input can overflow them; they refuse
//! what goes deeper than the bounds with a [`DepthError`] that says what and where. Compiling
//! itself also runs on a thread with a known stack ([`crate::GrammarCompiler`]), many times what
//! a grammar at the bounds needs.
//!
//! References are followed where they point into the same document (`#`, `#/$defs/x`, with
//! JSON-pointer and percent escapes). A reference back into a schema being walked is a
//! recursive structure, which is legal and compiles to a recursive grammar: it ends that path
//! rather than adding depth.

use std::collections::{HashMap, HashSet};

use serde_json::Value;

/// The deepest a JSON schema may nest objects and arrays in one place (not following `$ref`).
/// Real schemas, tool parameters included, nest under 10 levels.
pub const MAX_SCHEMA_NESTING: usize = 64;
/// The deepest a JSON schema may go once its `$ref`s are followed: each object or array
/// entered counts one, in the document or in a referenced definition, so a chain of `$ref`s
/// through definitions costs one per link.
pub const MAX_SCHEMA_DEPTH: usize = 512;
/// The longest chain of Lark rules (or tokens) in which each names the next.
pub const MAX_RULE_CHAIN: usize = 512;

/// A grammar that goes deeper than the compiler may follow.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DepthError {
    #[error("the JSON schema nests objects and arrays more than {limit} levels deep (at `{at}`)")]
    SchemaNesting { at: String, limit: usize },
    #[error(
        "the JSON schema's `$ref`s lead more than {limit} levels deep (at `{at}`); shorten the chain of references"
    )]
    SchemaDepth { at: String, limit: usize },
    #[error("the grammar's rules name each other in a chain of more than {limit} rules (from `{from}`)")]
    RuleChain { from: String, limit: usize },
}

/// Checks `schema` against [`MAX_SCHEMA_NESTING`] and [`MAX_SCHEMA_DEPTH`].
pub fn check_schema(schema: &Value) -> Result<(), DepthError> {
    check_schema_within(schema, MAX_SCHEMA_NESTING, MAX_SCHEMA_DEPTH)
}

/// Checks a Lark grammar: its rule chains against [`MAX_RULE_CHAIN`], and each `%json` schema
/// in it as [`check_schema`] does.
pub fn check_lark(grammar: &str) -> Result<(), DepthError> {
    check_lark_within(grammar, MAX_RULE_CHAIN)
}

/// One object or array being walked.
struct Frame<'a> {
    /// Its members that are objects or arrays, with their pointer steps.
    children: Vec<(&'a Value, String)>,
    next: usize,
    /// Its own `$ref` (local ones only), followed once its children are done.
    reference: Option<&'a str>,
    /// Levels from the root down to this one, this one included.
    depth: usize,
    /// Levels since the last `$ref` followed (or the root), this one included.
    local: usize,
    /// Levels from this one down, this one included, found so far.
    below: usize,
    /// The reference this frame was entered through, if it was.
    target: Option<String>,
    step: String,
}

impl<'a> Frame<'a> {
    fn new(value: &'a Value, step: String, depth: usize, local: usize, target: Option<String>) -> Self {
        let escape = |k: &str| k.replace('~', "~0").replace('/', "~1");
        let container = |v: &&Value| v.is_object() || v.is_array();
        let (children, reference) = match value {
            Value::Object(map) => (
                map.iter().filter(|(_, v)| container(v)).map(|(k, v)| (v, escape(k))).collect(),
                map.get("$ref").and_then(Value::as_str).filter(|r| r.starts_with('#')),
            ),
            Value::Array(list) => (
                list.iter()
                    .enumerate()
                    .filter(|(_, v)| container(v))
                    .map(|(i, v)| (v, i.to_string()))
                    .collect(),
                None,
            ),
            _ => (Vec::new(), None),
        };
        Frame { children, next: 0, reference, depth, local, below: 1, target, step }
    }
}

/// The value `reference` (`#`, `#/a/b`) names in `root`, if it exists there.
fn resolve<'a>(root: &'a Value, reference: &str) -> Option<&'a Value> {
    let fragment = percent_decode(reference.strip_prefix('#')?)?;
    if fragment.is_empty() {
        return Some(root);
    }
    root.pointer(&fragment)
}

/// A URI fragment with its `%xx` escapes decoded; `None` when they are malformed.
fn percent_decode(text: &str) -> Option<String> {
    if !text.contains('%') {
        return Some(text.to_owned());
    }
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// Where the top of `stack` is: a pointer from the last reference followed (or the root),
/// its middle elided when long.
fn location(stack: &[Frame<'_>]) -> String {
    const SHOWN: usize = 6;
    let start = stack.iter().rposition(|f| f.target.is_some()).unwrap_or(0);
    let mut at = stack[start].target.clone().unwrap_or_else(|| "#".to_owned());
    let steps = &stack[start + 1..];
    if steps.len() > SHOWN {
        at.push_str("/…");
    }
    for frame in &steps[steps.len().saturating_sub(SHOWN)..] {
        at.push('/');
        at.push_str(&frame.step);
    }
    at
}

/// [`check_schema`] with the bounds given.
fn check_schema_within(root: &Value, max_nesting: usize, max_depth: usize) -> Result<(), DepthError> {
    if !root.is_object() && !root.is_array() {
        return Ok(());
    }
    // Levels below each reference walked to its end, and the references being walked now.
    let mut done: HashMap<String, usize> = HashMap::new();
    let mut open: HashSet<String> = HashSet::new();
    let mut stack = vec![Frame::new(root, String::new(), 1, 1, None)];
    while let Some(top) = stack.last_mut() {
        if let Some((child, step)) = top.children.get(top.next).cloned() {
            top.next += 1;
            let (depth, local) = (top.depth + 1, top.local + 1);
            stack.push(Frame::new(child, step, depth, local, None));
            if local > max_nesting {
                return Err(DepthError::SchemaNesting { at: location(&stack), limit: max_nesting });
            }
            if depth > max_depth {
                return Err(DepthError::SchemaDepth { at: location(&stack), limit: max_depth });
            }
            continue;
        }
        if let Some(reference) = top.reference.take() {
            if open.contains(reference) {
                continue;
            }
            if let Some(&below) = done.get(reference) {
                top.below = top.below.max(below + 1);
                if top.depth + below > max_depth {
                    return Err(DepthError::SchemaDepth { at: reference.to_owned(), limit: max_depth });
                }
                continue;
            }
            // Non-local or dangling references are llguidance's to report.
            let Some(target) = resolve(root, reference).filter(|v| v.is_object() || v.is_array()) else {
                continue;
            };
            let depth = top.depth + 1;
            open.insert(reference.to_owned());
            stack.push(Frame::new(target, "$ref".into(), depth, 1, Some(reference.to_owned())));
            if depth > max_depth {
                return Err(DepthError::SchemaDepth { at: location(&stack), limit: max_depth });
            }
            continue;
        }
        let Some(frame) = stack.pop() else { break };
        if let Some(target) = frame.target {
            open.remove(&target);
            done.insert(target, frame.below);
        }
        if let Some(parent) = stack.last_mut() {
            parent.below = parent.below.max(frame.below + 1);
        }
    }
    Ok(())
}

/// A Lark grammar's definitions: each rule or token with the names its body uses.
#[derive(Debug, Default)]
struct LarkOutline<'g> {
    uses: HashMap<&'g str, Vec<&'g str>>,
    /// Names in the order they are defined.
    order: Vec<&'g str>,
}

/// Reads `grammar` as llguidance's Lark lexer would, closely enough to find definitions and
/// names: strings, regexes, comments and special tokens are skipped, `%json` schemas are
/// checked, a line starting with `|` continues the statement before it.
fn outline_lark(grammar: &str) -> Result<LarkOutline<'_>, DepthError> {
    let bytes = grammar.as_bytes();
    let mut outline = LarkOutline::default();
    // The statement being read: its first name, whether it defines it, the names after `:`.
    let mut first: Option<&str> = None;
    let mut defining = false;
    let mut names: Vec<&str> = Vec::new();
    let mut directive = false;
    let mut at_start = true;
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        match b {
            b'\n' => {
                let mut j = i;
                while j < bytes.len() && bytes[j].is_ascii_whitespace() {
                    j += 1;
                }
                if bytes.get(j) != Some(&b'|') {
                    end_statement(&mut outline, &mut first, &mut defining, &mut names);
                    directive = false;
                    at_start = true;
                }
                i = j;
            }
            b'#' => i = skip_line(bytes, i),
            b'/' if bytes.get(i + 1) == Some(&b'/') => i = skip_line(bytes, i),
            b'/' => i = skip_quoted(bytes, i, b'/'),
            b'"' => i = skip_quoted(bytes, i, b'"'),
            b'<' => {
                let close =
                    bytes[i + 1..].iter().position(|&c| c == b'>' || c == b'<' || c.is_ascii_whitespace());
                i = match close {
                    Some(n) if bytes[i + 1 + n] == b'>' => i + n + 2,
                    _ => i + 1,
                };
            }
            b'%' => {
                let word_end = i + 1 + bytes[i + 1..].iter().take_while(|c| c.is_ascii_alphabetic()).count();
                let word = &grammar[i..word_end];
                directive |= at_start;
                at_start = false;
                i = word_end;
                if matches!(word, "%json" | "%regex" | "%llguidance") {
                    let rest = &grammar[i..];
                    let mut values = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
                    if let Some(Ok(value)) = values.next() {
                        if word == "%json" {
                            check_schema(&value)?;
                        }
                        i += values.byte_offset();
                    }
                }
            }
            b':' if bytes.get(i + 1) == Some(&b':') => i += 2,
            b':' => {
                if !directive && !defining && first.is_some() && names.is_empty() {
                    defining = true;
                }
                i += 1;
            }
            b'@' => i += 1 + bytes[i + 1..].iter().take_while(|&&c| is_name_byte(c)).count(),
            c if c.is_ascii_alphabetic() || c == b'_' || c == b'!' || c == b'?' => {
                let start = i + bytes[i..].iter().take_while(|&&c| c == b'!' || c == b'?').count();
                let end = start + bytes[start..].iter().take_while(|&&c| is_name_byte(c)).count();
                let name = &grammar[start..end];
                if first.is_none() && at_start {
                    first = Some(name);
                } else if defining && !name.is_empty() {
                    names.push(name);
                }
                at_start = false;
                i = end.max(i + 1);
            }
            _ => i += 1,
        }
    }
    end_statement(&mut outline, &mut first, &mut defining, &mut names);
    Ok(outline)
}

/// Records the statement just read, if it defined a name.
fn end_statement<'g>(
    outline: &mut LarkOutline<'g>,
    first: &mut Option<&'g str>,
    defining: &mut bool,
    names: &mut Vec<&'g str>,
) {
    if let (Some(name), true) = (first.take(), *defining) {
        if !outline.uses.contains_key(name) {
            outline.order.push(name);
        }
        outline.uses.entry(name).or_default().append(names);
    }
    first.take();
    names.clear();
    *defining = false;
}

fn is_name_byte(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_' || c == b'-'
}

/// The index of the newline ending the line at `i` (or the end).
fn skip_line(bytes: &[u8], i: usize) -> usize {
    i + bytes[i..].iter().position(|&c| c == b'\n').unwrap_or(bytes.len() - i)
}

/// The index after a string or regex opened by `quote` at `i` (backslash escapes), or after
/// the line when it is not closed there.
fn skip_quoted(bytes: &[u8], i: usize, quote: u8) -> usize {
    let mut j = i + 1;
    while j < bytes.len() {
        match bytes[j] {
            b'\\' => j += 2,
            b'\n' => return j,
            c if c == quote => return j + 1,
            _ => j += 1,
        }
    }
    bytes.len()
}

/// [`check_lark`] with the bound given.
fn check_lark_within(grammar: &str, max_chain: usize) -> Result<(), DepthError> {
    let outline = outline_lark(grammar)?;
    // The longest chain from each name walked to its end, and the names being walked now.
    let mut done: HashMap<&str, usize> = HashMap::new();
    let mut open: HashSet<&str> = HashSet::new();
    for &from in &outline.order {
        if done.contains_key(from) {
            continue;
        }
        let too_long = || DepthError::RuleChain { from: from.to_owned(), limit: max_chain };
        // (name, index of the next name it uses, the longest chain below found so far)
        let mut stack: Vec<(&str, usize, usize)> = vec![(from, 0, 1)];
        open.insert(from);
        while let Some(top) = stack.last_mut() {
            let (name, next, _) = *top;
            let uses = &outline.uses[name];
            if let Some(&child) = uses.get(next) {
                top.1 += 1;
                if open.contains(child) || !outline.uses.contains_key(child) {
                    continue;
                }
                if let Some(&below) = done.get(child) {
                    top.2 = top.2.max(below + 1);
                    if stack.len() + below > max_chain {
                        return Err(too_long());
                    }
                    continue;
                }
                open.insert(child);
                stack.push((child, 0, 1));
                if stack.len() > max_chain {
                    return Err(too_long());
                }
                continue;
            }
            let Some((name, _, below)) = stack.pop() else { break };
            open.remove(name);
            done.insert(name, below);
            if let Some(parent) = stack.last_mut() {
                parent.2 = parent.2.max(below + 1);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn chain(n: usize) -> Value {
        let mut defs = serde_json::Map::new();
        for i in 0..n {
            defs.insert(format!("d{i}"), json!({"$ref": format!("#/$defs/d{}", i + 1)}));
        }
        defs.insert(format!("d{n}"), json!({"type": "string"}));
        json!({"$defs": defs, "$ref": "#/$defs/d0"})
    }

    fn nested(n: usize, key: &str) -> Value {
        let mut s = json!({"type": "string"});
        for _ in 0..n {
            s = match key {
                "items" => json!({"type": "array", "items": s}),
                _ => json!({"type": "object", "properties": {"a": s}}),
            };
        }
        s
    }

    #[test]
    fn ref_chains_count_one_level_per_link() {
        assert_eq!(check_schema_within(&chain(40), 64, 44), Ok(()));
        let err = check_schema_within(&chain(40), 64, 40).unwrap_err();
        assert!(matches!(&err, DepthError::SchemaDepth { at, .. } if at.starts_with("#/$defs/d")), "{err}");
        assert!(check_schema(&chain(300)).is_ok());
        assert!(matches!(check_schema(&chain(1000)), Err(DepthError::SchemaDepth { .. })));
    }

    #[test]
    fn nesting_is_bounded_in_place_and_through_references() {
        assert!(check_schema(&nested(60, "items")).is_ok());
        let err = check_schema(&nested(70, "items")).unwrap_err();
        assert!(matches!(&err, DepthError::SchemaNesting { at, .. } if at.starts_with("#/…/items")), "{err}");
        let err = check_schema(&nested(40, "properties")).unwrap_err();
        assert!(matches!(err, DepthError::SchemaNesting { .. }), "{err}");
        // Definitions 30 deep each, chained: fine in each place, too deep together.
        let mut defs = serde_json::Map::new();
        for i in 0..20 {
            let mut s = json!({"$ref": format!("#/$defs/d{}", i + 1)});
            for _ in 0..30 {
                s = json!({"type": "array", "items": s});
            }
            defs.insert(format!("d{i}"), s);
        }
        defs.insert("d20".into(), json!({"type": "string"}));
        let schema = json!({"$defs": defs, "$ref": "#/$defs/d0"});
        assert!(matches!(check_schema(&schema), Err(DepthError::SchemaDepth { .. })));
    }

    #[test]
    fn recursion_and_shared_definitions_are_fine() {
        let tree =
            json!({"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#"}}}});
        assert_eq!(check_schema(&tree), Ok(()));
        let cycle =
            json!({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"});
        assert_eq!(check_schema(&cycle), Ok(()));
        // Every definition uses the two before it: exponentially many paths, linear work.
        let mut defs = serde_json::Map::new();
        for i in 2..150 {
            let uses = [format!("#/$defs/d{}", i - 1), format!("#/$defs/d{}", i - 2)];
            defs.insert(format!("d{i}"), json!({"anyOf": [{"$ref": uses[0]}, {"$ref": uses[1]}]}));
        }
        defs.insert("d1".into(), json!({"type": "string"}));
        defs.insert("d0".into(), json!({"type": "integer"}));
        let schema = json!({"$defs": defs, "$ref": "#/$defs/d149"});
        let started = std::time::Instant::now();
        assert_eq!(check_schema(&schema), Ok(()));
        assert!(started.elapsed().as_secs() < 2);
        // Escaped pointers are followed.
        let mut defs = serde_json::Map::new();
        for i in 0..600 {
            defs.insert(format!("a/{i}"), json!({"$ref": format!("#/%24defs/a~1{}", i + 1)}));
        }
        let escaped = json!({"$defs": defs, "$ref": "#/%24defs/a~10"});
        assert!(matches!(check_schema(&escaped), Err(DepthError::SchemaDepth { .. })));
    }

    fn lark_chain(n: usize) -> String {
        let mut g = String::from("start: r0\n");
        for i in 0..n {
            g.push_str(&format!("r{i}: r{} \"x\"\n", i + 1));
        }
        g + &format!("r{n}: \"x\"\n")
    }

    #[test]
    fn lark_rule_chains_are_bounded() {
        assert_eq!(check_lark_within(&lark_chain(30), 40), Ok(()));
        let err = check_lark_within(&lark_chain(50), 40).unwrap_err();
        assert_eq!(err, DepthError::RuleChain { from: "start".into(), limit: 40 });
        assert!(check_lark(&lark_chain(300)).is_ok());
        assert!(check_lark(&lark_chain(1000)).is_err());
        // Tokens chain too; names in strings, regexes and comments are not uses.
        let tokens: String = (0..60).map(|i| format!("T{i}: T{} | \"a\"\n", i + 1)).collect();
        assert!(check_lark_within(&format!("start: T0\n{tokens}"), 50).is_err());
        let quiet = "start: a \"b c d\" /e f/ // g h\n# i j\na: \"x\"\n";
        let outline = outline_lark(quiet).unwrap();
        assert_eq!(outline.uses["start"], ["a"]);
        // Continuation lines belong to the rule above; directives define nothing.
        let outline = outline_lark("start: a\n  | b\n%ignore c\na: \"x\"\nb: a\n").unwrap();
        assert_eq!(outline.uses["start"], ["a", "b"]);
        assert_eq!(outline.order, ["start", "a", "b"]);
        // Recursive rules are fine.
        assert!(check_lark("start: list\nlist: \"[\" (list (\",\" list)*)? \"]\"\n").is_ok());
    }

    #[test]
    fn lark_json_schemas_are_checked() {
        let g = format!("start: \"<\" %json {} \">\"\n", chain(1000));
        assert!(matches!(check_lark(&g), Err(DepthError::SchemaDepth { .. })));
        let g = format!("start: \"<\" %json {} \">\" after\nafter: \"x\"\n", chain(10));
        let outline = outline_lark(&g).unwrap();
        assert_eq!(outline.uses["start"], ["after"], "the JSON's keys are not rule names");
    }
}
