//! Tests of flags, files and their checks.

use std::path::Path;

use super::MountConfig;
use super::*;

const FILE: &str = "/etc/activm/run.toml";

fn parse_ok(text: &str) -> (Machine, Vec<GuestSpec>) {
    parse(text, Path::new(FILE)).unwrap_or_else(|p| panic!("{}", p.message))
}

fn parse_err(text: &str) -> Problem {
    match parse(text, Path::new(FILE)) {
        Ok(parsed) => panic!("parsed: {parsed:?}"),
        Err(problem) => problem,
    }
}

fn build_err(text: &str) -> Problem {
    let (machine, guests) = parse_ok(text);
    match build(&machine, &guests, &Source::File(FILE.into()), 0) {
        Ok(plan) => panic!("built: {plan:?}"),
        Err(problem) => problem,
    }
}

#[test]
fn sizes_parse() {
    assert_eq!(parse_size("256M"), Ok(256 << 20));
    assert_eq!(parse_size("1G"), Ok(1 << 30));
    assert_eq!(parse_size("64MiB"), Ok(64 << 20));
    assert_eq!(parse_size("4096"), Ok(4096));
    assert!(parse_size("12Q").is_err());
    assert!(parse_size("M").is_err());
    assert!(parse_size("99999999999999G").is_err());
}

#[test]
fn a_full_file_parses() {
    let (machine, guests) = parse_ok(
        r#"
        pcpus = 2
        quantum = 5
        chaos = 7
        timeout = 1.5
        stats = true
        boot_timing = true
        trace = "run.json"
        ctl = "/tmp/activm.sock"
        io_latency = 1000
        io_inline_wait = 40
        place_vcpus = false
        batch_sched_idle = false

        [[guest]]
        image = "apps/rt-tests"
        name = "aware"
        vcpus = 4
        mem = "512M"
        args = ["blk", "two words"]
        env = { LANG = "C.UTF-8", EMPTY = "" }
        disk = "disk.img"
        disk_read_only = true
        mounts = ["data:/data", "/srv/ro:/ro/:ro"]
        thread_stack = 65536
        thread_stacks = 64
        prefault = true

        [[guest]]
        image = "/opt/guests/demo"
        no_activations = true
        "#,
    );
    assert_eq!(
        machine,
        Machine {
            pcpus: Some(2),
            quantum_ms: 5.0,
            chaos: Some(7),
            timeout_secs: Some(1.5),
            stats: true,
            boot_timing: true,
            trace: Some("/etc/activm/run.json".into()),
            ctl: Some("/tmp/activm.sock".into()),
            io_latency_us: 1000,
            io_inline_wait_us: 40,
            host_sched: false,
            place_vcpus: false,
            batch_sched_idle: Some(false),
            from_flags: Vec::new(),
        }
    );
    assert_eq!(
        guests[0],
        GuestSpec {
            image: "/etc/activm/apps/rt-tests".into(),
            name: Some("aware".into()),
            vcpus: 4,
            mem: 512 << 20,
            args: vec!["blk".into(), "two words".into()],
            env: vec![
                EnvVar {
                    key: "EMPTY".into(),
                    value: "".into()
                },
                EnvVar {
                    key: "LANG".into(),
                    value: "C.UTF-8".into()
                },
            ],
            activations: true,
            latency_critical: false,
            prefault: true,
            disk: Some("/etc/activm/disk.img".into()),
            disk_read_only: true,
            mounts: vec![
                MountConfig {
                    host: "/etc/activm/data".into(),
                    guest: "/data".into(),
                    read_only: false,
                },
                MountConfig {
                    host: "/srv/ro".into(),
                    guest: "/ro".into(),
                    read_only: true,
                },
            ],
            thread_stack: 64 << 10,
            thread_stacks: Some(64),
            publish: Vec::new(),
            allow_connect: Vec::new(),
        }
    );
    assert_eq!(
        guests[1],
        GuestSpec {
            activations: false,
            ..GuestSpec::new("/opt/guests/demo")
        }
    );
}

#[test]
fn a_minimal_file_takes_the_defaults() {
    let (machine, guests) = parse_ok("[[guest]]\nimage = \"demo\"\n");
    assert_eq!(machine, Machine::default());
    assert_eq!(guests, [GuestSpec::new("/etc/activm/demo")]);
    let (_, guests) = parse("[[guest]]\nimage = \"demo\"\n", Path::new("run.toml")).unwrap();
    assert_eq!(guests[0].image, Path::new("./demo"));
}

