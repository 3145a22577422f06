//! Token counting: exact cl100k/o200k counts (vocabularies embedded by `bpe-openai`, built once on
//! first use) and a cheap estimate for unknown models. Pure; no pyo3.
//!
//! Exact counts follow tiktoken's `encode_ordinary`: the text is split by the encoding's pattern
//! (hand-written in [`crate::pretokenize`]), a piece that is itself a token counts 1 (looked up in
//! a hash table of the vocabulary), any other piece is byte-pair encoded by `bpe-openai`.

use std::hash::BuildHasher;
use std::sync::LazyLock;

use bpe_openai::Tokenizer;
use hashbrown::{DefaultHashBuilder, HashTable};

use crate::fingerprint::validate;
use crate::json::{parse_object, Node, RequestError};
use crate::pretokenize::{self, Pattern};

/// An exact tokenizer: split pattern, byte-pair encoder and the set of its tokens.
struct Exact {
    tokenizer: &'static Tokenizer,
    pattern: Pattern,
    hasher: DefaultHashBuilder,
    /// Ids of all tokens, keyed by the hash of their bytes.
    tokens: HashTable<u32>,
}

static CL100K: LazyLock<Exact> =
    LazyLock::new(|| Exact::new(bpe_openai::cl100k_base(), Pattern::Cl100k));
static O200K: LazyLock<Exact> =
    LazyLock::new(|| Exact::new(bpe_openai::o200k_base(), Pattern::O200k));

impl Exact {
    fn new(tokenizer: &'static Tokenizer, pattern: Pattern) -> Self {
        let bpe = &tokenizer.bpe;
        let hasher = DefaultHashBuilder::default();
        let n = bpe.num_tokens();
        let mut tokens = HashTable::with_capacity(n);
        for id in 0..n as u32 {
            let bytes = bpe.token_bytes(id);
            tokens.insert_unique(hasher.hash_one(bytes), id, |&id| {
                hasher.hash_one(bpe.token_bytes(id))
            });
        }
        Self {
            tokenizer,
            pattern,
            hasher,
            tokens,
        }
    }

    fn count(&self, text: &str) -> usize {
        pretokenize::split(text, self.pattern)
            .map(|piece| self.count_piece(piece.as_bytes()))
            .sum()
    }

    #[inline]
    fn count_piece(&self, piece: &[u8]) -> usize {
        let bpe = &self.tokenizer.bpe;
        let hash = self.hasher.hash_one(piece);
        if self
            .tokens
            .find(hash, |&id| bpe.token_bytes(id) == piece)
            .is_some()
        {
            1
        } else {
            bpe.count(piece)
        }
    }
}

/// A tokenizer family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Encoding {
    Cl100k,
    O200k,
    /// One token per 4 UTF-8 bytes, rounded up; for models whose tokenizer is unknown.
    Estimate,
}

/// Tokens added per chat message and for priming the reply (as in the cookbook of the API vendor).
pub const TOKENS_PER_MESSAGE: usize = 3;
/// Extra token for a message's `name`.
pub const TOKENS_PER_NAME: usize = 1;
/// Tokens priming the assistant's reply.
pub const REPLY_PRIMING: usize = 3;

impl Encoding {
    /// Parse `"cl100k_base"`, `"o200k_base"` or `"estimate"`.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "cl100k_base" => Some(Self::Cl100k),
            "o200k_base" => Some(Self::O200k),
            "estimate" => Some(Self::Estimate),
            _ => None,
        }
    }

    /// The canonical name of this encoding.
    pub fn name(self) -> &'static str {
        match self {
            Self::Cl100k => "cl100k_base",
            Self::O200k => "o200k_base",
            Self::Estimate => "estimate",
        }
    }

    /// Number of tokens in `text`.
    pub fn count(self, text: &str) -> usize {
        match self {
            Self::Cl100k => CL100K.count(text),
            Self::O200k => O200K.count(text),
            Self::Estimate => text.len().div_ceil(4),
        }
    }
}

/// Build both exact tokenizers now (a few hundred ms) instead of on the first count.
pub fn preload() {
    pretokenize::preload();
    LazyLock::force(&CL100K);
    LazyLock::force(&O200K);
}

/// The encoding a model name uses (`ft:` fine-tune prefixes are looked through).
pub fn encoding_for_model(model: &str) -> Encoding {
    let base = model.strip_prefix("ft:").unwrap_or(model);
    let is_family = |family: &str| {
        base.strip_prefix(family)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('-'))
    };
    if base.starts_with("gpt-4o")
        || base.starts_with("gpt-4.1")
        || base.starts_with("gpt-4.5")
        || base.starts_with("gpt-5")
        || base.starts_with("chatgpt-4o")
        || ["o1", "o3", "o4", "o4-mini"].into_iter().any(is_family)
    {
        Encoding::O200k
    } else if base.starts_with("gpt-4")
        || base.starts_with("gpt-3.5")
        || base.starts_with("text-embedding-")
    {
        Encoding::Cl100k
    } else {
        Encoding::Estimate
    }
}

