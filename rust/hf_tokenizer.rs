//! Hugging Face `tokenizer.json` tokenizers (the `tokenizers` crate), built once from a file and
//! then only read. Pure; no pyo3.
//!
//! Counts are of the whole text: a file's truncation and padding settings are dropped at load,
//! and encoding skips offset tracking (`encode_fast`), which the counts do not need.

use std::fmt;
use std::panic::{self, AssertUnwindSafe};
use std::path::{Path, PathBuf};

use tokenizers::{Model, OffsetReferential, OffsetType, PostProcessor, PreTokenizer, Tokenizer};

/// Why a tokenizer file could not be loaded.
#[derive(Debug)]
pub enum LoadError {
    /// The file could not be read.
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The file was read but is not a tokenizer the crate can build.
    Parse { path: PathBuf, message: String },
}

impl LoadError {
    /// The file the error is about.
    pub fn path(&self) -> &Path {
        match self {
            Self::Read { path, .. } | Self::Parse { path, .. } => path,
        }
    }
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Read { path, source } => {
                write!(f, "cannot read tokenizer file {}: {source}", path.display())
            }
            Self::Parse { path, message } => {
                write!(
                    f,
                    "cannot load tokenizer file {}: {message}",
                    path.display()
                )
            }
        }
    }
}

impl std::error::Error for LoadError {}

/// A text the tokenizer could not encode (e.g. a character a word-level vocabulary lacks and no
/// unknown token to stand for it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EncodeError(pub String);

impl fmt::Display for EncodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cannot encode text: {}", self.0)
    }
}

impl std::error::Error for EncodeError {}

/// A loaded `tokenizer.json`: normalizer, pre-tokenizer, model (BPE, Unigram, `WordPiece` or
/// `WordLevel`), added tokens and post-processor, exactly as the file describes them.
pub struct HfTokenizer {
    inner: Tokenizer,
}

impl fmt::Debug for HfTokenizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HfTokenizer")
            .field("vocab_size", &self.vocab_size())
            .finish_non_exhaustive()
    }
}

impl HfTokenizer {
    /// Read and build the tokenizer in `path`.
    pub fn from_file(path: &Path) -> Result<Self, LoadError> {
        let bytes = std::fs::read(path).map_err(|source| LoadError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::from_json(&bytes).map_err(|message| LoadError::Parse {
            path: path.to_owned(),
            message,
        })
    }

    /// Build the tokenizer from the contents of a `tokenizer.json`.
    pub fn from_json(json: &[u8]) -> Result<Self, String> {
        // A malformed file must surface as an error, not a panic inside the crate.
        let built = panic::catch_unwind(AssertUnwindSafe(|| Tokenizer::from_bytes(json))).map_err(
            |payload| {
                let why = payload
                    .downcast_ref::<&str>()
                    .map(ToString::to_string)
                    .or_else(|| payload.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "the tokenizers crate panicked".to_owned());
                format!("invalid tokenizer: {why}")
            },
        )?;
        let mut inner = built.map_err(|e| e.to_string())?;
        // Counts are of the whole prompt, never of a truncated or padded one.
        inner.with_truncation(None).map_err(|e| e.to_string())?;
        inner.with_padding(None);
        Ok(Self { inner })
    }

    /// Size of the vocabulary, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// Token ids of `text`. Added (special) tokens written in the text are matched as such; the
    /// post-processor's tokens (e.g. BOS) are added only with `add_special_tokens`.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, EncodeError> {
        let encoding = self
            .inner
            .encode_fast(text, add_special_tokens)
            .map_err(|e| EncodeError(e.to_string()))?;
        Ok(encoding.get_ids().to_vec())
    }

    /// Number of tokens of `text`, as `encode(text, add_special_tokens).len()`: the same
    /// pipeline (added tokens, normalizer, pre-tokenizer, model) without building the
    /// `Encoding` (token strings, offsets, masks), then the post-processor's token count.
    pub fn count(&self, text: &str, add_special_tokens: bool) -> Result<usize, EncodeError> {
        let specials = if add_special_tokens {
            self.inner
                .get_post_processor()
                .map_or(0, |p| p.added_tokens(false))
        } else {
            0
        };
        if text.is_empty() {
            return Ok(specials);
        }
        let fail = |e: tokenizers::Error| EncodeError(e.to_string());
        let mut pieces = self
            .inner
            .get_added_vocabulary()
            .extract_and_normalize(self.inner.get_normalizer(), text);
        if let Some(pre_tokenizer) = self.inner.get_pre_tokenizer() {
            pre_tokenizer.pre_tokenize(&mut pieces).map_err(fail)?;
        }
        let model = self.inner.get_model();
        pieces
            .tokenize(|piece| model.tokenize(piece.get()))
            .map_err(fail)?;
        let tokens: usize = pieces
            .get_splits(OffsetReferential::Normalized, OffsetType::None)
            .iter()
            .map(|(_, _, tokens)| tokens.as_ref().map_or(0, Vec::len))
            .sum();
        Ok(tokens + specials)
    }