#[test]
fn unknown_keys_are_named() {
    let p = parse_err("pcpu = 2\n[[guest]]\nimage = \"demo\"\n");
    assert_eq!(p.status, EXIT_USAGE);
    assert!(
        p.message.starts_with(&format!(
            "{FILE}:1:1: pcpu: unknown field `pcpu`, expected one of"
        )),
        "{}",
        p.message
    );
    let p = parse_err("[[guest]]\nimage = \"demo\"\n[[guest]]\nimage = \"demo\"\nvcpu = 2\n");
    assert_eq!(p.status, EXIT_USAGE);
    assert!(
        p.message
            .starts_with(&format!("{FILE}:5:1: guest[1].vcpu: unknown field `vcpu`")),
        "{}",
        p.message
    );
    assert!(
        p.message.ends_with("\n  |\n5 | vcpu = 2\n  | ^^^^"),
        "{}",
        p.message
    );
}

#[test]
fn wrong_types_are_named() {
    for (text, start) in [
        (
            "[[guest]]\nimage = \"demo\"\nvcpus = \"four\"\n",
            ":3:9: guest[0].vcpus: invalid type: string \"four\", expected u32",
        ),
        (
            "[[guest]]\nimage = \"demo\"\nargs = \"exit 3\"\n",
            ":3:8: guest[0].args: invalid type: string \"exit 3\", expected a sequence",
        ),
        (
            "[[guest]]\nimage = \"demo\"\nargs = [\n  \"exit\",\n  3,\n]\n",
            ":5:3: guest[0].args[1]: invalid type: integer `3`, expected a string",
        ),
        (
            "[[guest]]\nimage = 7\n",
            ":2:9: guest[0].image: invalid type: integer `7`",
        ),
        (
            "stats = \"yes\"\n[[guest]]\nimage = \"demo\"\n",
            ":1:9: stats: invalid type: string \"yes\", expected a boolean",
        ),
        (
            "pcpus = -1\n[[guest]]\nimage = \"demo\"\n",
            ":1:9: pcpus: invalid value: integer `-1`",
        ),
        (
            "[[guest]]\nimage = \"demo\"\nmem = \"12Q\"\n",
            ":3:7: guest[0].mem: unknown size suffix \"Q\" (use K, M or G)",
        ),
        (
            "[[guest]]\nimage = \"demo\"\nmem = -4\n",
            ":3:7: guest[0].mem: invalid value: integer `-4`, expected a size",
        ),
        (
            "[[guest]]\nimage = \"demo\"\nthread_stack = 1.5\n",
            ":3:16: guest[0].thread_stack: invalid type: floating point `1.5`, expected a size",
        ),
        (
            "[guest]\nimage = \"demo\"\n",
            ":1:1: guest: invalid type: map, expected [[guest]] tables, one per guest",
        ),
    ] {
        let p = parse_err(text);
        assert_eq!(p.status, EXIT_USAGE, "{text}");
        assert!(
            p.message.starts_with(&format!("{FILE}{start}")),
            "{start:?} at the start of {}",
            p.message
        );
    }
}

#[test]
fn a_guest_needs_an_image_and_a_file_needs_a_guest() {
    let p = parse_err("[[guest]]\nimage = \"demo\"\n\n[[guest]]\nvcpus = 2\n");
    assert_eq!(p.status, EXIT_USAGE);
    assert!(
        p.message
            .starts_with(&format!("{FILE}:4:1: guest[1]: missing field `image`")),
        "{}",
        p.message
    );
    for text in ["", "pcpus = 2\n", "guest = []\n"] {
        let p = parse_err(text);
        assert_eq!(p.status, EXIT_USAGE);
        assert_eq!(
            p.message,
            format!("{FILE}: no [[guest]] table: list at least one guest, each with an image")
        );
    }
    let p = build_err("[[guest]]\nimage = \"\"\n");
    assert_eq!(p.message, format!("{FILE}: guest[0]: image is empty"));
}

#[test]
fn syntax_errors_say_where() {
    let p = parse_err("[[guest]]\nimage = \"demo\nvcpus = 2\n");
    assert_eq!(p.status, EXIT_USAGE);
    assert!(
        p.message
            .starts_with(&format!("{FILE}:2:14: invalid basic string")),
        "{}",
        p.message
    );
}

