//! Hand-written pretokenizers for the cl100k and o200k split patterns: the same pieces as
//! tiktoken's regexes (fancy-regex, backtracking, leftmost-first), without a regex engine.
//!
//! cl100k: `'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+|
//! ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s`
//!
//! o200k: `[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+C?|
//! [^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*C?|\p{N}{1,3}|
//! ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+` with `C = (?i:'s|'t|'re|'ve|'m|'ll|'d)`.
//!
//! Every character belongs to one of the disjoint classes below (taken from `regex-syntax`'s
//! Unicode tables, the ones the regex engines use), so each alternative reduces to runs of
//! classes; the comments at each step give the alternative it implements.

use std::sync::LazyLock;

use regex_syntax::hir::{Class, HirKind};

/// `\p{Lu}` or `\p{Lt}`.
const UPPER: u8 = 1;
/// `\p{Ll}`.
const LOWER: u8 = 2;
/// `\p{Lm}` or `\p{Lo}`.
const MODIFIER_OTHER: u8 = 4;
/// `\p{M}` (not a letter, but in both o200k letter classes).
const MARK: u8 = 8;
/// `\p{N}`.
const NUMBER: u8 = 16;
/// `\s` except `\r` and `\n`.
const SPACE: u8 = 32;
/// `\r` or `\n`.
const NEWLINE: u8 = 64;
/// Anything else.
const OTHER: u8 = 128;
/// Past the end of the text (no class).
const END: u8 = 0;

/// `\p{L}`.
const LETTER: u8 = UPPER | LOWER | MODIFIER_OTHER;
/// `\s`.
const WHITESPACE: u8 = SPACE | NEWLINE;
/// `[^\s\p{L}\p{N}]`.
const PUNCT: u8 = MARK | OTHER;
/// `[^\r\n\p{L}\p{N}]`.
const PREFIX: u8 = MARK | SPACE | OTHER;
/// o200k's `[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]`.
const O200K_UPPER: u8 = UPPER | MODIFIER_OTHER | MARK;
/// o200k's `[\p{Ll}\p{Lm}\p{Lo}\p{M}]`.
const O200K_LOWER: u8 = LOWER | MODIFIER_OTHER | MARK;

const BLOCK_BITS: u32 = 8;
const BLOCK: usize = 1 << BLOCK_BITS;

/// Class of every code point: `blocks[index[cp >> 8] * 256 + (cp & 255)]`, identical blocks shared.
struct Classes {
    index: Vec<u16>,
    blocks: Vec<u8>,
}

static CLASSES: LazyLock<Classes> = LazyLock::new(Classes::build);

const fn ascii_classes() -> [u8; 128] {
    let mut table = [OTHER; 128];
    let mut b = 0;
    while b < 128 {
        let c = b as u8;
        table[b] = if c.is_ascii_uppercase() {
            UPPER
        } else if c.is_ascii_lowercase() {
            LOWER
        } else if c.is_ascii_digit() {
            NUMBER
        } else if c == b'\r' || c == b'\n' {
            NEWLINE
        } else if matches!(c, b' ' | b'\t' | 0x0b | 0x0c) {
            SPACE
        } else {
            OTHER
        };
        b += 1;
    }
    table
}

static ASCII: [u8; 128] = ascii_classes();

