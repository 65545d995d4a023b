//! Splitting a document into overlapping chunks of about `chunk_tokens`
//! tokens. A token here is a whitespace-separated word, or a single CJK
//! character (CJK text has no spaces, and one character is roughly one
//! model token), which keeps chunking independent of the embedder.

use sha2::{Digest, Sha256};

/// One piece of a document as it is indexed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    /// Position in the document, from 0.
    pub ordinal: usize,
    /// The exact text of the document between the chunk's first and last token.
    pub text: String,
    /// First and last line of the chunk in the document, 1-based, inclusive.
    pub start_line: usize,
    pub end_line: usize,
    /// Hex SHA-256 of `text`: an unchanged chunk keeps its embedding.
    pub hash: String,
}

/// Splits `text` into chunks of `size` tokens, each overlapping the previous
/// one by `overlap` tokens (clamped below `size`, so chunking always advances).
pub fn chunk(text: &str, size: usize, overlap: usize) -> Vec<Chunk> {
    let size = size.max(1);
    let step = size - overlap.min(size - 1);
    let tokens = tokens(text);
    let mut chunks = Vec::new();
    let mut first = 0;
    while first < tokens.len() {
        let last = (first + size).min(tokens.len()) - 1;
        let (start, end) = (tokens[first].0, tokens[last].1);
        let piece = &text[start..end];
        let start_line = line_of(text, start);
        chunks.push(Chunk {
            ordinal: chunks.len(),
            text: piece.to_owned(),
            start_line,
            end_line: start_line + piece.matches('\n').count(),
            hash: hash(piece),
        });
        if last + 1 == tokens.len() {
            break;
        }
        first += step;
    }
    chunks
}

/// Hex SHA-256 of `text`.
pub fn hash(text: &str) -> String {
    let digest = Sha256::digest(text.as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// Byte ranges of the tokens of `text`.
fn tokens(text: &str) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut word: Option<usize> = None;
    for (i, c) in text.char_indices() {
        if c.is_whitespace() || is_cjk(c) {
            if let Some(start) = word.take() {
                out.push((start, i));
            }
            if is_cjk(c) {
                out.push((i, i + c.len_utf8()));
            }
        } else if word.is_none() {
            word = Some(i);
        }
    }
    if let Some(start) = word {
        out.push((start, text.len()));
    }
    out
}

/// Approximate token count, by the same rule chunking uses.
pub fn count_tokens(text: &str) -> usize {
    tokens(text).len()
}

fn is_cjk(c: char) -> bool {
    matches!(c as u32,
        0x3040..=0x30FF      // kana
        | 0x3400..=0x4DBF    // CJK extension A
        | 0x4E00..=0x9FFF    // CJK unified ideographs
        | 0xAC00..=0xD7AF    // Hangul syllables
        | 0xF900..=0xFAFF    // compatibility ideographs
        | 0x20000..=0x2FFFF) // extensions B and later
}

fn line_of(text: &str, byte: usize) -> usize {
    text[..byte].matches('\n').count() + 1
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(n: usize) -> String {
        (0..n)
            .map(|i| format!("w{i}"))
            .collect::<Vec<_>>()
            .join(" ")
    }

    #[test]
    fn short_text_is_one_chunk() {
        let c = chunk("hello world", 256, 32);
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].text, "hello world");
        assert_eq!((c[0].start_line, c[0].end_line), (1, 1));
    }

    #[test]
    fn empty_text_has_no_chunks() {
        assert!(chunk("", 10, 2).is_empty());
        assert!(chunk("  \n\t ", 10, 2).is_empty());
    }

    #[test]
    fn chunks_overlap_by_the_given_tokens() {
        let c = chunk(&words(25), 10, 3);
        // Starts at 0, 7, 14, 21; the last one reaches the end.
        assert_eq!(c.len(), 4);
        assert!(c[0].text.starts_with("w0 ") && c[0].text.ends_with(" w9"));
        assert!(c[1].text.starts_with("w7 ") && c[1].text.ends_with(" w16"));
        assert!(c[3].text.starts_with("w21 ") && c[3].text.ends_with(" w24"));
        for piece in &c {
            assert!(count_tokens(&piece.text) <= 10);
        }
        assert_eq!(
            c.iter().map(|x| x.ordinal).collect::<Vec<_>>(),
            [0, 1, 2, 3]
        );
    }

    #[test]
    fn exact_multiple_does_not_emit_a_tail_of_overlap_only() {
        let c = chunk(&words(10), 10, 3);
        assert_eq!(c.len(), 1);
    }

    #[test]
    fn overlap_at_or_above_size_still_advances() {
        let c = chunk(&words(5), 2, 9);
        assert_eq!(c.len(), 4);
        assert_eq!(c[1].text, "w1 w2");
    }

    #[test]
    fn lines_are_tracked() {
        let text = "alpha beta\ngamma delta\n\nepsilon zeta\neta";
        let c = chunk(text, 3, 1);
        assert_eq!(c[0].text, "alpha beta\ngamma");
        assert_eq!((c[0].start_line, c[0].end_line), (1, 2));
        assert_eq!(c[1].text, "gamma delta\n\nepsilon");
        assert_eq!((c[1].start_line, c[1].end_line), (2, 4));
        assert_eq!((c[2].start_line, c[2].end_line), (4, 5));
    }

    #[test]
    fn cjk_characters_are_tokens() {
        assert_eq!(count_tokens("炉温过高 check F2"), 6);
        let c = chunk("一二三四五六", 4, 1);
        assert_eq!(c.len(), 2);
        assert_eq!(c[0].text, "一二三四");
        assert_eq!(c[1].text, "四五六");
    }

    #[test]
    fn unchanged_text_hashes_the_same() {
        let a = chunk(&words(30), 10, 2);
        let mut changed = words(30);
        changed.push_str(" extra");
        let b = chunk(&changed, 10, 2);
        assert_eq!(a[0].hash, b[0].hash);
        assert_ne!(a.last().map(|c| &c.hash), b.last().map(|c| &c.hash));
        assert_eq!(hash("abc").len(), 64);
    }
}
