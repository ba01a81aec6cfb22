//! References, resolved once each from the runner's environment. A value is text: one starting with
//! `!` is sent as it is, never run (pi would run it). Values live in [`Secret`], whose `Debug` never
//! shows them.

use std::collections::BTreeMap;

use config::mcp::{McpServer, Transport};
use config::reference::{Part, Template};
use protocol::reason::Reason;

use crate::job_file::{ForgeServer, JobServer, Stop};

pub use protocol::secret::Secret;

/// A server with every reference filled in.
#[derive(Debug, Clone, PartialEq)]
pub enum Resolved {
    Http {
        /// The URL with path and query values filled in, percent-encoded.
        url: Secret,
        headers: Vec<(String, Secret)>,
    },
    Stdio {
        command: String,
        args: Vec<Secret>,
        env: Vec<(String, Secret)>,
    },
}

/// Resolves every reference of `server` from `env` (each name looked up once).
pub fn resolve(server: &JobServer, env: &dyn Fn(&str) -> Option<String>) -> Result<Resolved, Stop> {
    let name = server.name();
    let mut values: BTreeMap<String, String> = BTreeMap::new();
    let mut lookup = |var: &str| -> Result<String, Stop> {
        if let Some(v) = values.get(var) {
            return Ok(v.clone());
        }
        match env(var).filter(|v| !v.is_empty()) {
            Some(v) => {
                values.insert(var.to_owned(), v.clone());
                Ok(v)
            }
            None => Err(Stop::new(
                Reason::McpSecretMissing,
                Some(name),
                format!("{var} is not set in the job"),
            )),
        }
    };
    match server {
        JobServer::Overlay(s) => resolve_overlay(s, &mut lookup),
        JobServer::Forge(f) => resolve_forge(f, &mut lookup),
    }
}

fn fill(
    t: &Template,
    lookup: &mut dyn FnMut(&str) -> Result<String, Stop>,
    encode: bool,
) -> Result<String, Stop> {
    let mut out = String::new();
    for part in t.parts() {
        match part {
            Part::Literal(l) => out.push_str(l),
            Part::Ref(r) => {
                let v = lookup(r.name().as_str())?;
                if encode {
                    out.push_str(&percent_encode(&v));
                } else {
                    out.push_str(&v);
                }
            }
        }
    }
    Ok(out)
}

