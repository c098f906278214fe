//! Checking the settings, from flags or a file alike, and turning them into the run plan.

use std::path::Path;
use std::time::Duration;

use super::DiskConfig;
use super::{
    host_cpus, GuestSpec, Key, Machine, MonitorOptions, Problem, RunPlan, Source, VmConfig,
    EXIT_INVALID, EXIT_USAGE, MAX_QUANTUM_MS, MAX_TIMEOUT_SECS,
};

/// How errors name guest `index`'s setting `key`, or the machine's (`index` `None`).
fn setting(
    source: &Source,
    machine: &Machine,
    guests: &[GuestSpec],
    key: Key,
    index: Option<usize>,
) -> String {
    match (source, index) {
        (Source::Flags, _) => key.flag().into(),
        (Source::File(_), None) if machine.from_flags.contains(&key) => key.flag().into(),
        (Source::File(path), None) => format!("{}: {}", path.display(), key.key()),
        (Source::File(path), Some(i)) => {
            format!(
                "{}: {}: {}",
                path.display(),
                guest_label(guests, i),
                key.key()
            )
        }
    }
}

/// `guest[1] ("name")`, or `guest[1]` for a guest without a name.
fn guest_label(guests: &[GuestSpec], index: usize) -> String {
    match guests.get(index).and_then(|g| g.name.as_ref()) {
        Some(name) => format!("guest[{index}] ({name:?})"),
        None => format!("guest[{index}]"),
    }
}

/// The same path, as far as the host can tell (a path that does not resolve stays as it is).
fn same_file(a: &Path, b: &Path) -> bool {
    let resolve = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    resolve(a) == resolve(b)
}

