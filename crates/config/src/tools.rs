//! pi's names for MCP tools and the `*` patterns of `run.excludeTools`, shared by the admission
//! (does an exclusion leave a server a way in?) and the job's hub (which tools it withholds).

/// A name as pi writes it into a tool name: every character outside `[A-Za-z0-9_]` becomes `_`.
pub fn pi_name(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// The prefix pi gives every tool of `server`: `mcp__<server>__`.
pub fn mcp_prefix(server: &str) -> String {
    format!("mcp__{}__", pi_name(server))
}

/// The name pi gives `tool` of `server` (before pi's hash suffix for names over 64 characters,
/// which only an exact pattern for such a name would miss).
pub fn mcp_tool_name(server: &str, tool: &str) -> String {
    format!("{}{}", mcp_prefix(server), pi_name(tool))
}

/// `*` matches any run of characters; everything else matches itself.
pub fn glob(pattern: &str, text: &str) -> bool {
    let (p, t): (Vec<char>, Vec<char>) = (pattern.chars().collect(), text.chars().collect());
    let (mut pi, mut ti) = (0, 0);
    let (mut star, mut mark) = (None, 0);
    while ti < t.len() {
        if pi < p.len() && p[pi] != '*' && p[pi] == t[ti] {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some(pi);
            mark = ti;
            pi += 1;
        } else if let Some(s) = star {
            pi = s + 1;
            mark += 1;
            ti = mark;
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|c| *c == '*')
}

/// Whether `exclude` (tool names and `*` patterns) takes away `tool` of `server`.
pub fn excludes(exclude: &[String], server: &str, tool: &str) -> bool {
    let name = mcp_tool_name(server, tool);
    exclude.iter().any(|p| glob(p, &name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_patterns_follow_pi() {
        assert_eq!(
            mcp_tool_name("my-docs", "get.page"),
            "mcp__my_docs__get_page"
        );
        assert!(glob("mcp__docs__*", "mcp__docs__search"));
        assert!(glob("*search", "mcp__docs__search"));
        assert!(!glob("mcp__docs__*", "mcp__docs2__search"));
        assert!(!glob("search", "mcp__docs__search"));
        let exclude = vec!["mcp__docs__delete_*".to_owned(), "bash".to_owned()];
        assert!(excludes(&exclude, "docs", "delete_page"));
        assert!(!excludes(&exclude, "docs", "search"));
        assert!(!excludes(&exclude, "other", "delete_page"));
    }
}
