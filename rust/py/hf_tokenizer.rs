//! Python wrappers of Hugging Face tokenizers and chat templates.

// Doc comments here become Python docstrings (help()), written for Python readers.
#![allow(clippy::doc_markdown)]

use pyo3::prelude::*;
use pyo3::pybacked::PyBackedBytes;
use pyo3::types::{PyBytes, PyString};

use crate::chat_template::{self, RenderError};
use crate::hf_tokenizer::{self, EncodeError, LoadError};
use crate::py::errors::{request_error, ChatTemplateError, TokenizeError, TokenizerLoadError};
use crate::py::normalize::DETACH_MIN_BYTES;
use crate::py::text::{self, owned_text, utf8, Text};

fn load_error(py: Python<'_>, err: &LoadError) -> PyErr {
    let exc = TokenizerLoadError::new_err(err.to_string());
    // The file is also an attribute, for callers that report it apart from the message.
    match exc
        .value(py)
        .setattr("path", err.path().to_string_lossy().into_owned())
    {
        Ok(()) => exc,
        Err(e) => e,
    }
}

fn encode_error(err: &EncodeError) -> PyErr {
    TokenizeError::new_err(err.to_string())
}

fn render_error(err: RenderError) -> PyErr {
    match err {
        RenderError::Request(e) => request_error(e),
        RenderError::Template(e) => ChatTemplateError::new_err(e.to_string()),
    }
}

/// Run `work` with the GIL released when the input is large enough for that to pay off. Inputs
/// are already Rust values (`PyBackedStr`/`PyBackedBytes` hold a reference to their immutable
/// Python object, taken and later dropped with the GIL held), so nothing Python is touched
/// meanwhile.
fn maybe_detach<T: Send>(py: Python<'_>, len: usize, work: impl FnOnce() -> T + Send) -> T {
    if len >= DETACH_MIN_BYTES {
        py.detach(work)
    } else {
        work()
    }
}

/// A Hugging Face `tokenizer.json` (the Rust `tokenizers` crate), loaded once from a path;
/// nothing is downloaded. Thread-safe; counting releases the GIL for texts of 1 KiB or more.
/// The file's truncation and padding settings are ignored: counts are of the whole text.
#[pyclass(frozen, module = "router._native")]
pub struct HfTokenizer {
    inner: hf_tokenizer::HfTokenizer,
    path: String,
}

#[pymethods]
impl HfTokenizer {
    /// Load the tokenizer in `path` (str or os.PathLike); TokenizerLoadError if it cannot.
    #[new]
    fn new(py: Python<'_>, path: &Bound<'_, PyAny>) -> PyResult<Self> {
        let path = text::path(path, "path")?;
        let shown = path.to_string_lossy().into_owned();
        let loaded = py.detach(move || hf_tokenizer::HfTokenizer::from_file(&path));
        let inner = loaded.map_err(|e| load_error(py, &e))?;
        Ok(Self { inner, path: shown })
    }

    /// The file the tokenizer was loaded from.
    #[getter]
    fn path(&self) -> &str {
        &self.path
    }

    /// Size of the vocabulary, added tokens included.
    #[getter]
    fn vocab_size(&self) -> usize {
        self.inner.vocab_size()
    }

    /// Number of tokens in `text`. Special tokens written in the text (e.g. "<|im_start|>")
    /// count as one token each; the post-processor's (e.g. BOS) are added only with
    /// `add_special_tokens`. Equal to `len(tokenizers.Tokenizer.encode(text,
    /// add_special_tokens=...).ids)`.
    #[pyo3(signature = (text, *, add_special_tokens = false))]
    fn count(
        &self,
        py: Python<'_>,
        text: Bound<'_, PyString>,
        add_special_tokens: bool,
    ) -> PyResult<usize> {
        let text = owned_text(text, "text")?;
        maybe_detach(py, text.len(), || {
            self.inner.count(&text, add_special_tokens)
        })
        .map_err(|e| encode_error(&e))
    }

    /// Token ids of `text` (as `tokenizers.Tokenizer.encode(text, ...).ids`).
    #[pyo3(signature = (text, *, add_special_tokens = false))]
    fn encode(
        &self,
        py: Python<'_>,
        text: Bound<'_, PyString>,
        add_special_tokens: bool,
    ) -> PyResult<Vec<u32>> {
        let text = owned_text(text, "text")?;
        maybe_detach(py, text.len(), || {
            self.inner.encode(&text, add_special_tokens)
        })
        .map_err(|e| encode_error(&e))
    }

