//! Prompt normalization for the `normalized` cache level. Pure; no pyo3.
//!
//! Two texts share a cache key at `normalized` only if they differ in blank space, and only in
//! blank space that plain prose does not use to say anything. These four folds are all there
//! is; everything else is compared code point for code point:
//!
//! | # | fold | where |
//! |---|------|-------|
//! | 1 | space separators and line breaks at the end of the text are removed | end of text |
//! | 2 | blank lines before the first non-blank line are removed | start of text |
//! | 3 | 1 to 3 leading spaces of a one-line text are removed (Markdown ignores them; 4 make code) | one-line text |
//! | 4 | a run of space separators between two visible characters (neither blank nor a tab) of a prose line becomes one U+0020 | prose lines |
//!
//! Space separators are Unicode's `Zs`: U+0020, U+00A0 (no-break), U+1680, U+2000..U+200A,
//! U+202F, U+205F, U+3000. Line breaks are Python's `str.splitlines` set: `\n \r \v \f`,
//! U+001C..U+001E, U+0085, U+2028, U+2029, and `\r\n` as one.
//!
//! | kept exactly | because |
//! |---|---|
//! | letter case | identifiers, base64, units (mW/MW), formulas (CO/Co) differ only in it |
//! | every non-space character, no Unicode normalization | 3² is not 32, ½ is not 1⁄2, Ⅻ is not XII; fullwidth `Ａ` is not `A` to a question about code points or look-alike domains |
//! | punctuation, trailing `?` and `!` included | "abc!" is not "abc"; `??!` is a C trigraph |
//! | tabs, U+001F | delimiters in pasted data |
//! | line breaks, their kind and number | rows, list items, poetry, code |
//! | zero-width characters | ZWJ/ZWNJ change emoji and spelling |
//! | fenced blocks: from a line opening with three backticks or tildes to its closing fence or the end | code |
//! | indented lines (starting with blank space) | code, nested lists |
//! | the lines of a paragraph from its first to its last with a backtick | inline code spans never leave their paragraph, so this covers them without matching backticks |
//! | blank space at the end of a line (before a line break) | two or more spaces there are a Markdown hard line break; one, after a `\`, is not a shell line continuation |
//! | blank space beside a tab | a field's padding in tab-separated data |
//! | everything from the line holding the first quote mark to the end of the text | `"a     b"` is not `"a b"`; quote marks do not pair reliably (`"` both opens and closes, a quotation may run over paragraphs or stay open), so only text before the first one is surely outside every quotation |
//! | a paragraph of two or more lines, at least half of them with a run of two or more spaces between visible characters | space-aligned columns: folding them moves a value under another column when a cell is empty |
//!
//! Quote marks: the double ones `"` « » “ ” „ ‟ ‹ › 「 」 『 』 〝 〞 〟 ＂ always, and the single
//! ones `'` ‘ ’ ‚ ‛ ＇ unless between two word characters (an apostrophe: don't, l’été); a word
//! character is an ASCII letter or digit or any non-ASCII character but a space separator, a
//! line break or a quote mark. Paragraphs are separated by blank lines and fences.
//!
//! "The text" is what the model reads: a message's text parts are one text, normalized the way
//! each server may join them ([`normalize_parts`]), never part by part.

/// Normalize `text` for cache matching; idempotent: `normalize(normalize(x)) == normalize(x)`.
pub fn normalize(text: &str) -> String {
    let mut out = Vec::with_capacity(text.len());
    normalize_into(text, &mut out);
    // Only whole characters of `text` and ASCII spaces were written.
    String::from_utf8(out).unwrap_or_default()
}

/// The paragraph being written: where it starts in the text and in `out`, how many lines it
/// has so far and how many of them hold a run of two or more spaces between visible characters.
struct Paragraph {
    start: usize,
    out_start: usize,
    lines: usize,
    runs: usize,
}

impl Paragraph {
    /// End the paragraph before `end`: if it looks space-aligned (two or more lines, at least
    /// half of them with a run), write it again exactly as in the text.
    fn close(self, b: &[u8], end: usize, out: &mut Vec<u8>) {
        if self.lines >= 2 && 2 * self.runs >= self.lines {
            out.truncate(self.out_start);
            out.extend_from_slice(&b[self.start..end]);
        }
    }
}