/// Prompt tokens of a request body: chat `messages`, else completions `prompt`, else embeddings
/// `input` (a string, a list of strings, a token list or a list of token lists).
pub fn count_request_tokens(body: &[u8], encoding: Encoding) -> Result<usize, RequestError> {
    let request = parse_object(body)?;
    validate(&request)?;
    // Prompt text outside the messages: tool and function definitions, a response schema,
    // vLLM's `documents` (rendered by RAG chat templates) and `chat_template_kwargs`, a
    // predicted output (`prediction`, read by the model alongside the prompt).
    let mut extra = 0;
    for field in [
        "tools",
        "functions",
        "response_format",
        "tool_choice",
        "documents",
        "chat_template_kwargs",
        "prediction",
    ] {
        if let Some(value) = request.get(field) {
            extra += count_json(value, encoding);
        }
    }
    if let Some(Node::Arr(messages)) = request.get("messages") {
        return Ok(count_messages(messages, encoding) + extra);
    }
    for field in ["prompt", "input"] {
        if let Some(value) = request.get(field) {
            // A completions `suffix` is prompt too (fill-in-the-middle).
            let suffix = request.get("suffix").map_or(0, |s| count_json(s, encoding));
            return Ok(count_texts(value, encoding) + suffix);
        }
    }
    Err(RequestError::Shape(
        "request has none of `messages`, `prompt` or `input`".to_owned(),
    ))
}

/// An image's tokens when its size is not known: the high-detail image rule at its largest (85
/// base + 170 per 512-pixel tile, at most 8 tiles after scaling to `2048 x 768`).
pub const IMAGE_TOKENS: usize = 85 + 170 * 8;
/// An image sent with `detail: "low"`.
pub const IMAGE_TOKENS_LOW: usize = 85;

/// Every string and key of a JSON value encoded, numbers one token each: what a definition
/// (a tool, a schema) costs in the prompt, give or take its rendering.
fn count_json(value: &Node<'_>, encoding: Encoding) -> usize {
    match value {
        Node::Str(s) => encoding.count(s),
        Node::Num(_) | Node::Bool(_) => 1,
        Node::Null => 0,
        Node::Arr(items) => items.iter().map(|v| count_json(v, encoding)).sum(),
        Node::Obj(entries) => entries
            .iter()
            .map(|(k, v)| encoding.count(k) + count_json(v, encoding))
            .sum(),
    }
}

/// A content part's tokens: every text it carries (`text`, `input_text`, `refusal`, ...), and
/// an image by the image rule, never by the bytes of its URL.
fn count_part(part: &Node<'_>, encoding: Encoding) -> usize {
    let Node::Obj(fields) = part else {
        return part.as_str().map_or(0, |s| encoding.count(s));
    };
    let mut total = 0;
    for (key, value) in fields {
        match (key.as_ref(), value) {
            ("type", _) => {}
            ("image_url" | "input_image" | "image", image) => {
                let detail = image.get("detail").and_then(Node::as_str);
                total += if detail == Some("low") {
                    IMAGE_TOKENS_LOW
                } else {
                    IMAGE_TOKENS
                };
            }
            ("input_audio" | "file", _) => total += count_json(value, encoding).min(IMAGE_TOKENS),
            (_, Node::Str(s)) => total += encoding.count(s),
            (_, nested) => total += count_json(nested, encoding),
        }
    }
    total
}

