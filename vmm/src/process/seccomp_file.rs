// SPDX-License-Identifier: Apache-2.0
//! `--seccomp-filter FILE`: the threads' filters from a file, as Firecracker
//! takes them, instead of minivmm's own lists.
//!
//! Firecracker writes its filters as seccompiler JSON (one object per thread
//! category, `vmm`, `api` and `vcpu`, each with `default_action`,
//! `filter_action` and `filter`, the rules with their `args` conditions) and
//! at run time reads that JSON compiled by its `seccompiler-bin` into a
//! serialized map of BPF programs. That binary form is an encoding of the
//! tool's version (bitcode), not a format: minivmm reads the JSON, the file
//! both the tool and the operator start from, and compiles it at start with
//! the rust-vmm seccompiler whose JSON format Firecracker's follows. A
//! compiled file is refused in one line that says to pass its JSON.
//!
//! Thread categories map one to one: `vmm` is minivmm's main thread (the
//! event loop and every device backend, as Firecracker's `vmm` thread is),
//! `api` the API thread, `vcpu` every vCPU thread. As in Firecracker, all
//! three must be present and no other; an empty `filter` list with an
//! `allow` default installs nothing on that thread. The filters are used as
//! they are: minivmm's calls that a file does not allow end the process
//! with the file's action (`trap` gives exit status 148 and one line naming
//! the call, as with minivmm's own lists).

use std::io::Read;
use std::path::{Path, PathBuf};

use seccompiler::{BpfProgram, TargetArch};

use super::seccomp::{Filters, SeccompMode};

/// The thread categories of a Firecracker filter file.
pub const CATEGORIES: [&str; 3] = ["vmm", "api", "vcpu"];

/// Most bytes read from a filter file (Firecracker's compiled map is
/// bounded at 100,000 bytes; its JSON for x86_64 is about 40 KB).
const MAX_FILE_BYTES: u64 = 1 << 20;

/// Errors taking filters from a file.
#[derive(Debug, thiserror::Error)]
pub enum SeccompFileError {
    /// The file cannot be read.
    #[error("--seccomp-filter '{0}': cannot read it")]
    Read(PathBuf, #[source] std::io::Error),
    /// The file is larger than any filter file.
    #[error("--seccomp-filter '{0}': larger than {MAX_FILE_BYTES} bytes")]
    TooLarge(PathBuf),
    /// The file is not JSON (a compiled map, most likely).
    #[error(
        "--seccomp-filter '{0}': not JSON; minivmm takes the seccompiler JSON a filter is \
         compiled from, not seccompiler-bin's compiled output"
    )]
    NotJson(PathBuf),
    /// seccompiler refused the JSON.
    #[error("--seccomp-filter '{0}': {1}")]
    Compile(PathBuf, String),
    /// A category other than `vmm`, `api` and `vcpu`.
    #[error("--seccomp-filter '{0}': unknown thread category '{1}' (vmm, api and vcpu only)")]
    UnknownCategory(PathBuf, String),
    /// One of the three categories is missing.
    #[error("--seccomp-filter '{0}': the thread category '{1}' is missing")]
    MissingCategory(PathBuf, &'static str),
}

/// The filters `path` gives, by minivmm's thread kinds.
pub fn filters_from_file(path: &Path) -> Result<Filters, SeccompFileError> {
    let file = std::fs::File::open(path).map_err(|e| SeccompFileError::Read(path.into(), e))?;
    let mut text = Vec::new();
    file.take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut text)
        .map_err(|e| SeccompFileError::Read(path.into(), e))?;
    if text.len() as u64 > MAX_FILE_BYTES {
        return Err(SeccompFileError::TooLarge(path.into()));
    }
    filters_from_json(path, &text)
}

/// The filters the JSON `text` (read from `path`) gives.
pub fn filters_from_json(path: &Path, text: &[u8]) -> Result<Filters, SeccompFileError> {
    let first = text.iter().find(|b| !b.is_ascii_whitespace());
    if first != Some(&b'{') {
        return Err(SeccompFileError::NotJson(path.into()));
    }
    let mut map = seccompiler::compile_from_json(text, TargetArch::x86_64)
        .map_err(|e| SeccompFileError::Compile(path.into(), e.to_string()))?;
    let mut names: Vec<&String> = map.keys().collect();
    names.sort();
    if let Some(other) = names.iter().find(|k| !CATEGORIES.contains(&k.as_str())) {
        return Err(SeccompFileError::UnknownCategory(
            path.into(),
            other.to_string(),
        ));
    }
    let mut take = |name: &'static str| -> Result<Option<BpfProgram>, SeccompFileError> {
        let prog = map
            .remove(name)
            .ok_or(SeccompFileError::MissingCategory(path.into(), name))?;
        Ok(installable(prog))
    };
    Ok(Filters {
        mode: SeccompMode::On,
        event_loop: take("vmm")?,
        api: take("api")?,
        vcpu: take("vcpu")?,
        from_file: true,
    })
}

