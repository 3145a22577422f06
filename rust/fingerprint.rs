//! Request fingerprints: a canonical form of a whole chat/completions/embeddings request and a
//! 128-bit xxh3 key over it plus a tenant namespace. Pure; no pyo3.
//!
//! Every top-level field is output-affecting (unknown ones too, the safe side for a cache) except
//! the transport-only ones in [`TRANSPORT_FIELDS`]. Absent and default-valued fields differ.
//! Member order counts but in the request object and in each message (see [`write_request`]).

use crate::json::{self, parse_document, write_parsed, write_string, Node, RequestError};
use crate::normalize::{normalize, normalize_into, normalize_parts};
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
    /// Canonical JSON only: whitespace between tokens, string escapes and the member order of
    /// the request object and of each message do not matter; member order anywhere else does,
    /// and numbers keep their literal (`1`, `1.0` and `1e0` differ).
    Exact,
    /// Also [`normalize`] message text (a message's text parts as one text, see
    /// [`normalize_parts`]) and `input` strings; not a prefill or a completions `prompt`.
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
    let request = parse_document(body)?;
    validate(&request)?;
    let mut out = Vec::with_capacity(body.len());
    write_request(&request, level, &mut out);
    // The writers only ever append whole UTF-8 sequences.
    Ok(String::from_utf8(out).unwrap_or_default())
}

/// The first line of what a fingerprint hashes. Bump it whenever the canonical form or
/// [`normalize`] changes a key (4: `normalized` keeps blank space at line ends, beside tabs,
/// from the first quote mark on and in space-aligned paragraphs; 5: member order counts but in
/// the request and its messages, repeated keys are all kept, and a message's text parts are
/// normalized as one text).
pub const VERSION: &str = "router-fp/5";