/// Append the normalized UTF-8 of `text` to `out`. Every byte written is a byte of `text` or an
/// ASCII space, so text without JSON escapes stays without them.
pub fn normalize_into(text: &str, out: &mut Vec<u8>) {
    let b = trim(text).as_bytes();
    // From the line holding the first quote mark on, everything may be inside a quotation.
    let quoted = first_quote(b).map_or(b.len(), |q| line_start(b, q));
    let ticks = b.contains(&b'`');
    let mut fence: Option<(u8, usize)> = None;
    // The paragraph's lines from the first to the last with a backtick: [start, end).
    let mut code = (0, 0);
    let mut paragraph: Option<Paragraph> = None;
    let mut i = 0;
    while i < b.len() {
        if i >= quoted && paragraph.is_none() {
            out.extend_from_slice(&b[i..]);
            return;
        }
        if let Some(open) = fence {
            let end = line_end(b, i);
            if closes(&b[i..end], open) {
                fence = None;
            }
            i = copy_line(b, i, end, out);
            continue;
        }
        let end_if_fence = opens(b, i).map(|open| (open, line_end(b, i)));
        if let Some((open, end)) = end_if_fence {
            if let Some(p) = paragraph.take() {
                p.close(b, i, out);
            }
            fence = Some(open);
            i = copy_line(b, i, end, out);
            continue;
        }
        if starts_blank(b, i) || break_len(b, i) > 0 {
            let end = line_end(b, i);
            if is_blank(&b[i..end]) {
                if let Some(p) = paragraph.take() {
                    p.close(b, i, out);
                }
                i = copy_line(b, i, end, out);
                continue;
            }
        }
        let p = paragraph.get_or_insert_with(|| {
            if ticks {
                code = tick_lines(b, i);
            }
            Paragraph {
                start: i,
                out_start: out.len(),
                lines: 0,
                runs: 0,
            }
        });
        let run;
        if i >= quoted || (code.0..code.1).contains(&i) || starts_blank(b, i) {
            let end = line_end(b, i);
            run = has_run(&b[i..end]);
            i = copy_line(b, i, end, out);
        } else {
            let end;
            (end, run) = prose(b, i, out);
            i = copy_line(b, end, end, out);
        }
        p.lines += 1;
        p.runs += usize::from(run);
    }
    if let Some(p) = paragraph {
        p.close(b, b.len(), out);
    }
}

/// A message's text parts normalized as one text (see [`normalize_parts`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Parts {
    /// The parts joined by a line break and normalized, cut where each part ends (a part whose
    /// text fold 1 or 2 removed whole is empty).
    pub parts: Vec<String>,
    /// The parts joined without a separator, normalized.
    pub unseparated: String,
    /// The parts joined by a blank line, normalized.
    pub paragraphs: String,
}

/// Normalize the text parts of one message as the text a server renders from them, whichever
/// way it joins them: vLLM and llama.cpp's server join them with a line break for a chat
/// template that takes a string (vLLM `"\n".join`, llama.cpp `concat_typed_text`), a template
/// that loops over the parts writes them one after the other, and llama.cpp's `render_content`
/// puts a blank line between them. Normalizing each part alone is wrong in every one of these:
/// the line-start folds would apply where no line starts (`"  return 1"` after `"def f():"` is
/// indented code), a quotation opened in one part would not cover the next, and a fence, a
/// paragraph with a backtick or space-aligned columns would be cut at each part. Two messages
/// share all three joinings and where each part ends only if every server renders them alike up
/// to the folds.
pub fn normalize_parts(texts: &[&str]) -> Parts {
    let lines = texts.join("\n");
    let mut separators = Vec::with_capacity(texts.len().saturating_sub(1));
    let mut at = 0;
    for text in texts.iter().take(texts.len().saturating_sub(1)) {
        at += text.len();
        separators.push(at);
        at += 1;
    }
    let mut out = Vec::with_capacity(lines.len());
    normalize_into(&lines, &mut out);
    let mut parts = Vec::with_capacity(texts.len());
    let mut from = 0;
    for (cut, kept) in separators_in(lines.as_bytes(), trim_span(&lines), &separators, &out) {
        parts.push(utf8(&out[from..cut]));
        from = cut + usize::from(kept);
    }
    parts.push(utf8(&out[from..]));
    Parts {
        parts,
        unseparated: normalize(&texts.concat()),
        paragraphs: normalize(&texts.join("\n\n")),
    }
}

