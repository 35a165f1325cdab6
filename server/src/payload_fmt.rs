//! Payloads as operators read them: `sepp job` and the admin UI's job page.

use std::fmt::Write as _;

/// A one-line preview of a payload's bytes. UTF-8 text is shown as it is, its control
/// characters escaped (`\n`, `\u{1b}`) so that it stays on one line, cut after `max_chars`
/// characters with the full size stated (`… (2048 bytes in all)`). Other bytes are shown as
/// their size and, in hex, as many of the first ones as fit in `max_chars`.
pub fn preview(data: &[u8], max_chars: usize) -> String {
    match std::str::from_utf8(data) {
        Ok(text) => {
            let mut out = String::new();
            let mut chars = text.chars();
            for c in chars.by_ref().take(max_chars) {
                if c.is_control() {
                    out.extend(c.escape_default());
                } else {
                    out.push(c);
                }
            }
            if chars.next().is_some() {
                let _ = write!(out, "… ({} bytes in all)", data.len());
            }
            out
        }
        Err(_) => {
            let shown = data.len().min(max_chars / 2);
            let mut out = format!("{} bytes, not UTF-8, hex: ", data.len());
            for b in &data[..shown] {
                let _ = write!(out, "{b:02x}");
            }
            if shown < data.len() {
                out.push('…');
            }
            out
        }
    }
}

#[cfg(test)]
mod tests {
    use super::preview;

    #[test]
    fn short_text_is_shown_whole_and_on_one_line() {
        assert_eq!(preview(b"{\"n\": 7}", 100), "{\"n\": 7}");
        assert_eq!(preview(b"a\nb\tc\x1b", 100), "a\\nb\\tc\\u{1b}");
        assert_eq!(
            preview("grüße".as_bytes(), 5),
            "grüße",
            "counted in characters"
        );
    }

    #[test]
    fn long_text_is_cut_at_a_character_with_its_full_size() {
        let text = "é".repeat(300);
        let p = preview(text.as_bytes(), 100);
        assert_eq!(p, format!("{}… (600 bytes in all)", "é".repeat(100)));
    }

    #[test]
    fn other_bytes_show_their_size_and_the_first_ones_in_hex() {
        assert_eq!(
            preview(&[0xff, 0x00, 0x10], 100),
            "3 bytes, not UTF-8, hex: ff0010"
        );
        let data: Vec<u8> = (0..=255).collect();
        let p = preview(&data[128..], 8);
        assert_eq!(p, "128 bytes, not UTF-8, hex: 80818283…");
    }
}
