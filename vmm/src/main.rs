// SPDX-License-Identifier: Apache-2.0
//! `minivmm`: boot a Linux guest with virtio-net cards on host TAPs.
//!
//! Exit status: 0 when the guest reboots or powers off or minivmm is stopped
//! by SIGTERM/SIGINT; 1 for bad usage or configuration (the argument parser's
//! own errors included) or a failure before boot, always one line on stderr;
//! 2 when the VM fails at run time; 3 when the guest reset after its kernel
//! reported a panic through the pvpanic register.
//! 101 when minivmm itself panicked, on any thread (a bug).
//! 148 when a thread made a system call its seccomp filter forbids.

use std::path::Path;
use std::process::ExitCode;
use std::sync::mpsc::RecvTimeoutError;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::error::ErrorKind;
use clap::Parser;
use log::{error, info};

use devices::mmds::SharedMmds;
use vmm::api::http::Response;
use vmm::api::preboot::{Preboot, SnapshotLoad, Step};
use vmm::api::ApiChannel;
use vmm::config::cli::{clap_line, Cli, CliParts, Launch};
use vmm::config::fc_flags::PCI_WARNING;
use vmm::config::VmmConfig;
use vmm::error_line;
use vmm::host_socket::VsockSocket;
use vmm::kvm::vm_exit::VmExit;
use vmm::process::seccomp::{self, Filters, SeccompMode};
use vmm::process::seccomp_file;
use vmm::process::signals::SignalFd;

/// Bad usage or configuration, or a failure before the guest runs.
const EXIT_CONFIG: u8 = 1;
/// The VM failed at run time (also `VmExit::exit_code` for faults).
const EXIT_RUNTIME: u8 = 2;
/// How often the pre-boot API loop looks for a stop signal.
const SIGNAL_POLL: Duration = Duration::from_millis(100);

fn fail(msg: &str) -> ExitCode {
    eprintln!("minivmm: error: {msg}");
    ExitCode::from(EXIT_CONFIG)
}

/// How a built VM's end becomes the process's exit status.
fn run_vm(vmm: vmm::vmm::Vmm, start: Instant, filters: Filters, log_to_file: bool) -> ExitCode {
    let level = log::max_level();
    match vmm.run(start, filters) {
        Ok(reason) => {
            match &reason {
                VmExit::Fault(_) => error!("{}", reason.describe()),
                _ => info!("{}", reason.describe()),
            }
            if reason.needs_stderr(level, log_to_file) {
                eprintln!("minivmm: error: {}", reason.describe());
            }
            ExitCode::from(reason.exit_code() as u8)
        }
        Err(e) => {
            eprintln!("minivmm: error: cannot run the VM: {}", error_line(&e));
            ExitCode::from(EXIT_RUNTIME)
        }
    }
}

/// Everything between a configuration and a VM ready to run: inherited
/// TAP descriptors, the log (installed once per process: `logger_ready`)
/// and the build (over the vsock socket `PUT /vsock` bound, if any). An
/// error is one line.
fn prepare(
    config: &VmmConfig,
    launch: &Launch,
    start: Instant,
    logger_ready: &mut bool,
    vsock: Option<Arc<VsockSocket>>,
    mmds: &SharedMmds,
) -> Result<vmm::vmm::Vmm, String> {
    // Inherited TAP descriptors are claimed before this process opens any
    // file, so a number the user names cannot be one of ours.
    let tap_fds = vmm::builder::claim_tap_fds(config).map_err(|e| error_line(&e))?;
    init_logger(config, logger_ready)?;
    let boot_timer = launch.boot_timer.then_some(start);
    let mut vmm = vmm::builder::build(config, tap_fds, boot_timer, vsock, mmds.clone())
        .map_err(|e| error_line(&e))?;
    vmm.set_id(&launch.id);
    Ok(vmm)
}