/// Whole characters of a normalized text, which only cuts at a line break.
fn utf8(bytes: &[u8]) -> String {
    String::from_utf8(bytes.to_vec()).unwrap_or_default()
}

/// Where each separator of `text` (ascending byte offsets, each at a line break) is in `out`,
/// the normalized `text`, and whether it is still there. The folds never remove, change or add
/// a line break between the ends that folds 1-3 keep (`span`), so the n-th break there is the
/// n-th break of `out`; a separator cut off before or after them is at `out`'s start or end.
fn separators_in(
    text: &[u8],
    span: (usize, usize),
    separators: &[usize],
    out: &[u8],
) -> Vec<(usize, bool)> {
    let (mut i, mut o) = (span.0, 0);
    let mut cuts = Vec::with_capacity(separators.len());
    for &at in separators {
        if at < span.0 {
            cuts.push((0, false));
            continue;
        }
        if at >= span.1 {
            cuts.push((out.len(), false));
            continue;
        }
        loop {
            let (brk, out_brk) = (line_end(text, i), line_end(out, o));
            let n = break_len(text, brk);
            debug_assert_eq!(text.get(brk..brk + n), out.get(out_brk..out_brk + n));
            if n == 0 || brk > at {
                // Not reached: `at` is inside a line break of the span.
                cuts.push((out.len(), false));
                break;
            }
            (i, o) = (brk + n, out_brk + n);
            if at < i {
                // A part's trailing `\r` and the separator are one `\r\n` break.
                cuts.push((out_brk + (at - brk), true));
                break;
            }
        }
    }
    cuts
}

/// Folds 1-3: the text without trailing blank space, leading blank lines, and the up to three
/// leading spaces of a one-line text.
fn trim(text: &str) -> &str {
    let (start, end) = trim_span(text);
    &text[start..end]
}

/// Where [`trim`]'s text starts and ends in `text`.
fn trim_span(text: &str) -> (usize, usize) {
    let text = text.trim_end_matches(|c| is_space(c) || is_line_break(c));
    let first = text.len()
        - text
            .trim_start_matches(|c| is_space(c) || is_line_break(c))
            .len();
    let line_start = text[..first].rfind(is_line_break).map_or(0, |i| {
        i + text[i..].chars().next().map_or(1, char::len_utf8)
    });
    let rest = &text[line_start..];
    let indent = &text[line_start..first];
    if !indent.is_empty() && indent.chars().count() <= 3 && !rest.contains(is_line_break) {
        (first, text.len())
    } else {
        (line_start, text.len())
    }
}

/// True for Unicode space separators (`Zs`), the characters fold 4 collapses.
pub fn is_space(c: char) -> bool {
    matches!(
        c,
        ' ' | '\u{a0}' | '\u{1680}' | '\u{2000}'
            ..='\u{200a}' | '\u{202f}' | '\u{205f}' | '\u{3000}'
    )
}

/// True for the line breaks of Python's `str.splitlines`.
pub fn is_line_break(c: char) -> bool {
    matches!(
        c,
        '\n' | '\u{b}' | '\u{c}' | '\r' | '\u{1c}'..='\u{1e}' | '\u{85}' | '\u{2028}' | '\u{2029}'
    )
}

/// Length in bytes of the quote mark starting at `b[i]` and whether it is a single one (which
/// is also an apostrophe), or `(0, false)`. Double: `"` « » “ ” „ ‟ ‹ › 「 」 『 』 〝 〞 〟 ＂;
/// single: `'` ‘ ’ ‚ ‛ ＇.
fn quote_len(b: &[u8], i: usize) -> (usize, bool) {
    match b.get(i..).unwrap_or_default() {
        [b'"', ..] => (1, false),
        [b'\'', ..] => (1, true),
        [0xc2, 0xab | 0xbb, ..] => (2, false),
        [0xe2, 0x80, 0x98..=0x9b, ..] | [0xef, 0xbc, 0x87, ..] => (3, true),
        [0xe2, 0x80, 0x9c..=0x9f | 0xb9 | 0xba, ..]
        | [0xe3, 0x80, 0x8c..=0x8f | 0x9d..=0x9f, ..]
        | [0xef, 0xbc, 0x82, ..] => (3, false),
        _ => (0, false),
    }
}

/// Length in bytes of the UTF-8 sequence led by `c`.
const fn char_len(c: u8) -> usize {
    match c {
        0..=0x7f => 1,
        0xc0..=0xdf => 2,
        0xe0..=0xef => 3,
        _ => 4,
    }
}

