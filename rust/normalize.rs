//! Prompt normalization: NFKC, full case folding, whitespace collapse, optional trimming of
//! trailing punctuation and politeness filler. Pure; no pyo3.

use crate::casefold::{FOLDS, WHITESPACE};
use unicode_normalization::{is_nfkc_quick, IsNormalized, UnicodeNormalization};

/// Which optional steps run after NFKC + case folding + whitespace collapse.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Options {
    /// Drop trailing `. ! ? , ; : 。 、` (repeatedly, with the spaces before them).
    pub strip_punctuation: bool,
    /// Drop leading/trailing politeness words ("please", "thanks", ...) when other words remain.
    pub strip_filler: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            strip_punctuation: true,
            strip_filler: false,
        }
    }
}

/// Trailing characters removed by `strip_punctuation` (after NFKC, so full-width forms are ASCII).
const PUNCTUATION: &[char] = &['.', '!', '?', ',', ';', ':', '\u{3002}', '\u{3001}'];

/// Trailing filler phrases, longest first so "thank you very much" wins over "thank you".
const TRAILING_FILLER: &[&str] = &[
    "thank you very much",
    "thanks a lot",
    "thank you",
    "thanks",
    "please",
    "thx",
    "pls",
    "plz",
];

/// Leading filler words; only politeness, never greetings (those can be the whole question).
const LEADING_FILLER: &[&str] = &["please", "kindly", "pls", "plz"];

/// Bound on NFKC/case-fold rounds; real text reaches a fixpoint in one or two.
const MAX_FOLD_ROUNDS: usize = 4;

/// Normalize `text` for cache matching; idempotent: `normalize(normalize(x)) == normalize(x)`.
pub fn normalize(text: &str, options: Options) -> String {
    let mut out = if text.is_ascii() {
        collapse_ascii(text)
    } else {
        collapse(&fold_fixpoint(text))
    };
    strip(&mut out, options);
    out
}

/// Python's `str.isspace` on an ASCII byte.
pub const fn is_ascii_space(b: u8) -> bool {
    matches!(b, b'\t' | b'\n' | 0x0b | 0x0c | b'\r' | 0x1c..=0x1f | b' ')
}

/// True if Python's `str.isspace` holds for `c`.
pub fn is_space(c: char) -> bool {
    if c.is_ascii() {
        is_ascii_space(c as u8)
    } else {
        WHITESPACE.binary_search(&u32::from(c)).is_ok()
    }
}

/// Append the full case folding of `c` to `out`.
fn push_folded(c: char, out: &mut String) {
    if c.is_ascii() {
        out.push(c.to_ascii_lowercase());
    } else if let Ok(i) = FOLDS.binary_search_by_key(&u32::from(c), |&(cp, _)| cp) {
        out.push_str(FOLDS[i].1);
    } else {
        out.push(c);
    }
}

/// NFKC of `text`, skipping the work when the quick check proves it already normalized.
fn nfkc(text: String) -> String {
    if is_nfkc_quick(text.chars()) == IsNormalized::Yes {
        text
    } else {
        text.nfkc().collect()
    }
}

/// NFKC, then case fold + NFKC until nothing changes (folding can un-normalize a string).
/// Full case folding is idempotent, so once NFKC leaves the folded text alone it is final.
fn fold_fixpoint(text: &str) -> String {
    let mut current = nfkc(text.to_owned());
    for _ in 0..MAX_FOLD_ROUNDS {
        let mut folded = String::with_capacity(current.len());
        for c in current.chars() {
            push_folded(c, &mut folded);
        }
        if folded == current {
            break;
        }
        if is_nfkc_quick(folded.chars()) == IsNormalized::Yes {
            return folded;
        }
        let next: String = folded.nfkc().collect();
        if next == folded {
            return folded;
        }
        current = next;
    }
    current
}

/// Lowercase ASCII and collapse whitespace runs into one space, trimming both ends.
fn collapse_ascii(text: &str) -> String {
    let mut out = Vec::with_capacity(text.len());
    let mut pending_space = false;
    for &b in text.as_bytes() {
        if is_ascii_space(b) {
            pending_space = !out.is_empty();
        } else {
            if pending_space {
                out.push(b' ');
                pending_space = false;
            }
            out.push(b.to_ascii_lowercase());
        }
    }
    // Only ASCII bytes were pushed, so this cannot fail.
    String::from_utf8(out).unwrap_or_default()
}