    /// Number of tokens of each text, in order, with the GIL released once for all of them.
    #[pyo3(signature = (texts, *, add_special_tokens = false))]
    fn count_many(
        &self,
        py: Python<'_>,
        texts: Vec<Bound<'_, PyString>>,
        add_special_tokens: bool,
    ) -> PyResult<Vec<usize>> {
        let texts = texts
            .into_iter()
            .map(|text| owned_text(text, "each text"))
            .collect::<PyResult<Vec<_>>>()?;
        let total: usize = texts.iter().map(|t| t.len()).sum();
        maybe_detach(py, total, || {
            texts
                .iter()
                .map(|text| self.inner.count(text, add_special_tokens))
                .collect::<Result<Vec<_>, _>>()
        })
        .map_err(|e| encode_error(&e))
    }

    /// Prompt tokens of a chat request body rendered with `template` (see ChatTemplate.render
    /// for the request forms read). Without `add_special_tokens` the rendered text is counted as
    /// is, as transformers' apply_chat_template(tokenize=True) and vLLM do (the template's
    /// bos_token is the BOS); with it, as llama.cpp does, a leading bos_token is cut and the
    /// post-processor adds its tokens. BOS counts once either way.
    #[pyo3(signature = (template, body, *, add_generation_prompt = true, add_special_tokens = false))]
    fn count_chat(
        &self,
        py: Python<'_>,
        template: &Bound<'_, ChatTemplate>,
        body: Bound<'_, PyBytes>,
        add_generation_prompt: bool,
        add_special_tokens: bool,
    ) -> PyResult<usize> {
        let template = &template.get().inner;
        let body = PyBackedBytes::from(body);
        let counted = maybe_detach(py, body.len(), || {
            let rendered = template
                .render_request(&body, add_generation_prompt)
                .map_err(ChatCountError::Render)?;
            self.inner
                .count_rendered(&rendered, template.bos_token(), add_special_tokens)
                .map_err(ChatCountError::Encode)
        });
        counted.map_err(|e| match e {
            ChatCountError::Render(e) => render_error(e),
            ChatCountError::Encode(e) => encode_error(&e),
        })
    }

    /// The id of `token` in the vocabulary or the added tokens, or None.
    fn token_to_id(&self, token: &Bound<'_, PyString>) -> PyResult<Option<u32>> {
        Ok(self.inner.token_to_id(utf8(token, "token")?))
    }

    fn __repr__(&self) -> String {
        format!(
            "HfTokenizer({:?}, vocab_size={})",
            self.path,
            self.inner.vocab_size()
        )
    }
}

/// A failure inside the GIL-free part of `count_chat`, turned into a Python error after it.
enum ChatCountError {
    Render(RenderError),
    Encode(EncodeError),
}

/// A model's chat template (Jinja, from tokenizer_config.json's "chat_template" or the GGUF's
/// tokenizer.chat_template) compiled once, with its BOS and EOS token strings. Rendered as
/// transformers renders it: trim_blocks and lstrip_blocks, loop controls, raise_exception,
/// strftime_now (UTC), tojson as Python's json.dumps, Python string and dict methods.
#[pyclass(frozen, module = "router._native")]
pub struct ChatTemplate {
    inner: chat_template::ChatTemplate,
}

#[pymethods]
impl ChatTemplate {
    /// Compile `template`; ChatTemplateError (with the line) on a syntax error.
    #[new]
    #[allow(clippy::needless_pass_by_value)]
    #[pyo3(
        signature = (template, bos_token = Text::Default(""), eos_token = Text::Default("")),
        text_signature = "(template, bos_token=\"\", eos_token=\"\")"
    )]
    fn new(
        template: &Bound<'_, PyString>,
        bos_token: Text<'_>,
        eos_token: Text<'_>,
    ) -> PyResult<Self> {
        let template = utf8(template, "template")?;
        let (bos_token, eos_token) = (bos_token.get("bos_token")?, eos_token.get("eos_token")?);
        chat_template::ChatTemplate::new(template, bos_token, eos_token)
            .map(|inner| Self { inner })
            .map_err(|e| ChatTemplateError::new_err(e.to_string()))
    }

    /// The prompt text of a request body: Chat Completions (`messages`, `tools`), Anthropic
    /// Messages (`system` first) or Responses (`instructions`, `input`), or a bare JSON array
    /// of messages. Content parts are joined into one string (their `text`, newline-separated;
    /// images skipped), as llama.cpp and vLLM do for string-content templates.
    #[pyo3(signature = (body, add_generation_prompt = true))]
    fn render(
        &self,
        py: Python<'_>,
        body: Bound<'_, PyBytes>,
        add_generation_prompt: bool,
    ) -> PyResult<String> {
        let body = PyBackedBytes::from(body);
        maybe_detach(py, body.len(), || {
            self.inner.render_request(&body, add_generation_prompt)
        })
        .map_err(render_error)
    }

    /// The BOS token string given at construction.
    #[getter]
    fn bos_token(&self) -> &str {
        self.inner.bos_token()
    }
}

/// Register the classes on the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<HfTokenizer>()?;
    m.add_class::<ChatTemplate>()
}
