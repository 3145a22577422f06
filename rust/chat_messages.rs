//! The prompt of a request body as chat-template messages: Chat Completions `messages`,
//! Anthropic Messages (`system` first) and Responses (`instructions`, `input` items). Content
//! parts are joined into one string, as llama.cpp and vLLM do for string-content templates.
//! Pure; no pyo3.

use std::collections::BTreeMap;

use minijinja::Value;

use crate::json::{Node, RequestError};

/// The messages of a chat, Anthropic Messages or Responses request body, as template values.
pub fn chat_messages(request: &Node<'_>) -> Result<Vec<Value>, RequestError> {
    let mut out = Vec::new();
    // Anthropic's top-level `system` and the Responses API's `instructions` are a system message.
    for field in ["system", "instructions"] {
        if let Some(system) = request.get(field) {
            if let Some(text) = flatten_content(system) {
                out.push(message("system", text));
            }
        }
    }
    match (request.get("messages"), request.get("input")) {
        (Some(Node::Arr(messages)), _) => {
            for m in messages {
                out.push(message_value(m)?);
            }
        }
        (Some(other), _) => {
            return Err(RequestError::Shape(format!(
                "`messages` must be an array, got {}",
                other.type_name()
            )))
        }
        (None, Some(Node::Str(text))) => out.push(message("user", text.to_string())),
        (None, Some(Node::Arr(items))) => {
            for item in items {
                if let Some(m) = response_item(item)? {
                    out.push(m);
                }
            }
        }
        _ => {
            return Err(RequestError::Shape(
                "request has no `messages` array and no Responses `input`".to_owned(),
            ))
        }
    }
    Ok(out)
}

fn message(role: &str, content: String) -> Value {
    let mut map = BTreeMap::new();
    map.insert("role".to_owned(), Value::from(role));
    map.insert("content".to_owned(), Value::from(content));
    Value::from(map)
}

/// A chat message with its content parts joined into one string.
fn message_value(node: &Node<'_>) -> Result<Value, RequestError> {
    let Node::Obj(fields) = node else {
        return Err(RequestError::Shape(format!(
            "each message must be an object, got {}",
            node.type_name()
        )));
    };
    let mut map = BTreeMap::new();
    for (key, value) in fields {
        let value = match (key.as_ref(), value) {
            ("content", Node::Arr(_)) => Value::from(flatten_content(value).unwrap_or_default()),
            _ => to_value(value),
        };
        map.insert(key.to_string(), value);
    }
    Ok(Value::from(map))
}

/// A Responses API input item as a chat message: messages, function calls and their outputs;
/// other items (reasoning, images) are skipped.
fn response_item(item: &Node<'_>) -> Result<Option<Value>, RequestError> {
    let kind = item.get("type").and_then(Node::as_str);
    match kind {
        None | Some("message") if item.get("role").is_some() => message_value(item).map(Some),
        Some("function_call") => {
            let mut function = BTreeMap::new();
            for field in ["name", "arguments"] {
                let text = item.get(field).and_then(Node::as_str).unwrap_or_default();
                function.insert(field.to_owned(), Value::from(text));
            }
            let mut call = BTreeMap::new();
            call.insert("type".to_owned(), Value::from("function"));
            call.insert("function".to_owned(), Value::from(function));
            if let Some(id) = item.get("call_id") {
                call.insert("id".to_owned(), to_value(id));
            }
            let mut map = BTreeMap::new();
            map.insert("role".to_owned(), Value::from("assistant"));
            map.insert("content".to_owned(), Value::from(()));
            map.insert(
                "tool_calls".to_owned(),
                Value::from(vec![Value::from(call)]),
            );
            Ok(Some(Value::from(map)))
        }
        Some("function_call_output") => {
            let output = item.get("output").and_then(flatten_content);
            let mut map = BTreeMap::new();
            map.insert("role".to_owned(), Value::from("tool"));
            map.insert(
                "content".to_owned(),
                Value::from(output.unwrap_or_default()),
            );
            if let Some(id) = item.get("call_id") {
                map.insert("tool_call_id".to_owned(), to_value(id));
            }
            Ok(Some(Value::from(map)))
        }
        _ => Ok(None),
    }
}

