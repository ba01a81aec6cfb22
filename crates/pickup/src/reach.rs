//! Whether a job's user can use a folder, from the folder's permission bits and the user's ids
//! (pure), and the message that says what is wrong: the path, the user by uid (and name, when
//! `/etc/passwd` has it) and what that user cannot do there.
//!
//! Only the mode's bits are read, as the kernel reads them for a process without capabilities (the
//! job's user holds none): the owner's bits for the owner, else the group's for a member of the
//! folder's group, else the others'. An ACL is not read. The folders above need not be open to
//! the user: the worker binds folders from descriptors (see the sandbox crate's `bwrap`).

use std::fmt;
use std::path::{Path, PathBuf};

/// What a job does with a folder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// List it (`r`).
    Read,
    /// Make, change and remove what is in it (`w`).
    Write,
    /// Enter it and reach what is in it (`x`).
    Enter,
}

impl Access {
    pub fn as_str(self) -> &'static str {
        match self {
            Access::Read => "read",
            Access::Write => "write",
            Access::Enter => "enter",
        }
    }

    /// The bit of a `rwx` triple.
    fn bit(self) -> u32 {
        match self {
            Access::Read => 0o4,
            Access::Write => 0o2,
            Access::Enter => 0o1,
        }
    }
}

/// What a local job's user does with its repository: everything.
pub const WORKSPACE: [Access; 3] = [Access::Read, Access::Write, Access::Enter];

/// A folder's permission bits and owner, as `stat` gives them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Folder {
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
}

/// A user as a process runs: uid, gid and supplementary groups (a job's bubblewrap has none).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
}

/// Of `need`, what `user` cannot do with `folder`, in `need`'s order. Pure.
pub fn missing(folder: &Folder, user: &User, need: &[Access]) -> Vec<Access> {
    let shift = if user.uid == folder.uid {
        6
    } else if user.gid == folder.gid || user.groups.contains(&folder.gid) {
        3
    } else {
        0
    };
    let granted = (folder.mode >> shift) & 0o7;
    need.iter()
        .copied()
        .filter(|a| granted & a.bit() == 0)
        .collect()
}

/// A folder the job's user cannot use as it must: what [`check`] refuses with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unreachable {
    pub path: PathBuf,
    pub uid: u32,
    /// The user's name in `/etc/passwd`, when it has one.
    pub name: Option<String>,
    pub folder: Folder,
    pub missing: Vec<Access>,
}

impl fmt::Display for Unreachable {
    /// `the job's user nobody (uid 65534) cannot write /srv/repo (mode 0555, owner uid 65534,
    /// group gid 65534)`.
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "the job's user ")?;
        if let Some(name) = &self.name {
            write!(f, "{name} ")?;
        }
        let what: Vec<&str> = self.missing.iter().map(|a| a.as_str()).collect();
        let what = match what.split_last() {
            Some((last, [])) => (*last).to_owned(),
            Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
            None => "use".to_owned(),
        };
        write!(
            f,
            "(uid {}) cannot {what} {} (mode {:04o}, owner uid {}, group gid {})",
            self.uid,
            self.path.display(),
            self.folder.mode & 0o7777,
            self.folder.uid,
            self.folder.gid
        )
    }
}

impl std::error::Error for Unreachable {}

/// `Ok` when `user` can do all of `need` with `folder` at `path`; else what it cannot, with the
/// user's name from `passwd` (the text of `/etc/passwd`, when read). Pure.
pub fn check(
    path: &Path,
    folder: &Folder,
    user: &User,
    need: &[Access],
    passwd: Option<&str>,
) -> Result<(), Unreachable> {
    let missing = missing(folder, user, need);
    if missing.is_empty() {
        return Ok(());
    }
    Err(Unreachable {
        path: path.to_owned(),
        uid: user.uid,
        name: passwd.and_then(|text| name_in_passwd(text, user.uid)),
        folder: *folder,
        missing,
    })
}

