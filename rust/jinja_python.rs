//! What transformers' Jinja environment has and minijinja lacks: `raise_exception`,
//! `strftime_now`, a `tojson` writing what Python's `json.dumps` writes, and Python's
//! whitespace for `trim` and `str.strip`. Pure; no pyo3.

use std::fmt::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Error, ErrorKind, State, Value};

/// Python's `str.isspace`: Unicode `White_Space` plus the four ASCII separators 0x1C-0x1F.
fn is_python_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// Python's methods on template values (minijinja-contrib), with `strip`, `lstrip` and `rstrip`
/// stripping what Python strips.
pub fn python_method(
    state: &mut State,
    value: &Value,
    method: &str,
    args: &[Value],
) -> Result<Value, Error> {
    if let (Some(s), []) = (value.as_str(), args) {
        match method {
            "strip" => return Ok(Value::from(s.trim_matches(is_python_space))),
            "lstrip" => return Ok(Value::from(s.trim_start_matches(is_python_space))),
            "rstrip" => return Ok(Value::from(s.trim_end_matches(is_python_space))),
            _ => {}
        }
    }
    minijinja_contrib::pycompat::unknown_method_callback(state, value, method, args)
}

/// Jinja's `trim(value, chars=None)`: Python's `value.strip(chars)`.
pub fn trim(value: &str, chars: Option<&str>) -> String {
    match chars {
        Some(chars) => value.trim_matches(|c| chars.contains(c)).to_owned(),
        None => value.trim_matches(is_python_space).to_owned(),
    }
}

/// `raise_exception(message)`: templates call it to reject a conversation.
pub fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

/// `strftime_now(format)`: the current UTC time; `%d %m %Y %y %H %M %S %j %b %B %a %A %e %%`.
pub fn strftime_now(format: &str) -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    strftime(format, secs)
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const DAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

/// Format Unix time `secs` (UTC) with the common strftime codes; others are kept verbatim.
pub fn strftime(format: &str, secs: u64) -> String {
    let days = secs / 86_400;
    let rem = secs % 86_400;
    let (year, month, day) = civil_from_days(days);
    let yday = days - days_from_civil(year, 1, 1) + 1;
    // 1970-01-01 was a Thursday (index 3 from Monday).
    let weekday = ((days + 3) % 7) as usize;
    let month_name = MONTHS[(month - 1) as usize];
    let mut out = String::with_capacity(format.len() + 8);
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let _ = match chars.next() {
            Some('d') => write!(out, "{day:02}"),
            Some('e') => write!(out, "{day:2}"),
            Some('m') => write!(out, "{month:02}"),
            Some('Y') => write!(out, "{year}"),
            Some('y') => write!(out, "{:02}", year % 100),
            Some('H') => write!(out, "{:02}", rem / 3600),
            Some('M') => write!(out, "{:02}", rem / 60 % 60),
            Some('S') => write!(out, "{:02}", rem % 60),
            Some('j') => write!(out, "{yday:03}"),
            Some('b') => write!(out, "{}", &month_name[..3]),
            Some('B') => write!(out, "{month_name}"),
            Some('a') => write!(out, "{}", &DAYS[weekday][..3]),
            Some('A') => write!(out, "{}", DAYS[weekday]),
            Some('%') | None => write!(out, "%"),
            Some(other) => write!(out, "%{other}"),
        };
    }
    out
}

/// (year, month 1-12, day 1-31) of a day count since 1970-01-01 (Howard Hinnant's algorithm).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

/// Days since 1970-01-01 of a date on or after it.
fn days_from_civil(year: u64, month: u64, day: u64) -> u64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year / 400;
    let yoe = year - era * 400;
    let mp = if month > 2 { month - 3 } else { month + 9 };
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// `tojson` as transformers defines it: Python's `json.dumps(value, ensure_ascii=False)`, with
/// its `indent`, `separators` and `sort_keys` arguments.
#[allow(clippy::needless_pass_by_value)] // minijinja hands keyword arguments over by value
pub fn tojson(value: &Value, indent: Option<usize>, kwargs: Kwargs) -> Result<Value, Error> {
    let indent = match indent {
        Some(n) => Some(n),
        None => kwargs.get::<Option<usize>>("indent")?,
    };
    let sort_keys = kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false);
    let ensure_ascii = kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false);
    let (item_sep, key_sep) = match kwargs.get::<Option<Value>>("separators")? {
        Some(pair) => (
            pair.get_item_by_index(0)?.to_string(),
            pair.get_item_by_index(1)?.to_string(),
        ),
        None if indent.is_some() => (",".to_owned(), ": ".to_owned()),
        None => (", ".to_owned(), ": ".to_owned()),
    };
    kwargs.assert_all_used()?;
    let mut writer = JsonWriter {
        out: String::new(),
        indent,
        item_sep,
        key_sep,
        sort_keys,
        ensure_ascii,
    };
    writer.value(value, 0)?;
    Ok(Value::from_safe_string(writer.out))
}

