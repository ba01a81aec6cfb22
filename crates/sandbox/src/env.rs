//! The job's environment: a closed map, built from its parts in a fixed order. Pure.
//!
//! The order is the product's: base `PI_*` settings, the provider's key under pi's own variable
//! name, the `PI_FORWARD_ENV` names (values from the worker's environment), the `run.secrets`
//! values, the proxy variables (both spellings, and Node's switch for them), `HOME`, then the worker's computed values and the forge token. A
//! name set again by a later part takes the later value (and the later place), so nothing an
//! operator lists early can replace what the worker sets after it. An empty value is left out: it
//! neither sets a variable nor clears one set before.
//!
//! Every value is held as a [`Secret`], so the map's `Debug` shows names only.

use std::fmt;

use crate::secrets::Secret;

/// The job's id.
pub const JOB_ID: &str = "PI_JOB_ID";

/// The variable that tells pi to stay off the network for its own checks.
pub const OFFLINE: &str = "PI_OFFLINE";

/// The variable without which Node 22 does not read the proxy variables for `fetch`.
pub const NODE_USE_ENV_PROXY: &str = "NODE_USE_ENV_PROXY";

/// The parts of a job's environment, in the order they are applied.
#[derive(Debug, Clone, Copy)]
pub struct Parts<'a> {
    pub job_id: &'a str,
    pub provider: Option<&'a str>,
    pub model: Option<&'a str>,
    /// Further base settings, each named `PI_*` (applied before the four above).
    pub settings: &'a [(String, String)],
    /// The provider's key: one of the variables pi reads for `provider` (or the one the overlay's
    /// `models.json` names for it, in `models_keys`), and its value.
    pub provider_key: Option<(&'a str, &'a Secret)>,
    /// The variables the overlay's `models.json` names as `provider`'s `apiKey`.
    pub models_keys: &'a [String],
    /// `PI_FORWARD_ENV`: names whose values come from the worker's environment.
    pub forward_env: &'a [String],
    /// `run.secrets`, resolved.
    pub secrets: &'a [(String, Secret)],
    pub proxy: Option<&'a Proxy>,
    pub home: &'a str,
    /// Values the worker computes for the job (`PATH` for the image, ...).
    pub computed: &'a [(String, String)],
    pub forge: Option<&'a ForgeToken>,
}

impl<'a> Parts<'a> {
    /// The parts of job `job_id` with `home` and nothing else: no provider, key, secret, proxy,
    /// forge token, or computed value.
    pub fn new(job_id: &'a str, home: &'a str) -> Parts<'a> {
        Parts {
            job_id,
            provider: None,
            model: None,
            settings: &[],
            provider_key: None,
            models_keys: &[],
            forward_env: &[],
            secrets: &[],
            proxy: None,
            home,
            computed: &[],
            forge: None,
        }
    }
}

/// The egress proxy's variables: `HTTPS_PROXY`, `HTTP_PROXY` and `NO_PROXY`, each also in
/// lowercase, and `NODE_USE_ENV_PROXY=1` when there is a proxy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Proxy {
    pub https: String,
    pub http: String,
    pub no_proxy: String,
}

/// The forge token the worker minted for the job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ForgeToken {
    /// `GITHUB_TOKEN` and `GH_TOKEN`.
    Github(Secret),
    /// `GITLAB_TOKEN` and `GL_TOKEN`, with `GITLAB_HOST`.
    Gitlab { token: Secret, host: String },
}

/// A job's environment: names in order, each once, every value hidden from `Debug`. No name is
/// empty or holds `=`, and no value is empty or holds a NUL byte.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct JobEnv {
    vars: Vec<(String, Secret)>,
}

impl JobEnv {
    /// The names and values, in order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Secret)> {
        self.vars.iter().map(|(n, v)| (n.as_str(), v))
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.vars.iter().map(|(n, _)| n.as_str())
    }

    pub fn get(&self, name: &str) -> Option<&Secret> {
        self.vars.iter().find(|(n, _)| n == name).map(|(_, v)| v)
    }

    pub fn len(&self) -> usize {
        self.vars.len()
    }

    pub fn is_empty(&self) -> bool {
        self.vars.is_empty()
    }

    /// Sets `name`, a later value replacing an earlier one and taking its place at the end; an
    /// empty value is left out.
    fn set(&mut self, name: &str, value: Secret) -> Result<(), EnvError> {
        if !config::dotenv::is_variable_name(name) {
            return Err(EnvError::BadName {
                name: name.escape_debug().to_string(),
            });
        }
        if value.is_empty() {
            return Ok(());
        }
        if value.expose().contains('\0') {
            return Err(EnvError::BadValue {
                name: name.to_owned(),
            });
        }
        self.vars.retain(|(n, _)| n != name);
        self.vars.push((name.to_owned(), value));
        Ok(())
    }
}

