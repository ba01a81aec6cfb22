//! The names a forge event carries that the worker builds URLs and paths from (the repository,
//! its branches, the item's number, the installation), held to the forge's own grammar. A name
//! outside it is refused where the event comes in (the receiver's `bad-payload`) and again at
//! admission (a job saved or queued before), so no later step builds anything from it.

use crate::forge_event::{Forge, ForgeEvent};

/// The field of an event that is not one the forge makes, as a message names it (never its
/// value).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the event's {0} is not one the forge makes")]
pub struct Invalid(pub &'static str);

/// A GitHub account: 1 to 39 letters, digits and single hyphens, neither first nor last.
fn github_owner(owner: &str) -> bool {
    (1..=39).contains(&owner.len())
        && owner
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        && !owner.starts_with('-')
        && !owner.ends_with('-')
        && !owner.contains("--")
}

/// A repository's own name (GitHub's, or one segment of a GitLab path): 1 to 100 letters,
/// digits, `.`, `_` and `-`, not beginning with `-`, never `.` or `..`, not ending in `.git` or
/// `.atom`.
fn segment(name: &str) -> bool {
    (1..=100).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        && !name.starts_with('-')
        && name != "."
        && name != ".."
        && !name.ends_with(".git")
        && !name.ends_with(".atom")
}

/// `owner/name` on GitHub; `group/…/project` on GitLab (2 to 20 segments, at most 255 bytes).
pub fn is_repository(forge: Forge, path: &str) -> bool {
    match forge {
        Forge::Github => path
            .split_once('/')
            .is_some_and(|(owner, name)| github_owner(owner) && segment(name)),
        Forge::Gitlab => {
            let parts: Vec<&str> = path.split('/').collect();
            path.len() <= 255 && (2..=20).contains(&parts.len()) && parts.iter().all(|p| segment(p))
        }
    }
}

/// A branch name as git takes one (`git check-ref-format --branch`): no control character, space,
/// `~ ^ : ? * [ \`, no `..`, `@{` or `//`, not `@`, neither beginning with `-`, `/` or `.` nor
/// ending with `/`, `.` or `.lock`, no component beginning with `.`; at most 255 bytes.
pub fn is_branch(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 255
        && name != "@"
        && !name.bytes().any(|b| {
            b.is_ascii_control()
                || b == 0x7f
                || matches!(b, b' ' | b'~' | b'^' | b':' | b'?' | b'*' | b'[' | b'\\')
        })
        && !name.contains("..")
        && !name.contains("@{")
        && !name.contains("//")
        && !name.starts_with(['-', '/'])
        && !name.ends_with(['/', '.'])
        && !name.ends_with(".lock")
        && !name
            .split('/')
            .any(|c| c.starts_with('.') || c.ends_with(".lock"))
}

/// Holds `event` to its forge's grammar: the repository, its default branch, a pull request's
/// head branch, and numbers above zero (the item, the repository, the installation).
pub fn check(event: &ForgeEvent) -> Result<(), Invalid> {
    let repository = match event.forge {
        Forge::Github => "repository.full_name",
        Forge::Gitlab => "project.path_with_namespace",
    };
    if !is_repository(event.forge, &event.repository) {
        return Err(Invalid(repository));
    }
    if !is_branch(&event.default_branch) {
        return Err(Invalid("default branch"));
    }
    if let Some(head) = &event.head
        && !is_branch(&head.branch)
    {
        return Err(Invalid("head branch"));
    }
    if event.number == 0 {
        return Err(Invalid("item number"));
    }
    if event.repository_id == 0 {
        return Err(Invalid("repository id"));
    }
    if event.installation == Some(0) {
        return Err(Invalid("installation id"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repositories_are_the_forges_own_names() {
        for good in [
            "octo-org/hello-world",
            "a/b",
            "user1/repo.name_2",
            "o/.github",
        ] {
            assert!(is_repository(Forge::Github, good), "{good}");
        }
        for bad in [
            "octo-org/hello-world/../../../app/installations",
            "../../octo-org/hello-world",
            "octo-org/hello\nworld",
            "octo-org",
            "-octo/x",
            "octo--org/x",
            "octo/..",
            "octo/.",
            "octo/x y",
            "octo/x%2F..",
            "octo/x.git",
            "",
        ] {
            assert!(!is_repository(Forge::Github, bad), "{bad:?}");
        }
        assert!(is_repository(Forge::Gitlab, "group/sub/hello"));
        for bad in [
            "hello",
            "group/../x",
            "group//x",
            "group/sub/x\r",
            "group/sub/",
        ] {
            assert!(!is_repository(Forge::Gitlab, bad), "{bad:?}");
        }
    }

    #[test]
    fn branches_are_names_git_takes() {
        for good in ["main", "feature/x-1", "release-2.0", "pi-dispatch/job-1"] {
            assert!(is_branch(good), "{good}");
        }
        for bad in [
            "", "-x", "/x", "x/", "x.", "x.lock", "a..b", "a//b", "a b", "a\nb", "a~1", "a^",
            "a:b", "a?", "a*", "a[", "a\\b", "@", "a@{1}", ".hidden", "x/.y",
        ] {
            assert!(!is_branch(bad), "{bad:?}");
        }
    }
}