struct JsonWriter {
    out: String,
    indent: Option<usize>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
    ensure_ascii: bool,
}

impl JsonWriter {
    fn value(&mut self, value: &Value, depth: usize) -> Result<(), Error> {
        match value.kind() {
            ValueKind::Undefined | ValueKind::None => self.out.push_str("null"),
            ValueKind::Bool => self
                .out
                .push_str(if value.is_true() { "true" } else { "false" }),
            ValueKind::Number => {
                if value.is_integer() {
                    let _ = write!(self.out, "{value}");
                } else {
                    let f = f64::try_from(value.clone())?;
                    self.float(f);
                }
            }
            ValueKind::String => self.string(value.as_str().unwrap_or_default()),
            ValueKind::Map => {
                let mut keys: Vec<Value> = value.try_iter()?.collect();
                if self.sort_keys {
                    keys.sort();
                }
                self.out.push('{');
                for (i, key) in keys.iter().enumerate() {
                    self.separator(i, depth + 1);
                    match key.as_str() {
                        Some(k) => self.string(k),
                        None => self.string(&key.to_string()),
                    }
                    let sep = std::mem::take(&mut self.key_sep);
                    self.out.push_str(&sep);
                    self.key_sep = sep;
                    self.value(&value.get_item(key)?, depth + 1)?;
                }
                self.close(keys.is_empty(), depth, '}');
            }
            ValueKind::Seq | ValueKind::Iterable => {
                self.out.push('[');
                let mut empty = true;
                for (i, item) in value.try_iter()?.enumerate() {
                    empty = false;
                    self.separator(i, depth + 1);
                    self.value(&item, depth + 1)?;
                }
                self.close(empty, depth, ']');
            }
            _ => self.string(&value.to_string()),
        }
        Ok(())
    }

    fn separator(&mut self, index: usize, depth: usize) {
        if index > 0 {
            let sep = std::mem::take(&mut self.item_sep);
            // With an indent Python strips the trailing space of the item separator.
            self.out.push_str(if self.indent.is_some() {
                sep.trim_end()
            } else {
                &sep
            });
            self.item_sep = sep;
        }
        if let Some(width) = self.indent {
            self.out.push('\n');
            self.out.extend(std::iter::repeat_n(' ', width * depth));
        }
    }

    fn close(&mut self, empty: bool, depth: usize, bracket: char) {
        if let (Some(width), false) = (self.indent, empty) {
            self.out.push('\n');
            self.out.extend(std::iter::repeat_n(' ', width * depth));
        }
        self.out.push(bracket);
    }

    /// Python's float repr: shortest round trip, `.0` on integral values, exponent past 1e16.
    fn float(&mut self, f: f64) {
        if f.is_nan() {
            self.out.push_str("NaN");
        } else if f.is_infinite() {
            self.out
                .push_str(if f > 0.0 { "Infinity" } else { "-Infinity" });
        } else if f != 0.0 && (f.abs() >= 1e16 || f.abs() < 1e-4) {
            let s = format!("{f:e}");
            let (mantissa, exp) = s.split_once('e').unwrap_or((&s, "0"));
            let (sign, digits) = exp.strip_prefix('-').map_or(("+", exp), |rest| ("-", rest));
            let _ = write!(self.out, "{mantissa}e{sign}{digits:0>2}");
        } else if f.fract() == 0.0 {
            let _ = write!(self.out, "{f:.1}");
        } else {
            let _ = write!(self.out, "{f}");
        }
    }

    fn string(&mut self, s: &str) {
        self.out.push('"');
        for c in s.chars() {
            match c {
                '"' => self.out.push_str("\\\""),
                '\\' => self.out.push_str("\\\\"),
                '\n' => self.out.push_str("\\n"),
                '\r' => self.out.push_str("\\r"),
                '\t' => self.out.push_str("\\t"),
                '\u{8}' => self.out.push_str("\\b"),
                '\u{c}' => self.out.push_str("\\f"),
                c if (c as u32) < 0x20 || (self.ensure_ascii && !c.is_ascii()) => {
                    let mut units = [0u16; 2];
                    for unit in c.encode_utf16(&mut units) {
                        let _ = write!(self.out, "\\u{unit:04x}");
                    }
                }
                c => self.out.push(c),
            }
        }
        self.out.push('"');
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strftime_codes() {
        // 2024-07-26 13:25:09 UTC, a Friday.
        assert_eq!(
            strftime("%d %b %Y %H:%M:%S %A %j %%", 1_722_000_309),
            "26 Jul 2024 13:25:09 Friday 208 %"
        );
        assert_eq!(strftime("%Y-%m-%d", 0), "1970-01-01");
    }
}
