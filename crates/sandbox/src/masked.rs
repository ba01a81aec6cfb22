//! A job's read-only folders as its mount table shows them: a bind mount names the folder it was
//! made from by its path on the host (the deployment's folder, the job's id), which every process
//! of the job reads in `/proc/self/mountinfo`. So a root worker gives the job each of them as a
//! read-only overlay of its own instead, whose layers are named by descriptor: the mount table then
//! says `overlay`, its root `/`, and `lowerdir=/proc/self/fd/N:…`, and no path of the host.
//!
//! An overlay needs two layers when it has no upper one: the folder, and an empty folder under it.
//! The overlays are mounted in the job's own folder on the host (`masked/`), and unmounted when
//! dropped.

use std::io;
use std::os::fd::{AsRawFd as _, OwnedFd};
use std::os::unix::fs::DirBuilderExt as _;
use std::path::{Path, PathBuf};

use rustix::fs::{Mode, OFlags};
use rustix::mount::{MountFlags, UnmountFlags};

/// The job's folders, each as an overlay of its own; unmounted when dropped.
#[derive(Debug)]
pub struct Masked {
    places: Vec<PathBuf>,
    root: PathBuf,
}

/// The overlay's options for `layers`, named by descriptor. Pure.
pub fn options(layers: &[i32]) -> String {
    let lower: Vec<String> = layers
        .iter()
        .map(|fd| format!("/proc/self/fd/{fd}"))
        .collect();
    format!("lowerdir={}", lower.join(":"))
}

fn open_dir(path: &Path) -> io::Result<OwnedFd> {
    Ok(rustix::fs::open(
        path,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
        Mode::empty(),
    )?)
}

impl Masked {
    /// Read-only overlays of each of `folders` in `dir/masked` (a mount an earlier attempt left
    /// there goes first); their places, in the same order (a folder that is not there is its own
    /// place, unmounted). Needs root.
    pub fn over(dir: &Path, folders: &[&Path]) -> io::Result<(Masked, Vec<PathBuf>)> {
        let root = dir.join("masked");
        let empty = root.join("empty");
        let mut masked = Masked {
            places: Vec::new(),
            root: root.clone(),
        };
        for n in 0..folders.len() {
            let _ = rustix::mount::unmount(root.join(n.to_string()), UnmountFlags::DETACH);
        }
        let mut builder = std::fs::DirBuilder::new();
        builder.mode(0o755).recursive(true).create(&empty)?;
        let below = open_dir(&empty)?;
        let mut places = Vec::new();
        for (n, folder) in folders.iter().enumerate() {
            // One the job does not use (a container's image is in the container): as it is.
            if !folder.is_dir() {
                places.push(folder.to_path_buf());
                continue;
            }
            let place = root.join(n.to_string());
            builder.create(&place)?;
            let layer = open_dir(folder)?;
            let data = std::ffi::CString::new(options(&[layer.as_raw_fd(), below.as_raw_fd()]))
                .map_err(io::Error::other)?;
            rustix::mount::mount(
                "overlay",
                &place,
                "overlay",
                MountFlags::RDONLY | MountFlags::NOSUID | MountFlags::NODEV,
                Some(data.as_c_str()),
            )?;
            masked.places.push(place.clone());
            places.push(place);
        }
        Ok((masked, places))
    }
}

impl Drop for Masked {
    fn drop(&mut self) {
        for place in &self.places {
            let _ = rustix::mount::unmount(place, UnmountFlags::DETACH);
            let _ = std::fs::remove_dir(place);
        }
        let _ = std::fs::remove_dir(self.root.join("empty"));
        let _ = std::fs::remove_dir(&self.root);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_layers_are_named_by_descriptor_only() {
        assert_eq!(options(&[7, 8]), "lowerdir=/proc/self/fd/7:/proc/self/fd/8");
    }
}
