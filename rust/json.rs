//! Decoding request bodies into a borrowed JSON tree and writing canonical JSON. Pure; no pyo3.
//!
//! A small strict RFC 8259 parser instead of `serde_json::Value`: strings without escapes and
//! every number are borrowed from the body, which makes the fingerprint of a 2 KB request a few
//! microseconds. [`parse_object`] sorts each object's members by key and keeps the last of equal
//! keys (token counting and templates read members by key); [`parse_document`] keeps every
//! member in the order written, for the fingerprint: member order changes what a model
//! generates in many places (a JSON schema's `properties` are generated in that order by
//! Structured Outputs and grammar-constrained decoding; chat templates render `tools` with
//! `tojson`, which keeps it), and a duplicate key is read as the first member by some parsers
//! and as the last by others.
//!
//! Numbers keep their literal exactly, every digit as written: `1`, `1.0`, `1e0` and `-0` vs `0`
//! stay apart. Unifying equal values is not safe for every field: an upstream may reject `1.0`
//! where it wants an integer (the cache would answer what the origin refuses), numbers inside
//! `tools` or `response_format` schemas are rendered into the model's prompt as written by the
//! server's own JSON encoder (`1.0` and `1` render differently), and integers past 2^53 or
//! 2^64 are exact for Python upstreams (`seed` 12345678901234567890 and ...891 are different
//! seeds). A literal can only mean one value, so equal literals are always safe to share.

use std::borrow::Cow;
use std::fmt;

/// Deepest JSON nesting accepted (arrays and objects).
pub const MAX_DEPTH: usize = 128;

/// Why a request body was rejected.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RequestError {
    /// Not UTF-8, not JSON, nested too deep, or a number whose value overflows f64.
    Decode(String),
    /// Valid JSON of the wrong shape (e.g. `messages` not an array).
    Shape(String),
}

impl fmt::Display for RequestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Decode(m) | Self::Shape(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for RequestError {}

/// A parsed JSON value borrowing from the request body.
#[derive(Clone, Debug, PartialEq)]
pub enum Node<'a> {
    Null,
    Bool(bool),
    /// A number's literal exactly as in the body (valid JSON number syntax, within f64 range).
    Num(&'a str),
    /// A borrowed string is a run of the body without escapes, so it holds no `"`, `\\` or
    /// control character ([`write_parsed`] relies on this).
    Str(Cow<'a, str>),
    Arr(Vec<Node<'a>>),
    /// Members: from [`parse_object`] sorted by key, duplicates resolved to the last one (as
    /// most JSON parsers do); from [`parse_document`] every member in the order written.
    Obj(Vec<(Cow<'a, str>, Node<'a>)>),
}

impl<'a> Node<'a> {
    /// The value under `key` if this is an object that has it; the last of duplicate keys.
    pub fn get(&self, key: &str) -> Option<&Node<'a>> {
        match self {
            // Objects in requests hold a few members: a scan from the end is as fast as a
            // binary search, and works on members in the order written too.
            Self::Obj(entries) => entries.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    /// The string, if this is one.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Self::Str(s) => Some(s),
            _ => None,
        }
    }

    /// The JSON type name, for error messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            Self::Null => "null",
            Self::Bool(_) => "boolean",
            Self::Num(_) => "number",
            Self::Str(_) => "string",
            Self::Arr(_) => "array",
            Self::Obj(_) => "object",
        }
    }
}

/// Parse raw request bytes into a JSON object (returned as `Node::Obj`), each object's members
/// sorted by key and the last of duplicate keys kept.
pub fn parse_object(body: &[u8]) -> Result<Node<'_>, RequestError> {
    parse(body, false)
}

/// Parse raw request bytes into a JSON object (returned as `Node::Obj`), each object's members
/// in the order written, duplicate keys included: everything a server could read differently.
pub fn parse_document(body: &[u8]) -> Result<Node<'_>, RequestError> {
    parse(body, true)
}

