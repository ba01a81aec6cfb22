//! `/job/mcp.json`: the servers a job connects, as the worker writes them, and the digest by which
//! the job's runner knows that the file is the one written for it.

use crate::json::{self, Json, Object};
use sha2::{Digest, Sha256};

/// Where the image keeps the forge servers' wrappers.
pub const FORGE_GITHUB_COMMAND: &str = "/usr/local/bin/forge-mcp-github";
pub const FORGE_GITLAB_COMMAND: &str = "/usr/local/bin/forge-mcp-gitlab";

/// The forge's own server, as the worker writes it for a job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Forge {
    /// `host`: a GitHub Enterprise Server's address (`https://HOST`, its API at `/api/v3`) for the
    /// server's `GITHUB_HOST`; none for GitHub's own.
    Github { host: Option<String> },
    /// The GitLab API's base (`GITLAB_URL` with `/api/v4`).
    Gitlab { api_url: String },
}

/// The file's text and its digest (sha256, lowercase hex).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobMcpFile {
    pub text: String,
    pub digest: String,
}

impl JobMcpFile {
    /// Writes the file: the named overlay entries exactly as written (references and all), then
    /// the forge entry, and `codemodeModels`.
    pub fn new(
        entries: &[(String, Json)],
        forge: Option<&Forge>,
        codemode_models: bool,
    ) -> JobMcpFile {
        let mut servers: Vec<(String, Json)> = entries.to_vec();
        if let Some(forge) = forge {
            servers.push(("forge".to_owned(), forge_entry(forge)));
        }
        let root = Object::from_members(vec![
            (
                "mcpServers".to_owned(),
                Json::Object(Object::from_members(servers)),
            ),
            ("codemodeModels".to_owned(), Json::Bool(codemode_models)),
        ]);
        let text = json::to_pretty(&Json::Object(root));
        let digest = digest(text.as_bytes());
        JobMcpFile { text, digest }
    }
}

/// The digest a runner compares with its input's ([`crate::job_dir::RunnerInput::mcp_digest`]).
pub fn digest(bytes: &[u8]) -> String {
    crate::ids::hex(Sha256::digest(bytes))
}

fn string(s: &str) -> Json {
    Json::String(s.to_owned())
}

fn forge_entry(forge: &Forge) -> Json {
    let (command, description, env) = match forge {
        Forge::Github { host } => {
            let mut env = vec![(
                "GITHUB_PERSONAL_ACCESS_TOKEN".to_owned(),
                string("${GH_TOKEN}"),
            )];
            if let Some(host) = host {
                env.push(("GITHUB_HOST".to_owned(), string(host)));
            }
            (
                FORGE_GITHUB_COMMAND,
                "GitHub: this repository's issues, pull requests, code and users, with the job's own token",
                env,
            )
        }
        Forge::Gitlab { api_url } => (
            FORGE_GITLAB_COMMAND,
            "GitLab: this project's issues, merge requests and code, with the job's own token",
            vec![
                (
                    "GITLAB_PERSONAL_ACCESS_TOKEN".to_owned(),
                    string("${GITLAB_TOKEN}"),
                ),
                ("GITLAB_API_URL".to_owned(), string(api_url)),
            ],
        ),
    };
    Json::Object(Object::from_members(vec![
        ("type".to_owned(), string("stdio")),
        ("command".to_owned(), string(command)),
        ("env".to_owned(), Json::Object(Object::from_members(env))),
        ("description".to_owned(), string(description)),
    ]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_the_entries_as_written_then_forge_and_a_digest_of_the_bytes() {
        let docs = json::parse(r#"{"url": "https://h.example.com/mcp", "headers": {"Authorization": "Bearer ${DOCS_TOKEN}"}, "description": "Docs"}"#).unwrap();
        let file = JobMcpFile::new(
            &[("docs".to_owned(), docs.clone())],
            Some(&Forge::Github { host: None }),
            true,
        );
        let parsed = json::parse(&file.text).unwrap();
        let servers = parsed
            .as_object()
            .unwrap()
            .get("mcpServers")
            .unwrap()
            .as_object()
            .unwrap();
        assert_eq!(servers.keys().collect::<Vec<_>>(), ["docs", "forge"]);
        assert_eq!(servers.get("docs"), Some(&docs));
        assert!(file.text.contains("${GH_TOKEN}"));
        assert_eq!(file.digest, digest(file.text.as_bytes()));
        assert_eq!(file.digest.len(), 64);
        let other = JobMcpFile::new(&[("docs".to_owned(), docs)], None, true);
        assert_ne!(other.digest, file.digest);
    }
}
