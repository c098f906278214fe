//! The monitor: one or more guests on one budget of physical CPUs.
//!
//! It creates the guests, starts one thread per vCPU, runs the dispatcher (a thread that asks
//! the allocator to rebalance every quantum and kicks the vCPUs it revokes), turns SIGINT and
//! SIGTERM into SIGNAL upcalls (a second signal stops every guest), and collects the outcomes.

use std::io::Write;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::allocator::Allocator;
use crate::config::{MonitorOptions, VmConfig};
use crate::error::Error;
use crate::guest::{Guest, PrefixedConsole, Processors};
use crate::report::{boot_timing, RunReport};
use crate::trace::Trace;
use crate::vcpu;
use crate::vm::Outcome;

/// A guest's name: the one its configuration gives, else its image's file name, made unique
/// among `configs` with `#index` (given names are left as they are).
fn guest_names(configs: &[VmConfig]) -> Vec<String> {
    let mut names: Vec<String> = configs
        .iter()
        .map(|c| match &c.name {
            Some(name) => name.clone(),
            None => c
                .image
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| "guest".into()),
        })
        .collect();
    let duplicated: Vec<bool> = names
        .iter()
        .map(|n| names.iter().filter(|m| *m == n).count() > 1)
        .collect();
    for (i, name) in names.iter_mut().enumerate() {
        if duplicated[i] && configs[i].name.is_none() {
            *name = format!("{name}#{i}");
        }
    }
    names
}

/// Which guests' vCPU threads run at the host's idle priority: with a latency-critical guest,
/// every other one, unless `batch_sched_idle` says no (by default not under `host_sched`,
/// where it is what a user does by hand).
fn batch_at_idle_priority(configs: &[VmConfig], options: &MonitorOptions) -> Vec<bool> {
    let on = options.batch_sched_idle.unwrap_or(!options.host_sched)
        && configs.iter().any(|c| c.latency_critical);
    configs.iter().map(|c| on && !c.latency_critical).collect()
}

