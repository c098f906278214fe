//! The `std` guests (guests/apps/std-*, built for `guests/aarch64-activm-std.json`) on arm64
//! KVM: the same programs and the same exact outputs as on x86_64 (tests/kvm/std_guests.rs).

use super::cases::{stdout_of, Case};

/// The std guests the cases run (copied into the initramfs).
pub(super) const STD_APPS: &[&str] = &["std-demo", "std-rayon"];

/// `std-demo --exit 3`'s whole stdout on `vcpus` vCPUs.
fn std_demo_output(vcpus: u32) -> String {
    format!(
        "args: [\"--exit\", \"3\"]\n\
         available_parallelism: {vcpus}\n\
         mutex: 80000\n\
         threads: worker-0=10000 worker-1=10000 worker-2=10000 worker-3=10000 worker-4=10000 \
         worker-5=10000 worker-6=10000 worker-7=10000\n\
         main thread-local: 0\n\
         condvar: 2000 turns\n\
         channel: sum 7998000\n\
         sync_channel: sum 5050\n\
         scoped+rwlock+barrier: [1, 2, 3, 4]\n\
         sleep 20ms: ok\n\
         wait_timeout 10ms: ok\n\
         wait_timeout notified: ok\n\
         once: 1 inits, sum 336\n\
         hashmap: 81\n\
         done\n"
    )
}

/// `std-rayon`'s whole stdout on `vcpus` vCPUs.
fn rayon_output(vcpus: u32) -> String {
    format!(
        "threads: {vcpus}\nsum: equal\nsort: equal\nstable sort: equal\nmap+collect: equal\n\
         join: fib(25)+fib(24) = 121393\n"
    )
}

pub(super) fn cases() -> Vec<Case> {
    let runs = [
        ("std-demo-2", "std-rayon-2", 2, "--vcpus 2"),
        ("std-demo-4", "std-rayon-4", 4, "--vcpus 4"),
        (
            "std-demo-2-noact",
            "std-rayon-2-noact",
            2,
            "--vcpus 2 --no-activations",
        ),
    ];
    let mut cases = Vec::new();
    for (demo, rayon, vcpus, flags) in runs {
        cases.push(Case::exact(
            demo,
            stdout_of(
                demo,
                &format!("/guests/std-demo {flags} --timeout 150"),
                "--exit 3",
            ),
            3,
            std_demo_output(vcpus),
        ));
        cases.push(Case::exact(
            rayon,
            stdout_of(
                rayon,
                &format!("/guests/std-rayon {flags} --timeout 150"),
                "",
            ),
            0,
            rayon_output(vcpus),
        ));
    }
    // A panic in a std thread: std's message, then sys_abort's status 134.
    cases.push(Case::new(
        "std-panic",
        "/activm run /guests/std-demo --vcpus 2 --timeout 60 -- panic",
        134,
        &["thread 'doomed' (2) panicked at src/main.rs:", "boom"],
    ));
    cases
}
