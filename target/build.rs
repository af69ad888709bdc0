//! Sets `POLLUX_BUILD_COMMIT` (`pollux_target::BUILD_COMMIT`): the commit pollux is built
#![allow(clippy::print_stdout)] // cargo reads a build script's instructions from its stdout
//! from (`git rev-parse --short HEAD`), or `unknown` when git or the repository is absent (a
//! source tarball). Never fails the build.

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8(out.stdout).ok()?;
    let s = s.trim();
    (!s.is_empty()).then(|| s.to_owned())
}

fn main() {
    let commit = git(&["rev-parse", "--short", "HEAD"]).unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=POLLUX_BUILD_COMMIT={commit}");
    // Run again when HEAD moves: HEAD itself (a checkout), the branch it names (a commit) and
    // packed-refs. `--git-path` finds them in a linked worktree too.
    println!("cargo:rerun-if-changed=build.rs");
    let mut watch = vec!["HEAD".to_owned(), "packed-refs".to_owned()];
    if let Some(r) = git(&["symbolic-ref", "-q", "HEAD"]) {
        watch.push(r);
    }
    for p in watch {
        if let Some(path) = git(&["rev-parse", "--git-path", &p]) {
            println!("cargo:rerun-if-changed={path}");
        }
    }
}