/// The name of `uid` in the text of an `/etc/passwd` file (`name:x:uid:gid:...`). Pure.
pub fn name_in_passwd(passwd: &str, uid: u32) -> Option<String> {
    passwd.lines().find_map(|line| {
        let mut fields = line.split(':');
        let name = fields.next()?;
        let id = fields.nth(1)?.parse::<u32>().ok()?;
        (id == uid && !name.is_empty()).then(|| name.to_owned())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOBODY: User = User {
        uid: 65534,
        gid: 65534,
        groups: Vec::new(),
    };

    fn folder(mode: u32, uid: u32, gid: u32) -> Folder {
        Folder {
            mode: 0o040000 | mode,
            uid,
            gid,
        }
    }

    #[test]
    fn the_owners_bits_are_the_owners() {
        assert_eq!(missing(&folder(0o700, 65534, 0), &NOBODY, &WORKSPACE), []);
        assert_eq!(
            missing(&folder(0o577, 65534, 65534), &NOBODY, &WORKSPACE),
            [Access::Write]
        );
        assert_eq!(
            missing(&folder(0o077, 65534, 65534), &NOBODY, &WORKSPACE),
            WORKSPACE
        );
        assert_eq!(
            missing(&folder(0o300, 65534, 0), &NOBODY, &WORKSPACE),
            [Access::Read]
        );
    }

    #[test]
    fn the_group_then_the_others() {
        // Group 65534 is the user's own; group 50 is a supplementary group.
        assert_eq!(missing(&folder(0o070, 0, 65534), &NOBODY, &WORKSPACE), []);
        let member = User {
            groups: vec![50],
            ..NOBODY
        };
        assert_eq!(
            missing(&folder(0o750, 0, 50), &member, &WORKSPACE),
            [Access::Write]
        );
        assert_eq!(
            missing(&folder(0o750, 0, 50), &NOBODY, &[Access::Enter]),
            [Access::Enter]
        );
        assert_eq!(
            missing(&folder(0o705, 0, 50), &NOBODY, &WORKSPACE),
            [Access::Write]
        );
        // The others' bits never help a member of the group.
        assert_eq!(
            missing(&folder(0o707, 0, 50), &member, &[Access::Read]),
            [Access::Read]
        );
    }

    #[test]
    fn a_refusal_says_the_path_the_user_and_what() {
        let passwd = "root:x:0:0:root:/root:/bin/bash\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n";
        let err = check(
            Path::new("/srv/repo"),
            &folder(0o555, 65534, 65534),
            &NOBODY,
            &WORKSPACE,
            Some(passwd),
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "the job's user nobody (uid 65534) cannot write /srv/repo (mode 0555, owner uid 65534, group gid 65534)"
        );
        let err = check(
            Path::new("/srv/repo"),
            &folder(0o070, 4242, 4242),
            &User {
                uid: 4242,
                gid: 4242,
                groups: Vec::new(),
            },
            &WORKSPACE,
            Some(passwd),
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "the job's user (uid 4242) cannot read, write or enter /srv/repo (mode 0070, owner uid 4242, group gid 4242)"
        );
        assert_eq!(
            check(
                Path::new("/srv/repo"),
                &folder(0o700, 65534, 65534),
                &NOBODY,
                &WORKSPACE,
                None
            ),
            Ok(())
        );
    }

    #[test]
    fn names_come_from_passwd_lines() {
        let passwd = "# comment\nbad line\nroot:x:0:0::/root:/bin/sh\n:x:7:7::/:/bin/sh\nnobody:x:65534:65534::/:/bin/false";
        assert_eq!(name_in_passwd(passwd, 0).as_deref(), Some("root"));
        assert_eq!(name_in_passwd(passwd, 65534).as_deref(), Some("nobody"));
        assert_eq!(name_in_passwd(passwd, 7), None);
        assert_eq!(name_in_passwd(passwd, 1000), None);
    }
}
