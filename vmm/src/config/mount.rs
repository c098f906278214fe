//! `--mount HOSTDIR:GUESTDIR[:ro]` (`mounts` in a file): a host directory a guest may reach,
//! parsed and checked. `devices::fs_path` opens it.

use std::path::PathBuf;

/// A host directory mapped into a guest, as asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MountConfig {
    pub host: PathBuf,
    /// Absolute, without `.`, `..`, empty components or a trailing `/` (except `/` itself).
    pub guest: String,
    pub read_only: bool,
}

/// Parse `HOSTDIR:GUESTDIR` or `HOSTDIR:GUESTDIR:ro`.
pub fn parse_mount(text: &str) -> Result<MountConfig, String> {
    let (rest, read_only) = match text.strip_suffix(":ro") {
        Some(rest) => (rest, true),
        None => (text, false),
    };
    let Some((host, guest)) = rest.rsplit_once(':') else {
        return Err(format!(
            "mount {text:?}: expected HOSTDIR:GUESTDIR or HOSTDIR:GUESTDIR:ro"
        ));
    };
    if host.is_empty() {
        return Err(format!("mount {text:?}: the host directory is empty"));
    }
    let bad_component = guest
        .split('/')
        .skip(1)
        .any(|c| matches!(c, "." | "..") || c.contains('\0'));
    if !guest.starts_with('/') || bad_component || guest.contains("//") {
        return Err(format!(
            "mount {text:?}: the guest directory must be an absolute path without `.`, `..` or `//`"
        ));
    }
    let guest = match guest.trim_end_matches('/') {
        "" => "/".to_owned(),
        trimmed => trimmed.to_owned(),
    };
    Ok(MountConfig {
        host: PathBuf::from(host),
        guest,
        read_only,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mounts_parse() {
        let m = parse_mount("/tmp/x:/data").unwrap();
        assert_eq!((m.guest.as_str(), m.read_only), ("/data", false));
        let m = parse_mount("a:b:/data/:ro").unwrap();
        assert_eq!(
            (m.host, m.guest.as_str(), m.read_only),
            ("a:b".into(), "/data", true)
        );
        assert_eq!(parse_mount("/tmp:/").unwrap().guest, "/");
        for bad in [
            "/tmp",
            ":/data",
            "/tmp:data",
            "/tmp:/a/../b",
            "/tmp:/a//b",
            "/tmp:/.",
        ] {
            assert!(parse_mount(bad).is_err(), "{bad}");
        }
    }
}