/// `--snapshot-version` and `--describe-snapshot` (a version on stdout, as
/// Firecracker prints it, `v` first) and `--rebase-snap`: done and exit,
/// before anything else.
fn snapshot_info(cli: &Cli) -> Option<ExitCode> {
    use vmm::snapshot::format;
    if cli.snapshot_version {
        println!("v{}", format::SNAPSHOT_VERSION);
        return Some(ExitCode::SUCCESS);
    }
    if let (true, Some(base), Some(diff)) = (cli.rebase_snap, &cli.base_file, &cli.diff_file) {
        return Some(match vmm::snapshot::memory::rebase(base, diff) {
            Ok(n) => {
                println!(
                    "{n} bytes of {} copied onto {}",
                    diff.display(),
                    base.display()
                );
                ExitCode::SUCCESS
            }
            Err(e) => fail(&error_line(&e)),
        });
    }
    let path = cli.describe_snapshot.as_ref()?;
    Some(
        match format::read_file(path).and_then(|b| format::describe(&b)) {
            Ok(v) => {
                println!("v{v}");
                ExitCode::SUCCESS
            }
            Err(e) => fail(&error_line(&e)),
        },
    )
}

/// `PUT /snapshot/load` in the pre-boot loop: the snapshot's VM, ready to
/// run, and its configuration; or the fault's line.
fn load_snapshot(
    req: &SnapshotLoad,
    parts: &CliParts,
    start: Instant,
    logger_ready: &mut bool,
) -> Result<(vmm::vmm::Vmm, VmmConfig), String> {
    let (mut vmm, config) = vmm::snapshot::restore::load(req, parts.flags.clone(), |cfg| {
        init_logger(cfg, logger_ready)
    })?;
    vmm.set_id(&parts.launch.id);
    info!(
        "snapshot loaded in {:.1} ms after start",
        start.elapsed().as_secs_f64() * 1e3
    );
    Ok((vmm, config))
}

/// Installs the log `config` asks for, once per process (`logger_ready`).
fn init_logger(config: &VmmConfig, logger_ready: &mut bool) -> Result<(), String> {
    if !*logger_ready {
        vmm::logger::init(&config.logger).map_err(|e| error_line(&e))?;
        *logger_ready = true;
    }
    Ok(())
}

/// Runs a built VM, serving the API's run-time requests if `api` (its
/// channel and the instance id) is given, and returns the exit status.
fn boot(
    mut vmm: vmm::vmm::Vmm,
    config: VmmConfig,
    launch: &Launch,
    start: Instant,
    filters: Filters,
    api: Option<(ApiChannel, String)>,
) -> ExitCode {
    log_startup(launch);
    let to_file = config.logger.path.is_some();
    if let Some((channel, id)) = api {
        vmm.serve_api(channel, id, config);
    }
    run_vm(vmm, start, filters, to_file)
}

/// Logs how long the launcher (Firecracker's jailer, which passes its
/// start time) took to get here, when it said.
fn log_startup(launch: &Launch) {
    let Some(started_us) = launch.start_time_us else {
        return;
    };
    let now_us = vmm::monotonic_us();
    info!(
        "start-up: {} us from the launcher's start (its CPU time {} us, its parent's {} us)",
        now_us.saturating_sub(started_us),
        launch.start_time_cpu_us.unwrap_or(0),
        launch.parent_cpu_time_us.unwrap_or(0)
    );
}

/// minivmm with `--api-sock`: the socket first, then either the VM the
/// flags or the file describe, or the one the API configures.
fn main_with_api(
    start: Instant,
    parts: CliParts,
    filters: Filters,
    sock: &Path,
    mmds: SharedMmds,
) -> ExitCode {
    // Before the API thread exists, so that it inherits the mask: a stop
    // signal before InstanceStart is read here, not the default action.
    let signals = match SignalFd::new(&[libc::SIGTERM, libc::SIGINT, libc::SIGUSR1]) {
        Ok(s) => s,
        Err(e) => return fail(&format!("cannot set up the stop signals: {e}")),
    };
    let channel = match vmm::api::start(sock, filters.api.clone(), parts.launch.api_payload_limit) {
        Ok(c) => c,
        Err(e) => return fail(&error_line(&e)),
    };
    serve(start, parts, filters, channel, &signals, sock, &mmds)
}

