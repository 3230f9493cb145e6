// SPDX-License-Identifier: Apache-2.0
//! The harness's progress-watching deadlines (`minivmm_tests::progress`): a wait that sees
//! progress goes on (to its cap), time the host's other work takes from the watched processes
//! does not count as a stall, a stopped VMM fails its wait within the stall window, and a
//! watched command leaves no process behind.

use std::os::unix::process::CommandExt;
use std::process::Command;
use std::time::{Duration, Instant};

use minivmm_tests::progress::{run_delays, RunDelays};
use minivmm_tests::{
    cli_args, require, run_watched, write_ticking_kernel, Expired, Need, Patience, Vm, Watch,
};

const fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

/// One thread's run delay.
fn delay(tid: u32, d: Duration) -> RunDelays {
    RunDelays::from([(tid, d)])
}

#[test]
fn a_watch_resets_on_progress_and_fails_after_the_stall_window() {
    let t0 = Instant::now();
    let none = RunDelays::new();
    let mut w = Watch::new_at(t0, Patience::new(secs(10), secs(100)), &[], none.clone());
    assert_eq!(w.check_at(t0 + secs(9), &none, &[1]), Ok(()));
    // Progress at 9 s: the window starts again there.
    assert_eq!(w.check_at(t0 + secs(18), &none, &[1]), Ok(()));
    assert_eq!(
        w.check_at(t0 + secs(19), &none, &[1]),
        Err(Expired::Stalled {
            idle: secs(10),
            wall: secs(10),
            waited: secs(19)
        })
    );
    // Any change is progress, a new counter too.
    let mut w = Watch::new_at(t0, Patience::new(secs(10), secs(100)), &[], none.clone());
    assert_eq!(w.check_at(t0, &none, &[5]), Ok(()));
    assert_eq!(w.check_at(t0 + secs(9), &none, &[5, 0]), Ok(()));
    assert_eq!(w.check_at(t0 + secs(18), &none, &[5, 0]), Ok(()));
    assert!(w.check_at(t0 + secs(19), &none, &[5, 0]).is_err());
    assert_eq!(w.longest_idle(), secs(10));
}

#[test]
fn time_the_host_took_from_the_watched_threads_is_not_a_stall() {
    let t0 = Instant::now();
    let p = Patience::new(secs(10), secs(100));
    let mut w = Watch::new_at(t0, p, &[], delay(7, secs(3)));
    assert_eq!(w.check_at(t0, &delay(7, secs(3)), &[1]), Ok(()));
    // 25 s on the clock, of which the thread waited 20 for a CPU: 5 s of its own time.
    assert_eq!(w.check_at(t0 + secs(25), &delay(7, secs(23)), &[1]), Ok(()));
    assert_eq!(w.longest_idle(), secs(5));
    // Threads run side by side: the largest delay counts, not the sum. A thread born after
    // the last progress counts from zero.
    let both = RunDelays::from([(7, secs(24)), (8, secs(6))]);
    assert_eq!(
        w.check_at(t0 + secs(31), &both, &[1]),
        Err(Expired::Stalled {
            idle: secs(10),
            wall: secs(31),
            waited: secs(31)
        })
    );
    // Progress takes the delays of that moment as the new base.
    let mut w = Watch::new_at(t0, p, &[], RunDelays::new());
    assert_eq!(w.check_at(t0 + secs(5), &delay(7, secs(50)), &[2]), Ok(()));
    assert!(w.check_at(t0 + secs(14), &delay(7, secs(50)), &[2]).is_ok());
    assert!(w
        .check_at(t0 + secs(15), &delay(7, secs(50)), &[2])
        .is_err());
}

#[test]
fn a_wait_that_keeps_progressing_ends_at_the_cap() {
    let t0 = Instant::now();
    let none = RunDelays::new();
    let mut w = Watch::new_at(t0, Patience::new(secs(10), secs(30)), &[], none.clone());
    for (i, at) in (0..30).step_by(5).enumerate() {
        assert_eq!(w.check_at(t0 + secs(at), &none, &[i as u64]), Ok(()));
    }
    assert_eq!(
        w.check_at(t0 + secs(30), &none, &[99]),
        Err(Expired::Capped {
            own: secs(30),
            waited: secs(30)
        })
    );
    // The cap is in own time too: 50 s on the clock of which 25 waiting for a CPU is 25 s.
    let mut w = Watch::new_at(
        t0,
        Patience::new(secs(10), secs(30)),
        &[],
        delay(3, secs(1)),
    );
    for (i, at) in (0..50).step_by(5).enumerate() {
        let waited_for_cpu = delay(3, secs(1 + at / 2));
        assert_eq!(
            w.check_at(t0 + secs(at), &waited_for_cpu, &[i as u64]),
            Ok(())
        );
    }
    assert_eq!(
        w.check_at(t0 + secs(60), &delay(3, secs(31)), &[99]),
        Err(Expired::Capped {
            own: secs(30),
            waited: secs(60)
        })
    );
    assert_eq!(
        Patience::of(secs(60)),
        Patience::new(secs(60), secs(60) * Patience::CAP_FACTOR)
    );
}

