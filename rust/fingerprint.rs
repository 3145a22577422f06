//! Request fingerprints: a canonical form of a whole chat/completions/embeddings request and a
//! 128-bit xxh3 key over it plus a tenant namespace. Pure; no pyo3.
//!
//! Every top-level field is output-affecting (unknown ones too, the safe side for a cache) except
//! the transport-only ones in [`TRANSPORT_FIELDS`]. Absent and default-valued fields differ.

use crate::json::{self, parse_object, write_string, Node, RequestError};
use crate::normalize::{normalize, Options};
use std::borrow::Cow;
use std::fmt::Write as _;

/// Top-level fields that change how a response is delivered or billed, never its content.
pub const TRANSPORT_FIELDS: &[&str] = &[
    "metadata",
    "prompt_cache_key",
    "safety_identifier",
    "service_tier",
    "store",
    "stream",
    "stream_options",
    "user",
];

/// True for the fields in [`TRANSPORT_FIELDS`] (a `match`, cheaper than scanning the list).
fn is_transport(key: &str) -> bool {
    matches!(
        key,
        "metadata"
            | "prompt_cache_key"
            | "safety_identifier"
            | "service_tier"
            | "store"
            | "stream"
            | "stream_options"
            | "user"
    )
}

/// How much of the request text is normalized before hashing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    /// Canonical JSON only: key order, whitespace and number spelling do not matter.
    Exact,
    /// Also [`normalize`] message text, `prompt` and `input` strings (default options).
    Normalized,
}

impl Level {
    /// Parse `"exact"` or `"normalized"`.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "exact" => Some(Self::Exact),
            "normalized" => Some(Self::Normalized),
            _ => None,
        }
    }

    fn tag(self) -> &'static str {
        match self {
            Self::Exact => "exact",
            Self::Normalized => "normalized",
        }
    }
}

/// The canonical JSON of a request body (what the fingerprint hashes, minus the namespace).
pub fn canonical(body: &[u8], level: Level) -> Result<String, RequestError> {
    let request = parse_object(body)?;
    validate(&request)?;
    let mut out = String::with_capacity(body.len());
    write_request(&request, level, &mut out);
    Ok(out)
}

/// The 16-byte key of a request: xxh3-128 over a versioned header, the namespace and
/// [`canonical`]; big-endian bytes.
pub fn fingerprint(body: &[u8], namespace: &str, level: Level) -> Result<[u8; 16], RequestError> {
    let request = parse_object(body)?;
    validate(&request)?;
    let mut out = String::with_capacity(body.len() + namespace.len() + 32);
    // Length-prefixed so no namespace can be confused with the start of a body.
    let _ = write!(
        out,
        "router-fp/1\n{}\n{}:{namespace}\n",
        level.tag(),
        namespace.len()
    );
    write_request(&request, level, &mut out);
    Ok(xxhash_rust::xxh3::xxh3_128(out.as_bytes()).to_be_bytes())
}

/// Object entries, sorted by key.
type Entries<'a> = [(Cow<'a, str>, Node<'a>)];

/// Check the types of the fields the canonical form and token counting look inside.
pub fn validate(request: &Node<'_>) -> Result<(), RequestError> {
    if let Some(model) = request.get("model") {
        if model.as_str().is_none() {
            return Err(shape("model", "a string", model));
        }
    }
    if let Some(messages) = request.get("messages") {
        let Node::Arr(items) = messages else {
            return Err(shape("messages", "an array", messages));
        };
        for (i, message) in items.iter().enumerate() {
            validate_message(i, message)?;
        }
    }
    for field in ["prompt", "input"] {
        if let Some(value) = request.get(field) {
            if !matches!(value, Node::Str(_) | Node::Arr(_)) {
                return Err(shape(field, "a string or an array", value));
            }
        }
    }
    Ok(())
}

fn validate_message(i: usize, message: &Node<'_>) -> Result<(), RequestError> {
    if !matches!(message, Node::Obj(_)) {
        return Err(shape(&format!("messages[{i}]"), "an object", message));
    }
    match message.get("role") {
        Some(Node::Str(_)) => {}
        Some(role) => return Err(shape(&format!("messages[{i}].role"), "a string", role)),
        None => return Err(RequestError::Shape(format!("messages[{i}] has no `role`"))),
    }
    for field in ["name", "tool_call_id"] {
        if let Some(value) = message.get(field) {
            if value.as_str().is_none() {
                return Err(shape(&format!("messages[{i}].{field}"), "a string", value));
            }
        }
    }
    match message.get("content") {
        None | Some(Node::Null | Node::Str(_)) => {}
        Some(Node::Arr(parts)) => {
            for (j, part) in parts.iter().enumerate() {
                if !matches!(part, Node::Obj(_)) {
                    return Err(shape(
                        &format!("messages[{i}].content[{j}]"),
                        "an object",
                        part,
                    ));
                }
            }
        }
        Some(content) => {
            return Err(shape(
                &format!("messages[{i}].content"),
                "a string, an array or null",
                content,
            ))
        }
    }
    if let Some(calls) = message.get("tool_calls") {
        if !matches!(calls, Node::Arr(_)) {
            return Err(shape(
                &format!("messages[{i}].tool_calls"),
                "an array",
                calls,
            ));
        }
    }
    Ok(())
}

