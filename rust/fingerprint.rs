//! Request fingerprints: a canonical form of a whole chat/completions/embeddings request and a
//! 128-bit xxh3 key over it plus a tenant namespace. Pure; no pyo3.
//!
//! Every top-level field is output-affecting (unknown ones too, the safe side for a cache) except
//! the transport-only ones in [`TRANSPORT_FIELDS`]. Absent and default-valued fields differ.

use crate::json::{self, parse_object, write_parsed, write_string, Node, RequestError};
use crate::normalize::{is_ascii_space, normalize, Options};
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
    let mut out = Vec::with_capacity(body.len());
    write_request(&request, level, &mut out);
    // The writers only ever append whole UTF-8 sequences.
    Ok(String::from_utf8(out).unwrap_or_default())
}

/// The 16-byte key of a request: xxh3-128 over a versioned header, the namespace and
/// [`canonical`]; big-endian bytes.
pub fn fingerprint(body: &[u8], namespace: &str, level: Level) -> Result<[u8; 16], RequestError> {
    let request = parse_object(body)?;
    validate(&request)?;
    let mut out = Vec::with_capacity(body.len() + namespace.len() + 32);
    // Length-prefixed so no namespace can be confused with the start of a body.
    let _ = write!(
        out,
        "router-fp/1\n{}\n{}:{namespace}\n",
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
            (Level::Normalized, "prompt" | "input", _) => write_texts(value, out),
            _ => json::write_value(value, out),
        }
    }
    out.push(b'}');
}

fn write_messages(items: &[Node<'_>], out: &mut Vec<u8>) {
    out.push(b'[');
    for (i, message) in items.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        match message {
            Node::Obj(fields) => write_object_with(fields, "content", out),
            other => json::write_value(other, out),
        }
    }
    out.push(b']');
}