fn serve(
    start: Instant,
    parts: CliParts,
    filters: Filters,
    channel: ApiChannel,
    signals: &SignalFd,
    sock: &Path,
    mmds: &SharedMmds,
) -> ExitCode {
    let id = parts.launch.id.clone();
    let mut logger_ready = false;
    let (vmm, config) = if parts.has_file || parts.flags.kernel.is_some() {
        // Configured at start, as Firecracker with --config-file: the API
        // serves the run-time requests.
        let config = match parts.file.overlay(parts.flags).finish() {
            Ok(c) => c,
            Err(e) => return fail(&error_line(&e)),
        };
        match prepare(&config, &parts.launch, start, &mut logger_ready, None, mmds) {
            Ok(v) => (v, config),
            Err(msg) => return fail(&msg),
        }
    } else {
        let api = PrebootApi {
            channel: &channel,
            signals,
            sock,
            mmds,
        };
        match configure_by_api(&parts, &api, start, &mut logger_ready) {
            Ok(built) => built,
            Err(code) => return code,
        }
    };
    boot(
        vmm,
        config,
        &parts.launch,
        start,
        filters,
        Some((channel, id)),
    )
}

/// What the pre-boot API loop reads from and serves.
#[derive(Clone, Copy)]
struct PrebootApi<'a> {
    channel: &'a ApiChannel,
    signals: &'a SignalFd,
    sock: &'a Path,
    mmds: &'a SharedMmds,
}

/// Whether a stop signal came before any VM ran: a clean end, and the API
/// socket goes with it. (Once a VM ran, the main thread's seccomp filter
/// allows no unlink: the socket stays, as Firecracker's does. The vsock
/// socket has a remover of its own: the pre-boot state drops it.)
fn stop_requested(signals: &SignalFd, sock: &Path) -> bool {
    match signals.read() {
        Ok(Some(sig)) if sig != libc::SIGUSR1 => {
            let _ = std::fs::remove_file(sock);
            true
        }
        _ => false,
    }
}

/// Answers the pre-boot API until an InstanceStart builds a VM, which it
/// returns with its configuration; or the exit status when a stop signal
/// or the API thread's end comes first.
fn configure_by_api(
    parts: &CliParts,
    api: &PrebootApi<'_>,
    start: Instant,
    logger_ready: &mut bool,
) -> Result<(vmm::vmm::Vmm, VmmConfig), ExitCode> {
    let PrebootApi {
        channel,
        signals,
        sock,
        mmds,
    } = *api;
    let mut pre = Preboot::with_seccomp(parts.flags.seccomp.unwrap_or_default())
        .with_mmds(mmds.clone())
        .with_flags(&parts.flags);
    loop {
        let cmd = match channel.commands.recv_timeout(SIGNAL_POLL) {
            Ok(cmd) => cmd,
            Err(RecvTimeoutError::Timeout) => {
                if stop_requested(signals, sock) {
                    return Err(ExitCode::SUCCESS);
                }
                continue;
            }
            Err(RecvTimeoutError::Disconnected) => {
                return Err(fail("the API socket's thread stopped before InstanceStart"));
            }
        };
        // One the API thread gave up on (and told its client so) is
        // dropped unapplied.
        let Some(cmd) = cmd.claim() else {
            continue;
        };
        let settings = match pre.handle(cmd.request, &parts.launch.id) {
            Step::Reply(r) => {
                cmd.reply.send(r);
                continue;
            }
            Step::Start(s) => s,
            Step::Load(req) => match load_snapshot(&req, parts, start, logger_ready) {
                Ok(built) => {
                    cmd.reply.send(Response::no_content());
                    return Ok(built);
                }
                Err(msg) => {
                    cmd.reply
                        .send(Response::fault(&format!("snapshot/load: {msg}")));
                    continue;
                }
            },
        };
        let built = settings
            .overlay(parts.flags.clone())
            .finish()
            .map_err(|e| error_line(&e))
            .and_then(|config| {
                prepare(
                    &config,
                    &parts.launch,
                    start,
                    logger_ready,
                    pre.vsock_socket(),
                    mmds,
                )
                .map(|v| (v, config))
            });
        match built {
            Ok(built) => {
                cmd.reply.send(Response::no_content());
                return Ok(built);
            }
            Err(msg) => cmd
                .reply
                .send(Response::fault(&format!("InstanceStart: {msg}"))),
        }
    }
}

/// Firecracker's flags that only warn, before anything starts:
/// `--enable-pci` (its devices stay on virtio-MMIO).
fn firecracker_notices(cli: &Cli) {
    if cli.firecracker.enable_pci {
        eprintln!("minivmm: warning: {PCI_WARNING}");
    }
}