fn shape(path: &str, expected: &str, got: &Node<'_>) -> RequestError {
    RequestError::Shape(format!(
        "`{path}` must be {expected}, got {}",
        got.type_name()
    ))
}

fn write_request(request: &Node<'_>, level: Level, out: &mut String) {
    let Node::Obj(entries) = request else {
        return json::write_value(request, out);
    };
    out.push('{');
    let mut first = true;
    for (key, value) in entries {
        if is_transport(key) {
            continue;
        }
        if !first {
            out.push(',');
        }
        first = false;
        write_string(key, out);
        out.push(':');
        match (level, key.as_ref(), value) {
            (Level::Normalized, "messages", Node::Arr(items)) => write_messages(items, out),
            (Level::Normalized, "prompt" | "input", _) => write_texts(value, out),
            _ => json::write_value(value, out),
        }
    }
    out.push('}');
}

fn write_messages(items: &[Node<'_>], out: &mut String) {
    out.push('[');
    for (i, message) in items.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        match message {
            Node::Obj(fields) => write_object_with(fields, "content", out),
            other => json::write_value(other, out),
        }
    }
    out.push(']');
}

/// A string normalized; an array with its strings and its text parts' `text` normalized.
fn write_texts(value: &Node<'_>, out: &mut String) {
    match value {
        Node::Str(s) => write_normalized(s, out),
        Node::Arr(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                match item {
                    Node::Obj(part) => write_object_with(part, "text", out),
                    other => write_texts(other, out),
                }
            }
            out.push(']');
        }
        other => json::write_value(other, out),
    }
}

/// Append `normalize(s)` (default options) as a JSON string. ASCII text, the common case, is
/// collapsed and escaped word by word straight into `out`, then lowercased in place.
fn write_normalized(s: &str, out: &mut String) {
    if !s.is_ascii() {
        return write_string(&normalize(s, Options::default()), out);
    }
    out.reserve(s.len() + 2);
    out.push('"');
    let start = out.len();
    let bytes = s.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if is_ascii_space(bytes[i]) {
            i += 1;
            continue;
        }
        let end = bytes[i..]
            .iter()
            .position(|&b| is_ascii_space(b))
            .map_or(bytes.len(), |n| i + n);
        if out.len() > start {
            out.push(' ');
        }
        push_escaped_word(&s[i..end], out);
        i = end;
    }
    // Escapes are lowercase already (`\b`, `\u00xx`), so folding them too changes nothing.
    out[start..].make_ascii_lowercase();
    // No escape sequence ends in punctuation or a space, so trimming the tail is safe.
    while out.len() > start && out.ends_with(['.', '!', '?', ',', ';', ':', ' ']) {
        out.pop();
    }
    out.push('"');
}

/// Python's `str.isspace` on an ASCII byte.
fn is_ascii_space(b: u8) -> bool {
    matches!(b, b'\t' | b'\n' | 0x0b | 0x0c | b'\r' | 0x1c..=0x1f | b' ')
}

/// Append an ASCII word (no whitespace) with JSON escapes, in runs of plain bytes.
fn push_escaped_word(word: &str, out: &mut String) {
    let bytes = word.as_bytes();
    let mut run = 0;
    for (i, &b) in bytes.iter().enumerate() {
        if b >= 0x20 && b != b'"' && b != b'\\' {
            continue;
        }
        out.push_str(&word[run..i]);
        match b {
            b'"' => out.push_str("\\\""),
            b'\\' => out.push_str("\\\\"),
            0x08 => out.push_str("\\b"),
            _ => {
                let _ = write!(out, "\\u{b:04x}");
            }
        }
        run = i + 1;
    }
    out.push_str(&word[run..]);
}

