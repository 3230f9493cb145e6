// SPDX-License-Identifier: Apache-2.0
//! The log: env_logger with a timestamp and level on every line.
//!
//! Lines look like `2026-12-02T10:00:00.123Z INFO  vmm::builder: message`
//! (UTC, milliseconds), on stderr or, with `--log-path` / `logger.log_path`,
//! in a file or FIFO (see `line_writer`). The level comes from `--log-level` (or the
//! file's `logger.level`, restricted to `logger.module` if given); `RUST_LOG`
//! directives such as `devices::virtio::net=debug` are applied after it, so
//! they win where they overlap. An explicit `show_level: false` (the file's
//! or `PUT /logger`'s, as Firecracker spells it) leaves the level out;
//! `--show-level` and `--show-log-origin` are Firecracker's flags for the
//! level (shown by default here) and the source file and line.

use std::io::Write;

use env_logger::{Builder, Target, WriteStyle};
use log::LevelFilter;

use crate::config::LoggerConfig;
use crate::line_writer::NonBlockingLineWriter;

/// Errors setting up the log.
#[derive(Debug, thiserror::Error)]
pub enum LoggerError {
    /// The log path cannot be opened.
    #[error("cannot open log path '{0}'")]
    Open(std::path::PathBuf, #[source] std::io::Error),
    /// A logger was installed already (only in tests).
    #[error("a logger is already installed")]
    Installed(#[source] log::SetLoggerError),
}

/// The instance id every line carries after the level (`--id`, when given),
/// so lines of several VMs in one log can be told apart.
static INSTANCE_ID: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Puts `[id]` in every log line from now on (once per process).
pub fn set_instance_id(id: &str) {
    let _ = INSTANCE_ID.set(id.to_string());
}

/// Builds the logger `cfg` describes, with `rust_log` (the RUST_LOG value)
/// applied on top.
pub fn builder(cfg: &LoggerConfig, rust_log: Option<&str>) -> Result<Builder, LoggerError> {
    let mut b = Builder::new();
    match &cfg.module {
        Some(module) => {
            b.filter_level(LevelFilter::Off);
            b.filter_module(module, cfg.level);
        }
        None => {
            b.filter_level(cfg.level);
        }
    }
    if let Some(spec) = rust_log {
        b.parse_filters(spec);
    }
    let origin = cfg.show_origin;
    let show_level = cfg.show_level;
    b.format(move |buf, record| {
        let ts = buf.timestamp_millis();
        write!(buf, "{ts} ")?;
        if show_level {
            write!(buf, "{:<5} ", record.level())?;
        }
        if let Some(id) = INSTANCE_ID.get() {
            write!(buf, "[{id}] ")?;
        }
        write!(buf, "{}", record.target())?;
        if origin {
            write!(
                buf,
                " [{}:{}]",
                record.file().unwrap_or("?"),
                record.line().unwrap_or(0)
            )?;
        }
        writeln!(buf, ": {}", record.args())
    });
    b.write_style(WriteStyle::Never);
    match &cfg.path {
        Some(path) => {
            let out = NonBlockingLineWriter::open(path)
                .map_err(|e| LoggerError::Open(path.clone(), e))?;
            b.target(Target::Pipe(Box::new(out)));
        }
        None => {
            b.target(Target::Stderr);
        }
    }
    Ok(b)
}

/// Installs the process's logger.
pub fn init(cfg: &LoggerConfig) -> Result<(), LoggerError> {
    let rust_log = std::env::var("RUST_LOG").ok();
    builder(cfg, rust_log.as_deref())?
        .try_init()
        .map_err(LoggerError::Installed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use log::{Level, Log, Record};

    /// The logger `cfg` (with `rust_log` as RUST_LOG) makes when it writes
    /// to the file `name` of this test process, no file of an earlier run
    /// left there; and that file's path.
    fn logger_to_file(
        name: &str,
        cfg: LoggerConfig,
        rust_log: Option<&str>,
    ) -> (env_logger::Logger, std::path::PathBuf) {
        let path = std::env::temp_dir().join(format!("minivmm-log-{}-{name}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let cfg = LoggerConfig {
            path: Some(path.clone()),
            ..cfg
        };
        (builder(&cfg, rust_log).unwrap().build(), path)
    }

    fn emit(logger: &env_logger::Logger, level: Level, target: &str, msg: &str) {
        logger.log(
            &Record::builder()
                .level(level)
                .target(target)
                .args(format_args!("{msg}"))
                .build(),
        );
    }

    #[test]
    fn lines_have_time_and_level_and_rust_log_filters_modules() {
        let cfg = LoggerConfig {
            level: LevelFilter::Warn,
            ..LoggerConfig::default()
        };
        let (logger, p) = logger_to_file("filters", cfg, Some("devices::virtio::net=debug"));
        emit(&logger, Level::Info, "vmm::builder", "hidden");
        emit(&logger, Level::Warn, "vmm::builder", "shown warn");
        emit(
            &logger,
            Level::Debug,
            "devices::virtio::net::rxtx",
            "shown debug",
        );
        emit(
            &logger,
            Level::Trace,
            "devices::virtio::net::rxtx",
            "hidden trace",
        );
        let text = std::fs::read_to_string(&p).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        // 2026-12-02T10:00:00.123Z WARN  vmm::builder: shown warn
        let (ts, rest) = lines[0].split_once(' ').unwrap();
        assert_eq!(ts.len(), "2026-12-02T10:00:00.123Z".len(), "{ts}");
        assert!(ts.ends_with('Z') && ts.as_bytes()[10] == b'T', "{ts}");
        assert_eq!(rest, "WARN  vmm::builder: shown warn");
        assert!(lines[1].ends_with("DEBUG devices::virtio::net::rxtx: shown debug"));
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn a_module_restricts_the_log_and_origin_is_shown() {
        let cfg = LoggerConfig {
            path: None,
            level: LevelFilter::Info,
            module: Some("vmm::event_loop".into()),
            show_origin: true,
            show_level: true,
        };
        let (logger, p) = logger_to_file("module", cfg, None);
        emit(&logger, Level::Error, "vmm::builder", "other module");
        logger.log(
            &Record::builder()
                .level(Level::Info)
                .target("vmm::event_loop")
                .file(Some("vmm/src/event_loop.rs"))
                .line(Some(42))
                .args(format_args!("ours"))
                .build(),
        );
        let text = std::fs::read_to_string(&p).unwrap();
        assert_eq!(text.lines().count(), 1, "{text}");
        assert!(text.contains("INFO  vmm::event_loop [vmm/src/event_loop.rs:42]: ours"));
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn show_level_false_leaves_the_level_out() {
        let cfg = LoggerConfig {
            level: LevelFilter::Info,
            show_level: false,
            ..LoggerConfig::default()
        };
        let (logger, p) = logger_to_file("nolevel", cfg, None);
        emit(&logger, Level::Warn, "vmm::builder", "no level here");
        let text = std::fs::read_to_string(&p).unwrap();
        let (ts, rest) = text.trim_end().split_once(' ').unwrap();
        assert!(ts.ends_with('Z'), "{text}");
        assert_eq!(rest, "vmm::builder: no level here");
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn an_unopenable_path_is_an_error() {
        let cfg = LoggerConfig {
            path: Some("/nonexistent/dir/log".into()),
            ..LoggerConfig::default()
        };
        let err = builder(&cfg, None).err().unwrap();
        assert!(crate::error_line(&err).starts_with("cannot open log path"));
    }
}