impl fmt::Debug for JobEnv {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.debug_map()
            .entries(self.vars.iter().map(|(n, v)| (n, v)))
            .finish()
    }
}

/// A part that cannot go into an environment. Names the variable, never its value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvError {
    #[error("{name} is not a variable name (letters, digits and '_', not starting with a digit)")]
    BadName { name: String },
    #[error("the value of {name} holds a NUL byte, which no environment can carry")]
    BadValue { name: String },
    #[error("{name} is a base setting of the job and must start with PI_")]
    NotASetting { name: String },
    #[error("{name} is not a key variable pi reads for provider {provider}")]
    NotAProviderKey { name: String, provider: String },
}

/// Builds the job's environment from its parts; `host` gives the worker's own variables (for
/// `PI_FORWARD_ENV`).
pub fn build(parts: &Parts, host: &dyn Fn(&str) -> Option<String>) -> Result<JobEnv, EnvError> {
    let mut env = JobEnv::default();
    let plain = |v: &str| Secret::new(v);

    for (name, value) in parts.settings {
        if !name.starts_with("PI_") {
            return Err(EnvError::NotASetting { name: name.clone() });
        }
        env.set(name, plain(value))?;
    }
    env.set(JOB_ID, plain(parts.job_id))?;
    if let Some(provider) = parts.provider {
        env.set("PI_PROVIDER", plain(provider))?;
    }
    if let Some(model) = parts.model {
        env.set("PI_MODEL", plain(model))?;
    }
    env.set(OFFLINE, plain("1"))?;

    if let Some((name, value)) = parts.provider_key {
        let provider = parts.provider.unwrap_or_default();
        if !is_provider_key(provider, name) && !parts.models_keys.iter().any(|k| k == name) {
            return Err(EnvError::NotAProviderKey {
                name: name.to_owned(),
                provider: provider.to_owned(),
            });
        }
        env.set(name, value.clone())?;
    }

    for name in parts.forward_env {
        if let Some(value) = host(name) {
            env.set(name, Secret::new(value))?;
        }
    }

    for (name, value) in parts.secrets {
        env.set(name, value.clone())?;
    }

    if let Some(proxy) = parts.proxy {
        // Both spellings: curl and wget read only the lowercase one for some schemes, and Node 22's
        // fetch reads them at all only with NODE_USE_ENV_PROXY.
        for (upper, lower, value) in [
            ("HTTPS_PROXY", "https_proxy", &proxy.https),
            ("HTTP_PROXY", "http_proxy", &proxy.http),
            ("NO_PROXY", "no_proxy", &proxy.no_proxy),
        ] {
            env.set(upper, plain(value))?;
            env.set(lower, plain(value))?;
        }
        if !proxy.https.is_empty() || !proxy.http.is_empty() {
            env.set(NODE_USE_ENV_PROXY, plain("1"))?;
        }
    }

    env.set("HOME", plain(parts.home))?;

    for (name, value) in parts.computed {
        env.set(name, plain(value))?;
    }

    match parts.forge {
        Some(ForgeToken::Github(token)) => {
            env.set("GITHUB_TOKEN", token.clone())?;
            env.set("GH_TOKEN", token.clone())?;
        }
        Some(ForgeToken::Gitlab { token, host }) => {
            env.set("GITLAB_TOKEN", token.clone())?;
            env.set("GL_TOKEN", token.clone())?;
            env.set("GITLAB_HOST", plain(host))?;
        }
        None => {}
    }
    Ok(env)
}