/// The 16-byte key of a request: xxh3-128 over a versioned header, the namespace and
/// [`canonical`]; big-endian bytes. The header's version changes whenever the canonical form
/// does, so a shared tier never answers from keys made under older rules.
pub fn fingerprint(body: &[u8], namespace: &str, level: Level) -> Result<[u8; 16], RequestError> {
    let request = parse_document(body)?;
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

/// An object's members.
type Entries<'a> = [(Cow<'a, str>, Node<'a>)];

/// One member of an object.
type Member<'a> = (Cow<'a, str>, Node<'a>);

/// The members of an object that servers read by key (the request, a message), in key order
/// (equal keys in the order written), and whether a key repeats.
#[inline]
fn by_key<'n, 'a>(fields: &'n Entries<'a>) -> (KeyOrder<'n, 'a>, bool) {
    let n = fields.len();
    let mut order = KeyOrder {
        fields,
        small: [0; SMALL],
        large: Vec::new(),
        next: 0,
    };
    let repeats = if let [(a, _), (b, _)] = fields {
        // Most messages: role and content.
        let ab = key_cmp(a, b);
        order.small[usize::from(ab.is_le())] = 1;
        ab.is_eq()
    } else if n <= SMALL {
        for (i, slot) in order.small[..n].iter_mut().enumerate() {
            *slot = i as u8;
        }
        sort_members(fields, &mut order.small[..n])
    } else {
        order.large = (0..n).collect();
        sort_members(fields, &mut order.large)
    };
    (order, repeats)
}

/// Sort member indices by key, stably (without allocating for a message's few members: an
/// insertion sort): repeated keys keep their order, which servers read differently. True if a
/// key repeats.
fn sort_members<I: Copy + Into<usize>>(fields: &Entries<'_>, slots: &mut [I]) -> bool {
    let key = |i: I| fields[i.into()].0.as_ref();
    slots.sort_by(|&i, &j| key_cmp(key(i), key(j)));
    slots.windows(2).any(|w| key(w[0]) == key(w[1]))
}

/// Keys in byte order; most keys of an object differ in their first byte, decided without a
/// call to `memcmp`.
fn key_cmp(a: &str, b: &str) -> std::cmp::Ordering {
    match (a.as_bytes().first(), b.as_bytes().first()) {
        (Some(x), Some(y)) if x != y => x.cmp(y),
        _ => a.cmp(b),
    }
}

/// Objects with up to this many members are put in key order on the stack.
const SMALL: usize = 16;

/// An object's members in the order [`by_key`] found.
struct KeyOrder<'n, 'a> {
    fields: &'n Entries<'a>,
    small: [u8; SMALL],
    large: Vec<usize>,
    next: usize,
}

impl<'n, 'a> Iterator for KeyOrder<'n, 'a> {
    type Item = &'n Member<'a>;

    fn next(&mut self) -> Option<Self::Item> {
        let at = self.next;
        if at >= self.fields.len() {
            return None;
        }
        self.next += 1;
        let i = if self.large.is_empty() {
            usize::from(self.small[at])
        } else {
            self.large[at]
        };
        self.fields.get(i)
    }
}

/// True if a key of `fields` (members in the order written) repeats.
fn repeats(fields: &Entries<'_>) -> bool {
    if fields.len() <= 16 {
        fields
            .iter()
            .enumerate()
            .any(|(i, (key, _))| fields[..i].iter().any(|(k, _)| k == key))
    } else {
        by_key(fields).1
    }
}

/// Write the request. Member order is ignored only where every server reads members by key and
/// never renders them in order: the request object's own fields and each message's (chat and
/// Anthropic `messages`, Responses `input` items). Everywhere else (`response_format`, `tools`,
/// `tool_choice`, content parts, tool calls, any schema, unknown fields) it is kept: JSON
/// schema `properties` are generated in their order, and chat templates render tools with
/// `tojson`, which keeps it. A repeated key is read as its first member by some parsers and as
/// its last by others: every member is kept, and nothing under an object with one is normalized.
fn write_request(request: &Node<'_>, level: Level, out: &mut Vec<u8>) {
    let Node::Obj(fields) = request else {
        return json::write_value(request, out);
    };
    let (members, repeated) = by_key(fields);
    let normalized = level == Level::Normalized && !repeated;
    let members = members.filter(|(key, _)| !is_transport(key));
    write_object(members, out, |key, value, out| {
        match (key, value) {
            ("messages", Node::Arr(items)) => write_messages(items, normalized, out),
            // A completions `prompt` is continued as written: its last blank space picks the
            // next token, so it keys exactly.
            ("input", Node::Str(text)) if normalized => write_text(text, out),
            ("input", Node::Arr(items)) => write_items(items, true, normalized, out),
            _ => return false,
        }
        true
    });
}

/// Messages, at level `normalized` with their text normalized, but for a trailing assistant
/// message: a prefill the model continues as written, whose last blank space picks the next
/// token.
fn write_messages(items: &[Node<'_>], normalized: bool, out: &mut Vec<u8>) {
    out.push(b'[');
    for (i, message) in items.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        match message {
            Node::Obj(fields) => {
                let prefill = i + 1 == items.len() && is_assistant(message);
                write_message(fields, normalized && !prefill, out);
            }
            other => json::write_value(other, out),
        }
    }
    out.push(b']');
}

fn is_assistant(message: &Node<'_>) -> bool {
    matches!(message.get("role"), Some(Node::Str(role)) if role == "assistant")
}

/// A message's members in key order, its `content` normalized if `normalized`.
fn write_message(fields: &Entries<'_>, normalized: bool, out: &mut Vec<u8>) {
    let (members, repeated) = by_key(fields);
    let normalized = normalized && !repeated;
    write_object(members, out, |key, value, out| match value {
        Node::Str(text) if normalized && key == "content" => {
            write_text(text, out);
            true
        }
        Node::Arr(parts) if normalized && key == "content" => {
            write_items(parts, false, true, out);
            true
        }
        _ => false,
    });
}

/// An object of `members` in their order: each value written by `special` if it says so
/// (returns true), else as it is.
fn write_object<'n, 'a: 'n>(
    members: impl Iterator<Item = &'n Member<'a>>,
    out: &mut Vec<u8>,
    mut special: impl FnMut(&str, &Node<'a>, &mut Vec<u8>) -> bool,
) {
    out.push(b'{');
    for (i, (key, value)) in members.enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write_parsed(key, out);
        out.push(b':');
        if !special(key, value, out) {
            json::write_value(value, out);
        }
    }
    out.push(b'}');
}

