//! The frame every page is drawn in, the panel's style sheet, the login form, and how times and
//! lengths are written. Pure: markup in, markup out, every value escaped by maud.

use maud::{DOCTYPE, Markup, html};

/// The panel's one style sheet, served at `/panel.css`: nothing is fetched from elsewhere.
pub const CSS: &str = r#"
/* Text on each colour reads at 4.5:1 or more (WCAG AA): white on the badges, ink on amber. */
:root { color-scheme: light; --ink: #1f2933; --muted: #616e7c; --line: #d9dee4; --bg: #f6f7f9;
  --ok: #1f7a4a; --fail: #c53030; --policy: #f0b429; --cancel: #616e7c; --accent: #2f6fd0; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.45 system-ui, sans-serif; color: var(--ink); background: var(--bg); }
header { display: flex; align-items: center; gap: 20px; padding: 10px 24px; background: #1f2933; color: #fff; }
header a { color: #fff; text-decoration: none; }
header a.here { border-bottom: 2px solid #fff; }
header .brand { font-weight: 600; margin-right: 12px; }
header form { margin-left: auto; }
main { padding: 16px 24px 40px; max-width: 1200px; }
h1 { font-size: 20px; margin: 8px 0 12px; }
h2 { font-size: 16px; margin: 24px 0 8px; }
table { border-collapse: collapse; width: 100%; background: #fff; border: 1px solid var(--line); }
th, td { text-align: left; padding: 6px 10px; border-bottom: 1px solid var(--line); vertical-align: top; }
th { background: #eef1f4; font-weight: 600; font-size: 13px; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
.muted { color: var(--muted); }
.pill { display: inline-block; padding: 1px 8px; border-radius: 10px; font-size: 12px; color: #fff; background: var(--cancel); }
.pill.completed, .pill.ok, .pill.ready, .pill.running, .pill.live { background: var(--ok); }
.pill.failed, .pill.fail, .pill.lost, .pill.gone { background: var(--fail); }
.pill.policy, .pill.warn, .pill.cancelling, .pill.waiting, .pill.draining, .pill.waiting-for-host { background: var(--policy); color: var(--ink); }
.pill.queued { background: var(--accent); }
.notice { padding: 8px 12px; background: #e6f0ff; border: 1px solid #b3cdf5; margin-bottom: 12px; }
ul.tools { margin: 4px 0 0; padding-left: 18px; }
.error { padding: 8px 12px; background: #fde8e8; border: 1px solid #f5b3b3; margin-bottom: 12px; }
dl.facts { display: grid; grid-template-columns: max-content 1fr; gap: 4px 16px; background: #fff; border: 1px solid var(--line); padding: 12px 16px; margin: 0; }
dl.facts dt { color: var(--muted); }
dl.facts dd { margin: 0; }
form.filters { display: flex; gap: 12px; align-items: end; flex-wrap: wrap; margin-bottom: 12px; }
form.filters label { display: flex; flex-direction: column; font-size: 12px; color: var(--muted); }
button { font: inherit; padding: 3px 10px; border: 1px solid #9aa5b1; background: #fff; border-radius: 4px; cursor: pointer; }
button.danger { border-color: var(--fail); color: var(--fail); }
header button { background: transparent; color: #fff; border-color: #9aa5b1; }
pre { white-space: pre-wrap; word-break: break-word; margin: 0; font: 12px/1.4 ui-monospace, monospace; }
ol.transcript { background: #fff; border: 1px solid var(--line); margin: 0; padding: 8px 8px 8px 48px; }
ol.transcript li { padding: 3px 0; border-bottom: 1px solid #eef1f4; }
ol.transcript .kind { font-weight: 600; margin-right: 8px; }
.login { max-width: 360px; margin: 80px auto; background: #fff; border: 1px solid var(--line); padding: 24px; }
.login input { width: 100%; padding: 6px; margin: 8px 0 12px; font: inherit; }
nav.pages { margin-top: 10px; display: flex; gap: 16px; }
p.reload { display: flex; justify-content: flex-end; align-items: center; gap: 12px; margin: 0; font-size: 13px; }
svg { background: #fff; border: 1px solid var(--line); display: block; margin: 4px 0 12px; }
"#;

/// Where a page belongs in the header's links.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Section {
    Queue,
    Runs,
    Pins,
    Health,
}

/// The panel's one script, served at `/panel.js`: it reloads a page that asks for it (`refresh`
/// in [`frame`]) until the reader pauses it.
pub const JS: &str = include_str!("panel.js");

/// A page in the panel's frame, with the header's links and the logout form (which carries the
/// session's CSRF token). With `refresh`, the page reloads itself every so many seconds through
/// the panel's script, under a bar whose button pauses and resumes that; without script it never
/// reloads by itself, and the bar's "Refresh" link is there instead.
pub fn frame(
    title: &str,
    here: Option<Section>,
    csrf: &str,
    refresh: Option<u32>,
    body: &Markup,
) -> Markup {
    let link = |s: Section, href: &str, text: &str| {
        html! { a href=(href) class=[(here == Some(s)).then_some("here")] { (text) } }
    };
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · pi-dispatch" }
                link rel="stylesheet" href="/panel.css";
                @if refresh.is_some() {
                    script src="/panel.js" defer {}
                }
            }
            body {
                header {
                    span.brand { "pi-dispatch" }
                    (link(Section::Queue, "/", "Queue"))
                    (link(Section::Runs, "/runs", "Runs"))
                    (link(Section::Pins, "/pins", "Pins"))
                    (link(Section::Health, "/health", "Health"))
                    form method="post" action="/logout" {
                        input type="hidden" name="csrf" value=(csrf);
                        button type="submit" { "Log out" }
                    }
                }
                main {
                    @if let Some(secs) = refresh {
                        // The script shows the state and the button; a plain reload is the link.
                        p.reload #reload data-every=(secs) {
                            span.reload-state hidden {}
                            button type="button" hidden { "Pause refresh" }
                            a href="" { "Refresh" }
                        }
                    }
                    (body)
                }
            }
        }
    }
}

/// The login form, with why the last try was refused.
pub fn login(refused: Option<&str>) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                title { "Log in · pi-dispatch" }
                link rel="stylesheet" href="/panel.css";
            }
            body {
                form.login method="post" action="/login" {
                    h1 { "pi-dispatch panel" }
                    @if let Some(why) = refused {
                        p.error { (why) }
                    }
                    label for="token" { "The panel's token (PI_PANEL_TOKEN)" }
                    input #token type="password" name="token" autocomplete="current-password" autofocus;
                    button type="submit" { "Log in" }
                }
            }
        }
    }
}

/// Unix milliseconds as a UTC time, to the second.
pub use records::record::utc as when;

/// A length of time, as people say it: `850 ms`, `12.4 s`, `3m 05s`, `2h 10m`.
pub fn took(ms: u64) -> String {
    match ms {
        0..1_000 => format!("{ms} ms"),
        1_000..60_000 => format!("{:.1} s", ms as f64 / 1000.0),
        60_000..3_600_000 => format!("{}m {:02}s", ms / 60_000, ms % 60_000 / 1000),
        _ => format!("{}h {:02}m", ms / 3_600_000, ms % 3_600_000 / 60_000),
    }
}

/// A sum of money in dollars, to the cent, or below a cent to four places.
pub fn dollars(usd: f64) -> String {
    if usd > 0.0 && usd < 0.01 {
        format!("${usd:.4}")
    } else {
        format!("${usd:.2}")
    }
}

/// `n` things, with the noun in the plural unless there is one: `1 turn`, `3 tool calls`.
pub fn count(n: usize, what: &str) -> String {
    if n == 1 {
        format!("1 {what}")
    } else {
        format!("{n} {what}s")
    }
}

/// An outcome, a server state or a check's level as a coloured word.
pub fn pill(word: &str) -> Markup {
    html! { span class={"pill " (word)} { (word) } }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_and_lengths_read_as_people_write_them() {
        assert_eq!(when(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(when(1_796_317_925_000), "2026-12-03 17:12:05 UTC");
        assert_eq!(took(850), "850 ms");
        assert_eq!(took(12_400), "12.4 s");
        assert_eq!(took(185_000), "3m 05s");
        assert_eq!(took(7_800_000), "2h 10m");
        assert_eq!(dollars(0.004), "$0.0040");
        assert_eq!(dollars(1.5), "$1.50");
        assert_eq!(count(1, "turn"), "1 turn");
        assert_eq!(count(0, "tool call"), "0 tool calls");
    }

    #[test]
    fn a_title_with_markup_is_text() {
        let page = frame("<b>x</b>", None, "c\"srf", None, &html! {}).into_string();
        assert!(page.contains("&lt;b&gt;x&lt;/b&gt;"), "{page}");
        assert!(page.contains("value=\"c&quot;srf\""), "{page}");
    }
}