#[test]
fn values_are_checked_with_the_flags_statuses() {
    let p = build_err(
        "[[guest]]\nimage = \"demo\"\n[[guest]]\nimage = \"demo\"\nname = \"b\"\nvcpus = 0\n",
    );
    assert_eq!(p.status, EXIT_INVALID);
    assert_eq!(
        p.message,
        format!("{FILE}: guest[1] (\"b\"): vcpus must be between 1 and 64, not 0")
    );
    let p = build_err("[[guest]]\nimage = \"demo\"\nmem = \"3M\"\n");
    assert_eq!(p.status, EXIT_INVALID);
    assert!(p.message.starts_with(&format!(
        "{FILE}: guest[0]: mem must be a multiple of 2 MiB"
    )));
    let p = build_err("[[guest]]\nimage = \"demo\"\nthread_stack = \"1K\"\n");
    assert_eq!(
        p.message,
        format!("{FILE}: guest[0]: thread_stack must be between 4K and 64M")
    );
    let p = build_err("timeout = 0\n[[guest]]\nimage = \"demo\"\n");
    assert_eq!(p.status, EXIT_USAGE);
    assert_eq!(
        p.message,
        format!("{FILE}: timeout must be a positive number of seconds")
    );
    let p = build_err("quantum = -1\n[[guest]]\nimage = \"demo\"\n");
    assert_eq!(p.status, EXIT_USAGE);
    // Huge values are usage errors, never a panic building a Duration.
    for (text, message) in [
        ("timeout = 1e30", "timeout is at most 31536000 seconds"),
        ("timeout = 1e19", "timeout is at most 31536000 seconds"),
        ("quantum = 1e300", "quantum is at most 60000 milliseconds"),
    ] {
        let p = build_err(&format!("{text}\n[[guest]]\nimage = \"demo\"\n"));
        assert_eq!(
            (p.status, p.message),
            (EXIT_USAGE, format!("{FILE}: {message}"))
        );
    }
    let p = build_err("pcpus = 0\n[[guest]]\nimage = \"demo\"\n");
    assert_eq!(
        (p.status, p.message),
        (EXIT_INVALID, format!("{FILE}: pcpus must be at least 1"))
    );
    let p = build_err("io_latency = 20000000\n[[guest]]\nimage = \"demo\"\ndisk = \"d.img\"\n");
    assert_eq!(p.status, EXIT_INVALID);
    assert_eq!(
        p.message,
        format!("{FILE}: io_latency is at most 10000000 us")
    );
    let p = build_err("io_inline_wait = 2000\n[[guest]]\nimage = \"demo\"\ndisk = \"d.img\"\n");
    assert_eq!(p.status, EXIT_INVALID);
    assert_eq!(
        p.message,
        format!("{FILE}: io_inline_wait is at most 1000 us")
    );
}

#[test]
fn a_flag_over_the_file_is_named_as_a_flag() {
    let (mut machine, guests) = parse_ok("timeout = 5\n[[guest]]\nimage = \"demo\"\n");
    machine.timeout_secs = Some(-1.0);
    machine.from_flags.push(Key::Timeout);
    let p = build(&machine, &guests, &Source::File(FILE.into()), 0).unwrap_err();
    assert_eq!(p.message, "--timeout must be a positive number of seconds");
}

#[test]
fn disks_names_and_latency_are_checked_across_guests() {
    let p = build_err("[[guest]]\nimage = \"demo\"\ndisk_read_only = true\n");
    assert_eq!(p.status, EXIT_USAGE);
    assert_eq!(
        p.message,
        format!("{FILE}: guest[0]: disk_read_only needs a disk")
    );
    let p = build_err("io_latency = 100\n[[guest]]\nimage = \"demo\"\n");
    assert_eq!(
        p.message,
        format!("{FILE}: io_latency needs a guest with a disk")
    );
    let p = build_err(
        "[[guest]]\nimage = \"a\"\ndisk = \"d.img\"\n[[guest]]\nimage = \"b\"\ndisk = \"d.img\"\ndisk_read_only = true\n",
    );
    assert_eq!(p.status, EXIT_USAGE);
    assert_eq!(
        p.message,
        format!("{FILE}: guest[1]: disk /etc/activm/d.img is also guest[0]'s disk: guests share a disk only read-only")
    );
    let (machine, guests) = parse_ok(
        "[[guest]]\nimage = \"a\"\ndisk = \"d.img\"\ndisk_read_only = true\n[[guest]]\nimage = \"b\"\ndisk = \"d.img\"\ndisk_read_only = true\n",
    );
    assert!(build(&machine, &guests, &Source::File(FILE.into()), 0).is_ok());
    let p = build_err(
        "[[guest]]\nimage = \"a\"\nname = \"x\"\n[[guest]]\nimage = \"b\"\nname = \"x\"\n",
    );
    assert_eq!(
        p.message,
        format!("{FILE}: guest[1] (\"x\"): name is also guest[0]'s: names must be unique")
    );
    let p = build_err("[[guest]]\nimage = \"a\"\nname = \"\"\n");
    assert_eq!(p.status, EXIT_USAGE);
}