/// A string normalized; an array with its strings and its text parts' `text` normalized.
fn write_texts(value: &Node<'_>, out: &mut Vec<u8>) {
    match value {
        // Borrowed strings hold no escapes, so no whitespace but the space (see `Node::Str`).
        Node::Str(Cow::Borrowed(s)) => write_normalized::<true>(s, out),
        Node::Str(s) => write_normalized::<false>(s, out),
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

/// Bit in [`ASCII_CLASS`]: Python whitespace.
const SPACE: u8 = 1;
/// Bit in [`ASCII_CLASS`]: `"`, `\\` or another control character, escaped in JSON.
const ESCAPE: u8 = 2;
/// Bit in [`ASCII_CLASS`]: part of a non-ASCII character (NFKC and full case folding apply).
const NON_ASCII: u8 = 4;

/// Class of every byte for the ASCII fast path of [`write_normalized`].
static ASCII_CLASS: [u8; 256] = {
    let mut table = [0; 256];
    let mut b = 0;
    while b < 256 {
        let byte = b as u8;
        table[b] = if is_ascii_space(byte) {
            SPACE
        } else if byte >= 0x80 {
            NON_ASCII
        } else if byte < 0x20 || byte == b'"' || byte == b'\\' {
            ESCAPE
        } else {
            0
        };
        b += 1;
    }
    table
};

/// What the fast path writes for an ASCII byte: whitespace as a space, letters lowercased.
static ASCII_FOLD: [u8; 256] = {
    let mut table = [0; 256];
    let mut b = 0;
    while b < 256 {
        let byte = b as u8;
        table[b] = if is_ascii_space(byte) {
            b' '
        } else {
            byte.to_ascii_lowercase()
        };
        b += 1;
    }
    table
};

/// Append `normalize(s)` (default options) as a JSON string. ASCII text, the common case, is
/// folded and collapsed by [`fold_ascii`] straight into `out` (escaped afterwards if it holds a
/// quote, a backslash or a control character). `PLAIN` promises `s` has no `"`, `\\` or control
/// character, which makes the eight-byte check cheaper.
fn write_normalized<const PLAIN: bool>(s: &str, out: &mut Vec<u8>) {
    let bytes = s.as_bytes();
    out.push(b'"');
    let start = out.len();
    out.resize(start + bytes.len(), 0);
    let Some((len, escape)) = fold_ascii::<PLAIN>(bytes, &mut out[start..]) else {
        out.truncate(start - 1);
        return write_string(&normalize(s, Options::default()), out);
    };
    out.truncate(start + len);
    // Trailing whitespace and `strip_punctuation` (ASCII has no `。` or `、`).
    while out.len() > start
        && matches!(
            out[out.len() - 1],
            b'.' | b'!' | b'?' | b',' | b';' | b':' | b' '
        )
    {
        out.pop();
    }
    if escape {
        let folded = out.split_off(start - 1);
        // ASCII in, ASCII out.
        let folded = std::str::from_utf8(&folded[1..]).unwrap_or_default();
        return write_string(folded, out);
    }
    out.push(b'"');
}

const ONES: u64 = 0x0101_0101_0101_0101;
const HIGHS: u64 = 0x8080_8080_8080_8080;

/// High bit set in each byte of `w` that is at least `b`; every byte of `w` must be ASCII
/// (setting the high bits first means no subtraction borrows from the next byte).
const fn at_least(w: u64, b: u8) -> u64 {
    ((w | HIGHS) - ONES * b as u64) & HIGHS
}

/// High bit set in each byte of `w` (all ASCII) equal to `b`.
const fn equal(w: u64, b: u8) -> u64 {
    !at_least(w ^ (ONES * b as u64), 1) & HIGHS
}

/// Lowercase case folding and whitespace collapse of ASCII `bytes` into `buf` (as long as
/// `bytes`), leading and trailing space dropped except one trailing space: the folded length
/// and whether the result needs JSON escapes; `None` if `bytes` is not all ASCII.
/// Eight bytes at a time while they hold only letters, digits, punctuation and single spaces;
/// `PLAIN` as in [`write_normalized`].
fn fold_ascii<const PLAIN: bool>(bytes: &[u8], buf: &mut [u8]) -> Option<(usize, bool)> {
    let mut len = 0;
    // Starting "after a space" drops leading whitespace.
    let mut after_space = true;
    let mut seen = 0;
    let mut i = 0;
    while let Some(chunk) = bytes.get(i..i + 8) {
        i += 8;
        let w = u64::from_le_bytes(chunk.try_into().unwrap_or([0; 8]));
        if w & HIGHS != 0 {
            return None;
        }
        let spaces = equal(w, b' ');
        let single_spaces = spaces & (spaces << 8 | u64::from(after_space) << 7) == 0;
        let plain = if PLAIN {
            single_spaces
        } else {
            single_spaces
                && !at_least(w, 0x21) & HIGHS == spaces
                && equal(w, b'"') | equal(w, b'\\') == 0
        };
        if plain {
            let upper = at_least(w, b'A') & !at_least(w, b'Z' + 1);
            let folded = w | upper >> 2;
            // `len` never passes the input position, so it stays in bounds.
            buf[len..len + 8].copy_from_slice(&folded.to_le_bytes());
            len += 8;
            after_space = spaces >> 63 != 0;
        } else {
            for &b in chunk {
                seen |= fold_byte(b, buf, &mut len, &mut after_space);
            }
        }
    }
    for &b in &bytes[i..] {
        seen |= fold_byte(b, buf, &mut len, &mut after_space);
    }
    (seen & NON_ASCII == 0).then_some((len, seen & ESCAPE != 0))
}

/// One byte of [`fold_ascii`], branch-free; returns its class.
#[inline]
fn fold_byte(b: u8, buf: &mut [u8], len: &mut usize, after_space: &mut bool) -> u8 {
    let class = ASCII_CLASS[usize::from(b)];
    let space = class & SPACE != 0;
    buf[*len] = ASCII_FOLD[usize::from(b)];
    // A space directly after another (or at the start) is overwritten by the next byte.
    *len += usize::from(!(space && *after_space));
    *after_space = space;
    class
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
            let mut fast = Vec::new();
            write_normalized::<false>(text, &mut fast);
            let mut slow = Vec::new();
            write_string(&normalize(text, Options::default()), &mut slow);
            assert_eq!(fast, slow, "{text:?}");
        }
    }

    #[test]
    fn eight_byte_fast_path_equals_normalize_then_escape() {
        // Every chunk alignment of spaces, runs, capitals, escapes and the letters next to
        // the case boundaries (`@ [ \` { `).
        let alphabet = b"aZ AZ@[`{  \t\n\x1c\"\\\x01.!?,;:09~\x7f";
        let mut state = 0x2545_f491_4f6c_dd1d_u64;
        for len in 0..200 {
            for _ in 0..20 {
                let text: String = (0..len)
                    .map(|_| {
                        state = state
                            .wrapping_mul(6_364_136_223_846_793_005)
                            .wrapping_add(1);
                        char::from(alphabet[(state >> 33) as usize % alphabet.len()])
                    })
                    .collect();
                let mut fast = Vec::new();
                write_normalized::<false>(&text, &mut fast);
                let mut slow = Vec::new();
                write_string(&normalize(&text, Options::default()), &mut slow);
                assert_eq!(fast, slow, "{text:?}");
                // The same without escapes, as the parser borrows it.
                let text: String = text
                    .chars()
                    .filter(|&c| c >= ' ' && c != '"' && c != '\\')
                    .collect();
                let mut plain = Vec::new();
                write_normalized::<true>(&text, &mut plain);
                let mut slow = Vec::new();
                write_string(&normalize(&text, Options::default()), &mut slow);
                assert_eq!(plain, slow, "{text:?}");
            }
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