/// Check `machine` and `guests` and turn them into what the monitor runs. `start_tsc` is the
/// TSC at process start (for `--boot-timing`).
pub fn build(
    machine: &Machine,
    guests: &[GuestSpec],
    source: &Source,
    start_tsc: u64,
) -> Result<RunPlan, Problem> {
    let name = |key: Key, index: Option<usize>| setting(source, machine, guests, key, index);
    let fail = |status: u8, key: Key, index: Option<usize>, what: &str| Problem {
        status,
        message: format!("{} {what}", name(key, index)),
    };
    if guests.is_empty() {
        return Err(Problem::usage(match source {
            Source::Flags => "no guest to run".into(),
            Source::File(path) => format!("{}: no [[guest]] to run", path.display()),
        }));
    }
    let timeout = match machine.timeout_secs {
        Some(secs) if !(secs > 0.0 && secs.is_finite()) => {
            return Err(fail(
                EXIT_USAGE,
                Key::Timeout,
                None,
                "must be a positive number of seconds",
            ))
        }
        Some(secs) if secs > MAX_TIMEOUT_SECS => {
            return Err(fail(
                EXIT_USAGE,
                Key::Timeout,
                None,
                &format!("is at most {MAX_TIMEOUT_SECS} seconds"),
            ))
        }
        other => other.and_then(|secs| Duration::try_from_secs_f64(secs).ok()),
    };
    if !(machine.quantum_ms > 0.0 && machine.quantum_ms.is_finite()) {
        return Err(fail(
            EXIT_USAGE,
            Key::Quantum,
            None,
            "must be a positive number of milliseconds",
        ));
    }
    if machine.quantum_ms > MAX_QUANTUM_MS {
        return Err(fail(
            EXIT_USAGE,
            Key::Quantum,
            None,
            &format!("is at most {MAX_QUANTUM_MS} milliseconds"),
        ));
    }
    if machine.pcpus == Some(0) {
        return Err(fail(EXIT_INVALID, Key::Pcpus, None, "must be at least 1"));
    }
    if machine.io_latency_us > 0 && guests.iter().all(|g| g.disk.is_none()) {
        return Err(fail(
            EXIT_USAGE,
            Key::IoLatency,
            None,
            "needs a guest with a disk",
        ));
    }
    for (i, guest) in guests.iter().enumerate() {
        if guest.image.as_os_str().is_empty() {
            return Err(fail(EXIT_USAGE, Key::Image, Some(i), "is empty"));
        }
        if guest.disk_read_only && guest.disk.is_none() {
            return Err(fail(EXIT_USAGE, Key::DiskReadOnly, Some(i), "needs a disk"));
        }
        if let Some(given) = &guest.name {
            if given.is_empty() || given.chars().any(char::is_control) {
                return Err(fail(
                    EXIT_USAGE,
                    Key::Name,
                    Some(i),
                    "must be non-empty, without control characters",
                ));
            }
            if let Some(first) = guests[..i]
                .iter()
                .position(|g| g.name.as_ref() == Some(given))
            {
                return Err(fail(
                    EXIT_USAGE,
                    Key::Name,
                    Some(i),
                    &format!("is also guest[{first}]'s: names must be unique"),
                ));
            }
        }
        if let Some(disk) = &guest.disk {
            let earlier = guests[..i]
                .iter()
                .position(|g| g.disk.as_deref().is_some_and(|d| same_file(d, disk)));
            if let Some(first) = earlier {
                if !(guest.disk_read_only && guests[first].disk_read_only) {
                    return Err(fail(
                        EXIT_USAGE,
                        Key::Disk,
                        Some(i),
                        &format!(
                            "{} is also guest[{first}]'s disk: guests share a disk only read-only",
                            disk.display()
                        ),
                    ));
                }
            }
        }
    }
    let mut configs = Vec::with_capacity(guests.len());
    for (i, guest) in guests.iter().enumerate() {
        let net = net_config(guest).map_err(|(key, what)| fail(EXIT_USAGE, key, Some(i), &what))?;
        super::check_env(&guest.args, &guest.env)
            .map_err(|what| fail(EXIT_USAGE, Key::Env, Some(i), &what))?;
        let config = VmConfig {
            image: guest.image.clone(),
            name: guest.name.clone(),
            vcpus: guest.vcpus,
            mem_size: guest.mem,
            args: guest.args.clone(),
            env: guest.env.clone(),
            boot_timing: machine.boot_timing,
            timeout,
            start_tsc,
            thread_stack_size: guest.thread_stack,
            thread_stacks: guest.thread_stacks,
            disk: guest.disk.as_ref().map(|path| DiskConfig {
                path: path.clone(),
                read_only: guest.disk_read_only,
                latency: Duration::from_micros(machine.io_latency_us),
                inline_wait: Duration::from_micros(machine.io_inline_wait_us),
            }),
            mounts: guest.mounts.clone(),
            net,
            activations: guest.activations,
            latency_critical: guest.latency_critical,
            prefault: guest.prefault,
        };
        if let Err((key, what)) = config.check() {
            // The disk timings are the machine's settings, not the guest's.
            let index = (!matches!(key, Key::IoLatency | Key::IoInlineWait)).then_some(i);
            return Err(fail(EXIT_INVALID, key, index, &what));
        }
        configs.push(config);
    }
    Ok(RunPlan {
        guests: configs,
        options: MonitorOptions {
            pcpus: machine.pcpus.unwrap_or_else(host_cpus),
            quantum: Duration::try_from_secs_f64(machine.quantum_ms / 1000.0)
                .unwrap_or(Duration::from_millis(10)),
            activations: true,
            timeout,
            trace: machine.trace.clone(),
            handle_signals: true,
            ctl_socket: machine.ctl.clone(),
            chaos_seed: machine.chaos,
            host_sched: machine.host_sched,
            place_vcpus: machine.place_vcpus,
            batch_sched_idle: machine.batch_sched_idle,
            preempt_at: None,
        },
        stats: machine.stats,
    })
}

/// The guest's `publish` and `allow_connect` entries, parsed (`/udp` entries apart).
fn net_config(guest: &GuestSpec) -> Result<super::NetConfig, (Key, String)> {
    let mut net = super::NetConfig::default();
    for s in &guest.publish {
        net.add_publish(s).map_err(|e| (Key::Publish, e))?;
    }
    for s in &guest.allow_connect {
        net.add_allow_connect(s)
            .map_err(|e| (Key::AllowConnect, e))?;
    }
    Ok(net)
}