fn parse(body: &[u8], as_written: bool) -> Result<Node<'_>, RequestError> {
    let text = std::str::from_utf8(body).map_err(|e| {
        RequestError::Decode(format!(
            "request body is not valid UTF-8 (byte {})",
            e.valid_up_to()
        ))
    })?;
    let mut parser = Parser {
        text,
        bytes: body,
        pos: 0,
        depth: 0,
        // Enough for a typical request's deepest open containers without regrowing.
        values: Vec::with_capacity(32),
        keys: Vec::with_capacity(16),
        as_written,
        failure: None,
    };
    if parser.push_value().is_err() {
        return Err(parser
            .failure
            .take()
            .unwrap_or_else(|| parser.error("invalid value")));
    }
    parser.skip_ws();
    if parser.pos != body.len() {
        return Err(parser.error("trailing characters"));
    }
    let value = parser.values.pop().unwrap_or(Node::Null);
    match value {
        Node::Obj(_) => Ok(value),
        other => Err(RequestError::Shape(format!(
            "request body must be a JSON object, got {}",
            other.type_name()
        ))),
    }
}

/// Index of the first byte at or after `from` that is `"`, `\\` or a control character (the
/// bytes that end a plain run inside a JSON string), or `bytes.len()`. Eight bytes at a time.
pub fn find_special(bytes: &[u8], from: usize) -> usize {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    let mut i = from;
    while let Some(chunk) = bytes.get(i..i + 8) {
        let w = u64::from_le_bytes(chunk.try_into().unwrap_or([0; 8]));
        let quote = w ^ (ONES * u64::from(b'"'));
        let slash = w ^ (ONES * u64::from(b'\\'));
        // Lowest flagged byte is exact; borrows can only flag bytes above it.
        let mask = (quote.wrapping_sub(ONES) & !quote)
            | (slash.wrapping_sub(ONES) & !slash)
            | (w.wrapping_sub(ONES * 0x20) & !w);
        let mask = mask & HIGHS;
        if mask != 0 {
            return i + (mask.trailing_zeros() / 8) as usize;
        }
        i += 8;
    }
    while i < bytes.len() && !matches!(bytes[i], b'"' | b'\\' | 0x00..=0x1f) {
        i += 1;
    }
    i
}

/// An object's entries: key and value.
type Entry<'a> = (Cow<'a, str>, Node<'a>);

/// A parse failure. Its message, with the position, waits in [`Parser::failure`], so the hot
/// path passes around one-byte results instead of moving error strings.
struct Fail;

type Parsed<T> = Result<T, Fail>;

struct Parser<'a> {
    text: &'a str,
    bytes: &'a [u8],
    pos: usize,
    depth: usize,
    /// Values of the arrays and objects being parsed, innermost last: each value is pushed
    /// here, and each container moves its own off the end into a vector of exactly its length
    /// (nodes are not returned up the call chain, nor vectors grown per container).
    values: Vec<Node<'a>>,
    /// Keys of the objects being parsed, the same way.
    keys: Vec<Cow<'a, str>>,
    /// Keep each object's members as written instead of sorting and deduplicating them.
    as_written: bool,
    failure: Option<RequestError>,
}

impl<'a> Parser<'a> {
    fn at(&self) -> String {
        let before = &self.bytes[..self.pos.min(self.bytes.len())];
        // Only on the error path, so a plain count is fine.
        let line = before.split(|&b| b == b'\n').count();
        let line_start = before
            .iter()
            .rposition(|&b| b == b'\n')
            .map_or(0, |i| i + 1);
        format!("line {line} column {}", before.len() - line_start + 1)
    }

    fn error(&self, what: &str) -> RequestError {
        RequestError::Decode(format!(
            "request body is not valid JSON: {what} at {}",
            self.at()
        ))
    }

