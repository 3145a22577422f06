//! Decoding request bodies and writing canonical JSON. Pure; no pyo3.

use serde_json::{Map, Value};
use std::fmt::{self, Write as _};

/// Deepest JSON nesting accepted (`serde_json`'s own recursion limit).
pub const MAX_DEPTH: usize = 128;

/// Why a request body was rejected.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RequestError {
    /// Not UTF-8, not JSON, nested too deep, or a number outside f64.
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

/// Parse raw request bytes into a JSON object.
pub fn parse_object(body: &[u8]) -> Result<Map<String, Value>, RequestError> {
    let text = std::str::from_utf8(body).map_err(|e| {
        RequestError::Decode(format!(
            "request body is not valid UTF-8 (byte {})",
            e.valid_up_to()
        ))
    })?;
    let value: Value = serde_json::from_str(text).map_err(|e| {
        let msg = e.to_string();
        if msg.starts_with("recursion limit exceeded") {
            RequestError::Decode(format!(
                "request body is nested deeper than {MAX_DEPTH} levels (line {}, column {})",
                e.line(),
                e.column()
            ))
        } else {
            RequestError::Decode(format!("request body is not valid JSON: {msg}"))
        }
    })?;
    match value {
        Value::Object(map) => Ok(map),
        other => Err(RequestError::Shape(format!(
            "request body must be a JSON object, got {}",
            type_name(&other)
        ))),
    }
}

/// The JSON type name of a value, for error messages.
pub fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Append `value` as canonical JSON: sorted keys, no spaces,
/// numbers as in [`write_number`], strings as in [`write_string`].
pub fn write_value(value: &Value, out: &mut String) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(true) => out.push_str("true"),
        Value::Bool(false) => out.push_str("false"),
        Value::Number(n) => write_number(n, out),
        Value::String(s) => write_string(s, out),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_value(item, out);
            }
            out.push(']');
        }
        Value::Object(map) => {
            out.push('{');
            for (i, (k, v)) in sorted(map).into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_string(k, out);
                out.push(':');
                write_value(v, out);
            }
            out.push('}');
        }
    }
}

/// The entries of `map` in key order; explicit so that a crate enabling `serde_json`'s
/// `preserve_order` feature elsewhere in the build cannot make keys order-sensitive.
pub fn sorted(map: &Map<String, Value>) -> Vec<(&String, &Value)> {
    let mut entries: Vec<_> = map.iter().collect();
    entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
    entries
}

/// Append a JSON string escaped exactly like Python's `json.dumps(ensure_ascii=False)`.
pub fn write_string(s: &str, out: &mut String) {
    out.push('"');
    let mut start = 0;
    for (i, b) in s.bytes().enumerate() {
        let escape = match b {
            b'"' => "\\\"",
            b'\\' => "\\\\",
            b'\n' => "\\n",
            b'\r' => "\\r",
            b'\t' => "\\t",
            0x08 => "\\b",
            0x0c => "\\f",
            0x00..=0x1f => "",
            _ => continue,
        };
        out.push_str(&s[start..i]);
        if escape.is_empty() {
            let _ = write!(out, "\\u{b:04x}");
        } else {
            out.push_str(escape);
        }
        start = i + 1;
    }
    out.push_str(&s[start..]);
    out.push('"');
}

/// Append a number so that equal values print equally: integral values (1, 1.0, 1e0) as
/// integers, other floats like Python's `repr(float)`.
pub fn write_number(n: &serde_json::Number, out: &mut String) {
    if let Some(i) = n.as_i64() {
        let _ = write!(out, "{i}");
    } else if let Some(u) = n.as_u64() {
        let _ = write!(out, "{u}");
    } else if let Some(f) = n.as_f64() {
        write_float(f, out);
    }
}

/// 2^63: the integral floats below this print as integers.
const TWO_POW_63: f64 = 9_223_372_036_854_775_808.0;

/// Append a finite float: integral and within i64 as an integer, else Python's `repr`.
pub fn write_float(f: f64, out: &mut String) {
    if f.fract() == 0.0 && f.abs() < TWO_POW_63 {
        let _ = write!(out, "{}", f as i64);
        return;
    }
    // `{:e}` gives the shortest round-trip digits, e.g. "1.2345e-7"; re-lay them like Python.
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let decpt = exp + 1;
    out.push_str(sign);
    if -4 < decpt && decpt <= 16 {
        let len = i32::try_from(digits.len()).unwrap_or(i32::MAX);
        if decpt <= 0 {
            out.push_str("0.");
            for _ in 0..-decpt {
                out.push('0');
            }
            out.push_str(&digits);
        } else if decpt >= len {
            out.push_str(&digits);
            for _ in 0..decpt - len {
                out.push('0');
            }
            out.push_str(".0");
        } else {
            let (int, frac) = digits.split_at(decpt as usize);
            out.push_str(int);
            out.push('.');
            out.push_str(frac);
        }
    } else {
        out.push_str(&digits[..1]);
        if digits.len() > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        let _ = write!(
            out,
            "e{}{:02}",
            if exp < 0 { '-' } else { '+' },
            exp.unsigned_abs()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canon(text: &str) -> String {
        let value: Value = serde_json::from_str(text).unwrap();
        let mut out = String::new();
        write_value(&value, &mut out);
        out
    }

    #[test]
    fn floats_match_python_repr() {
        for (f, expected) in [
            (0.1, "0.1"),
            (1.5, "1.5"),
            (1e-5, "1e-05"),
            (0.0001, "0.0001"),
            (1e16, "10000000000000000"),
            (1e20, "1e+20"),
            (-2.5e-300, "-2.5e-300"),
            (123_456.789, "123456.789"),
            (1.797_693_134_862_315_7e308, "1.7976931348623157e+308"),
        ] {
            let mut out = String::new();
            write_float(f, &mut out);
            assert_eq!(out, expected);
        }
    }

    #[test]
    fn canonical_sorts_and_unifies_numbers() {
        assert_eq!(
            canon(r#"{ "b": 1.0, "a": [1, 1e0, -0.0, 2.50] }"#),
            r#"{"a":[1,1,0,2.5],"b":1}"#
        );
        assert_eq!(canon(r#""\u0001\"\\\n é""#), r#""\u0001\"\\\n é""#);
    }

    #[test]
    fn rejects_bad_bodies() {
        assert!(matches!(
            parse_object(b"\xff"),
            Err(RequestError::Decode(_))
        ));
        assert!(matches!(parse_object(b"{"), Err(RequestError::Decode(_))));
        assert!(matches!(parse_object(b"NaN"), Err(RequestError::Decode(_))));
        assert!(matches!(
            parse_object(b"[1e400]"),
            Err(RequestError::Decode(_))
        ));
        assert!(matches!(parse_object(b"[1]"), Err(RequestError::Shape(_))));
        let deep = "[".repeat(MAX_DEPTH + 1) + &"]".repeat(MAX_DEPTH + 1);
        let err = parse_object(deep.as_bytes()).unwrap_err();
        assert!(err.to_string().contains("nested deeper"), "{err}");
        let ok = format!("{{\"a\":{}{}}}", "[".repeat(100), "]".repeat(100));
        assert!(parse_object(ok.as_bytes()).is_ok());
    }
}
