//! Whether a trigger's `run.excludeTools` leaves a server's tools a way in: pi's tool names and
//! `*` patterns against each route pi has to a tool (declared directly, loaded by `tool_search`,
//! called from a `codemode` script).

use config::mcp::{Exposure, McpServer};

/// How a server's tools can be reached, for judging `excludeTools`.
pub(crate) struct Routes {
    /// `mcp__<server>__`, as pi writes it (characters outside `[A-Za-z0-9_]` become `_`).
    prefix: String,
    /// The exposure of tools no exact `toolExposure` name covers (none when a `*` entry takes all).
    default: Vec<Exposure>,
    /// Tools named exactly in `toolExposure`, as pi names them, with their exposure.
    named: Vec<(String, Exposure)>,
}

use config::tools::{glob, mcp_prefix, pi_name};

impl Routes {
    pub(crate) fn new(
        server: &str,
        exposure: Exposure,
        tool_exposure: &[(String, Exposure)],
    ) -> Routes {
        let prefix = mcp_prefix(server);
        let mut default = Vec::new();
        let mut named = Vec::new();
        for (key, e) in tool_exposure {
            if key.contains('*') {
                default.push(*e);
            } else {
                named.push((format!("{prefix}{}", pi_name(key)), *e));
            }
        }
        if !tool_exposure.iter().any(|(k, _)| k == "*") {
            default.push(exposure);
        }
        Routes {
            prefix,
            default,
            named,
        }
    }

    fn of(server: &McpServer) -> Routes {
        Routes::new(
            server.name.as_str(),
            server.exposure.unwrap_or(Exposure::Codemode),
            &server.tool_exposure,
        )
    }

    /// Whether any route to a tool survives `exclude` (pi tool names and `*` patterns).
    pub(crate) fn way_in(&self, exclude: &[String]) -> bool {
        if exclude.iter().any(|p| covers_every_tool(p, &self.prefix)) {
            return false;
        }
        let open = |tool: &str| !exclude.iter().any(|p| glob(p, tool));
        let (codemode, search) = (open("codemode"), open("tool_search"));
        let reachable = |e: &Exposure| match e {
            Exposure::Direct => true,
            Exposure::Deferred => search,
            Exposure::Codemode => codemode || search,
            Exposure::Hidden => false,
        };
        self.default.iter().any(reachable)
            || self
                .named
                .iter()
                .any(|(tool, e)| open(tool) && reachable(e))
    }
}

/// Whether any route to the server's tools survives `exclude`.
pub fn has_way_in(server: &McpServer, exclude: &[String]) -> bool {
    Routes::of(server).way_in(exclude)
}

/// Whether `pattern` matches every tool name starting with `prefix`: it ends in `*`, and what comes
/// before that star matches some start of `prefix` (the star then takes the rest of any name).
fn covers_every_tool(pattern: &str, prefix: &str) -> bool {
    pattern.strip_suffix('*').is_some_and(|head| {
        (0..=prefix.len()).any(|k| prefix.is_char_boundary(k) && glob(head, &prefix[..k]))
    })
}