/// An empty program installs nothing (the kernel refuses an empty filter;
/// Firecracker skips it too).
fn installable(prog: BpfProgram) -> Option<BpfProgram> {
    (!prog.is_empty()).then_some(prog)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A filter in Firecracker's layout: `vcpu` traps `getpid` only, `api`
    /// allows a short list, `vmm` allows everything (an allow default with an
    /// empty list, which seccompiler compiles to a single `allow`).
    const FIRECRACKER_STYLE: &str = r#"{
        "vmm": { "default_action": "allow", "filter_action": "trap", "filter": [] },
        "api": {
            "default_action": "trap",
            "filter_action": "allow",
            "filter": [
                { "syscall": "read" },
                { "syscall": "write", "comment": "answers" },
                { "syscall": "ioctl", "args": [
                    { "index": 1, "type": "dword", "op": "eq", "val": 21505, "comment": "TCGETS" }
                ] }
            ]
        },
        "vcpu": { "default_action": "allow", "filter_action": "trap",
                  "filter": [ { "syscall": "getpid" } ] }
    }"#;

    fn p() -> PathBuf {
        PathBuf::from("f.json")
    }

    #[test]
    fn firecracker_categories_map_to_minivmms_threads() {
        let f = filters_from_json(&p(), FIRECRACKER_STYLE.as_bytes()).unwrap();
        assert!(f.from_file);
        assert_eq!(f.mode, SeccompMode::On);
        let (vcpu, api, vmm) = (f.vcpu.unwrap(), f.api.unwrap(), f.event_loop.unwrap());
        // Each category's own program went to its thread: the api list is
        // the longest, the vmm one (allow everything) the shortest.
        assert!(api.len() > vcpu.len(), "{} {}", api.len(), vcpu.len());
        assert!(vcpu.len() > vmm.len(), "{} {}", vcpu.len(), vmm.len());
        let compiled =
            seccompiler::compile_from_json(FIRECRACKER_STYLE.as_bytes(), TargetArch::x86_64)
                .unwrap();
        assert_eq!(compiled["api"], api);
        assert_eq!(compiled["vcpu"], vcpu);
        assert_eq!(compiled["vmm"], vmm);
    }

    #[test]
    fn a_bad_file_is_one_line_saying_why() {
        let line =
            |text: &str| crate::error_line(&filters_from_json(&p(), text.as_bytes()).unwrap_err());
        // Firecracker's compiled form (bitcode bytes) is not read.
        assert!(line("\u{3}vmm\u{0}\u{1}").contains("not JSON; minivmm takes the seccompiler JSON"));
        assert!(line("").contains("not JSON"));
        let no_vcpu = r#"{"vmm": {"default_action": "allow", "filter_action": "trap", "filter": []},
                          "api": {"default_action": "allow", "filter_action": "trap", "filter": []}}"#;
        assert_eq!(
            line(no_vcpu),
            "--seccomp-filter 'f.json': the thread category 'vcpu' is missing"
        );
        let extra = FIRECRACKER_STYLE.replacen(
            "\"vmm\":",
            "\"jailer\": {\"default_action\": \"allow\", \"filter_action\": \"trap\", \"filter\": []}, \"vmm\":",
            1,
        );
        assert_eq!(
            line(&extra),
            "--seccomp-filter 'f.json': unknown thread category 'jailer' (vmm, api and vcpu only)"
        );
        let bad_call = FIRECRACKER_STYLE.replace("getpid", "no_such_call");
        assert!(
            line(&bad_call).starts_with("--seccomp-filter 'f.json': "),
            "{}",
            line(&bad_call)
        );
        assert!(line("{ not json").starts_with("--seccomp-filter 'f.json': "));
    }

    #[test]
    fn files_are_read_bounded() {
        let dir = std::env::temp_dir().join(format!("minivmm-seccomp-file-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let good = dir.join("good.json");
        std::fs::write(&good, FIRECRACKER_STYLE).unwrap();
        assert!(filters_from_file(&good).unwrap().api.is_some());
        let big = dir.join("big.json");
        std::fs::write(&big, vec![b' '; MAX_FILE_BYTES as usize + 1]).unwrap();
        assert!(matches!(
            filters_from_file(&big),
            Err(SeccompFileError::TooLarge(_))
        ));
        let at_bound = dir.join("bound.json");
        std::fs::write(&at_bound, vec![b' '; MAX_FILE_BYTES as usize]).unwrap();
        assert!(matches!(
            filters_from_file(&at_bound),
            Err(SeccompFileError::NotJson(_))
        ));
        assert!(matches!(
            filters_from_file(&dir.join("missing.json")),
            Err(SeccompFileError::Read(..))
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