    /// Record why parsing stops here.
    #[cold]
    fn fail(&mut self, what: &str) -> Fail {
        self.failure = Some(self.error(what));
        Fail
    }

    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.pos).copied()
    }

    fn skip_ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.pos += 1;
        }
    }

    fn literal(&mut self, word: &str) -> Parsed<()> {
        if self.bytes[self.pos..].starts_with(word.as_bytes()) {
            self.pos += word.len();
            Ok(())
        } else {
            Err(self.fail("expected a value"))
        }
    }

    /// Parse one value onto [`Parser::values`].
    fn push_value(&mut self) -> Parsed<()> {
        self.skip_ws();
        let node = match self.peek() {
            Some(b'{') => return self.object(),
            Some(b'[') => return self.array(),
            Some(b'"') => {
                let (start, plain) = self.scan_string();
                Node::Str(if plain {
                    Cow::Borrowed(&self.text[start..self.pos - 1])
                } else {
                    Cow::Owned(self.escaped_string(start)?)
                })
            }
            Some(b't') => {
                self.literal("true")?;
                Node::Bool(true)
            }
            Some(b'f') => {
                self.literal("false")?;
                Node::Bool(false)
            }
            Some(b'n') => {
                self.literal("null")?;
                Node::Null
            }
            Some(b'-' | b'0'..=b'9') => Node::Num(self.number()?),
            Some(_) => return Err(self.fail("expected a value")),
            None => return Err(self.fail("unexpected end of input")),
        };
        self.values.push(node);
        Ok(())
    }

    fn enter(&mut self) -> Parsed<()> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            self.failure = Some(RequestError::Decode(format!(
                "request body is nested deeper than {MAX_DEPTH} levels ({})",
                self.at()
            )));
            return Err(Fail);
        }
        self.pos += 1;
        Ok(())
    }

    fn array(&mut self) -> Parsed<()> {
        self.enter()?;
        let base = self.values.len();
        self.skip_ws();
        if self.peek() == Some(b']') {
            self.pos += 1;
        } else {
            loop {
                self.push_value()?;
                self.skip_ws();
                match self.peek() {
                    Some(b',') => self.pos += 1,
                    Some(b']') => {
                        self.pos += 1;
                        break;
                    }
                    _ => return Err(self.fail("expected `,` or `]`")),
                }
            }
        }
        self.depth -= 1;
        let items = self.values.drain(base..).collect();
        self.values.push(Node::Arr(items));
        Ok(())
    }

    fn object(&mut self) -> Parsed<()> {
        self.enter()?;
        let base = self.values.len();
        let key_base = self.keys.len();
        self.skip_ws();
        if self.peek() == Some(b'}') {
            self.pos += 1;
        } else {
            loop {
                self.skip_ws();
                if self.peek() != Some(b'"') {
                    return Err(self.fail("expected a string key"));
                }
                let (start, plain) = self.scan_string();
                let key = if plain {
                    Cow::Borrowed(&self.text[start..self.pos - 1])
                } else {
                    Cow::Owned(self.escaped_string(start)?)
                };
                self.keys.push(key);
                self.skip_ws();
                if self.peek() != Some(b':') {
                    return Err(self.fail("expected `:`"));
                }
                self.pos += 1;
                self.push_value()?;
                self.skip_ws();
                match self.peek() {
                    Some(b',') => self.pos += 1,
                    Some(b'}') => {
                        self.pos += 1;
                        break;
                    }
                    _ => return Err(self.fail("expected `,` or `}`")),
                }
            }
        }
        self.depth -= 1;
        let mut entries: Vec<Entry<'a>> = self
            .keys
            .drain(key_base..)
            .zip(self.values.drain(base..))
            .collect();
        let sorted = self.as_written
            || match entries.as_mut_slice() {
                // The common small cases without a sort call.
                [] | [_] => true,
                [a, b] => match a.0.cmp(&b.0) {
                    std::cmp::Ordering::Less => true,
                    std::cmp::Ordering::Greater => {
                        std::mem::swap(a, b);
                        true
                    }
                    std::cmp::Ordering::Equal => false,
                },
                many => many.windows(2).all(|w| w[0].0 < w[1].0),
            };
        if !sorted {
            // Stable sort, then keep the last of equal keys (moved into the surviving slot).
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            entries.dedup_by(|later, kept| {
                let same = later.0 == kept.0;
                if same {
                    std::mem::swap(later, kept);
                }
                same
            });
        }
        self.values.push(Node::Obj(entries));
        Ok(())
    }

    /// Step over a string at `"` to its closing quote (returning its start and `true`), or to
    /// the first byte that needs [`Parser::escaped_string`] (`false`). Callers build the `Cow`
    /// in place: returning one through memory stalls on store forwarding, once per string.
    fn scan_string(&mut self) -> (usize, bool) {
        let start = self.pos + 1;
        self.pos = find_special(self.bytes, start);
        let plain = self.peek() == Some(b'"');
        self.pos += usize::from(plain);
        (start, plain)
    }

    /// The rest of a string that started at `start` and stopped before a special byte.
    #[inline(never)]
    fn escaped_string(&mut self, start: usize) -> Parsed<String> {
        match self.peek() {
            Some(b'\\') => {}
            Some(_) => return Err(self.fail("control character in string")),
            None => return Err(self.fail("unterminated string")),
        }
        let mut out = String::with_capacity(self.pos - start + 16);
        out.push_str(&self.text[start..self.pos]);
        loop {
            let run = self.pos;
            self.pos = find_special(self.bytes, self.pos);
            out.push_str(&self.text[run..self.pos]);
            match self.peek() {
                Some(b'"') => {
                    self.pos += 1;
                    return Ok(out);
                }
                Some(b'\\') => {
                    self.pos += 1;
                    self.escape(&mut out)?;
                }
                Some(_) => return Err(self.fail("control character in string")),
                None => return Err(self.fail("unterminated string")),
            }
        }
    }

    fn escape(&mut self, out: &mut String) -> Parsed<()> {
        let c = match self.peek() {
            Some(b'"') => '"',
            Some(b'\\') => '\\',
            Some(b'/') => '/',
            Some(b'b') => '\u{8}',
            Some(b'f') => '\u{c}',
            Some(b'n') => '\n',
            Some(b'r') => '\r',
            Some(b't') => '\t',
            Some(b'u') => {
                self.pos += 1;
                let high = self.hex4()?;
                let code = if (0xD800..0xDC00).contains(&high) {
                    if !self.bytes[self.pos..].starts_with(b"\\u") {
                        return Err(self.fail("lone surrogate in \\u escape"));
                    }
                    self.pos += 2;
                    let low = self.hex4()?;
                    if !(0xDC00..0xE000).contains(&low) {
                        return Err(self.fail("lone surrogate in \\u escape"));
                    }
                    0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00)
                } else {
                    high
                };
                let Some(c) = char::from_u32(code) else {
                    return Err(self.fail("lone surrogate in \\u escape"));
                };
                out.push(c);
                return Ok(());
            }
            _ => return Err(self.fail("invalid escape")),
        };
        self.pos += 1;
        out.push(c);
        Ok(())
    }

    fn hex4(&mut self) -> Parsed<u32> {
        let bytes = self.bytes;
        let digits = bytes
            .get(self.pos..self.pos + 4)
            .and_then(|d| std::str::from_utf8(d).ok())
            .filter(|d| d.bytes().all(|b| b.is_ascii_hexdigit()));
        let Some(code) = digits.and_then(|d| u32::from_str_radix(d, 16).ok()) else {
            return Err(self.fail("invalid \\u escape"));
        };
        self.pos += 4;
        Ok(code)
    }

    fn digits(&mut self) -> usize {
        let start = self.pos;
        while let Some(b'0'..=b'9') = self.peek() {
            self.pos += 1;
        }
        self.pos - start
    }

    fn number(&mut self) -> Parsed<&'a str> {
        let start = self.pos;
        if self.peek() == Some(b'-') {
            self.pos += 1;
        }
        let int_start = self.pos;
        match self.digits() {
            0 => return Err(self.fail("invalid number")),
            n if n > 1 && self.bytes[int_start] == b'0' => {
                return Err(self.fail("invalid number (leading zero)"))
            }
            _ => {}
        }
        let mut integral = true;
        if self.peek() == Some(b'.') {
            self.pos += 1;
            integral = false;
            if self.digits() == 0 {
                return Err(self.fail("invalid number"));
            }
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.pos += 1;
            integral = false;
            if let Some(b'+' | b'-') = self.peek() {
                self.pos += 1;
            }
            if self.digits() == 0 {
                return Err(self.fail("invalid number"));
            }
        }
        let literal = &self.text[start..self.pos];
        // Up to 300 digits an integer is within f64's range without parsing it.
        if !integral || literal.len() > 300 {
            let finite = literal.parse::<f64>().is_ok_and(f64::is_finite);
            if !finite {
                return Err(self.fail("number out of range"));
            }
        }
        Ok(literal)
    }
}