/// Collapse whitespace runs (Python's definition) into one space, trimming both ends.
fn collapse(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut pending_space = false;
    for c in text.chars() {
        if is_space(c) {
            pending_space = !out.is_empty();
        } else {
            if pending_space {
                out.push(' ');
                pending_space = false;
            }
            out.push(c);
        }
    }
    out
}

/// Apply the optional trimming steps until none of them changes the text.
fn strip(s: &mut String, options: Options) {
    loop {
        let before = s.len();
        if options.strip_punctuation {
            while s.ends_with(PUNCTUATION) || s.ends_with(' ') {
                s.pop();
            }
        }
        if options.strip_filler {
            strip_trailing_filler(s);
            strip_leading_filler(s);
        }
        if s.len() == before {
            return;
        }
    }
}

/// Remove one trailing filler phrase that follows a space (never the whole text).
fn strip_trailing_filler(s: &mut String) {
    for filler in TRAILING_FILLER {
        if s.len() > filler.len() && s.ends_with(filler) {
            let cut = s.len() - filler.len();
            if s.as_bytes()[cut - 1] == b' ' {
                s.truncate(cut);
                while s.ends_with(' ') {
                    s.pop();
                }
                return;
            }
        }
    }
}

/// Remove one leading filler word (optionally followed by `, ! .`) when more words follow.
fn strip_leading_filler(s: &mut String) {
    let Some(space) = s.find(' ') else { return };
    let word = s[..space].trim_end_matches([',', '!', '.']);
    if LEADING_FILLER.contains(&word) {
        s.drain(..=space);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(text: &str) -> String {
        normalize(text, Options::default())
    }

    fn filler(text: &str) -> String {
        normalize(
            text,
            Options {
                strip_punctuation: true,
                strip_filler: true,
            },
        )
    }

    #[test]
    fn ascii_case_and_whitespace() {
        assert_eq!(n("  Hello\t\n  World!!  "), "hello world");
        assert_eq!(n(""), "");
        assert_eq!(n(" \t "), "");
    }

    #[test]
    fn keeps_punctuation_when_asked() {
        let keep = Options {
            strip_punctuation: false,
            strip_filler: false,
        };
        assert_eq!(normalize("Why?  ", keep), "why?");
    }

    #[test]
    fn unicode_nfkc_and_full_casefold() {
        // Full-width letters, ligature, sharp s, final sigma, Kelvin sign.
        assert_eq!(n("ＨＥＬＬＯ"), "hello");
        assert_eq!(n("ﬁne"), "fine");
        assert_eq!(n("Straße"), "strasse");
        assert_eq!(n("ΟΔΟΣ"), "οδοσ");
        assert_eq!(n("\u{212A}"), "k");
        assert_eq!(n("a\u{3000}b\u{00a0}c"), "a b c");
    }

    #[test]
    fn punctuation_and_filler() {
        assert_eq!(n("What is Rust？"), "what is rust");
        assert_eq!(filler("Please, tell me a joke, thanks!"), "tell me a joke");
        assert_eq!(filler("tell me a joke please please."), "tell me a joke");
        assert_eq!(filler("thanks"), "thanks");
        assert_eq!(filler("please"), "please");
        assert_eq!(filler("no thanksgiving"), "no thanksgiving");
    }

    #[test]
    fn idempotent_on_tricky_inputs() {
        for text in [
            "\u{0345}\u{0301}A",
            "ǅ ǈ ǋ ǲ",
            "ﬀ ﬃ İ ŉ",
            "x \u{0301}",
            "please please .",
            ". , ! thank you",
        ] {
            let once = filler(text);
            assert_eq!(filler(&once), once, "{text:?}");
            let once = n(text);
            assert_eq!(n(&once), once, "{text:?}");
        }
    }

    #[test]
    fn python_whitespace_set() {
        assert!(is_space('\u{1c}'));
        assert!(is_space('\u{85}'));
        assert!(is_space('\u{3000}'));
        assert!(!is_space('\u{200b}'));
    }
}