/// A busy loop pinned to CPU 0 beside a second one there: it gets at most about half the CPU,
/// and the rest shows as its run delay, so a watch over it with no progress at all ends after
/// at least about twice its stall window on the clock (more if other work shares CPU 0 too:
/// ten times under a load of 11 on the 2 cores).
#[test]
fn a_cpu_starved_process_gets_its_stall_window_in_its_own_time() {
    if run_delays(&[std::process::id()]).is_empty() {
        minivmm_tests::print_skip("this kernel has no per-thread schedstat");
        return;
    }
    let spin = || {
        Command::new("taskset")
            .args(["-c", "0", "sh", "-c", "while :; do :; done"])
            .spawn()
            .expect("taskset (util-linux)")
    };
    let (mut hog, mut watched) = (spin(), spin());
    let started = Instant::now();
    let mut w = Watch::new(Patience::new(secs(1), secs(120)), &[watched.id()]);
    let verdict = loop {
        if let Err(e) = w.check(&[]) {
            break e;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let took = started.elapsed();
    for c in [&mut hog, &mut watched] {
        let _ = c.kill();
        let _ = c.wait();
    }
    assert!(matches!(verdict, Expired::Stalled { .. }), "{verdict}");
    assert!(
        took >= Duration::from_millis(1800),
        "{verdict} after {took:?}"
    );
    eprintln!("a starved busy loop stalled after {took:?} on the clock: {verdict}");
}

/// A guest that prints a line about every second keeps a wait going past its stall window;
/// the same VMM stopped with SIGSTOP fails the next wait within the stall window.
#[test]
fn a_stopped_vmm_fails_its_wait_within_the_stall_window() {
    if !require(&[Need::Kvm]) {
        return;
    }
    let kernel = std::env::temp_dir().join(format!("minivmm-tick-{}.elf", std::process::id()));
    write_ticking_kernel(&kernel).unwrap();
    let args = cli_args(&["--kernel", kernel.to_str().unwrap(), "--mem", "64"]);
    let mut vm = Vm::spawn(&args, None).unwrap();
    let ticking = vm.wait_until("two console lines", Patience::of(secs(60)), &[], |c| {
        c.matches('\n').count() >= 2
    });
    assert_eq!(ticking, Ok(()), "{}", vm.report());

    // Running, it makes progress at every line: the wait ends at its cap, not its window.
    let started = Instant::now();
    let why = vm
        .wait_until(
            "text it never prints",
            Patience::new(secs(5), secs(12)),
            &[],
            |c| c.contains("never"),
        )
        .expect_err("the text never comes");
    let took = started.elapsed();
    assert!(why.contains("cap passed"), "{why}\n{}", vm.report());
    assert!(took >= secs(12), "{took:?}");

    vm.signal("STOP");
    let started = Instant::now();
    let why = vm
        .wait_until(
            "text it never prints",
            Patience::new(secs(3), secs(60)),
            &[],
            |c| c.contains("never"),
        )
        .expect_err("a stopped VMM prints nothing");
    let took = started.elapsed();
    vm.signal("CONT");
    assert!(why.contains("no progress"), "{why}");
    assert!(took >= secs(3) && took < secs(10), "{why} after {took:?}");
    eprintln!("the stopped VMM's wait failed after {took:?}: {why}");
    vm.terminate(secs(10));
    let _ = std::fs::remove_file(&kernel);
}

/// Whether process `pid` exists (and is not a zombie).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        !s.rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z')
    })
}

#[test]
fn a_watched_command_leaves_no_process_behind() {
    // A child left behind holding the output pipe would keep a plain `output()` waiting: the
    // command's group is killed once the command itself ends.
    let started = Instant::now();
    let out = run_watched(
        Command::new("sh").args(["-c", "sleep 300 & echo $!; sleep 0.5"]),
        Patience::new(secs(20), secs(60)),
        &[],
        Vec::new,
    )
    .unwrap();
    assert!(out.success(), "{}", out.stderr_text());
    assert!(started.elapsed() < secs(10), "{:?}", started.elapsed());
    let pid: u32 = out.stdout_text().trim().parse().expect("the sleep's pid");
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        !alive(pid),
        "the background sleep {pid} outlived its command"
    );

    // A command that stops making progress is ended after the stall window, with SIGINT
    // first: a shell trap sees it and prints. The command starts with SIGINT ignored, as
    // everything a non-interactive shell starts in the background does (a CI run started
    // with `&`): a shell cannot trap a signal ignored when it started, so the watch must
    // give the command SIGINT at its default. Without that the trap never ran and SIGKILL
    // ended the shell 30 s later, in two clean-clone runs started that way.
    let started = Instant::now();
    let mut stalled = Command::new("sh");
    stalled.args([
        "-c",
        "trap 'echo interrupted; exit 3' INT; echo hi; while :; do sleep 0.1; done",
    ]);
    // SAFETY: between fork and exec, `signal` only (async-signal-safe).
    unsafe {
        stalled.pre_exec(|| {
            libc::signal(libc::SIGINT, libc::SIG_IGN);
            Ok(())
        });
    }
    let out = run_watched(
        &mut stalled,
        Patience::new(secs(1), secs(60)),
        &[],
        Vec::new,
    )
    .unwrap();
    let took = started.elapsed();
    assert!(!out.success());
    assert!(
        matches!(out.expired, Some(Expired::Stalled { .. })),
        "{out:?}"
    );
    // Ended by the stall window (1 s) and its SIGINT, not by the cap (60 s) nor by SIGKILL
    // (30 s after the SIGINT): the trap printed.
    assert!(took < secs(30), "{took:?}");
    assert_eq!(out.stdout_text(), "hi\ninterrupted\n");
    assert!(out.stderr_text().contains("ended by the test's watch"));

    // Progress in a probe (not output) keeps it going.
    let mut n = 0;
    let out = run_watched(
        Command::new("sh").args(["-c", "sleep 3"]),
        Patience::new(secs(1), secs(60)),
        &[],
        || {
            n += 1;
            vec![n]
        },
    )
    .unwrap();
    assert!(out.success(), "{}", out.stderr_text());
}