impl Classes {
    fn build() -> Self {
        let mut flat = vec![OTHER; 0x11_0000];
        // Later entries win; the classes are disjoint except that `\r`/`\n` are also `\s`.
        for (pattern, class) in [
            (r"[\p{Lu}\p{Lt}]", UPPER),
            (r"\p{Ll}", LOWER),
            (r"[\p{Lm}\p{Lo}]", MODIFIER_OTHER),
            (r"\p{M}", MARK),
            (r"\p{N}", NUMBER),
            (r"\s", SPACE),
            (r"[\r\n]", NEWLINE),
        ] {
            let hir = regex_syntax::parse(pattern).expect("valid class");
            let HirKind::Class(Class::Unicode(ranges)) = hir.kind() else {
                unreachable!("{pattern} is a Unicode class")
            };
            for range in ranges.ranges() {
                flat[range.start() as usize..=range.end() as usize].fill(class);
            }
        }
        debug_assert!(flat[..128] == ASCII);
        let mut index = Vec::with_capacity(flat.len() / BLOCK);
        let mut blocks: Vec<u8> = Vec::new();
        let mut seen = hashbrown::HashMap::new();
        for block in flat.chunks(BLOCK) {
            let n = *seen.entry(block).or_insert_with(|| {
                blocks.extend_from_slice(block);
                (blocks.len() / BLOCK - 1) as u16
            });
            index.push(n);
        }
        Self { index, blocks }
    }

    fn of(&self, cp: u32) -> u8 {
        let block = usize::from(self.index[(cp >> BLOCK_BITS) as usize]);
        self.blocks[block * BLOCK + (cp as usize & (BLOCK - 1))]
    }
}

/// Build the Unicode class table now rather than on the first non-ASCII character.
pub fn preload() {
    LazyLock::force(&CLASSES);
}

/// Which split pattern.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pattern {
    Cl100k,
    O200k,
}

/// The pieces of `text` under `pattern`, in order; they concatenate to `text`.
pub fn split(text: &str, pattern: Pattern) -> Pieces<'_> {
    Pieces {
        text,
        pos: 0,
        pattern,
    }
}

/// Iterator of [`split`].
pub struct Pieces<'a> {
    text: &'a str,
    pos: usize,
    pattern: Pattern,
}

impl<'a> Iterator for Pieces<'a> {
    type Item = &'a str;

    #[inline]
    fn next(&mut self) -> Option<&'a str> {
        let start = self.pos;
        if start >= self.text.len() {
            return None;
        }
        let cursor = Cursor {
            bytes: self.text.as_bytes(),
        };
        let end = match self.pattern {
            Pattern::Cl100k => cursor.cl100k(start),
            Pattern::O200k => cursor.o200k(start),
        };
        self.pos = end;
        Some(&self.text[start..end])
    }
}

#[derive(Clone, Copy)]
struct Cursor<'a> {
    bytes: &'a [u8],
}

