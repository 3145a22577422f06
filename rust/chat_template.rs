//! Chat templates: the Jinja template of a model's `tokenizer_config.json` (or GGUF metadata),
//! rendered with minijinja the way transformers and llama.cpp render it. Pure; no pyo3.
//!
//! As in transformers: `trim_blocks` and `lstrip_blocks` on, loop controls, `raise_exception`,
//! `strftime_now`, a `tojson` that writes what Python's `json.dumps` writes, and Python's string
//! and dict methods (`.strip()`, `.startswith()`, `.items()`, ...) from minijinja-contrib. The
//! context has `messages`, `tools` (none without tools), `documents` (none),
//! `add_generation_prompt`, `bos_token` and `eos_token`.

use std::fmt::{self, Write as _};

use minijinja::syntax::SyntaxConfig;
use minijinja::{context, Environment, Error, Value};

use crate::chat_messages::{chat_messages, to_value};
use crate::jinja_python::{python_method, raise_exception, strftime_now, tojson, trim};
use crate::json::{parse_object, Node, RequestError};

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