/// A string normalized.
// Takes the `Cow` itself: which variant it is, is the point.
#[allow(clippy::ptr_arg)]
fn write_text(text: &Cow<'_, str>, out: &mut Vec<u8>) {
    match text {
        // Borrowed strings hold nothing to escape, and normalizing writes only their own bytes
        // and spaces, so the result goes straight into `out`.
        Cow::Borrowed(s) => {
            out.push(b'"');
            normalize_into(s, out);
            out.push(b'"');
        }
        Cow::Owned(s) => write_string(&normalize(s), out),
    }
}

/// What becomes of the string `text` of an object in [`write_items`].
enum Texts<'p> {
    /// Written as it is.
    Exact,
    /// Normalized alone (the only text part).
    Alone,
    /// Replaced by the next of [`crate::normalize::Parts::parts`].
    Joined(std::slice::Iter<'p, String>),
}

/// A content array (`by_key` false: parts keep their member order) or a Responses or
/// embeddings `input` array (`by_key` true: items are messages). At level `normalized` its
/// strings are normalized one by one (each an input of its own), and the string `text` of its
/// objects, the text parts of one text, together (see [`normalize_parts`]): with two or more,
/// the array is written as `{"parts":[...],"joined":[unseparated,paragraphs]}`, which no
/// request can hold there (`content` and `input` are a string, an array or null).
fn write_items(items: &[Node<'_>], by_key: bool, normalized: bool, out: &mut Vec<u8>) {
    if !normalized {
        return write_array(items, by_key, false, &mut Texts::Exact, out);
    }
    let mut texts = Vec::new();
    for item in items {
        if let Node::Obj(fields) = item {
            if repeats(fields) {
                // Which `text` a server reads is not known.
                return write_array(items, by_key, false, &mut Texts::Exact, out);
            }
            if let Some(Node::Str(text)) = item.get("text") {
                texts.push(text.as_ref());
            }
        }
    }
    if texts.len() < 2 {
        return write_array(items, by_key, true, &mut Texts::Alone, out);
    }
    let joined = normalize_parts(&texts);
    out.extend_from_slice(b"{\"parts\":");
    write_array(
        items,
        by_key,
        true,
        &mut Texts::Joined(joined.parts.iter()),
        out,
    );
    out.extend_from_slice(b",\"joined\":[");
    write_string(&joined.unseparated, out);
    out.push(b',');
    write_string(&joined.paragraphs, out);
    out.extend_from_slice(b"]}");
}

/// The array of [`write_items`]: strings normalized if `normalized`, objects' `text` as `texts`
/// says.
fn write_array(
    items: &[Node<'_>],
    by_key: bool,
    normalized: bool,
    texts: &mut Texts<'_>,
    out: &mut Vec<u8>,
) {
    out.push(b'[');
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        match item {
            Node::Str(text) if normalized => write_text(text, out),
            Node::Obj(fields) if by_key => {
                let (members, _) = self::by_key(fields);
                write_members(members, texts, out);
            }
            Node::Obj(fields) => write_members(fields.iter(), texts, out),
            other => json::write_value(other, out),
        }
    }
    out.push(b']');
}

/// An object's members, its string `text` as `texts` says.
fn write_members<'n, 'a: 'n>(
    members: impl Iterator<Item = &'n Member<'a>>,
    texts: &mut Texts<'_>,
    out: &mut Vec<u8>,
) {
    write_object(members, out, |key, value, out| match (value, &mut *texts) {
        (Node::Str(text), Texts::Alone) if key == "text" => {
            write_text(text, out);
            true
        }
        (Node::Str(_), Texts::Joined(parts)) if key == "text" => {
            write_string(parts.next().map_or("", String::as_str), out);
            true
        }
        _ => false,
    });
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
            let mut want = format!("router-fp/5\n{}\n2:ns\n", level.tag()).into_bytes();
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
            let decoded = parse_document(escaped.as_bytes()).unwrap();
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
            r#"{"input":"X","messages":[{"content":[{"type":"text","text":"Hello World!"}],"role":"user"}],"model":"M  X","prompt":["A  B. "]}"#
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

    fn key(body: &str, level: Level) -> [u8; 16] {
        fingerprint(body.as_bytes(), "", level).unwrap()
    }

    fn apart(a: &str, b: &str) {
        for level in [Level::Exact, Level::Normalized] {
            assert_ne!(key(a, level), key(b, level), "{level:?}\n{a}\n{b}");
        }
    }

    fn chat(extra: &str) -> String {
        format!(
            r#"{{"model":"m","temperature":0,"messages":[{{"role":"user","content":"Hi"}}]{extra}}}"#
        )
    }

    #[test]
    fn member_order_counts_where_it_can_change_the_output() {
        // Structured Outputs generate a schema's properties in order.
        let schema = |props: &str| {
            chat(&format!(
                r#","response_format":{{"type":"json_schema","json_schema":{{"name":"r","schema":{{"type":"object","properties":{props},"required":["reasoning","answer"]}}}}}}"#
            ))
        };
        apart(
            &schema(r#"{"reasoning":{"type":"string"},"answer":{"type":"string"}}"#),
            &schema(r#"{"answer":{"type":"string"},"reasoning":{"type":"string"}}"#),
        );
        // Chat templates render tools with `tojson`, which keeps the order.
        let tools = |params: &str| {
            chat(&format!(
                r#","tools":[{{"type":"function","function":{{"name":"f","parameters":{params}}}}}]"#
            ))
        };
        apart(
            &tools(r#"{"type":"object","properties":{"a":{},"b":{}}}"#),
            &tools(r#"{"type":"object","properties":{"b":{},"a":{}}}"#),
        );
        apart(
            &tools(r#"{"type":"object","properties":{}}"#),
            &tools(r#"{"properties":{},"type":"object"}"#),
        );
        for (a, b) in [
            (
                r#","tool_choice":{"type":"function","function":{"name":"f"}}"#,
                r#","tool_choice":{"function":{"name":"f"},"type":"function"}"#,
            ),
            (
                r#","guided_json":{"properties":{"x":{},"y":{}}}"#,
                r#","guided_json":{"properties":{"y":{},"x":{}}}"#,
            ),
            (
                r#","x_vendor":{"a":1,"b":2}"#,
                r#","x_vendor":{"b":2,"a":1}"#,
            ),
            (
                r#","logit_bias":{"1":1,"2":2}"#,
                r#","logit_bias":{"2":2,"1":1}"#,
            ),
        ] {
            apart(&chat(a), &chat(b));
        }
        // Content parts and tool calls keep their order too (the safe side).
        apart(
            r#"{"messages":[{"role":"user","content":[{"type":"text","text":"Hi"}]}]}"#,
            r#"{"messages":[{"role":"user","content":[{"text":"Hi","type":"text"}]}]}"#,
        );
        apart(
            r#"{"messages":[{"role":"assistant","tool_calls":[{"id":"1","type":"function","function":{"name":"f","arguments":"{}"}}]}]}"#,
            r#"{"messages":[{"role":"assistant","tool_calls":[{"type":"function","id":"1","function":{"name":"f","arguments":"{}"}}]}]}"#,
        );
    }

    #[test]
    fn member_order_of_the_request_and_its_messages_does_not_count() {
        for (a, b) in [
            (
                r#"{"model":"m","messages":[{"role":"user","content":"hi","name":"x"}],"response_format":{"type":"json_object"}}"#,
                r#"{"response_format":{"type":"json_object"},"messages":[{"name":"x","content":"hi","role":"user"}],"model":"m"}"#,
            ),
            (
                r#"{"model":"m","input":[{"role":"user","content":"hi"},{"type":"function_call_output","call_id":"c","output":"1"}]}"#,
                r#"{"input":[{"content":"hi","role":"user"},{"output":"1","call_id":"c","type":"function_call_output"}],"model":"m"}"#,
            ),
        ] {
            for level in [Level::Exact, Level::Normalized] {
                assert_eq!(key(a, level), key(b, level), "{level:?} {a}");
            }
        }
    }

    #[test]
    fn objects_past_the_stack_order_alike() {
        let fields: Vec<String> = (0..40).map(|i| format!(r#""f{i:02}":{i}"#)).collect();
        let mut reversed = fields.clone();
        reversed.reverse();
        let body = |f: &[String]| format!("{{{}}}", f.join(","));
        for level in [Level::Exact, Level::Normalized] {
            assert_eq!(key(&body(&fields), level), key(&body(&reversed), level));
        }
        let mut repeated = fields.clone();
        repeated.push(r#""f00":0"#.to_owned());
        apart(&body(&repeated), &body(&fields));
        let message = |f: &[String]| {
            format!(
                r#"{{"messages":[{{"role":"user","content":"a  b",{}}}]}}"#,
                f.join(",")
            )
        };
        assert_eq!(
            key(&message(&fields), Level::Normalized),
            key(&message(&reversed), Level::Normalized)
        );
        assert!(canonical(message(&repeated).as_bytes(), Level::Normalized)
            .unwrap()
            .contains(r#""content":"a  b""#));
    }

    #[test]
    fn repeated_keys_are_all_kept() {
        // A server reading the first of repeated keys and one reading the last see different
        // requests: neither may share a key with the request with only one of them.
        for (a, b) in [
            (r#"{"model":"a","model":"b"}"#, r#"{"model":"b"}"#),
            (r#"{"model":"a","model":"b"}"#, r#"{"model":"a"}"#),
            (
                r#"{"model":"a","model":"b"}"#,
                r#"{"model":"b","model":"a"}"#,
            ),
            (
                r#"{"model":"m","response_format":{"type":"json_object","type":"text"}}"#,
                r#"{"model":"m","response_format":{"type":"text"}}"#,
            ),
            (
                r#"{"messages":[{"role":"user","content":"a","content":"b"}]}"#,
                r#"{"messages":[{"role":"user","content":"b"}]}"#,
            ),
            (
                r#"{"messages":[{"role":"user","content":[{"type":"text","text":"a","text":"b"}]}]}"#,
                r#"{"messages":[{"role":"user","content":[{"type":"text","text":"b"}]}]}"#,
            ),
        ] {
            apart(a, b);
        }
        // Repeated keys stay in the order written, also where the rest is in key order.
        assert_eq!(
            canonical(br#"{"x":1,"model":"a","model":"b"}"#, Level::Exact).unwrap(),
            r#"{"model":"a","model":"b","x":1}"#
        );
        // Nothing under an object with a repeated key is normalized: a server may read either.
        assert_eq!(
            canonical(
                br#"{"messages":[{"role":"user","content":"a  b","role":"assistant"},{"role":"user","content":"c  d"}]}"#,
                Level::Normalized
            )
            .unwrap(),
            r#"{"messages":[{"content":"a  b","role":"user","role":"assistant"},{"content":"c d","role":"user"}]}"#
        );
        assert_eq!(
            canonical(br#"{"input":"a  b","n":1,"n":2}"#, Level::Normalized).unwrap(),
            r#"{"input":"a  b","n":1,"n":2}"#
        );
    }

    /// A chat request whose one user message holds these text parts.
    fn parts(texts: &[&str]) -> String {
        let parts: Vec<String> = texts
            .iter()
            .map(|t| {
                let mut text = Vec::new();
                write_string(t, &mut text);
                format!(
                    r#"{{"type":"text","text":{}}}"#,
                    String::from_utf8(text).unwrap()
                )
            })
            .collect();
        format!(
            r#"{{"model":"m","messages":[{{"role":"user","content":[{}]}}]}}"#,
            parts.join(",")
        )
    }

    #[test]
    fn text_parts_normalize_as_one_text() {
        for (a, b) in [
            // Line-start folds only where a line starts.
            (
                &["Fix this:\ndef f():", "  return 1"][..],
                &["Fix this:\ndef f():", "return 1"][..],
            ),
            (&["Join abc", " def"], &["Join abc", "def"]),
            (&["  x = 1", "y = 2"], &["x = 1", "y = 2"]),
            // A quotation opened in one part goes on in the next.
            (
                &[
                    "How many spaces are between the quotes: \"",
                    "a     b",
                    "\"?",
                ],
                &["How many spaces are between the quotes: \"", "a b", "\"?"],
            ),
            // So do a fence, a paragraph with a backtick and space-aligned columns.
            (
                &["Run:\n```", "x  =  1", "```"],
                &["Run:\n```", "x = 1", "```"],
            ),
            (&["Run `ls", "-l  -a` now"], &["Run `ls", "-l -a` now"]),
            (
                &["Name Age City", "Bob      Rome"],
                &["Name Age City", "Bob Rome"],
            ),
            // Columns in one part, prose in the next: a blank line between them (llama.cpp's
            // render_content) keeps the columns a paragraph of their own.
            (
                &["a  b\nc  d", "e f\ng h\ni j\nk l"],
                &["a b\nc d", "e f\ng h\ni j\nk l"],
            ),
            // Where the parts end: with or without a line break between them.
            (&["a", "b"], &["ab"]),
            (&["a", "b"], &["a\nb"]),
            (&["ab"], &["a\nb"]),
            (&["a\n", "b"], &["a", "\nb"]),
            (&["a", ""], &["a"]),
            (&["", "a"], &["a", ""]),
            (&["  ", "  x  y"], &["", "x y"]),
            (&["a\r", "b"], &["a", "\rb"]),
        ] {
            apart(&parts(a), &parts(b));
        }
        // Blank space that is blank space in every joining still folds.
        for (a, b) in [
            (
                &["Hello  world", "Line two\nLine three\nLine four"][..],
                &["Hello world", "Line two\nLine three\nLine four"][..],
            ),
            (&["Hi there.", "Bye now. "], &["Hi there.", "Bye now."]),
            (&["\n\nHi there.", "Bye."], &["Hi there.", "Bye."]),
        ] {
            assert_eq!(
                key(&parts(a), Level::Normalized),
                key(&parts(b), Level::Normalized),
                "{a:?} {b:?}"
            );
            assert_ne!(key(&parts(a), Level::Exact), key(&parts(b), Level::Exact));
        }
        assert_eq!(
            canonical(
                parts(&["\n  a  b", "c  d ", "e "]).as_bytes(),
                Level::Normalized
            )
            .unwrap(),
            r#"{"messages":[{"content":{"parts":[{"type":"text","text":"  a  b"},{"type":"text","text":"c  d "},{"type":"text","text":"e"}],"joined":["a bc d e","  a  b\n\nc d \n\ne"]},"role":"user"}],"model":"m"}"#
        );
        // One text part among others normalizes alone, as before.
        assert_eq!(
            canonical(
                br#"{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"u"}},{"type":"text","text":" a  b "}]}]}"#,
                Level::Normalized
            )
            .unwrap(),
            r#"{"messages":[{"content":[{"type":"image_url","image_url":{"url":"u"}},{"type":"text","text":"a b"}],"role":"user"}]}"#
        );
    }

    #[test]
    fn input_text_items_normalize_as_one_text_and_strings_one_by_one() {
        let items = |a: &str, b: &str| {
            format!(
                r#"{{"model":"m","input":[{{"type":"input_text","text":"{a}"}},{{"type":"input_text","text":"{b}"}}]}}"#
            )
        };
        apart(
            &items("def f():", "  return 1"),
            &items("def f():", "return 1"),
        );
        // Embeddings inputs are texts of their own.
        assert_eq!(
            canonical(br#"{"input":["  a  b ","c  "]}"#, Level::Normalized).unwrap(),
            r#"{"input":["a b","c"]}"#
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