/// Write an object canonically, passing the value of `special` through [`write_texts`].
fn write_object_with(fields: &Entries<'_>, special: &str, out: &mut String) {
    out.push('{');
    for (i, (key, value)) in fields.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        write_string(key, out);
        out.push(':');
        if key == special {
            write_texts(value, out);
        } else {
            json::write_value(value, out);
        }
    }
    out.push('}');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fp(body: &str) -> [u8; 16] {
        fingerprint(body.as_bytes(), "", Level::Exact).unwrap()
    }

    #[test]
    fn xxh3_128_known_vector() {
        // Reference value of XXH3_128bits("") from the xxHash test suite.
        assert_eq!(
            xxhash_rust::xxh3::xxh3_128(b""),
            0x99aa_06d3_0147_98d8_6001_c324_468d_497f
        );
    }

    #[test]
    fn key_order_whitespace_and_numbers_do_not_matter() {
        let a = r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"temperature":1}"#;
        let b = "{ \"temperature\" : 1.0,\n \"messages\": [ {\"content\":\"hi\", \"role\":\"user\"} ], \"model\":\"m\" }";
        assert_eq!(fp(a), fp(b));
    }

    #[test]
    fn ascii_fast_path_equals_normalize_then_escape() {
        for text in [
            "",
            "  Hello  World!!  ",
            "A \"quoted\" \\ path\\ ",
            "ctl \u{1}\u{8}\u{7f} x\t\n\r\u{b}\u{c}\u{1c}y",
            "...",
            " ,. ",
            "ends with escape\\",
            "ends with quote\"!",
        ] {
            let mut fast = String::new();
            write_normalized(text, &mut fast);
            let mut slow = String::new();
            write_string(&normalize(text, Options::default()), &mut slow);
            assert_eq!(fast, slow, "{text:?}");
        }
    }

    #[test]
    fn transport_list_and_match_agree() {
        for field in TRANSPORT_FIELDS {
            assert!(is_transport(field));
        }
        assert!(!is_transport("streams"));
    }

    #[test]
    fn transport_fields_are_ignored_but_others_count() {
        let base = r#"{"model":"m","messages":[]}"#;
        let transport = r#"{"model":"m","messages":[],"stream":true,"user":"u","stream_options":{"include_usage":true}}"#;
        assert_eq!(fp(base), fp(transport));
        assert_ne!(fp(base), fp(r#"{"model":"m","messages":[],"seed":1}"#));
        assert_ne!(fp(base), fp(r#"{"model":"m","messages":[],"x_unknown":1}"#));
        assert_ne!(fp(base), fp(r#"{"model":"n","messages":[]}"#));
    }

    #[test]
    fn namespace_and_level_change_the_key() {
        let body = br#"{"model":"m","prompt":"Hi"}"#;
        let a = fingerprint(body, "a", Level::Exact).unwrap();
        let b = fingerprint(body, "b", Level::Exact).unwrap();
        let n = fingerprint(body, "a", Level::Normalized).unwrap();
        assert_ne!(a, b);
        assert_ne!(a, n);
    }

    #[test]
    fn normalized_level_folds_text_only() {
        let body = br#"{"model":"M","messages":[{"role":"user","content":[{"type":"text","text":"  Hello  World! "}]}],"prompt":["A  B."],"input":"X"}"#;
        assert_eq!(
            canonical(body, Level::Normalized).unwrap(),
            r#"{"input":"x","messages":[{"content":[{"text":"hello world","type":"text"}],"role":"user"}],"model":"M","prompt":["a b"]}"#
        );
        let loud = br#"{"model":"m","messages":[{"role":"user","content":"HELLO   world!"}]}"#;
        let calm = br#"{"model":"m","messages":[{"role":"user","content":"hello world"}]}"#;
        assert_eq!(
            fingerprint(loud, "", Level::Normalized).unwrap(),
            fingerprint(calm, "", Level::Normalized).unwrap()
        );
        assert_ne!(
            fingerprint(loud, "", Level::Exact).unwrap(),
            fingerprint(calm, "", Level::Exact).unwrap()
        );
    }

    #[test]
    fn shape_errors_name_the_field() {
        for (body, needle) in [
            (r#"{"messages":{}}"#, "`messages` must be an array"),
            (r#"{"messages":[1]}"#, "`messages[0]` must be an object"),
            (r#"{"messages":[{}]}"#, "messages[0] has no `role`"),
            (r#"{"messages":[{"role":1}]}"#, "`messages[0].role`"),
            (r#"{"messages":[{"role":"u","content":5}]}"#, "content"),
            (r#"{"model":3}"#, "`model` must be a string"),
            (r#"{"prompt":{}}"#, "`prompt`"),
        ] {
            let err = canonical(body.as_bytes(), Level::Exact).unwrap_err();
            assert!(matches!(err, RequestError::Shape(_)), "{body}");
            assert!(err.to_string().contains(needle), "{err} / {needle}");
        }
    }
}