/// Run `configs` as guests sharing `options.pcpus` processors, each with its console; returns
/// one report per guest, in order.
pub fn run_guests(
    configs: &[VmConfig],
    consoles: Vec<Box<dyn Write + Send>>,
    options: &MonitorOptions,
) -> Result<Vec<RunReport>, Error> {
    if configs.is_empty() {
        return Err(Error::Config("no guest to run".into()));
    }
    if options.pcpus == 0 {
        return Err(Error::Config("--pcpus must be at least 1".into()));
    }
    if options.host_sched && options.chaos_seed.is_some() {
        return Err(Error::Config(
            "--chaos needs the allocator: not with --host-sched".into(),
        ));
    }
    // Host-scheduled: a slot for every vCPU, so nothing is ever revoked, and no upcalls.
    let host_sched = MonitorOptions {
        pcpus: configs
            .iter()
            .map(|c| c.vcpus as usize)
            .sum::<usize>()
            .max(1),
        activations: false,
        ..options.clone()
    };
    let options = if options.host_sched {
        &host_sched
    } else {
        options
    };
    // --timeout counts from here: loading the guests is part of the run.
    let deadline = options.timeout.map(|t| Instant::now() + t);
    let ctl_socket = match &options.ctl_socket {
        Some(path) => Some((path, crate::ctl::bind(path)?)),
        None => None,
    };
    vcpu::install_kick_handler()?;
    let signals = if options.handle_signals {
        Some(crate::signals::block()?)
    } else {
        None
    };
    let procs = Arc::new(Processors::new(Allocator::new(
        options.pcpus,
        options.quantum,
    )));
    if options.place_vcpus && !options.host_sched {
        // Each processor one host CPU, a granted vCPU's thread on it (allocator/place.rs);
        // host-scheduled vCPU threads are left wholly to Linux.
        procs.alloc.place_on_host_cpus();
    }
    let trace = match &options.trace {
        Some(path) => Some(Arc::new(
            Trace::create(path, crate::tsc_khz_estimate()).map_err(|e| {
                Error::Host(format!("cannot create the trace {}: {e}", path.display()))
            })?,
        )),
        None => None,
    };
    let names = guest_names(configs);
    let batch_idle = batch_at_idle_priority(configs, options);
    let mut guests = Vec::new();
    let mut threads = Vec::new();
    for ((config, console), name) in configs.iter().zip(consoles).zip(names) {
        let console: Box<dyn Write + Send> = if configs.len() > 1 {
            Box::new(PrefixedConsole::new(format!("[{name}] "), console))
        } else {
            console
        };
        let created = Guest::create(
            config,
            name,
            console,
            &procs,
            options.activations && config.activations,
            trace.clone(),
            options.preempt_at.as_ref(),
        )?;
        if let Some(disk) = &created.guest.disk {
            disk.queue
                .start(&created.guest)
                .map_err(|e| Error::Host(format!("cannot start a disk thread: {e}")))?;
        }
        let idle = batch_idle[created.guest.id];
        procs.alloc.set_host_idle_priority(created.guest.id, idle);
        for (index, fd) in created.fds.into_iter().enumerate() {
            let guest = Arc::clone(&created.guest);
            let thread = std::thread::Builder::new()
                .name(format!("g{}-vcpu{index}", guest.id))
                .spawn(move || {
                    if idle {
                        vcpu::enter_host_idle_priority(&guest);
                    }
                    vcpu::run_vcpu(fd, index as u32, guest)
                })
                .map_err(|e| Error::Host(format!("cannot start a vCPU thread: {e}")))?;
            threads.push(thread);
        }
        crate::devices::net::thread::spawn_thread(&created.guest)
            .map_err(|e| Error::Host(format!("cannot start the net thread: {e}")))?;
        guests.push(created.guest);
    }
    let started = crate::arch::current::timestamp();

    let stop_dispatcher = Arc::new(StopSignal::default());
    let dispatcher = {
        let procs = Arc::clone(&procs);
        let stop = Arc::clone(&stop_dispatcher);
        let chaos = options.chaos_seed;
        let guests = guests.clone();
        let max_budget = configs
            .iter()
            .map(|c| c.vcpus as usize)
            .sum::<usize>()
            .max(1);
        let budget = options.pcpus;
        let host_sched = options.host_sched;
        std::thread::Builder::new()
            .name("dispatcher".into())
            .spawn(move || {
                crate::sandbox::enter(crate::sandbox::ThreadKind::Dispatcher);
                let mut watch = InterruptWatch::default();
                match chaos {
                    None if host_sched => {
                        while !stop.wait(vcpu::INTERRUPT_WATCH_PERIOD) {
                            watch.maybe(&guests);
                        }
                    }
                    None => {
                        let pause = procs.alloc.quantum().max(Duration::from_micros(100));
                        while !stop.wait(pause) {
                            procs.revoke(procs.alloc.rebalance());
                            guests.iter().for_each(|g| g.retry_pending());
                            guests.iter().for_each(|g| g.drain_timeline());
                            watch.maybe(&guests);
                        }
                    }
                    Some(seed) => {
                        let mut rng = seed | 1;
                        let mut next = || {
                            // xorshift64
                            rng ^= rng << 13;
                            rng ^= rng >> 7;
                            rng ^= rng << 17;
                            rng
                        };
                        loop {
                            let pcpus = 1 + (next() as usize % max_budget.min(budget.max(1)));
                            procs.revoke(procs.alloc.set_budget(pcpus));
                            procs.revoke(procs.alloc.rebalance());
                            guests.iter().for_each(|g| g.retry_pending());
                            guests.iter().for_each(|g| g.drain_timeline());
                            watch.maybe(&guests);
                            if stop.wait(Duration::from_micros(100 + next() % 1900)) {
                                break;
                            }
                        }
                    }
                }
            })
            .map_err(|e| Error::Host(format!("cannot start the dispatcher: {e}")))?
    };
    // The first grants, without waiting a quantum.
    procs.revoke(procs.alloc.rebalance());
    let signal_thread = signals.map(|set| crate::signals::spawn_forwarder(set, guests.clone()));
    let ctl = match ctl_socket {
        Some((path, bound)) => Some(crate::ctl::serve(
            path,
            bound,
            guests.clone(),
            Arc::clone(&procs),
        )?),
        None => None,
    };
    // Every thread is started: the main thread's own filter now (threads inherit it).
    crate::sandbox::enter(crate::sandbox::ThreadKind::Main);

    wait_all(&procs, &guests, deadline, options.timeout);
    stop_dispatcher.stop();
    for thread in threads {
        if thread.join().is_err() {
            return Err(Error::Host("a vCPU thread panicked".into()));
        }
    }
    let _ = dispatcher.join();
    for guest in &guests {
        if let Some(hooks) = &guest.preempt_at {
            eprintln!("activm: [{}] {}", guest.name, hooks.summary());
        }
    }
    drop(signal_thread);
    drop(ctl);
    if let (Some(trace), Some(path)) = (&trace, &options.trace) {
        guests.iter().for_each(|g| g.finish_timeline());
        trace
            .finish()
            .map_err(|e| Error::Host(format!("cannot write the trace {}: {e}", path.display())))?;
    }
    Ok(guests
        .iter()
        .map(|guest| {
            let outcome = guest.outcome().unwrap_or(Outcome::AllStopped);
            let timing = guest
                .config
                .boot_timing
                .then(|| boot_timing(guest, started));
            RunReport::new(outcome, timing, guest)
        })
        .collect())
}

