//! Request fingerprints: a canonical form of a whole chat/completions/embeddings request and a
//! 128-bit xxh3 key over it plus a tenant namespace. Pure; no pyo3.
//!
//! Every top-level field is output-affecting (unknown ones too, the safe side for a cache) except
//! the transport-only ones in [`TRANSPORT_FIELDS`]. Absent and default-valued fields differ.

use crate::json::{self, parse_object, write_parsed, write_string, Node, RequestError};
use crate::normalize::{normalize, normalize_into};
use std::borrow::Cow;
use std::io::Write as _;

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
    /// Canonical JSON only: key order, whitespace between tokens and string escapes do not
    /// matter; numbers keep their literal (`1`, `1.0` and `1e0` differ).
    Exact,
    /// Also [`normalize`] message text, `prompt` and `input` strings.
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
    let mut out = Vec::with_capacity(body.len());
    write_request(&request, level, &mut out);
    // The writers only ever append whole UTF-8 sequences.
    Ok(String::from_utf8(out).unwrap_or_default())
}

/// The first line of what a fingerprint hashes. Bump it whenever the canonical form or
/// [`normalize`] changes a key (4: `normalized` keeps blank space at line ends, beside tabs,
/// from the first quote mark on and in space-aligned paragraphs).
pub const VERSION: &str = "router-fp/4";

