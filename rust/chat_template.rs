//! Chat templates: the Jinja template of a model's `tokenizer_config.json` (or GGUF metadata),
//! rendered with minijinja the way transformers and llama.cpp render it. Pure; no pyo3.
//!
//! As in transformers: `trim_blocks` and `lstrip_blocks` on, loop controls, `raise_exception`,
//! `strftime_now`, a `tojson` that writes what Python's `json.dumps` writes, and Python's string
//! and dict methods (`.strip()`, `.startswith()`, `.items()`, ...) from minijinja-contrib. The
//! context has `messages`, `tools` (none without tools), `documents` (none),
//! `add_generation_prompt`, `bos_token` and `eos_token`.

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};
use std::time::{SystemTime, UNIX_EPOCH};

use minijinja::syntax::SyntaxConfig;
use minijinja::value::{Kwargs, ValueKind};
use minijinja::{context, Environment, Error, ErrorKind, State, Value};

use crate::json::{parse_object, Node, Num, RequestError};

const NAME: &str = "chat_template";

/// Why a template could not be compiled or rendered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateError(pub String);

impl fmt::Display for TemplateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for TemplateError {}

impl From<Error> for TemplateError {
    fn from(err: Error) -> Self {
        // minijinja's alternate form adds the template line the error is on.
        let mut message = err.to_string();
        if let Some(line) = err.line() {
            if !message.contains("line") {
                let _ = write!(message, " (line {line})");
            }
        }
        Self(message)
    }
}

/// Why a request could not be rendered: its body, or the template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RenderError {
    Request(RequestError),
    Template(TemplateError),
}

impl From<RequestError> for RenderError {
    fn from(err: RequestError) -> Self {
        Self::Request(err)
    }
}

impl From<TemplateError> for RenderError {
    fn from(err: TemplateError) -> Self {
        Self::Template(err)
    }
}

impl fmt::Display for RenderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Request(e) => e.fmt(f),
            Self::Template(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for RenderError {}

/// A compiled chat template with the model's BOS and EOS token strings.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
}

impl fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .finish_non_exhaustive()
    }
}