/// True if the character starting at `b[i]` is part of a word: an ASCII letter or digit, or
/// any non-ASCII character but a space separator, a line break or a quote mark.
fn is_word(b: &[u8], i: usize) -> bool {
    match b.get(i) {
        None => false,
        Some(c) if c.is_ascii() => c.is_ascii_alphanumeric(),
        Some(_) => space_len(b, i) == 0 && break_len(b, i) == 0 && quote_len(b, i).0 == 0,
    }
}

/// Index of the first quote mark in `b` that may open or close a quotation: any double one,
/// and a single one unless it stands between two word characters (an apostrophe: don't,
/// l’été). Eight bytes at a time up to a candidate: `"`, `'` or a non-ASCII byte.
fn first_quote(b: &[u8]) -> Option<usize> {
    let mut i = 0;
    loop {
        while let Some(chunk) = b.get(i..i + 8) {
            let w = u64::from_le_bytes(chunk.try_into().unwrap_or([0; 8]));
            let candidates = (w | equal(w, b'"') | equal(w, b'\'')) & HIGHS;
            if candidates != 0 {
                i += (candidates.trailing_zeros() / 8) as usize;
                break;
            }
            i += 8;
        }
        let &c = b.get(i)?;
        match quote_len(b, i) {
            (0, _) => i += char_len(c),
            (n, single) => {
                let word_before = i.checked_sub(1).is_some_and(|mut k| {
                    while k > 0 && (0x80..0xc0).contains(&b[k]) {
                        k -= 1;
                    }
                    is_word(b, k)
                });
                let apostrophe = single && word_before && is_word(b, i + n);
                if !apostrophe {
                    return Some(i);
                }
                i += n;
            }
        }
    }
}

/// Index of the start of the line holding `b[i]`.
fn line_start(b: &[u8], i: usize) -> usize {
    (0..i)
        .rev()
        .find_map(|k| match break_len(b, k) {
            0 => None,
            n => Some(k + n),
        })
        .unwrap_or(0)
}

/// True if `line` holds a run of two or more space separators between two visible characters
/// (neither blank nor a tab): what space-aligned columns are made of.
fn has_run(line: &[u8]) -> bool {
    let (mut i, mut visible) = (0, false);
    while let Some(&c) = line.get(i) {
        if space_len(line, i) == 0 {
            visible = c != b'\t';
            i += char_len(c);
            continue;
        }
        let mut count = 0;
        while let n @ 1.. = space_len(line, i) {
            i += n;
            count += 1;
        }
        if count >= 2 && visible && line.get(i).is_some_and(|&c| c != b'\t') {
            return true;
        }
    }
    false
}

/// Length in bytes of the space separator starting at `b[i]`, or 0.
fn space_len(b: &[u8], i: usize) -> usize {
    match b.get(i..).unwrap_or_default() {
        [b' ', ..] => 1,
        [0xc2, 0xa0, ..] => 2,
        [0xe1, 0x9a, 0x80, ..]
        | [0xe2, 0x80, 0x80..=0x8a | 0xaf, ..]
        | [0xe2, 0x81, 0x9f, ..]
        | [0xe3, 0x80, 0x80, ..] => 3,
        _ => 0,
    }
}

/// Length in bytes of the line break starting at `b[i]`, or 0; CR LF is one break, as in
/// `str.splitlines` (two would make an empty line between them, a paragraph break).
fn break_len(b: &[u8], i: usize) -> usize {
    match b.get(i..).unwrap_or_default() {
        [b'\r', b'\n', ..] | [0xc2, 0x85, ..] => 2,
        [b'\n' | 0x0b | 0x0c | b'\r' | 0x1c..=0x1e, ..] => 1,
        [0xe2, 0x80, 0xa8 | 0xa9, ..] => 3,
        _ => 0,
    }
}

/// Length of the blank character (space separator or tab) at `b[i]`, or 0.
fn blank_len(b: &[u8], i: usize) -> usize {
    if b.get(i) == Some(&b'\t') {
        1
    } else {
        space_len(b, i)
    }
}

/// True if the line at `i` starts with blank space (indentation, or a blank line).
fn starts_blank(b: &[u8], i: usize) -> bool {
    blank_len(b, i) > 0
}