/// Every thread's filter, the file's (`--seccomp-filter`) or minivmm's own
/// lists for `mode`: compiled before anything starts, so a broken list is a
/// setup error; installed by the threads themselves (the API thread at its
/// start, the others in Vmm::run).
fn thread_filters(launch: &Launch, mode: SeccompMode) -> Result<Filters, String> {
    let filters = match &launch.seccomp_filter {
        Some(path) => seccomp_file::filters_from_file(path).map_err(|e| error_line(&e))?,
        None => Filters::new(mode).map_err(|e| error_line(&e))?,
    };
    seccomp::install_sigsys_handler().map_err(|e| error_line(&e))?;
    Ok(filters)
}

/// Enters the jail `--jail` asks for, if any (whether it did, or the error
/// line). The process that started returns only in the jailed child: it
/// stays outside as its supervisor and exits with its status.
fn enter_jail(cli: &Cli) -> Result<bool, String> {
    let launch = cli.launch().map_err(|e| error_line(&e))?;
    let Some(jail) = &launch.jail else {
        return Ok(false);
    };
    // What needs the host's /sys, asked before the jail hides it.
    let _ = vmm::kvm::pvm::is_pvm_host();
    vmm::process::jail::enter(jail).map_err(|e| error_line(&e))?;
    Ok(true)
}

fn main() -> ExitCode {
    let start = Instant::now();
    // Before anything can panic: a panic on any thread ends the process.
    vmm::process::terminal::install_panic_hook();
    // While there is one thread and no filter: glibc's allocator would
    // otherwise open files of its own later, under a filter.
    vmm::process::settle::process();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) => {
            // --help and --version print to stdout and succeed.
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(e) => return fail(&clap_line(&e)),
    };
    if let Some(code) = snapshot_info(&cli) {
        return code;
    }
    firecracker_notices(&cli);
    let mode = cli.seccomp_mode();
    // Jailed before any file the user named is opened, the config file
    // included: from here every path resolves inside the jail.
    let jailed = match enter_jail(&cli) {
        Ok(jailed) => jailed,
        Err(msg) => return fail(&msg),
    };
    let parts = match cli.into_parts() {
        Ok(p) => p,
        Err(e) => return fail(&error_line(&e)),
    };
    if jailed {
        // A jailed minivmm keeps only what it opens itself: inherited
        // descriptors go now, but stdio and the TAPs the configuration
        // names by number (`fd=N`).
        let keep: Vec<i32> = parts
            .file
            .nets
            .iter()
            .chain(&parts.flags.nets)
            .filter_map(|n| n.fd.and_then(|fd| i32::try_from(fd).ok()))
            .collect();
        if let Err(e) = vmm::process::jail::close_inherited(&keep) {
            return fail(&error_line(&e));
        }
    }
    // After the jail, so that a filter naming minivmm's own pid has the
    // one its PID namespace gives it.
    let filters = match thread_filters(&parts.launch, mode) {
        Ok(f) => f,
        Err(msg) => return fail(&msg),
    };
    if parts.launch.id != vmm::config::ids::DEFAULT_ID {
        vmm::logger::set_instance_id(&parts.launch.id);
    }
    // The store outlives the pre-boot API: made before it, filled from
    // --metadata, a bad file one line and exit 1.
    let mmds = match vmm::config::mmds::initial_store(
        parts.launch.metadata.as_deref(),
        parts.launch.mmds_size_limit,
    ) {
        Ok(m) => m,
        Err(e) => return fail(&error_line(&e)),
    };
    if let Some(sock) = parts.launch.api_sock.clone() {
        return main_with_api(start, parts, filters, &sock, mmds);
    }
    let launch = parts.launch.clone();
    let config = match parts.file.overlay(parts.flags).finish() {
        Ok(c) => c,
        Err(e) => return fail(&error_line(&e)),
    };
    let mut logger_ready = false;
    let vmm = match prepare(&config, &launch, start, &mut logger_ready, None, &mmds) {
        Ok(v) => v,
        Err(msg) => return fail(&msg),
    };
    boot(vmm, config, &launch, start, filters, None)
}
