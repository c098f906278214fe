//! `--preempt-at` (testing only): a vCPU preempted exactly at a chosen instruction. Here, inside
//! the adoption of the guest runtime's scheduler (docs/activations.md, "An adopting scheduler's
//! stack given back"): in the slice timer's re-arm that precedes the switch, before and after
//! the switch moves the stack pointer, and at the call that gives the left stack back. The code
//! before dab3b1c gave the left stack back at the vCPU's next switch into its scheduler, so a
//! context taken at the first two waited for adoption on a stack already back in the pool. This
//! test makes that interleaving every run, and runs the guest with `--rt-poison-stacks=on`, so
//! such a stack is poisoned when given back and the context's use of it ends the guest ("used
//! after it was given back"): on such code it fails every run (docs/activations.md, "Preempting
//! at an address").

use libtest_mimic::{Failed, Trial};

use super::{activm_run, guest};

/// The switch's first instructions in `jump_to_frame` (inlined into `adopt`) and
/// `__rt_resume_switch_frame`: `mov rsp, rdi; mov rbx, rdi; and rsp, -16`.
const SWITCH: &[u8] = &[0x48, 0x89, 0xfc, 0x48, 0x89, 0xfb, 0x48, 0x83, 0xe4, 0xf0];

/// The `--preempt-at` points inside the adoptions of the `rt-tests` image: the slice timer's
/// re-arm (`tick_by`, also reached from elsewhere), before and after the switch moves the stack
/// pointer, and the call that gives the left stack back.
fn switch_points(image: &std::path::Path) -> Result<String, Failed> {
    let elf = std::fs::read(image).map_err(|e| format!("{}: {e}", image.display()))?;
    let adopt = "activm_rt::upcall::recover::adopt";
    let (_, bytes) = activm::preempt_at::elf::function_bytes(&elf, adopt)?;
    let at = bytes
        .windows(SWITCH.len())
        .position(|w| w == SWITCH)
        .ok_or("no switch sequence in adopt (jump_to_frame changed?)")?;
    Ok(format!(
        "{adopt}+{at:#x},{adopt}+{:#x},__rt_release_left_stack,__rt_resume_switch_frame,\
         __rt_resume_switch_frame+3,activm_rt::alarm::tick_by",
        at + 3
    ))
}

/// `N` from `preempt-at: N preemptions (...)` and the hits of `point` in it (written as the
/// summary writes it: a `0x` offset).
fn hits(stderr: &str, point: &str) -> Option<(u64, u64)> {
    let line = stderr.lines().find(|l| l.contains("preempt-at: "))?;
    let total = line
        .split("preempt-at: ")
        .nth(1)?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    let at = line.find(&format!("{point} "))? + point.len() + 1;
    let count = line[at..]
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()?;
    Some((total, count))
}

pub(super) fn tests() -> Vec<Trial> {
    vec![
        Trial::test(
            "preempt_at_inside_the_adoption_switch_keeps_threads_exact",
            || {
                let image = guest("rt-tests")?;
                let points = switch_points(&image)?;
                // Four vCPUs on two processors under allocation chaos: schedulers are taken and
                // adopted all the time, and every adoption switch passes the points.
                let run = activm_run(
                    &image,
                    &[
                        "--vcpus",
                        "4",
                        "--pcpus",
                        "2",
                        "--chaos",
                        "1",
                        "--preempt-at",
                        &points,
                        "--preempt-at-count",
                        "60",
                    ],
                    // Stacks given back are poisoned: a context resumed on one after it went
                    // back to the pool ends the guest with "used after it was given back".
                    &["--rt-poison-stacks=on", "sa-chaos"],
                )?
                .expect_code(0)?
                .stdout_has("test sa-chaos ... ok")?
                .stdout_has("1 passed, 0 failed")?;
                let before_move = points.split(',').next().unwrap_or_default();
                let (total, at_move) = hits(&run.stderr, before_move)
                    .ok_or_else(|| format!("no preempt-at summary\n{}", run.stderr))?;
                let (_, at_release) =
                    hits(&run.stderr, "__rt_release_left_stack").unwrap_or((0, 0));
                if total < 10 || at_move == 0 || at_release == 0 {
                    return Err(format!(
                        "too few preemptions at the points ({total} in all, {at_move} before the \
                     stack moved, {at_release} at the release)\n{}",
                        run.stderr
                    )
                    .into());
                }
                Ok(())
            },
        ),
        Trial::test("preempt_at_unknown_symbol_is_an_error", || {
            activm_run(
                &guest("rt-tests")?,
                &["--preempt-at", "__rt_release_left_stack,no_such_symbol"],
                &[],
            )?
            .expect_code(1)?
            .stderr_has("--preempt-at: no symbol no_such_symbol in")?;
            activm_run(&guest("rt-tests")?, &["--preempt-at", "f+zz"], &[])?
                .expect_code(2)?
                .stderr_has("bad offset")?;
            Ok(())
        }),
    ]
}