/// A string, or the `text` of each content part joined by newlines (parts without text, such as
/// images, are skipped); `None` for anything else.
fn flatten_content(node: &Node<'_>) -> Option<String> {
    match node {
        Node::Str(s) => Some(s.to_string()),
        Node::Arr(parts) => {
            let mut text = String::new();
            for (i, part) in parts
                .iter()
                .filter_map(|p| p.get("text").and_then(Node::as_str))
                .enumerate()
            {
                if i > 0 {
                    text.push('\n');
                }
                text.push_str(part);
            }
            Some(text)
        }
        _ => None,
    }
}

/// A JSON value as a template value (objects keep the parser's sorted key order).
pub fn to_value(node: &Node<'_>) -> Value {
    match node {
        Node::Null => Value::from(()),
        Node::Bool(b) => Value::from(*b),
        // The literal as written: an integer when it is one, else the nearest float.
        Node::Num(literal) => {
            if let Ok(i) = literal.parse::<i64>() {
                Value::from(i)
            } else if let Ok(u) = literal.parse::<u64>() {
                Value::from(u)
            } else {
                Value::from(literal.parse::<f64>().unwrap_or(f64::NAN))
            }
        }
        Node::Str(s) => Value::from(s.as_ref()),
        Node::Arr(items) => Value::from(items.iter().map(to_value).collect::<Vec<_>>()),
        Node::Obj(entries) => Value::from(
            entries
                .iter()
                .map(|(k, v)| (k.to_string(), to_value(v)))
                .collect::<BTreeMap<_, _>>(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::json::parse_object;

    /// (role, content, `tool_call_id`) of each message; content and id "" when absent or none.
    fn messages(body: &str) -> Vec<(String, String, String)> {
        let request = parse_object(body.as_bytes()).unwrap();
        let field = |m: &Value, key: &str| {
            let v = m.get_item(&Value::from(key)).unwrap();
            v.as_str().unwrap_or_default().to_owned()
        };
        chat_messages(&request)
            .unwrap()
            .iter()
            .map(|m| {
                (
                    field(m, "role"),
                    field(m, "content"),
                    field(m, "tool_call_id"),
                )
            })
            .collect()
    }

    #[test]
    fn responses_function_calls_become_tool_messages() {
        let body = r#"{"input":[
            {"type":"message","role":"user","content":"weather?"},
            {"type":"function_call","call_id":"c1","name":"weather","arguments":"{}"},
            {"type":"function_call_output","call_id":"c1","output":"sunny"},
            {"type":"reasoning","summary":[]}
        ]}"#;
        let got = messages(body);
        let expected = [
            ("user", "weather?", ""),
            ("assistant", "", ""),
            ("tool", "sunny", "c1"),
        ];
        assert_eq!(got.len(), expected.len());
        for (g, e) in got.iter().zip(expected) {
            assert_eq!((g.0.as_str(), g.1.as_str(), g.2.as_str()), e);
        }
        let request = parse_object(body.as_bytes()).unwrap();
        let call = chat_messages(&request).unwrap()[1].to_string();
        assert!(call.contains("weather") && call.contains("c1"), "{call}");
    }

    #[test]
    fn system_fields_come_first_and_parts_join_with_newlines() {
        let got = messages(
            r#"{"system":"S","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image","source":{}},{"type":"text","text":"b"}]}]}"#,
        );
        assert_eq!(got[0].0, "system");
        assert_eq!(got[0].1, "S");
        assert_eq!(got[1].1, "a\nb");
    }

    #[test]
    fn shape_errors() {
        for body in ["{}", r#"{"messages":"x"}"#, r#"{"messages":[1]}"#] {
            let request = parse_object(body.as_bytes()).unwrap();
            assert!(
                matches!(chat_messages(&request), Err(RequestError::Shape(_))),
                "{body}"
            );
        }
    }
}