/// The 16-byte key of a request: xxh3-128 over a versioned header, the namespace and
/// [`canonical`]; big-endian bytes. The header's version changes whenever the canonical form
/// does, so a shared tier never answers from keys made under older rules.
pub fn fingerprint(body: &[u8], namespace: &str, level: Level) -> Result<[u8; 16], RequestError> {
    let request = parse_object(body)?;
    validate(&request)?;
    let mut out = Vec::with_capacity(body.len() + namespace.len() + 32);
    // Length-prefixed so no namespace can be confused with the start of a body.
    let _ = write!(
        out,
        "{VERSION}\n{}\n{}:{namespace}\n",
        level.tag(),
        namespace.len()
    );
    write_request(&request, level, &mut out);
    Ok(xxhash_rust::xxh3::xxh3_128(&out).to_be_bytes())
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
    let Node::Obj(fields) = message else {
        return Err(shape(&format!("messages[{i}]"), "an object", message));
    };
    // One pass over the fields instead of a lookup per name; checked below in a fixed order
    // so the first error reported does not depend on key order.
    let (mut role, mut name, mut call_id, mut content, mut calls) = (None, None, None, None, None);
    for (key, value) in fields {
        match key.as_ref() {
            "role" => role = Some(value),
            "name" => name = Some(value),
            "tool_call_id" => call_id = Some(value),
            "content" => content = Some(value),
            "tool_calls" => calls = Some(value),
            _ => {}
        }
    }
    match role {
        Some(Node::Str(_)) => {}
        Some(role) => return Err(shape(&format!("messages[{i}].role"), "a string", role)),
        None => return Err(RequestError::Shape(format!("messages[{i}] has no `role`"))),
    }
    for (field, value) in [("name", name), ("tool_call_id", call_id)] {
        if let Some(value) = value {
            if value.as_str().is_none() {
                return Err(shape(&format!("messages[{i}].{field}"), "a string", value));
            }
        }
    }
    match content {
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
    if let Some(calls) = calls {
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

fn write_request(request: &Node<'_>, level: Level, out: &mut Vec<u8>) {
    let Node::Obj(entries) = request else {
        return json::write_value(request, out);
    };
    out.push(b'{');
    let mut first = true;
    for (key, value) in entries {
        if is_transport(key) {
            continue;
        }
        if !first {
            out.push(b',');
        }
        first = false;
        write_parsed(key, out);
        out.push(b':');
        match (level, key.as_ref(), value) {
            (Level::Normalized, "messages", Node::Arr(items)) => write_messages(items, out),
            // A completions `prompt` is continued as written: its last blank space picks the
            // next token, so it keys exactly.
            (Level::Normalized, "input", _) => write_texts(value, out),
            _ => json::write_value(value, out),
        }
    }
    out.push(b'}');
}

/// Messages with their text normalized, but for a trailing assistant message: a prefill the
/// model continues as written, whose last blank space picks the next token.
fn write_messages(items: &[Node<'_>], out: &mut Vec<u8>) {
    out.push(b'[');
    for (i, message) in items.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        match message {
            Node::Obj(fields) if !(i + 1 == items.len() && is_assistant(message)) => {
                write_object_with(fields, "content", out);
            }
            other => json::write_value(other, out),
        }
    }
    out.push(b']');
}

fn is_assistant(message: &Node<'_>) -> bool {
    matches!(message.get("role"), Some(Node::Str(role)) if role == "assistant")
}

/// A string normalized; an array with its strings and its text parts' `text` normalized.
fn write_texts(value: &Node<'_>, out: &mut Vec<u8>) {
    match value {
        // Borrowed strings hold nothing to escape, and normalizing writes only their own bytes
        // and spaces, so the result goes straight into `out`.
        Node::Str(Cow::Borrowed(s)) => {
            out.push(b'"');
            normalize_into(s, out);
            out.push(b'"');
        }
        Node::Str(s) => write_string(&normalize(s), out),
        Node::Arr(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                match item {
                    Node::Obj(part) => write_object_with(part, "text", out),
                    other => write_texts(other, out),
                }
            }
            out.push(b']');
        }
        other => json::write_value(other, out),
    }
}

/// Write an object canonically, passing the value of `special` through [`write_texts`].
fn write_object_with(fields: &Entries<'_>, special: &str, out: &mut Vec<u8>) {
    out.push(b'{');
    for (i, (key, value)) in fields.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write_parsed(key, out);
        out.push(b':');
        if key == special {
            write_texts(value, out);
        } else {
            json::write_value(value, out);
        }
    }
    out.push(b'}');
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
    fn key_hashes_the_versioned_header() {
        let body = br#"{"model":"m","prompt":"x"}"#;
        for level in [Level::Exact, Level::Normalized] {
            let mut want = format!("router-fp/4\n{}\n2:ns\n", level.tag()).into_bytes();
            want.extend_from_slice(canonical(body, level).unwrap().as_bytes());
            assert_eq!(
                fingerprint(body, "ns", level).unwrap(),
                xxhash_rust::xxh3::xxh3_128(&want).to_be_bytes()
            );
        }
    }

    #[test]
    fn key_order_and_whitespace_do_not_matter() {
        let a = r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"temperature":1.0}"#;
        let b = "{ \"temperature\" : 1.0,\n \"messages\": [ {\"content\":\"hi\", \"role\":\"user\"} ], \"model\":\"m\" }";
        assert_eq!(fp(a), fp(b));
    }

    #[test]
    fn numbers_keep_every_digit_at_both_levels() {
        for (x, y) in [
            ("12345678901234567890", "12345678901234567891"),
            ("123456789012345678901", "123456789012345678902"),
            ("-12345678901234567890", "-12345678901234567891"),
            ("9007199254740993.0", "9007199254740992.0"),
            ("0.30000000000000000001", "0.3"),
            ("1", "1.0"),
            ("1e2", "100"),
            ("0", "-0"),
        ] {
            for level in [Level::Exact, Level::Normalized] {
                let key = |n: &str| {
                    let body = format!(r#"{{"model":"m","prompt":"x","seed":{n}}}"#);
                    fingerprint(body.as_bytes(), "", level).unwrap()
                };
                assert_ne!(key(x), key(y), "{x} {y} {level:?}");
            }
        }
    }

    #[test]
    fn borrowed_and_escaped_strings_normalize_alike() {
        // Without escapes (borrowed from the body) and with them (decoded into a new string).
        for text in [
            "  Hi   there ",
            "a  b\\tc",
            "x\\u00a0\\u00a0y",
            "`a  b`  c",
            "a \\\"b\\\"  c",
        ] {
            let escaped = format!(r#"{{"input":"{text}"}}"#);
            let decoded = parse_object(escaped.as_bytes()).unwrap();
            let Some(Node::Str(s)) = decoded.get("input") else {
                panic!("{text}")
            };
            let mut want = Vec::new();
            write_string(&normalize(s), &mut want);
            let canon = canonical(escaped.as_bytes(), Level::Normalized).unwrap();
            let want = format!("{{\"input\":{}}}", String::from_utf8(want).unwrap());
            assert_eq!(canon, want, "{text}");
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
        let body = br#"{"model":"M  X","messages":[{"role":"user","content":[{"type":"text","text":"  Hello  World! "}]}],"prompt":["A  B. "],"input":"X "}"#;
        assert_eq!(
            canonical(body, Level::Normalized).unwrap(),
            r#"{"input":"X","messages":[{"content":[{"text":"Hello World!","type":"text"}],"role":"user"}],"model":"M  X","prompt":["A  B. "]}"#
        );
        // A prefill (trailing assistant message) keys as written; earlier ones are normalized.
        let prefill = br#"{"messages":[{"role":"assistant","content":"a  b "},{"role":"user","content":"q "},{"role":"assistant","content":"The answer is "}]}"#;
        assert_eq!(
            canonical(prefill, Level::Normalized).unwrap(),
            r#"{"messages":[{"content":"a b","role":"assistant"},{"content":"q","role":"user"},{"content":"The answer is ","role":"assistant"}]}"#
        );
        let loud = br#"{"model":"m","messages":[{"role":"user","content":"  Hello   world! "}]}"#;
        let calm = br#"{"model":"m","messages":[{"role":"user","content":"Hello world!"}]}"#;
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