    /// Tokens of a rendered chat prompt. Without `add_special_tokens` the text is counted as is
    /// (transformers' `apply_chat_template(tokenize=True)`, vLLM): the template's own
    /// `bos_token` is the BOS. With it, as llama.cpp does, a leading `bos_token` is cut from the
    /// text and the post-processor adds its tokens, so BOS is counted once either way.
    pub fn count_rendered(
        &self,
        rendered: &str,
        bos_token: &str,
        add_special_tokens: bool,
    ) -> Result<usize, EncodeError> {
        let text = if add_special_tokens && !bos_token.is_empty() {
            rendered.strip_prefix(bos_token).unwrap_or(rendered)
        } else {
            rendered
        };
        self.count(text, add_special_tokens)
    }

    /// The id of a token of the vocabulary or of the added tokens.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A word-level vocabulary split on whitespace, with `<s>` added as a special token and put
    /// in front by the post-processor.
    const WORD_LEVEL: &str = r#"{
      "version": "1.0",
      "truncation": {"direction": "Right", "max_length": 2, "strategy": "LongestFirst", "stride": 0},
      "padding": null,
      "added_tokens": [
        {"id": 0, "content": "<s>", "single_word": false, "lstrip": false, "rstrip": false,
         "normalized": false, "special": true}
      ],
      "normalizer": null,
      "pre_tokenizer": {"type": "Whitespace"},
      "post_processor": {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<s>": {"id": "<s>", "ids": [0], "tokens": ["<s>"]}}
      },
      "decoder": null,
      "model": {"type": "WordLevel", "vocab": {"<s>": 0, "<unk>": 1, "hello": 2, "world": 3},
                "unk_token": "<unk>"}
    }"#;

    fn word_level() -> HfTokenizer {
        HfTokenizer::from_json(WORD_LEVEL.as_bytes()).unwrap()
    }

    #[test]
    fn counts_ignore_truncation_and_add_specials_on_request() {
        let tok = word_level();
        assert_eq!(tok.encode("hello world hello", false).unwrap(), [2, 3, 2]);
        assert_eq!(tok.count("hello world hello", false).unwrap(), 3);
        assert_eq!(tok.count("hello world hello", true).unwrap(), 4);
        assert_eq!(tok.encode("hello there", true).unwrap(), [0, 2, 1]);
        assert_eq!(tok.count("", false).unwrap(), 0);
        assert_eq!(tok.count("", true).unwrap(), 1);
    }

    #[test]
    fn rendered_prompts_count_bos_once() {
        let tok = word_level();
        assert_eq!(tok.count_rendered("<s>hello", "<s>", false).unwrap(), 2);
        assert_eq!(tok.count_rendered("<s>hello", "<s>", true).unwrap(), 2);
        assert_eq!(tok.count_rendered("hello", "<s>", true).unwrap(), 2);
        assert_eq!(tok.count_rendered("hello", "", false).unwrap(), 1);
    }

    #[test]
    fn added_tokens_in_text_are_matched() {
        let tok = word_level();
        assert_eq!(tok.encode("<s>hello", false).unwrap(), [0, 2]);
        assert_eq!(tok.token_to_id("world"), Some(3));
        assert_eq!(tok.vocab_size(), 4);
    }

    #[test]
    fn bad_files_are_errors_naming_the_path() {
        let missing = Path::new("/nonexistent/dir/tokenizer.json");
        let err = HfTokenizer::from_file(missing).unwrap_err();
        assert!(matches!(err, LoadError::Read { .. }));
        assert_eq!(err.path(), missing);
        assert!(err.to_string().contains("/nonexistent/dir/tokenizer.json"));

        assert!(HfTokenizer::from_json(b"{}").is_err());
        assert!(HfTokenizer::from_json(b"not json").is_err());
        assert!(HfTokenizer::from_json(br#"{"model": {"type": "BPE", "vocab": 3}}"#).is_err());
    }
}
