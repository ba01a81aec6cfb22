//! What the bot posts (a comment, a pull or merge request's text) made inert, and still read as
//! written. The text is the agent's final message, which a hostile issue can dictate, and the forge
//! acts on some text with the bot's rights:
//!
//! - a line starting with `/` is a GitLab quick action (`/merge`, `/approve`, `/label ~pi-fix`,
//!   which may start another job) and a slash command to bots that watch GitHub comments: the `/`
//!   gets a Markdown backslash before it, which renders as the same `/` and starts no command;
//! - `@all`, `@here`, `@channel`, `@everyone` and team mentions (`@org/team`) notify many people
//!   at once: a zero-width space after the `@` keeps the text and drops the notification;
//! - an HTML comment (`<!--`) is hidden on the page, and the worker marks its own comments with one:
//!   its `<` is written as `&lt;`, so the comment shows and no text can pass for a mark.
//!
//! Pure.

/// The text, made inert. A line ends at LF, CR or CRLF alike, as CommonMark ends one, and each
/// ending is written as the text had it.
pub fn markdown(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 16);
    for (ending, line) in lines(text) {
        out.push_str(ending);
        let indent = line.len() - line.trim_start_matches([' ', '\t']).len();
        let (lead, rest) = line.split_at(indent);
        out.push_str(lead);
        if rest.starts_with('/') {
            out.push('\\');
        }
        push_line(&mut out, rest);
    }
    out
}

/// The lines of `text`, each with the line ending before it (empty for the first): LF, CR or CRLF.
fn lines(text: &str) -> Vec<(&str, &str)> {
    let mut out = Vec::new();
    let mut ending = "";
    let mut rest = text;
    loop {
        match rest.find(['\r', '\n']) {
            None => {
                out.push((ending, rest));
                return out;
            }
            Some(at) => {
                out.push((ending, &rest[..at]));
                let len = if rest[at..].starts_with("\r\n") { 2 } else { 1 };
                ending = &rest[at..at + len];
                rest = &rest[at + len..];
            }
        }
    }
}

/// Text a stranger wrote (an issue, a comment) as it goes into the agent's prompt: every line
/// ending (CR, CRLF) as LF; control characters but LF and tab, and the invisible characters that
/// reorder or hide text (bidirectional overrides and isolates, zero-width ones), written as
/// `\u{…}` escapes, so the agent reads what a person sees, and no terminal that shows the prompt
/// acts on it.
pub fn prompt_text(text: &str) -> String {
    let text = text.replace("\r\n", "\n").replace('\r', "\n");
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        let hidden = matches!(c,
            '\u{200B}'..='\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2060}'..='\u{2069}' | '\u{FEFF}');
        if (c.is_control() && !matches!(c, '\n' | '\t')) || hidden {
            out.push_str(&format!("\\u{{{:x}}}", u32::from(c)));
        } else {
            out.push(c);
        }
    }
    out
}

/// The words that notify everyone a forge can reach.
const EVERYONE: [&str; 4] = ["all", "here", "channel", "everyone"];

const ZERO_WIDTH_SPACE: char = '\u{200B}';

fn is_name(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '-' || c == '_'
}

/// One line: mass mentions and HTML comments defused.
fn push_line(out: &mut String, line: &str) {
    let mut previous: Option<char> = None;
    for (at, c) in line.char_indices() {
        let rest = &line[at..];
        if c == '<' && rest.starts_with("<!--") {
            out.push_str("&lt;");
            previous = Some(c);
            continue;
        }
        out.push(c);
        if c == '@' && !previous.is_some_and(is_name) {
            let after = &rest[1..];
            let name: String = after.chars().take_while(|c| is_name(*c)).collect();
            let team = after[name.len()..].starts_with('/') && !name.is_empty();
            if team || EVERYONE.contains(&name.to_ascii_lowercase().as_str()) {
                out.push(ZERO_WIDTH_SPACE);
            }
        }
        previous = Some(c);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_ends_at_cr_crlf_and_lf_alike() {
        let text = "ok\r/close\r\n/merge\n/approve\r";
        let inert = markdown(text);
        assert_eq!(inert, "ok\r\\/close\r\n\\/merge\n\\/approve\r");
        // No line, however it ends, starts with a command.
        assert!(
            inert
                .split(['\r', '\n'])
                .all(|l| !l.trim_start().starts_with('/'))
        );
    }

    #[test]
    fn what_a_stranger_wrote_reaches_the_prompt_escaped_where_it_is_invisible() {
        let text = "title \u{1b}[31mred\u{1b}[0m and \u{202E}txt.exe\u{202C}\nline\ttab\r";
        assert_eq!(
            prompt_text(text),
            "title \\u{1b}[31mred\\u{1b}[0m and \\u{202e}txt.exe\\u{202c}\nline\ttab\n"
        );
        assert_eq!(prompt_text("plain, kept"), "plain, kept");
    }

    #[test]
    fn quick_actions_and_slash_commands_are_shown_not_run() {
        let text = "The fix is ready.\n/label ~pi-fix\n  /merge\n/approve\nSee a/b and http://x/y.";
        let inert = markdown(text);
        assert_eq!(
            inert,
            "The fix is ready.\n\\/label ~pi-fix\n  \\/merge\n\\/approve\nSee a/b and http://x/y."
        );
        // No line starts with a command any more, with or without its indent.
        assert!(inert.lines().all(|l| !l.trim_start().starts_with('/')));
        // Text with nothing to defuse is left as it is.
        let plain = "Nothing here:\n- a list\n\n```\ncode\n```";
        assert_eq!(markdown(plain), plain);
    }

    #[test]
    fn mass_mentions_and_comments_are_defused() {
        let inert = markdown("cc @all @Here @org/team-x, thanks @alice (mail me@all.example)");
        assert_eq!(
            inert,
            "cc @\u{200B}all @\u{200B}Here @\u{200B}org/team-x, thanks @alice (mail me@all.example)"
        );
        let marked = markdown("done <!-- pi-dispatch job other-job -->");
        assert_eq!(marked, "done &lt;!-- pi-dispatch job other-job -->");
        assert!(!protocol::forge_event::is_worker_comment(&marked));
    }
}
