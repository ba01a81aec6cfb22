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

/// The text, made inert.
pub fn markdown(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 16);
    for (i, line) in text.split('\n').enumerate() {
        if i > 0 {
            out.push('\n');
        }
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
