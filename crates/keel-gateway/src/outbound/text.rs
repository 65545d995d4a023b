//! Fitting text into a service's message size.

/// Splits `text` into pieces of at most `max` UTF-16 code units (how
/// Telegram counts; for ASCII, characters), cutting at the last line
/// break, else the last whitespace, within each piece, and mid-word only
/// when a piece has neither. Pieces are trimmed; blank ones are dropped.
pub fn split_text(text: &str, max: usize) -> Vec<String> {
    let max = max.max(1);
    let mut pieces = Vec::new();
    let mut rest = text.trim();
    while !rest.is_empty() {
        let Some(limit) = byte_limit(rest, max) else {
            pieces.push(rest.to_owned());
            break;
        };
        let window = &rest[..limit];
        let cut = window
            .rfind('\n')
            .or_else(|| window.rfind(char::is_whitespace))
            .filter(|&i| i > 0)
            .unwrap_or(limit);
        let piece = rest[..cut].trim();
        if !piece.is_empty() {
            pieces.push(piece.to_owned());
        }
        rest = rest[cut..].trim_start();
    }
    pieces
}

/// The byte index at which `text` exceeds `max` UTF-16 units, or `None`
/// if it fits whole.
fn byte_limit(text: &str, max: usize) -> Option<usize> {
    let mut units = 0;
    for (i, c) in text.char_indices() {
        units += c.len_utf16();
        if units > max {
            return Some(i);
        }
    }
    None
}

/// `text` cut to at most `max` UTF-16 units, with `…` when cut.
pub(crate) fn truncate(text: &str, max: usize) -> String {
    match byte_limit(text, max.saturating_sub(1).max(1)) {
        Some(i) if byte_limit(text, max).is_some() => format!("{}…", &text[..i]),
        _ => text.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_at_line_breaks_then_spaces_then_anywhere() {
        assert_eq!(split_text("short", 10), vec!["short"]);
        assert_eq!(
            split_text("line one\nline two is longer", 12),
            vec!["line one", "line two is", "longer"]
        );
        assert_eq!(split_text("abcdefghij", 4), vec!["abcd", "efgh", "ij"]);
        assert!(split_text("   ", 4).is_empty());
        let long = "word ".repeat(2000);
        let pieces = split_text(&long, 4096);
        assert!(pieces.iter().all(|p| p.encode_utf16().count() <= 4096));
        assert_eq!(pieces.join(" ").split(' ').count(), 2000);
    }

    #[test]
    fn counts_utf16_units_and_never_cuts_inside_a_character() {
        // Each emoji is two UTF-16 units.
        let pieces = split_text(&"😀".repeat(5), 4);
        assert_eq!(pieces, vec!["😀😀", "😀😀", "😀"]);
        assert_eq!(split_text("ééé", 2), vec!["éé", "é"]);
    }

    #[test]
    fn truncates_with_an_ellipsis() {
        assert_eq!(truncate("abcdef", 10), "abcdef");
        assert_eq!(truncate("abcdef", 6), "abcdef");
        assert_eq!(truncate("abcdefg", 6), "abcde…");
    }
}