/// True if `line` holds only spaces and tabs.
fn is_blank(line: &[u8]) -> bool {
    skip_blank(line, 0) == line.len()
}

/// The index after the blank characters from `i`.
fn skip_blank(b: &[u8], mut i: usize) -> usize {
    loop {
        match blank_len(b, i) {
            0 => return i,
            n => i += n,
        }
    }
}

/// Index of the line break ending the line at `i`, or `b.len()`.
fn line_end(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && break_len(b, i) == 0 {
        i += 1;
    }
    i
}

/// Copy `b[start..end]` and the line break at `end`; the start of the next line.
fn copy_line(b: &[u8], start: usize, end: usize, out: &mut Vec<u8>) -> usize {
    let next = end + break_len(b, end);
    out.extend_from_slice(&b[start..next]);
    next
}

/// The fence opened by the line at `i` (its character and length): after any indentation, three
/// or more backticks (and no backtick after them) or tildes.
fn opens(b: &[u8], i: usize) -> Option<(u8, usize)> {
    let start = skip_blank(b, i);
    let c = *b.get(start)?;
    if c != b'`' && c != b'~' {
        return None;
    }
    let n = b[start..].iter().take_while(|&&x| x == c).count();
    if n < 3 {
        return None;
    }
    let end = line_end(b, start);
    (c == b'~' || !b[start + n..end].contains(&b'`')).then_some((c, n))
}

/// True if `line` closes a fence opened with `n` times `c`: at least as many, then only blanks.
fn closes(line: &[u8], (c, n): (u8, usize)) -> bool {
    let start = skip_blank(line, 0);
    let run = line[start..].iter().take_while(|&&x| x == c).count();
    run >= n && is_blank(&line[start + run..])
}

/// For the paragraph starting at line `i` (it ends at a blank line, a fence or the end): the
/// span from the start of its first line holding a backtick to the end of its last one.
fn tick_lines(b: &[u8], start: usize) -> (usize, usize) {
    let (mut first, mut last) = (None, start);
    let mut i = start;
    while i < b.len() {
        let end = line_end(b, i);
        if i > start && (is_blank(&b[i..end]) || opens(b, i).is_some()) {
            break;
        }
        let next = end + break_len(b, end);
        if b[i..end].contains(&b'`') {
            first.get_or_insert(i);
            last = next;
        }
        i = next;
    }
    first.map_or((0, 0), |first| (first, last))
}

const ONES: u64 = 0x0101_0101_0101_0101;
const HIGHS: u64 = 0x8080_8080_8080_8080;

/// High bit set in each byte of `w` that is at least `b`; every byte of `w` must be ASCII
/// (setting the high bits first means no subtraction borrows from the next byte).
const fn at_least(w: u64, b: u8) -> u64 {
    ((w | HIGHS) - ONES * b as u64) & HIGHS
}

/// High bit set in each byte of `w` (all ASCII) equal to `b`.
const fn equal(w: u64, b: u8) -> u64 {
    !at_least(w ^ (ONES * b as u64), 1) & HIGHS
}

