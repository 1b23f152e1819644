//! Bakes the build's git commit into `STRAND_COMMIT` for `strand bench` reports; rebuilds when
//! HEAD moves. Outside a git checkout (or without git) the variable is unset and the report
//! says `unknown`.

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
        .filter(|s| !s.is_empty())
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let Some(commit) = git(&["rev-parse", "HEAD"]) else {
        return;
    };
    println!("cargo:rustc-env=STRAND_COMMIT={commit}");
    // HEAD, the branch it names and packed-refs: any commit or checkout touches one of them.
    // Only paths that exist: cargo takes a missing one as changed and would rebuild every time.
    let mut paths = vec!["HEAD".to_string(), "packed-refs".to_string()];
    paths.extend(git(&["symbolic-ref", "-q", "HEAD"]));
    for path in paths {
        if let Some(p) = git(&["rev-parse", "--git-path", &path])
            && std::path::Path::new(&p).exists()
        {
            println!("cargo:rerun-if-changed={p}");
        }
    }
}