/// Append `value` as canonical JSON: members in the tree's order (see [`Node::Obj`]), no
/// spaces, numbers as written, strings as in [`write_string`]. Only whole UTF-8 sequences are
/// written.
pub fn write_value(value: &Node<'_>, out: &mut Vec<u8>) {
    match value {
        Node::Null => out.extend_from_slice(b"null"),
        Node::Bool(true) => out.extend_from_slice(b"true"),
        Node::Bool(false) => out.extend_from_slice(b"false"),
        Node::Num(literal) => out.extend_from_slice(literal.as_bytes()),
        Node::Str(s) => write_parsed(s, out),
        Node::Arr(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_value(item, out);
            }
            out.push(b']');
        }
        Node::Obj(entries) => {
            out.push(b'{');
            for (i, (k, v)) in entries.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_parsed(k, out);
                out.push(b':');
                write_value(v, out);
            }
            out.push(b'}');
        }
    }
}

/// Append a parsed string or key like [`write_string`]. Borrowed ones come straight from the
/// body without escapes, so they hold nothing to escape and are copied without a scan.
// Takes the `Cow` itself: which variant it is, is the point.
#[allow(clippy::ptr_arg)]
pub fn write_parsed(s: &Cow<'_, str>, out: &mut Vec<u8>) {
    match s {
        Cow::Borrowed(plain) => {
            debug_assert_eq!(find_special(plain.as_bytes(), 0), plain.len());
            out.reserve(plain.len() + 2);
            out.push(b'"');
            out.extend_from_slice(plain.as_bytes());
            out.push(b'"');
        }
        Cow::Owned(text) => write_string(text, out),
    }
}