/// Everything but RFC 3986's unreserved characters percent-encoded, so that a value can never change
/// the shape of the URL it is put in (a `/`, `?`, `#` or `@` in a key stays data).
fn percent_encode(v: &str) -> String {
    let mut out = String::new();
    for b in v.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn header_value(server: &str, header: &str, v: String) -> Result<Secret, Stop> {
    // A line break in a value would end the header early: such a value cannot be sent.
    if v.bytes().any(|b| b == b'\r' || b == b'\n' || b == 0) {
        return Err(Stop::new(
            Reason::McpUnavailable,
            Some(server),
            format!("the value for header {header} holds a line break"),
        ));
    }
    Ok(Secret::new(v))
}

fn resolve_overlay(
    s: &McpServer,
    lookup: &mut dyn FnMut(&str) -> Result<String, Stop>,
) -> Result<Resolved, Stop> {
    let name = s.name.as_str();
    match &s.transport {
        Transport::Http(h) => {
            let url = &h.url;
            let mut text = format!("{}://{}", url.scheme().as_str(), url.host());
            if url.port() != url.scheme().default_port() {
                text.push_str(&format!(":{}", url.port()));
            }
            text.push_str(&fill(url.path(), lookup, true)?);
            for (i, q) in url.query().iter().enumerate() {
                let v = lookup(q.value.name().as_str())?;
                text.push(if i == 0 { '?' } else { '&' });
                text.push_str(&format!("{}={}", q.name, percent_encode(&v)));
            }
            let mut headers = Vec::new();
            for header in &h.headers {
                let v = lookup(header.value.name().as_str())?;
                let v = match header.scheme {
                    Some(scheme) => format!("{} {v}", scheme.as_str()),
                    None => v,
                };
                headers.push((header.name.clone(), header_value(name, &header.name, v)?));
            }
            Ok(Resolved::Http {
                url: Secret::new(text),
                headers,
            })
        }
        Transport::Stdio(st) => {
            let args = st
                .args
                .iter()
                .map(|a| fill(a, lookup, false).map(Secret::new))
                .collect::<Result<_, _>>()?;
            let env = st
                .env
                .iter()
                .map(|(k, r)| lookup(r.name().as_str()).map(|v| (k.clone(), Secret::new(v))))
                .collect::<Result<_, _>>()?;
            Ok(Resolved::Stdio {
                command: st.command.as_str().to_owned(),
                args,
                env,
            })
        }
    }
}

fn resolve_forge(
    f: &ForgeServer,
    lookup: &mut dyn FnMut(&str) -> Result<String, Stop>,
) -> Result<Resolved, Stop> {
    let env = f
        .env
        .iter()
        .map(
            |(k, v)| match config::reference::Reference::parse_whole(v) {
                Some(r) => lookup(r.name().as_str()).map(|v| (k.clone(), Secret::new(v))),
                None => Ok((k.clone(), Secret::new(v.clone()))),
            },
        )
        .collect::<Result<_, _>>()?;
    Ok(Resolved::Stdio {
        command: f.command.clone(),
        args: Vec::new(),
        env,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job_file;
    use protocol::job_mcp::{self, Forge, JobMcpFile};

    fn servers(entries: &[(&str, &str)], forge: Option<Forge>) -> Vec<JobServer> {
        let entries: Vec<(String, config::json::Json)> = entries
            .iter()
            .map(|(n, e)| (n.to_string(), config::json::parse(e).unwrap()))
            .collect();
        let file = JobMcpFile::new(&entries, forge.as_ref(), true);
        job_file::read(
            file.text.as_bytes(),
            Some(&job_mcp::digest(file.text.as_bytes())),
        )
        .unwrap()
        .servers
    }

    fn env(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |k| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn fills_headers_urls_args_and_env_as_text() {
        let s = servers(
            &[
                (
                    "docs",
                    r#"{"url": "https://h.example.com/mcp/${KEY}?k=${Q}", "headers": {"Authorization": "Bearer ${T}"}, "description": "d"}"#,
                ),
                (
                    "files",
                    r#"{"command": "node", "args": ["--token=${T}", "plain"], "env": {"X": "${BANG}"}, "description": "d"}"#,
                ),
            ],
            None,
        );
        let vars = env(&[
            ("KEY", "a/b?c"),
            ("Q", "x y"),
            ("T", "tok"),
            ("BANG", "!rm -rf /"),
        ]);
        let Resolved::Http { url, headers } = resolve(&s[0], &vars).unwrap() else {
            panic!()
        };
        assert_eq!(url.expose(), "https://h.example.com/mcp/a%2Fb%3Fc?k=x%20y");
        assert_eq!(headers[0].1.expose(), "Bearer tok");
        let Resolved::Stdio { args, env: e, .. } = resolve(&s[1], &vars).unwrap() else {
            panic!()
        };
        assert_eq!(args[0].expose(), "--token=tok");
        assert_eq!(
            e[0].1.expose(),
            "!rm -rf /",
            "a value starting with ! is text"
        );
    }

    #[test]
    fn a_missing_or_empty_variable_stops_the_job_naming_it_never_its_value() {
        let s = servers(
            &[(
                "docs",
                r#"{"url": "https://h.example.com/mcp", "headers": {"A": "${T}"}, "description": "d"}"#,
            )],
            None,
        );
        for vars in [env(&[]), env(&[("T", "")])] {
            let stop = resolve(&s[0], &vars).unwrap_err();
            assert_eq!(stop.reason, Reason::McpSecretMissing);
            assert_eq!(stop.server.as_deref(), Some("docs"));
            assert!(stop.cause.contains('T'));
        }
        let stop = resolve(&s[0], &env(&[("T", "a\r\nX-Evil: 1")])).unwrap_err();
        assert_eq!(stop.reason, Reason::McpUnavailable);
        assert!(!stop.cause.contains("Evil"));
    }

    #[test]
    fn the_forge_token_is_resolved_and_the_api_address_kept() {
        let s = servers(
            &[],
            Some(Forge::Gitlab {
                api_url: "https://gitlab.example.com/api/v4".into(),
            }),
        );
        let Resolved::Stdio { env: e, .. } =
            resolve(&s[0], &env(&[("GITLAB_TOKEN", "glpat-1")])).unwrap()
        else {
            panic!()
        };
        assert_eq!(e[0].1.expose(), "glpat-1");
        assert_eq!(e[1].1.expose(), "https://gitlab.example.com/api/v4");
    }

    #[test]
    fn secrets_never_show_in_debug() {
        let text = format!("{:?}", Secret::new("cnry-value"));
        assert!(!text.contains("cnry"));
    }
}
