//! The client's answers to approval requests: an `mcp_approval_response` input item names an
//! earlier `mcp_approval_request` (of the stored conversation, or given back in `input`) and
//! approves or denies its call. An approved call runs before the model goes on; a denied one
//! is shown to the model as a call that the user refused.

use serde_json::Value;

use super::items::{new_id, Call};
use crate::error::InvalidParam;

/// The answer to one approval request.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// The call asked about (with a fresh id, and the request's id as `approval_request_id`).
    pub call: Call,
    pub approve: bool,
    pub reason: Option<String>,
}

fn str_of<'a>(item: &'a Value, key: &str) -> Option<&'a str> {
    item.get(key).and_then(Value::as_str)
}

/// The decisions of this request's items (`items[first_new..]`) on approval requests not yet
/// answered in the conversation.
pub fn decisions(items: &[Value], first_new: usize) -> Result<Vec<Decision>, InvalidParam> {
    let mut out = Vec::new();
    for (i, item) in items.iter().enumerate().skip(first_new) {
        if str_of(item, "type") != Some("mcp_approval_response") {
            continue;
        }
        let p = format!("input[{}]", i - first_new);
        if let Some(k) = item.as_object().and_then(|o| {
            o.keys().find(|k| {
                !matches!(k.as_str(), "type" | "id" | "approval_request_id" | "approve" | "reason" | "status")
            })
        }) {
            return Err(InvalidParam::new(
                format!("{p}.{k}"),
                format!("unknown field `{k}` in an `mcp_approval_response` item"),
            ));
        }
        let id = str_of(item, "approval_request_id")
            .ok_or_else(|| InvalidParam::new(format!("{p}.approval_request_id"), "is required (a string)"))?;
        let approve = item
            .get("approve")
            .and_then(Value::as_bool)
            .ok_or_else(|| InvalidParam::new(format!("{p}.approve"), "is required (a boolean)"))?;
        let reason = match item.get("reason") {
            None | Some(Value::Null) => None,
            Some(Value::String(r)) => Some(r.clone()),
            Some(_) => return Err(InvalidParam::new(format!("{p}.reason"), "must be a string")),
        };
        let request = items[..i]
            .iter()
            .find(|r| str_of(r, "type") == Some("mcp_approval_request") && str_of(r, "id") == Some(id))
            .ok_or_else(|| {
                InvalidParam::new(
                    format!("{p}.approval_request_id"),
                    format!(
                        "no mcp_approval_request `{id}` in the conversation (give \
                         previous_response_id, or the request item in input)"
                    ),
                )
            })?;
        let answered = items
            .iter()
            .any(|c| str_of(c, "type") == Some("mcp_call") && str_of(c, "approval_request_id") == Some(id))
            || out.iter().any(|d: &Decision| d.call.approval_request_id.as_deref() == Some(id));
        if answered {
            continue;
        }
        let call = Call {
            id: new_id("mcp"),
            label: str_of(request, "server_label").unwrap_or_default().to_owned(),
            name: str_of(request, "name").unwrap_or_default().to_owned(),
            arguments: str_of(request, "arguments").unwrap_or("{}").to_owned(),
            approval_request_id: Some(id.to_owned()),
        };
        out.push(Decision { call, approve, reason });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn request(id: &str) -> Value {
        json!({"type": "mcp_approval_request", "id": id, "server_label": "calc", "name": "add",
               "arguments": "{\"a\":1}"})
    }

    #[test]
    fn responses_name_their_requests() {
        let items = vec![
            request("mcpr_1"),
            json!({"type": "mcp_approval_response", "approval_request_id": "mcpr_1", "approve": false,
                   "reason": "no"}),
        ];
        let d = decisions(&items, 1).unwrap();
        assert_eq!(d.len(), 1);
        assert!(!d[0].approve);
        assert_eq!((d[0].call.name.as_str(), d[0].call.arguments.as_str()), ("add", "{\"a\":1}"));
        assert_eq!(d[0].call.approval_request_id.as_deref(), Some("mcpr_1"));
        assert_eq!(d[0].reason.as_deref(), Some("no"));
    }

    #[test]
    fn answered_requests_do_not_run_twice() {
        let items = vec![
            request("mcpr_1"),
            json!({"type": "mcp_call", "id": "mcp_9", "approval_request_id": "mcpr_1"}),
            json!({"type": "mcp_approval_response", "approval_request_id": "mcpr_1", "approve": true}),
        ];
        assert!(decisions(&items, 2).unwrap().is_empty());
    }

    #[test]
    fn bad_responses_are_named() {
        let err = |resp: Value| decisions(&[request("mcpr_1"), resp], 1).unwrap_err().param.unwrap();
        assert_eq!(
            err(json!({"type": "mcp_approval_response", "approval_request_id": "nope", "approve": true})),
            "input[0].approval_request_id"
        );
        assert_eq!(
            err(json!({"type": "mcp_approval_response", "approve": true})),
            "input[0].approval_request_id"
        );
        assert_eq!(
            err(json!({"type": "mcp_approval_response", "approval_request_id": "mcpr_1", "approve": "yes"})),
            "input[0].approve"
        );
        assert_eq!(
            err(json!({"type": "mcp_approval_response", "approval_request_id": "mcpr_1", "approve": true,
                       "x": 1})),
            "input[0].x"
        );
    }
}