impl Cursor<'_> {
    /// (code point, class, UTF-8 length) of the character at byte `i`; `(0, END, 0)` at the end.
    #[inline]
    fn peek(self, i: usize) -> (u32, u8, usize) {
        match self.bytes.get(i) {
            Some(&b) if b < 0x80 => (u32::from(b), ASCII[usize::from(b)], 1),
            Some(_) => self.peek_multibyte(i),
            None => (0, END, 0),
        }
    }

    /// [`Self::peek`] for a character that is not ASCII (kept out of line: the ASCII path is hot).
    #[inline(never)]
    fn peek_multibyte(self, i: usize) -> (u32, u8, usize) {
        let b0 = self.bytes[i];
        let cont = |k: usize| u32::from(self.bytes[i + k] & 0x3f);
        let (cp, len) = if b0 < 0xe0 {
            ((u32::from(b0 & 0x1f) << 6) | cont(1), 2)
        } else if b0 < 0xf0 {
            ((u32::from(b0 & 0x0f) << 12) | (cont(1) << 6) | cont(2), 3)
        } else {
            (
                (u32::from(b0 & 0x07) << 18) | (cont(1) << 12) | (cont(2) << 6) | cont(3),
                4,
            )
        };
        (cp, CLASSES.of(cp), len)
    }

    #[inline]
    fn class(self, i: usize) -> u8 {
        self.peek(i).1
    }

    /// End of the run of characters in `set` starting at `i`.
    #[inline]
    fn run(self, mut i: usize, set: u8) -> usize {
        loop {
            let (_, class, len) = self.peek(i);
            if class & set == 0 {
                return i;
            }
            i += len;
        }
    }

    /// End of the run of bytes in `set` (ASCII) starting at `i`.
    #[inline]
    fn run_bytes(self, mut i: usize, set: &[u8]) -> usize {
        while self.bytes.get(i).is_some_and(|b| set.contains(b)) {
            i += 1;
        }
        i
    }

    /// `'(?i:s|t|re|ve|m|ll|d)` at `i` (both patterns accept the same set); its end.
    #[inline]
    fn contraction(self, i: usize) -> Option<usize> {
        if self.bytes.get(i) != Some(&b'\'') {
            return None;
        }
        let (c1, _, len1) = self.peek(i + 1);
        let lower = |c: u32| char::from_u32(c).map(|c| c.to_ascii_lowercase());
        match lower(c1)? {
            // Case-insensitive `s` also matches U+017F LATIN SMALL LETTER LONG S.
            's' | 't' | 'm' | 'd' | '\u{17f}' => Some(i + 1 + len1),
            first @ ('l' | 'v' | 'r') => {
                let second = if first == 'l' { 'l' } else { 'e' };
                let (c2, _, len2) = self.peek(i + 2);
                (lower(c2)? == second).then_some(i + 2 + len2)
            }
            _ => None,
        }
    }

    /// A run of `\s` at `i` not taken by an earlier alternative. `end_first`: cl100k tries
    /// `\s++$` before `\s*[\r\n]`, o200k after.
    #[inline]
    fn whitespace(self, i: usize, end_first: bool) -> usize {
        let mut last_newline_end = None;
        let mut last_start = i;
        let mut j = i;
        loop {
            let (_, class, len) = self.peek(j);
            if class & WHITESPACE == 0 {
                break;
            }
            if class == NEWLINE {
                last_newline_end = Some(j + len);
            }
            last_start = j;
            j += len;
        }
        let at_end = j == self.bytes.len();
        if at_end && end_first {
            // `\s++$`
            return j;
        }
        if let Some(end) = last_newline_end {
            // `\s*[\r\n]` / `\s*[\r\n]+`: backtracks to the last newline of the run.
            return end;
        }
        if at_end {
            // `\s+(?!\S)` at the end of the text.
            return j;
        }
        if last_start > i {
            // `\s+(?!\S)`: all but the last character, which goes with what follows.
            return last_start;
        }
        // `\s` / `\s+`: a single character.
        j
    }

    fn cl100k(self, i: usize) -> usize {
        let (c, class, len) = self.peek(i);
        if c == u32::from(b'\'') {
            if let Some(end) = self.contraction(i) {
                return end;
            }
        }
        // `[^\r\n\p{L}\p{N}]?+\p{L}++`
        if class & LETTER != 0 {
            return self.run(i + len, LETTER);
        }
        if class & PREFIX != 0 && self.class(i + len) & LETTER != 0 {
            return self.run(i + len, LETTER);
        }
        // `\p{N}{1,3}+`
        if class == NUMBER {
            return self.digits(i + len);
        }
        // ` ?[^\s\p{L}\p{N}]++[\r\n]*+`
        if let Some(end) = self.punctuation(i, c, class, b"\r\n") {
            return end;
        }
        self.whitespace(i, true)
    }

    /// End of `\p{N}{1,3}+` whose first digit ends at `end`.
    #[inline]
    fn digits(self, mut end: usize) -> usize {
        for _ in 0..2 {
            let (_, next, next_len) = self.peek(end);
            if next != NUMBER {
                break;
            }
            end += next_len;
        }
        end
    }

    /// End of ` ?[^\s\p{L}\p{N}]++[<trailers>]*+` at `i` (character `c` of `class`), if it matches.
    #[inline]
    fn punctuation(self, i: usize, c: u32, class: u8, trailers: &[u8]) -> Option<usize> {
        let start = if class & PUNCT != 0 {
            i
        } else if c == u32::from(b' ') && self.class(i + 1) & PUNCT != 0 {
            i + 1
        } else {
            return None;
        };
        Some(self.run_bytes(self.run(start, PUNCT), trailers))
    }

    /// o200k's `U*W+` (`upper_first == false`) or `U+W*` at `i`; its end.
    #[inline]
    fn o200k_word(self, i: usize, upper_first: bool) -> Option<usize> {
        // Greedy `U*`, remembering the end of its last character that is also in W.
        let mut j = i;
        let mut last_both_end = None;
        loop {
            let (_, class, len) = self.peek(j);
            if class & O200K_UPPER == 0 {
                break;
            }
            j += len;
            if class & O200K_LOWER != 0 {
                last_both_end = Some(j);
            }
        }
        if upper_first {
            // `U+W*`: no backtracking needed, W* cannot fail.
            return (j > i).then(|| self.run(j, O200K_LOWER));
        }
        if self.class(j) & O200K_LOWER != 0 {
            return Some(self.run(j, O200K_LOWER));
        }
        // Backtrack U* to its last character that W+ can take; W+ then stops right after it
        // (what follows is either in U only or is not in W).
        last_both_end
    }

    fn o200k(self, i: usize) -> usize {
        let (c, class, len) = self.peek(i);
        // The two word alternatives, each first with the optional prefix character taken.
        let prefixed = class & PREFIX != 0;
        if class & (O200K_UPPER | O200K_LOWER) != 0 || prefixed {
            for upper_first in [false, true] {
                let word = if prefixed {
                    self.o200k_word(i + len, upper_first)
                } else {
                    None
                };
                let word = word.or_else(|| {
                    if class & (O200K_UPPER | O200K_LOWER) != 0 {
                        self.o200k_word(i, upper_first)
                    } else {
                        None
                    }
                });
                if let Some(end) = word {
                    return self.contraction(end).unwrap_or(end);
                }
            }
        }
        // `\p{N}{1,3}`
        if class == NUMBER {
            return self.digits(i + len);
        }
        // ` ?[^\s\p{L}\p{N}]+[\r\n/]*`
        if let Some(end) = self.punctuation(i, c, class, b"\r\n/") {
            return end;
        }
        self.whitespace(i, false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pieces(text: &str, pattern: Pattern) -> Vec<&str> {
        split(text, pattern).collect()
    }

    #[test]
    fn cl100k_pieces() {
        let p = |t| pieces(t, Pattern::Cl100k);
        assert_eq!(p("hello world"), ["hello", " world"]);
        assert_eq!(
            p("I'm 12345 ok!!\n"),
            ["I", "'m", " ", "123", "45", " ok", "!!\n"]
        );
        assert_eq!(p("a  \n\n b"), ["a", "  \n\n", " b"]);
        assert_eq!(p("x   y"), ["x", "  ", " y"]);
        assert_eq!(p("x \n "), ["x", " \n "]);
        assert_eq!(p("'LL 'sup"), ["'LL", " '", "sup"]);
        assert_eq!(p(""), Vec::<&str>::new());
    }

    #[test]
    fn o200k_pieces() {
        let p = |t| pieces(t, Pattern::O200k);
        assert_eq!(p("hello world"), ["hello", " world"]);
        assert_eq!(p("HelloWorld ABCdef"), ["Hello", "World", " ABCdef"]);
        assert_eq!(p("they'll DON'T"), ["they'll", " DON'T"]);
        assert_eq!(p("x \n "), ["x", " \n", " "]);
        assert_eq!(p("a/b\n//"), ["a", "/b", "\n", "//"]);
        assert_eq!(p("a!\n/b"), ["a", "!\n/", "b"]);
    }

    #[test]
    fn pieces_cover_the_text() {
        let text = "Größe, naïve café — “quotes” 🎉 日本語\u{301} 'ſ 123456\r\n\t x  ";
        for pattern in [Pattern::Cl100k, Pattern::O200k] {
            assert_eq!(pieces(text, pattern).concat(), text);
        }
    }
}