#[test]
fn a_plan_carries_every_setting() {
    let (machine, guests) = parse_ok(
        r#"
        pcpus = 3
        quantum = 2.5
        timeout = 9
        io_latency = 300
        [[guest]]
        image = "a"
        name = "first"
        vcpus = 4
        args = ["x"]
        env = { K = "v=w" }
        disk = "d.img"
        [[guest]]
        image = "b"
        no_activations = true
        "#,
    );
    let plan = build(&machine, &guests, &Source::File(FILE.into()), 42).unwrap();
    assert_eq!(plan.options.pcpus, 3);
    assert_eq!(plan.options.quantum, Duration::from_micros(2500));
    assert_eq!(plan.options.timeout, Some(Duration::from_secs(9)));
    assert!(plan.options.activations);
    let [a, b] = &plan.guests[..] else {
        panic!("two guests")
    };
    assert_eq!(
        (a.name.as_deref(), a.vcpus, a.activations),
        (Some("first"), 4, true)
    );
    assert_eq!(a.args, ["x"]);
    assert_eq!(a.env, [parse_env("K=v=w").unwrap()]);
    assert!(b.env.is_empty());
    assert_eq!(a.start_tsc, 42);
    let disk = a.disk.as_ref().unwrap();
    assert_eq!(disk.latency, Duration::from_micros(300));
    assert_eq!(disk.path, Path::new("/etc/activm/d.img"));
    assert_eq!(
        (b.name.as_deref(), b.vcpus, b.activations),
        (None, 1, false)
    );
    assert!(b.disk.is_none());
}

#[test]
fn flags_errors_name_the_flags() {
    let mut guest = GuestSpec::new("demo");
    guest.vcpus = 65;
    let p = build(&Machine::default(), &[guest], &Source::Flags, 0).unwrap_err();
    assert_eq!(
        (p.status, p.message.as_str()),
        (EXIT_INVALID, "--vcpus must be between 1 and 64, not 65")
    );
    let machine = Machine {
        quantum_ms: 0.0,
        ..Machine::default()
    };
    let p = build(&machine, &[GuestSpec::new("demo")], &Source::Flags, 0).unwrap_err();
    assert_eq!(
        (p.status, p.message.as_str()),
        (
            EXIT_USAGE,
            "--quantum must be a positive number of milliseconds"
        )
    );
}

#[test]
fn env_entries_are_checked() {
    assert_eq!(
        parse_env("A=b=c"),
        Ok(EnvVar {
            key: "A".into(),
            value: "b=c".into()
        })
    );
    assert_eq!(parse_env("A="), Ok(parse_env("A=").unwrap()));
    assert_eq!(parse_env("A").unwrap_err(), "\"A\" is not KEY=VALUE");
    assert_eq!(parse_env("=x").unwrap_err(), "\"=x\": the key is empty");
    assert!(parse_env("A=x\0").is_err());

    let env_of =
        |vars: &[&str]| -> Vec<EnvVar> { vars.iter().map(|v| parse_env(v).unwrap()).collect() };
    let mut guest = GuestSpec::new("demo");
    guest.env = env_of(&["A=1", "A=2"]);
    let p = build(&Machine::default(), &[guest.clone()], &Source::Flags, 0).unwrap_err();
    assert_eq!(
        (p.status, p.message.as_str()),
        (EXIT_USAGE, "--env \"A\" is given twice")
    );
    // Arguments and environment share the argument block: each fits alone, not together.
    let big = format!("B={}", "x".repeat(3000));
    guest.env = env_of(&[&big]);
    assert!(build(&Machine::default(), &[guest.clone()], &Source::Flags, 0).is_ok());
    guest.args = vec!["y".repeat(2000)];
    let p = build(&Machine::default(), &[guest], &Source::Flags, 0).unwrap_err();
    assert_eq!(
        (p.status, p.message.as_str()),
        (
            EXIT_USAGE,
            "--env makes the guest arguments and environment take 5004 bytes; the limit is 4096"
        )
    );

    let p = build_err("[[guest]]\nimage = \"a\"\nenv = { \"\" = \"x\" }\n");
    assert_eq!(
        (p.status, p.message.as_str()),
        (
            EXIT_USAGE,
            "/etc/activm/run.toml: guest[0]: env \"=x\": the key is empty"
        )
    );
    let p = build_err("[[guest]]\nimage = \"a\"\nname = \"n\"\nenv = { \"A=B\" = \"x\" }\n");
    assert_eq!(
        p.message,
        "/etc/activm/run.toml: guest[0] (\"n\"): env key \"A=B\" contains '='"
    );
    let p = parse_err("[[guest]]\nimage = \"a\"\nenv = { A = 1 }\n");
    assert_eq!(p.status, EXIT_USAGE);
    assert!(
        p.message
            .contains("guest[0].env.A: invalid type: integer `1`, expected a string"),
        "{}",
        p.message
    );
}