/// When the dispatcher last ran the interrupt watch (`vcpu/nudge.rs`).
#[derive(Debug)]
struct InterruptWatch(Instant);

impl Default for InterruptWatch {
    fn default() -> Self {
        InterruptWatch(Instant::now())
    }
}

impl InterruptWatch {
    /// Run the watch on every guest if a period has passed since the last time.
    fn maybe(&mut self, guests: &[Arc<Guest>]) {
        if self.0.elapsed() >= vcpu::INTERRUPT_WATCH_PERIOD {
            self.0 = Instant::now();
            guests.iter().for_each(|g| g.watch_interrupts());
        }
    }
}

/// Tells the dispatcher to stop, waking it at once however long its pause.
#[derive(Debug, Default)]
struct StopSignal {
    stopped: Mutex<bool>,
    changed: Condvar,
}

impl StopSignal {
    fn stop(&self) {
        *self.stopped.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.changed.notify_all();
    }

    /// Pause up to `pause`; true if stopped (then at once).
    fn wait(&self, pause: Duration) -> bool {
        let stopped = self.stopped.lock().unwrap_or_else(|e| e.into_inner());
        *self
            .changed
            .wait_timeout_while(stopped, pause, |stopped| !*stopped)
            .unwrap_or_else(|e| e.into_inner())
            .0
    }
}

fn wait_all(
    procs: &Processors,
    guests: &[Arc<Guest>],
    deadline: Option<Instant>,
    timeout: Option<Duration>,
) {
    let (count, cv) = &procs.finished;
    let mut done = count.lock().unwrap_or_else(|e| e.into_inner());
    while *done < guests.len() {
        match deadline {
            None => done = cv.wait(done).unwrap_or_else(|e| e.into_inner()),
            Some(deadline) => {
                let now = Instant::now();
                if now >= deadline {
                    drop(done);
                    let timeout = timeout.unwrap_or_default();
                    // Every guest's report first: a guest stopped frees its processors, and
                    // the others' CPU samples would show them running on those.
                    for guest in guests {
                        guest.begin_hang_report(&format!("--timeout {timeout:?}"));
                    }
                    for guest in guests {
                        guest.finish(Outcome::TimedOut(timeout));
                    }
                    done = count.lock().unwrap_or_else(|e| e.into_inner());
                    continue;
                }
                done = cv
                    .wait_timeout(done, deadline - now)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
        }
    }
}

/// Boot and run one guest to its end on all host CPUs. Console output goes to `console`.
pub fn run(config: &VmConfig, console: Box<dyn Write + Send>) -> Result<RunReport, Error> {
    let options = MonitorOptions {
        timeout: config.timeout,
        ..MonitorOptions::default()
    };
    let mut reports = run_guests(std::slice::from_ref(config), vec![console], &options)?;
    Ok(reports.remove(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stop_wakes_a_long_pause_at_once() {
        let stop = Arc::new(StopSignal::default());
        let waiter = {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                let started = Instant::now();
                assert!(stop.wait(Duration::from_secs(600)));
                started.elapsed()
            })
        };
        std::thread::sleep(Duration::from_millis(20));
        stop.stop();
        assert!(waiter.join().unwrap() < Duration::from_secs(10));
        assert!(stop.wait(Duration::from_secs(600)));
    }

    #[test]
    fn guest_names_keep_given_names_and_number_repeated_images() {
        let named = |image: &str, name: &str| VmConfig {
            name: Some(name.into()),
            ..VmConfig::new(image)
        };
        let configs = [
            VmConfig::new("/g/demo"),
            named("/g/demo", "demo"),
            VmConfig::new("/g/demo"),
            named("/g/rt-tests", "aware"),
            VmConfig::new("/g/rt-tests"),
        ];
        assert_eq!(
            guest_names(&configs),
            ["demo#0", "demo", "demo#2", "aware", "rt-tests"]
        );
    }
}