/// Cookbook accounting: every string field of a message is encoded, plus fixed overheads. Content
/// parts count every text they carry and images by the image rule; tool calls count function
/// name and arguments.
fn count_messages(messages: &[Node<'_>], encoding: Encoding) -> usize {
    let mut total = REPLY_PRIMING;
    for message in messages {
        total += TOKENS_PER_MESSAGE;
        let Node::Obj(fields) = message else {
            continue;
        };
        for (key, value) in fields {
            match value {
                Node::Str(s) => total += encoding.count(s),
                Node::Arr(items) if key == "content" => {
                    for part in items {
                        total += count_part(part, encoding);
                    }
                }
                Node::Arr(calls) if key == "tool_calls" => {
                    for call in calls {
                        let function = call.get("function");
                        for field in ["name", "arguments"] {
                            if let Some(s) =
                                function.and_then(|f| f.get(field)).and_then(Node::as_str)
                            {
                                total += encoding.count(s);
                            }
                        }
                    }
                }
                _ => {}
            }
            if key == "name" {
                total += TOKENS_PER_NAME;
            }
        }
    }
    total
}

fn count_texts(value: &Node<'_>, encoding: Encoding) -> usize {
    match value {
        Node::Str(s) => encoding.count(s),
        // A pre-tokenized prompt: each number is one token.
        Node::Num(_) => 1,
        Node::Arr(items) => items.iter().map(|v| count_texts(v, encoding)).sum(),
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_counts() {
        // Values from tiktoken.
        assert_eq!(Encoding::Cl100k.count("hello world"), 2);
        assert_eq!(Encoding::O200k.count("hello world"), 2);
        assert_eq!(Encoding::Cl100k.count(""), 0);
        assert_eq!(Encoding::Estimate.count("abcde"), 2);
        assert_eq!(Encoding::Estimate.count(""), 0);
    }

    #[test]
    fn model_families() {
        for (model, enc) in [
            ("gpt-4o-mini", Encoding::O200k),
            ("gpt-4.1", Encoding::O200k),
            ("gpt-5-nano", Encoding::O200k),
            ("o1", Encoding::O200k),
            ("o3-mini", Encoding::O200k),
            ("o4-mini-2025", Encoding::O200k),
            ("ft:gpt-4o:org:x", Encoding::O200k),
            ("gpt-4-turbo", Encoding::Cl100k),
            ("gpt-3.5-turbo", Encoding::Cl100k),
            ("text-embedding-3-small", Encoding::Cl100k),
            ("o100", Encoding::Estimate),
            ("llama-3-8b", Encoding::Estimate),
        ] {
            assert_eq!(encoding_for_model(model), enc, "{model}");
        }
    }

    #[test]
    fn chat_request_accounting() {
        let body = br#"{"model":"gpt-4","messages":[{"role":"user","content":"hello world","name":"bob"}]}"#;
        // 3 priming + 3 per message + role(1) + content(2) + name(1) + 1 for name.
        assert_eq!(count_request_tokens(body, Encoding::Cl100k).unwrap(), 11);
        let parts = br#"{"messages":[{"role":"user","content":[{"type":"text","text":"hello world"},{"type":"image_url","image_url":{"url":"x"}}]}]}"#;
        // An image counts by the image rule (its size unknown: the largest), never its URL.
        assert_eq!(
            count_request_tokens(parts, Encoding::Cl100k).unwrap(),
            9 + IMAGE_TOKENS
        );
        let low = br#"{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA","detail":"low"}}]}]}"#;
        assert_eq!(
            count_request_tokens(low, Encoding::Cl100k).unwrap(),
            7 + IMAGE_TOKENS_LOW
        );
    }

    #[test]
    fn prompt_text_outside_message_text_counts() {
        let count = |b: &str| count_request_tokens(b.as_bytes(), Encoding::Cl100k).unwrap();
        let plain = count(r#"{"messages":[{"role":"user","content":"hi"}]}"#);
        let description = "word ".repeat(1000);
        let tools = format!(
            r#"{{"messages":[{{"role":"user","content":"hi"}}],"tools":[{{"type":"function","function":{{"name":"f","description":"{description}"}}}}]}}"#
        );
        assert!(count(&tools) >= plain + 1000);
        let schema = format!(
            r#"{{"messages":[{{"role":"user","content":"hi"}}],"response_format":{{"type":"json_schema","json_schema":{{"description":"{description}"}}}}}}"#
        );
        assert!(count(&schema) >= plain + 1000);
        for kind in ["input_text", "refusal"] {
            let part = format!(
                r#"{{"messages":[{{"role":"user","content":[{{"type":"{kind}","{kind}":"{description}"}}]}}]}}"#
            );
            assert!(count(&part) >= 1000, "{kind}");
        }
        // vLLM's RAG documents and template arguments, a predicted output.
        for field in [
            format!(r#""documents":[{{"title":"t","text":"{description}"}}]"#),
            format!(r#""chat_template_kwargs":{{"context":"{description}"}}"#),
            format!(r#""prediction":{{"type":"content","content":"{description}"}}"#),
        ] {
            let body = format!(r#"{{"messages":[{{"role":"user","content":"hi"}}],{field}}}"#);
            assert!(count(&body) >= plain + 1000, "{field}");
        }
        // A completions suffix (fill-in-the-middle).
        let prompt = count(r#"{"prompt":"hi"}"#);
        assert!(count(&format!(r#"{{"prompt":"hi","suffix":"{description}"}}"#)) >= prompt + 1000);
    }

    #[test]
    fn prompt_and_input_forms() {
        let count = |b: &str| count_request_tokens(b.as_bytes(), Encoding::Cl100k).unwrap();
        assert_eq!(count(r#"{"prompt":"hello world"}"#), 2);
        assert_eq!(count(r#"{"prompt":["hello world","hello"]}"#), 3);
        assert_eq!(count(r#"{"input":[1,2,3]}"#), 3);
        assert_eq!(count(r#"{"input":[[1,2],[3]]}"#), 3);
        assert!(matches!(
            count_request_tokens(b"{}", Encoding::Cl100k),
            Err(RequestError::Shape(_))
        ));
    }
}
