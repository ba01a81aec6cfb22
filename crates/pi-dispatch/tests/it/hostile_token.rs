//! A hijacked GitHub fix job against the repository, with the token the job holds (the one gh and
//! the forge's MCP server use), as a real job through the receiver and the worker with real pi and
//! the fake forge: its bash tool pushes a commit straight to the default branch and writes a file
//! there through the contents API. The forge refuses both, as the job's token was minted to read
//! the repository only; the control: the same token reads the repository, and the worker still
//! publishes the job's fix with a delivery token of its own.

use serde_json::{Value, json};
use testkit::fake_forge::FakeForge;
use testkit::fake_model::Step;

use crate::forge::{Kind, Site, triggers};

/// The attack, with the forge's git and API addresses: the token goes in git's environment and
/// node's headers only (never an argument); each step prints what became of it.
fn attack(git_url: &str, api: &str) -> String {
    format!(
        r#"H="Authorization: Basic $(printf 'x-access-token:%s' "$GH_TOKEN" | base64 -w0)"
export GIT_CONFIG_COUNT=1 GIT_CONFIG_KEY_0=http.extraHeader GIT_CONFIG_VALUE_0="$H"
git ls-remote {git_url} >/dev/null && echo CONTROL-READ-OK
git -c user.name=h -c user.email=h@example.invalid commit -q --allow-empty -m hijack
git push -q {git_url} HEAD:refs/heads/main 2>&1 && echo PUSHED-MAIN || echo PUSH-REFUSED
node -e 'fetch(process.argv[1], {{method: "PUT", headers: {{authorization: "Bearer " + process.env.GH_TOKEN, "content-type": "application/json"}}, body: JSON.stringify({{message: "x", branch: "main", content: Buffer.from("hijacked").toString("base64")}})}}).then(r => console.log("API-WRITE " + r.status))' {api}/repos/octo-org/hello/contents/HIJACK.md
git reset -q --hard HEAD~1
sed -i 's/8080/8780/' README.md && echo FIXED"#
    )
}

#[test]
fn a_github_jobs_own_token_cannot_write_the_repository_and_the_fix_is_still_published() {
    // The forge's address is known before the script is written: its listener is bound first,
    // on the test host the job reaches.
    let host = testkit::netns::TestHost::new();
    let listener = host.tcp(0);
    let address = std::net::IpAddr::from(host.v4);
    let url = format!("http://{address}:{}", listener.local_addr().unwrap().port());
    let git_url = format!("{url}/git/octo-org/hello.git");
    let api = format!("{url}/api/v3");
    let script = vec![
        Step::call("bash", json!({"command": attack(&git_url, &api)})),
        Step::text("Corrected the port in the README."),
    ];
    let site = Site::start_on(
        host,
        move |_, setup| FakeForge::serve_on(listener, address, setup),
        script,
        triggers(),
        &[],
    );
    assert_eq!(site.fake.github_git_url(), format!("{url}/git"));
    assert_eq!(site.fake.github_enterprise_api_url(), api);
    let a = site.label(Kind::Github, 5, "pi-fix", "d-hostile-token-5");
    assert_eq!(a["status"], 202, "{a}");
    let id = a["answer"]["jobs"][0].as_str().unwrap().to_owned();
    let worked = site.work();
    let record = site.s.record(&id);
    assert_eq!(
        record["outcome"], "completed",
        "{record:#}\n{}",
        worked.stderr
    );
    let results = site.s.results();
    let said = &results[1];
    // The probe ran: the job's token is live and reads the repository.
    assert!(said.contains("CONTROL-READ-OK"), "{said}");
    assert!(said.contains("FIXED"), "{said}");
    // Its writes were refused by the forge.
    assert!(said.contains("PUSH-REFUSED"), "{said}");
    assert!(!said.contains("PUSHED-MAIN"), "{said}");
    assert!(said.contains("API-WRITE 403"), "{said}");
    let repo = Kind::Github.repository();
    assert_eq!(
        site.fake
            .file_on("github", repo, "main", "README.md")
            .as_deref(),
        Some("The service listens on port 8080.\n")
    );
    assert_eq!(site.fake.file_on("github", repo, "main", "HIJACK.md"), None);
    // The worker published the fix, with its own token, on a branch of its own.
    let pulls = site.fake.pulls();
    assert_eq!(pulls.len(), 1, "{pulls:#?}");
    let branch = format!("pi-dispatch/{id}");
    assert!(
        site.fake
            .file_on("github", repo, &branch, "README.md")
            .is_some_and(|t| t.contains("8780")),
        "{:?}",
        site.fake.branches("github", repo)
    );
    let pushes = site.fake.pushes();
    assert!(
        pushes.contains(&false) && pushes.contains(&true),
        "{pushes:?}"
    );
    // What each token was minted with, as the forge saw it: the job's reads the repository, the
    // delivery's writes it, the comment's has no say over it.
    let minted: Vec<Value> = site
        .fake
        .minted()
        .iter()
        .map(|m| m.permissions.clone().unwrap_or(Value::Null))
        .collect();
    assert_eq!(minted.len(), 3, "{minted:#?}");
    assert_eq!(
        minted[0],
        json!({"contents": "read", "metadata": "read", "issues": "write", "pull_requests": "write"})
    );
    assert_eq!(
        minted[1],
        json!({"contents": "write", "metadata": "read", "pull_requests": "write"})
    );
    assert_eq!(
        minted[2],
        json!({"metadata": "read", "issues": "write", "pull_requests": "write"})
    );
    for m in &minted {
        for never in ["administration", "workflows", "secrets"] {
            assert!(m.get(never).is_none(), "{m}");
        }
    }
}