impl ChatTemplate {
    /// Compile `source`; a syntax error is reported with its line.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<Self, TemplateError> {
        let mut env = Environment::new();
        env.set_syntax(
            SyntaxConfig::builder()
                .trim_blocks(true)
                .lstrip_blocks(true)
                .build()?,
        );
        env.set_unknown_method_callback(python_method);
        env.add_filter("trim", trim);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.add_template_owned(NAME, source.to_owned())?;
        Ok(Self {
            env,
            bos_token: bos_token.to_owned(),
            eos_token: eos_token.to_owned(),
        })
    }

    /// The BOS token string the template was given.
    pub fn bos_token(&self) -> &str {
        &self.bos_token
    }

    /// Render `messages` (a list of message maps) with `tools` (none, or a list).
    pub fn render(
        &self,
        messages: Value,
        tools: Value,
        add_generation_prompt: bool,
    ) -> Result<String, TemplateError> {
        let template = self.env.get_template(NAME)?;
        let ctx = context! {
            messages => messages,
            tools => tools,
            documents => Value::from(()),
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token.as_str(),
            eos_token => self.eos_token.as_str(),
        };
        Ok(template.render(ctx)?)
    }

    /// Render the prompt of a request body (or of a bare JSON array of messages): a Chat Completions request (`messages`, `tools`),
    /// an Anthropic Messages request (`system` becomes the first message) or a Responses request
    /// (`instructions` and `input`). Content parts are joined into one string, as llama.cpp and
    /// vLLM do for string-content templates: their `text` fields joined by a newline.
    pub fn render_request(
        &self,
        body: &[u8],
        add_generation_prompt: bool,
    ) -> Result<String, RenderError> {
        // A bare array is the messages alone.
        let wrapped;
        let body = if body.trim_ascii_start().first() == Some(&b'[') {
            wrapped = [&b"{\"messages\":"[..], body, b"}"].concat();
            &wrapped[..]
        } else {
            body
        };
        let request = parse_object(body)?;
        let messages = chat_messages(&request)?;
        let tools = match request.get("tools") {
            Some(tools @ Node::Arr(items)) if !items.is_empty() => to_value(tools),
            _ => Value::from(()),
        };
        Ok(self.render(Value::from(messages), tools, add_generation_prompt)?)
    }
}

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
fn to_value(node: &Node<'_>) -> Value {
    match node {
        Node::Null => Value::from(()),
        Node::Bool(b) => Value::from(*b),
        Node::Num(Num::Int(i)) => Value::from(*i),
        Node::Num(Num::UInt(u)) => Value::from(*u),
        Node::Num(Num::Float(f)) => Value::from(*f),
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

/// Python's `str.isspace`: Unicode `White_Space` plus the four ASCII separators 0x1C-0x1F.
fn is_python_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// Python's methods on template values (minijinja-contrib), with `strip`, `lstrip` and `rstrip`
/// stripping what Python strips.
fn python_method(
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
fn trim(value: &str, chars: Option<&str>) -> String {
    match chars {
        Some(chars) => value.trim_matches(|c| chars.contains(c)).to_owned(),
        None => value.trim_matches(is_python_space).to_owned(),
    }
}

/// `raise_exception(message)`: templates call it to reject a conversation.
fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

/// `strftime_now(format)`: the current UTC time; `%d %m %Y %y %H %M %S %j %b %B %a %A %e %%`.
fn strftime_now(format: &str) -> String {
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
fn tojson(value: &Value, indent: Option<usize>, kwargs: Kwargs) -> Result<Value, Error> {
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

    const CHATML: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    fn render(template: &str, body: &str, add_generation_prompt: bool) -> String {
        ChatTemplate::new(template, "<s>", "</s>")
            .unwrap()
            .render_request(body.as_bytes(), add_generation_prompt)
            .unwrap()
    }

    #[test]
    fn chatml() {
        let body = r#"{"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"x"}},{"type":"text","text":"b"}]}]}"#;
        assert_eq!(
            render(CHATML, body, true),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\na\nb<|im_end|>\n<|im_start|>assistant\n"
        );
        assert_eq!(
            render(CHATML, body, false),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\na\nb<|im_end|>\n"
        );
    }

    #[test]
    fn anthropic_and_responses_forms() {
        let anthropic = r#"{"system":[{"type":"text","text":"S"}],"messages":[{"role":"user","content":"hi"}]}"#;
        assert_eq!(
            render(CHATML, anthropic, false),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
        );
        let responses = r#"{"instructions":"S","input":"hi"}"#;
        assert_eq!(
            render(CHATML, responses, false),
            render(CHATML, anthropic, false)
        );
        let items = r#"{"input":[{"role":"user","content":[{"type":"input_text","text":"hi"}]},{"type":"reasoning","summary":[]}]}"#;
        assert_eq!(
            render(CHATML, items, false),
            "<|im_start|>user\nhi<|im_end|>\n"
        );
    }

    #[test]
    fn helpers_and_python_methods() {
        let t = "{{ bos_token }}{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}{{ m.content.strip() | upper }}{% endfor %}{{ tools | tojson }}";
        let body = r#"{"messages":[{"role":"user","content":"  x "},{"role":"user","content":"y"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"b":[1,2.5,true,null],"a":"é\n"}}}]}"#;
        assert_eq!(
            render(t, body, true),
            "<s>X[{\"function\": {\"name\": \"f\", \"parameters\": {\"a\": \"é\\n\", \"b\": [1, 2.5, true, null]}}, \"type\": \"function\"}]"
        );
        let none = render(
            "{{ tools is none }} {{ tools | tojson }}",
            r#"{"messages":[]}"#,
            true,
        );
        assert_eq!(none, "True null");
        let err = ChatTemplate::new("{{ raise_exception('no system role') }}", "", "")
            .unwrap()
            .render_request(br#"{"messages":[]}"#, true)
            .unwrap_err();
        assert!(err.to_string().contains("no system role"), "{err}");
        assert!(ChatTemplate::new("{% for %}", "", "").is_err());
    }

    #[test]
    fn strip_and_trim_strip_what_python_strips() {
        let t = "{{ messages[0].content.strip() }}|{{ messages[0].content | trim }}|{{ messages[0].content.lstrip() }}|{{ 'xxaxx' | trim('x') }}";
        let body = r#"[{"role":"user","content":"\u001c\u00a0 a \u2028\u001f"}]"#;
        assert_eq!(render(t, body, true), "a|a|a \u{2028}\u{1f}|a");
    }

    #[test]
    fn tojson_indent_and_floats() {
        let t = ChatTemplate::new("{{ messages[0] | tojson(indent=2) }}", "", "").unwrap();
        let out = t
            .render_request(
                br#"{"messages":[{"role":"u","content":"c","x":[1e20,0.00001]}]}"#,
                false,
            )
            .unwrap();
        assert_eq!(
            out,
            "{\n  \"content\": \"c\",\n  \"role\": \"u\",\n  \"x\": [\n    1e+20,\n    1e-05\n  ]\n}"
        );
    }

    #[test]
    fn strftime_codes() {
        // 2024-07-26 13:05:09 UTC, a Friday.
        assert_eq!(
            strftime("%d %b %Y %H:%M:%S %A %j %%", 1_722_000_309),
            "26 Jul 2024 13:25:09 Friday 208 %"
        );
        assert_eq!(strftime("%Y-%m-%d", 0), "1970-01-01");
    }

    #[test]
    fn request_errors() {
        let t = ChatTemplate::new(CHATML, "", "").unwrap();
        assert!(matches!(
            t.render_request(b"{}", true),
            Err(RenderError::Request(RequestError::Shape(_)))
        ));
        assert!(matches!(
            t.render_request(b"{", true),
            Err(RenderError::Request(RequestError::Decode(_)))
        ));
        assert!(matches!(
            t.render_request(br#"{"messages":"x"}"#, true),
            Err(RenderError::Request(RequestError::Shape(_)))
        ));
    }
}