/// Fold 4 on the prose line at `i` (which does not start with blank space) into `out`; the
/// index of the line break that ends it (or `b.len()`) and whether it held a run of two or more
/// spaces between visible characters. Eight bytes at a time up to the first that needs a look:
/// not printable ASCII, or a space after a space.
fn prose(b: &[u8], mut i: usize, out: &mut Vec<u8>) -> (usize, bool) {
    let mut run = false;
    loop {
        let mut after_space = false;
        while let Some(chunk) = b.get(i..i + 8) {
            let w = u64::from_le_bytes(chunk.try_into().unwrap_or([0; 8]));
            // A non-ASCII byte only spoils its own lane of these masks, and it is flagged itself.
            let spaces = equal(w, b' ');
            let doubled = spaces & (spaces << 8 | u64::from(after_space) << 7);
            let special = (w | !at_least(w, 0x20) | doubled) & HIGHS;
            if special != 0 {
                let k = (special.trailing_zeros() / 8) as usize;
                out.extend_from_slice(&chunk[..k]);
                i += k;
                break;
            }
            out.extend_from_slice(chunk);
            after_space = spaces >> 63 != 0;
            i += 8;
        }
        let Some(&c) = b.get(i) else { return (i, run) };
        if space_len(b, i) > 0 {
            // The run's first space may already be out, copied by the eight-byte loop.
            let out_already = i > 0 && b[i - 1] == b' ';
            let start = i - usize::from(out_already);
            let mut end = i;
            let mut count = usize::from(out_already);
            while let n @ 1.. = space_len(b, end) {
                end += n;
                count += 1;
            }
            let beside_tab = start.checked_sub(1).map(|k| b[k]) == Some(b'\t')
                || matches!(b.get(end), None | Some(&b'\t'));
            if beside_tab || break_len(b, end) > 0 {
                // At a line's end (a Markdown hard break) or beside a tab (a field's padding).
                out.extend_from_slice(&b[i..end]);
            } else {
                if !out_already {
                    out.push(b' ');
                }
                run |= count >= 2;
            }
            i = end;
        } else if break_len(b, i) > 0 {
            return (i, run);
        } else {
            let n = char_len(c);
            out.extend_from_slice(&b[i..i + n]);
            i += n;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(text: &str) -> String {
        normalize(text)
    }

    #[test]
    fn blank_space_folds() {
        assert_eq!(n("  Hello\t\n  World!!  "), "  Hello\t\n  World!!");
        assert_eq!(n("  How   do I   reset it? "), "How do I reset it?");
        assert_eq!(n("a\u{a0}b\u{3000}\u{2009} c\n"), "a b c");
        assert_eq!(
            n("\n\n \nfirst  line\nsecond line\nthird line\n\n"),
            "first line\nsecond line\nthird line"
        );
        assert_eq!(n(""), "");
        assert_eq!(n(" \t "), "\t");
        assert_eq!(n(" \n\u{2028} "), "");
    }

    #[test]
    fn meaning_is_kept() {
        for text in [
            "What is 3²?",
            "x₂ + ½",
            "Ⅻ",
            "abc!",
            "aGVsbG8=",
            "ＡＢＣ",
            "ﬁne Straße",
            "e\u{301}",
            "a\tb",
            "a\u{200b}b",
            "a\r\nb",
        ] {
            assert_eq!(n(text), text, "{text:?}");
        }
    }

    #[test]
    fn code_is_kept() {
        let fenced = "Fix:\n```py\nx  =  1\n\nif  x:\n    y\n```\nand  more";
        assert_eq!(
            n(fenced),
            "Fix:\n```py\nx  =  1\n\nif  x:\n    y\n```\nand more"
        );
        let tilde = "~~~\na  b\n~~~~\nc  d";
        assert_eq!(n(tilde), "~~~\na  b\n~~~~\nc d");
        let unclosed = "see\n```\na  b";
        assert_eq!(n(unclosed), unclosed);
        let inline = "Run `ls  -l`  now\n\nthen  this\n\nand  `that`\nfine  here\nok\nyes\nno";
        assert_eq!(
            n(inline),
            "Run `ls  -l`  now\n\nthen this\n\nand  `that`\nfine here\nok\nyes\nno"
        );
        let spanning = "a `b\nc  d\ne` f\n\ng  h";
        assert_eq!(n(spanning), "a `b\nc  d\ne` f\n\ng h");
        // CR LF is one line break: the lines between backticks stay one paragraph's, kept.
        let crlf = "see `x = 1`\r\nif  a  ==  b:   pass\r\nand is `y` set?\r\n\r\nok  then";
        assert_eq!(
            n(crlf),
            "see `x = 1`\r\nif  a  ==  b:   pass\r\nand is `y` set?\r\n\r\nok then"
        );
        assert_eq!(n("```foo``` is  inline"), "```foo``` is  inline");
        assert_eq!(n("def f():\n    return  1"), "def f():\n    return  1");
        assert_eq!(n("    x  =  1"), "    x  =  1");
        assert_eq!(n("   x  =  1"), "x = 1");
        assert_eq!(n("  a\n  b"), "  a\n  b");
    }

    #[test]
    fn fast_path_equals_byte_path() {
        // No quote marks: from the first one on, all is copied and the folds go untested.
        let alphabet = b"aZ  \t\n\x1c,\\.!?09~`\x7f";
        let mut state = 0x2545_f491_4f6c_dd1d_u64;
        for len in 0..120 {
            for _ in 0..20 {
                let text: String = (0..len)
                    .map(|_| {
                        state = state
                            .wrapping_mul(6_364_136_223_846_793_005)
                            .wrapping_add(1);
                        char::from(alphabet[(state >> 33) as usize % alphabet.len()])
                    })
                    .collect();
                let once = n(&text);
                assert_eq!(n(&once), once, "{text:?}");
                // The byte path alone: a non-ASCII character every few bytes.
                let slow = text.replace('Z', "é");
                assert_eq!(n(&slow).replace('é', "Z"), once, "{text:?}");
            }
        }
    }

    #[test]
    fn idempotent_on_tricky_inputs() {
        for text in [
            "    ```  x",
            "  ```a  b",
            " \u{a0}a  b",
            "a \u{a0} \u{3000}b",
            "x\n```\n",
            "```\n```\na  b",
            "`\n\n`  a",
            "a  `\n  b  `  c",
            "\u{85}  a",
            "a\u{2028}  b  c",
            "a  '\nb  c",
            "x'  y",
            "'a\n\nb  c\nd  e",
            "a  b\nc \"d\"  e",
            "a \t b  \r\nc",
        ] {
            let once = n(text);
            assert_eq!(n(&once), once, "{text:?}");
        }
    }

    #[test]
    fn blank_space_at_a_line_end_or_beside_a_tab_is_kept() {
        // Markdown's hard line break is two or more spaces before the break; one is kept too.
        for text in [
            "foo  \nbar",
            "foo \nbar",
            "foo   \r\nbar",
            "foo\u{a0} \u{2028}bar",
            "ls \\ \n-l",
            "a  \tb",
            "a\t  b",
            "a \t b",
        ] {
            assert_eq!(n(text), text, "{text:?}");
        }
        assert_ne!(n("foo  \nbar"), n("foo \nbar"));
        assert_eq!(n("a  b  \nc d e\nf g h"), "a b  \nc d e\nf g h");
    }

    #[test]
    fn quoted_text_is_kept() {
        let wide = "How many spaces are between the quotes: \"a     b\"?";
        assert_eq!(n(wide), wide);
        assert_ne!(
            n(wide),
            n("How many spaces are between the quotes: \"a b\"?")
        );
        for q in [
            "\"", "«", "»", "“", "”", "„", "‟", "‹", "›", "「", "」", "『", "』", "〝", "〞", "〟",
            "＂", "'", "‘", "’", "‚", "‛", "＇",
        ] {
            let text = format!("say  {q}a  b");
            assert_eq!(n(&text), text, "{q}");
        }
        // Blank space before the line of the first quote mark still folds; from it on, nothing.
        assert_eq!(
            n("Count  these.\n\nSay \"a  b\"\n\nthen  stop"),
            "Count these.\n\nSay \"a  b\"\n\nthen  stop"
        );
        assert_eq!(
            n("He  said:\n\n“one\n\ntwo   three"),
            "He said:\n\n“one\n\ntwo   three"
        );
        // A quote mark in code counts too: the quotation may go on past the fence.
        assert_eq!(
            n("```\nx = \"a\n```\nsee  this"),
            "```\nx = \"a\n```\nsee  this"
        );
        assert_eq!(n("len('a  b')"), "len('a  b')");
        assert_eq!(n("’90s  music"), "’90s  music");
        // Apostrophes between word characters are not quote marks.
        assert_eq!(n("Don't  panic, it’s   fine"), "Don't panic, it’s fine");
        assert_eq!(n("l’été  est  là"), "l’été est là");
    }

    #[test]
    fn aligned_columns_are_kept() {
        for text in [
            "Name   Age  City\nBob         Rome\nAlice  30   Paris",
            // One row under a header that sets the widths: its run is an empty cell.
            "Name Age City\nBob      Rome",
            // Right-aligned: the indented rows count too.
            "  1  a\n 22  b\n333  c",
            "a  b\nc  \"d\"  e",
        ] {
            assert_eq!(n(text), text, "{text:?}");
        }
        // Fewer than half the lines with a run: prose with a stray double space.
        assert_eq!(n("a  b\nc d\ne f"), "a b\nc d\ne f");
        assert_eq!(n("a  b\nc \"d\" e\nf g"), "a b\nc \"d\" e\nf g");
        // Per paragraph.
        assert_eq!(n("a  b\nc  d\n\ne  f"), "a  b\nc  d\n\ne f");
        assert_eq!(
            n("a  b\nc  d\n```\nx\n```\ne  f"),
            "a  b\nc  d\n```\nx\n```\ne f"
        );
        // A run beside a tab or at a line's end is not a column.
        assert_eq!(n("a  \tb\nc  d\ne f"), "a  \tb\nc d\ne f");
    }

    #[test]
    fn parts_are_one_text() {
        let p = |texts: &[&str]| normalize_parts(texts);
        // Each part's share of the parts joined by a line break: line starts only at line starts.
        assert_eq!(
            p(&["def f():", "  return 1"]).parts,
            ["def f():", "  return 1"]
        );
        assert_eq!(p(&["abc", " def"]).parts, ["abc", " def"]);
        // A quotation opened in one part covers the next.
        let quoted = p(&["Say: \"", "a     b", "\"?"]);
        assert_eq!(quoted.parts, ["Say: \"", "a     b", "\"?"]);
        assert_eq!(quoted.unseparated, "Say: \"a     b\"?");
        // Folds 1 and 2 may remove whole parts; a trailing `\r` and the line break are one.
        assert_eq!(
            p(&["\n", "  ", "\n  Hi  there ", " "]).parts,
            ["", "", "Hi there", ""]
        );
        assert_eq!(p(&["a\r", "b  c\nd\ne"]).parts, ["a\r", "b c\nd\ne"]);
        let folded = p(&["  Hello   world ", "How  are you? "]);
        assert_eq!(folded.parts, ["  Hello   world ", "How  are you?"]);
        assert_eq!(folded.unseparated, "Hello world How are you?");
        assert_eq!(folded.paragraphs, "  Hello   world \n\nHow are you?");
    }

    #[test]
    fn separators_are_found_in_the_normalized_text() {
        let alphabet = [
            "a", "Z", " ", "  ", "\t", "\n", "\r", "\r\n", "`", "\"", "'", "é", "\u{2028}", "```",
        ];
        let mut state = 0x9e37_79b9_7f4a_7c15_u64;
        let mut pick = |n: usize| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1);
            (state >> 33) as usize % n
        };
        for _ in 0..3000 {
            let texts: Vec<String> = (0..=pick(4))
                .map(|_| {
                    (0..pick(10))
                        .map(|_| alphabet[pick(alphabet.len())])
                        .collect()
                })
                .collect();
            let texts: Vec<&str> = texts.iter().map(String::as_str).collect();
            let lines = texts.join("\n");
            let out = normalize(&lines);
            let mut separators = Vec::new();
            let mut at = 0;
            for text in &texts[..texts.len() - 1] {
                at += text.len();
                separators.push(at);
                at += 1;
            }
            let cuts = separators_in(
                lines.as_bytes(),
                trim_span(&lines),
                &separators,
                out.as_bytes(),
            );
            // Each kept separator is a line break of `out`, in order; the parts rebuild `out`.
            let mut rebuilt = String::new();
            let parts = normalize_parts(&texts).parts;
            for (part, (cut, kept)) in parts.iter().zip(&cuts) {
                assert!(!kept || out.as_bytes()[*cut] == b'\n', "{texts:?}");
                rebuilt.push_str(part);
                if *kept {
                    rebuilt.push('\n');
                }
            }
            rebuilt.push_str(&parts[parts.len() - 1]);
            assert_eq!(rebuilt, out, "{texts:?}");
            assert!(cuts.windows(2).all(|w| w[0].0 <= w[1].0), "{texts:?}");
        }
    }

    #[test]
    fn character_classes() {
        assert!(is_space('\u{a0}') && is_space('\u{202f}') && is_space('\u{3000}'));
        assert!(!is_space('\t') && !is_space('\u{200b}') && !is_space('\u{1f}'));
        assert!(is_line_break('\u{1c}') && is_line_break('\u{85}') && is_line_break('\u{2029}'));
        let quotes = "\"«»“”„‟‹›「」『』〝〞〟＂'‘’‚‛＇";
        for c in (0..0x11_0000).filter_map(char::from_u32) {
            let mut buf = [0; 4];
            let bytes = c.encode_utf8(&mut buf).as_bytes();
            assert_eq!(space_len(bytes, 0) > 0, is_space(c), "{c:?}");
            assert_eq!(break_len(bytes, 0) > 0, is_line_break(c), "{c:?}");
            assert_eq!(quote_len(bytes, 0).0 > 0, quotes.contains(c), "{c:?}");
            assert_eq!(quote_len(bytes, 0).1, "'‘’‚‛＇".contains(c), "{c:?}");
        }
    }
}