/// Whether pi reads `name` for `provider`'s key (the pickup's table of pi's variables).
fn is_provider_key(provider: &str, name: &str) -> bool {
    config::providers::is_key_of(provider, name)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CANARY: &str = "cnry-7f3a";

    fn parts<'a>(
        key: &'a Secret,
        secrets: &'a [(String, Secret)],
        proxy: &'a Proxy,
        forge: &'a ForgeToken,
        forward: &'a [String],
        computed: &'a [(String, String)],
    ) -> Parts<'a> {
        Parts {
            job_id: "job-1",
            provider: Some("openai"),
            model: Some("gpt-x"),
            settings: &[],
            provider_key: Some(("OPENAI_API_KEY", key)),
            models_keys: &[],
            forward_env: forward,
            secrets,
            proxy: Some(proxy),
            home: "/tmp/home",
            computed,
            forge: Some(forge),
        }
    }

    fn host(name: &str) -> Option<String> {
        match name {
            "DOCS_URL" => Some("https://docs.example".into()),
            "EMPTY" => Some(String::new()),
            "HOME" => Some("/root".into()),
            "GITHUB_TOKEN" => Some("operator-token".into()),
            _ => None,
        }
    }

    #[test]
    fn the_parts_go_in_their_order() {
        let key = Secret::new("sk-key");
        let secrets = vec![("DOCS_TOKEN".to_owned(), Secret::new("docs"))];
        let proxy = Proxy {
            https: "http://127.0.0.1:3128".into(),
            http: "http://127.0.0.1:3128".into(),
            no_proxy: "localhost,127.0.0.1".into(),
        };
        let forge = ForgeToken::Github(Secret::new("ghs_token"));
        let forward = vec![
            "DOCS_URL".to_owned(),
            "EMPTY".to_owned(),
            "UNSET".to_owned(),
        ];
        let computed = vec![
            (
                "PATH".to_owned(),
                "/opt/pi-dispatch-image/bin:/usr/bin".to_owned(),
            ),
            ("PI_DISPATCH_MCP_DIGEST".to_owned(), "abc".to_owned()),
        ];
        let env = build(
            &parts(&key, &secrets, &proxy, &forge, &forward, &computed),
            &host,
        )
        .unwrap();
        let names: Vec<&str> = env.names().collect();
        assert_eq!(
            names,
            [
                "PI_JOB_ID",
                "PI_PROVIDER",
                "PI_MODEL",
                "PI_OFFLINE",
                "OPENAI_API_KEY",
                "DOCS_URL",
                "DOCS_TOKEN",
                "HTTPS_PROXY",
                "https_proxy",
                "HTTP_PROXY",
                "http_proxy",
                "NO_PROXY",
                "no_proxy",
                "NODE_USE_ENV_PROXY",
                "HOME",
                "PATH",
                "PI_DISPATCH_MCP_DIGEST",
                "GITHUB_TOKEN",
                "GH_TOKEN",
            ]
        );
        assert_eq!(env.get("PI_OFFLINE").unwrap().expose(), "1");
        assert_eq!(env.get("OPENAI_API_KEY").unwrap().expose(), "sk-key");
        assert_eq!(env.get("GH_TOKEN").unwrap().expose(), "ghs_token");
        assert_eq!(env.get("HOME").unwrap().expose(), "/tmp/home");
    }

    #[test]
    fn an_early_operator_list_never_overrides_a_later_part() {
        let key = Secret::new("sk-key");
        // A secret and forwarded names that try to take the worker's variables.
        let secrets = vec![
            ("HTTPS_PROXY".to_owned(), Secret::new("http://evil")),
            ("http_proxy".to_owned(), Secret::new("http://evil")),
            ("NODE_USE_ENV_PROXY".to_owned(), Secret::new("0")),
            ("PI_JOB_ID".to_owned(), Secret::new("from-secret")),
        ];
        let proxy = Proxy {
            https: "http://proxy".into(),
            http: "http://proxy".into(),
            no_proxy: "localhost".into(),
        };
        let forge = ForgeToken::Github(Secret::new("minted"));
        let forward = vec!["HOME".to_owned(), "GITHUB_TOKEN".to_owned()];
        let computed = vec![("PATH".to_owned(), "/usr/bin".to_owned())];
        let env = build(
            &parts(&key, &secrets, &proxy, &forge, &forward, &computed),
            &host,
        )
        .unwrap();
        assert_eq!(env.get("HTTPS_PROXY").unwrap().expose(), "http://proxy");
        assert_eq!(env.get("http_proxy").unwrap().expose(), "http://proxy");
        assert_eq!(env.get("NODE_USE_ENV_PROXY").unwrap().expose(), "1");
        assert_eq!(env.get("HOME").unwrap().expose(), "/tmp/home");
        assert_eq!(env.get("GITHUB_TOKEN").unwrap().expose(), "minted");
        // A later part wins over an earlier one, and each name is there once.
        assert_eq!(env.get("PI_JOB_ID").unwrap().expose(), "from-secret");
        let mut names: Vec<&str> = env.names().collect();
        let all = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), all);
    }

    #[test]
    fn empty_values_are_left_out() {
        let empty = Secret::new("");
        let secrets = vec![("DOCS_TOKEN".to_owned(), Secret::new(""))];
        let proxy = Proxy {
            https: String::new(),
            http: String::new(),
            no_proxy: String::new(),
        };
        let forge = ForgeToken::Gitlab {
            token: Secret::new("glpat"),
            host: String::new(),
        };
        let forward = vec!["EMPTY".to_owned()];
        let env = build(
            &Parts {
                model: None,
                ..parts(&empty, &secrets, &proxy, &forge, &forward, &[])
            },
            &host,
        )
        .unwrap();
        let names: Vec<&str> = env.names().collect();
        assert_eq!(
            names,
            [
                "PI_JOB_ID",
                "PI_PROVIDER",
                "PI_OFFLINE",
                "HOME",
                "GITLAB_TOKEN",
                "GL_TOKEN"
            ]
        );
        assert!(env.iter().all(|(_, v)| !v.is_empty()));
    }

    #[test]
    fn debug_shows_names_never_values() {
        let key = Secret::new(format!("{CANARY}-key"));
        let secrets = vec![("DOCS_TOKEN".to_owned(), Secret::new(format!("{CANARY}-s")))];
        let proxy = Proxy {
            https: format!("http://{CANARY}"),
            http: String::new(),
            no_proxy: String::new(),
        };
        let forge = ForgeToken::Github(Secret::new(format!("{CANARY}-forge")));
        let computed = vec![("PATH".to_owned(), format!("/{CANARY}"))];
        let env = build(
            &parts(&key, &secrets, &proxy, &forge, &[], &computed),
            &|_| Some(format!("{CANARY}-host")),
        )
        .unwrap();
        let shown = format!("{env:?} {env:#?}");
        assert!(!shown.contains(CANARY), "{shown}");
        assert!(shown.contains("DOCS_TOKEN") && shown.contains("GH_TOKEN"));
        // The values are there all the same.
        assert!(
            env.iter()
                .filter(|(_, v)| v.expose().contains(CANARY))
                .count()
                >= 5
        );
    }

    #[test]
    fn refusals_name_the_variable_never_the_value() {
        let key = Secret::new("k");
        let bad_value = vec![("DOCS_TOKEN".to_owned(), Secret::new(format!("a\0{CANARY}")))];
        let proxy = Proxy {
            https: String::new(),
            http: String::new(),
            no_proxy: String::new(),
        };
        let forge = ForgeToken::Github(Secret::new("t"));
        let p = parts(&key, &bad_value, &proxy, &forge, &[], &[]);
        let e = build(&p, &host).unwrap_err();
        assert_eq!(
            e,
            EnvError::BadValue {
                name: "DOCS_TOKEN".into()
            }
        );
        assert!(!e.to_string().contains(CANARY));

        let bad_name = vec![("A=B".to_owned(), Secret::new("v"))];
        let p = parts(&key, &bad_name, &proxy, &forge, &[], &[]);
        assert!(matches!(build(&p, &host), Err(EnvError::BadName { .. })));

        let wrong_key = Parts {
            provider_key: Some(("ANTHROPIC_API_KEY", &key)),
            ..parts(&key, &[], &proxy, &forge, &[], &[])
        };
        assert_eq!(
            build(&wrong_key, &host).unwrap_err(),
            EnvError::NotAProviderKey {
                name: "ANTHROPIC_API_KEY".into(),
                provider: "openai".into()
            }
        );
        // A custom provider's key is the variable the overlay's models.json names for it.
        let named = vec!["FAKE_API_KEY".to_owned()];
        let custom = Parts {
            provider: Some("fake"),
            provider_key: Some(("FAKE_API_KEY", &key)),
            models_keys: &named,
            ..parts(&key, &[], &proxy, &forge, &[], &[])
        };
        assert_eq!(
            build(&custom, &host).unwrap().get("FAKE_API_KEY"),
            Some(&key)
        );

        let settings = vec![("NODE_OPTIONS".to_owned(), "x".to_owned())];
        let not_setting = Parts {
            settings: &settings,
            ..parts(&key, &[], &proxy, &forge, &[], &[])
        };
        assert!(matches!(
            build(&not_setting, &host),
            Err(EnvError::NotASetting { .. })
        ));
    }
}