/// Append a JSON string escaped exactly like Python's `json.dumps(ensure_ascii=False)`.
pub fn write_string(s: &str, out: &mut Vec<u8>) {
    let bytes = s.as_bytes();
    out.reserve(bytes.len() + 2);
    out.push(b'"');
    let mut start = 0;
    loop {
        let i = find_special(bytes, start);
        out.extend_from_slice(&bytes[start..i]);
        if i == bytes.len() {
            break;
        }
        push_escape(bytes[i], out);
        start = i + 1;
    }
    out.push(b'"');
}

/// Append the JSON escape of `"`, `\\` or a control character.
fn push_escape(b: u8, out: &mut Vec<u8>) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    match b {
        b'"' => out.extend_from_slice(b"\\\""),
        b'\\' => out.extend_from_slice(b"\\\\"),
        b'\n' => out.extend_from_slice(b"\\n"),
        b'\r' => out.extend_from_slice(b"\\r"),
        b'\t' => out.extend_from_slice(b"\\t"),
        0x08 => out.extend_from_slice(b"\\b"),
        0x0c => out.extend_from_slice(b"\\f"),
        _ => out.extend_from_slice(&[
            b'\\',
            b'u',
            b'0',
            b'0',
            HEX[usize::from(b >> 4)],
            HEX[usize::from(b & 0xf)],
        ]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canon(text: &str) -> String {
        let body = format!("{{\"v\":{text}}}");
        let value = parse_object(body.as_bytes()).unwrap();
        let mut out = Vec::new();
        write_value(value.get("v").unwrap(), &mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn canonical_sorts_dedups_and_keeps_number_literals() {
        assert_eq!(
            canon(r#"{ "b": 1.0, "a": [1, 1e0, 1E+0, -0.0, -0, 2.50, 18446744073709551615, 3] }"#),
            r#"{"a":[1,1e0,1E+0,-0.0,-0,2.50,18446744073709551615,3],"b":1.0}"#
        );
        let huge = format!("{}.{}e-7", "9".repeat(300), "1".repeat(80));
        assert_eq!(canon(&huge), huge);
        let long_int = "1".repeat(308);
        assert_eq!(canon(&long_int), long_int);
        assert_eq!(canon(r#"{"k":1,"k":2}"#), r#"{"k":2}"#);
        assert_eq!(
            canon(r#""\u0001\"\\\n é \u00e9 \ud83c\udf89 \/""#),
            "\"\\u0001\\\"\\\\\\n é é 🎉 /\""
        );
        assert_eq!(canon("100000000000000000001"), "100000000000000000001");
    }

    #[test]
    fn documents_keep_members_as_written() {
        let body = br#"{"b":{"y":1,"x":2,"y":3},"a":[{"k":1,"j":2}]}"#;
        let mut out = Vec::new();
        write_value(&parse_document(body).unwrap(), &mut out);
        assert_eq!(out, body);
        // The last of repeated keys is the one read by key.
        let document = parse_document(body).unwrap();
        assert_eq!(document.get("b").unwrap().get("y"), Some(&Node::Num("3")));
        assert_eq!(
            parse_object(body).unwrap().get("b").unwrap().get("y"),
            Some(&Node::Num("3"))
        );
    }

    #[test]
    fn rejects_bad_bodies() {
        for bad in [
            &b"\xff"[..],
            b"{",
            b"",
            b"NaN",
            b"{\"a\":NaN}",
            b"{\"a\":Infinity}",
            b"{\"a\":1e400}",
            b"{\"a\":-1e400}",
            b"{\"a\":1.0e+}",
            b"{\"a\":+1}",
            b"{\"a\":.5}",
            b"{\"a\":01}",
            b"{\"a\":1.}",
            b"{\"a\":-}",
            b"{\"a\":\"\\ud800\"}",
            b"{\"a\":\"\\udc00x\"}",
            b"{\"a\":\"\\x\"}",
            b"{\"a\":\"\x01\"}",
            b"{\"a\":1,}",
            b"{\"a\" 1}",
            b"{a:1}",
            b"{} {}",
            b"{\"a\":tru}",
        ] {
            assert!(
                matches!(parse_object(bad), Err(RequestError::Decode(_))),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        assert!(matches!(parse_object(b"[1]"), Err(RequestError::Shape(_))));
        let deep = format!(
            "{{\"a\":{}{}}}",
            "[".repeat(MAX_DEPTH),
            "]".repeat(MAX_DEPTH)
        );
        let err = parse_object(deep.as_bytes()).unwrap_err();
        assert!(err.to_string().contains("nested deeper"), "{err}");
        let too_big = format!("{{\"a\":{}}}", "1".repeat(400));
        let err = parse_object(too_big.as_bytes()).unwrap_err();
        assert!(err.to_string().contains("out of range"), "{err}");
        let ok = format!("{{\"a\":{}{}}}", "[".repeat(100), "]".repeat(100));
        assert!(parse_object(ok.as_bytes()).is_ok());
    }

    #[test]
    fn find_special_agrees_with_a_plain_scan() {
        let sample: Vec<u8> = (0u8..=255).cycle().take(700).collect();
        for from in 0..sample.len() {
            let naive = (from..sample.len())
                .find(|&i| matches!(sample[i], b'"' | b'\\' | 0x00..=0x1f))
                .unwrap_or(sample.len());
            assert_eq!(find_special(&sample, from), naive);
        }
        let plain = b"hello world, no specials here at all!!";
        assert_eq!(find_special(plain, 0), plain.len());
        assert_eq!(find_special(b"abcdefgh\\", 0), 8);
        assert_eq!(find_special(b"abcdefghijk\x7f\"", 0), 12);
    }

    #[test]
    fn error_positions() {
        let err = parse_object(b"{\n  \"a\": ?\n}").unwrap_err();
        assert!(err.to_string().contains("line 2 column 8"), "{err}");
    }
}
