//! Bad command lines and configuration files: a clear error and a documented status, never a panic or a hang.

use std::path::Path;
use std::process::Command;

use activm::testing::tiny_elf;
use libtest_mimic::Trial;

use super::{activm, activm_run, temp_image, Run, TempDir, ACTIVM};

/// Input errors: no guest code runs, but KVM may be opened.
pub(super) fn input_tests() -> Vec<Trial> {
    vec![
        Trial::test("missing_image_is_refused", || {
            activm_run(Path::new("/nonexistent/guest.elf"), &[], &[])?
                .expect_code(1)?
                .stderr_has("cannot read guest image")?;
            Ok(())
        }),
        Trial::test("non_elf_image_is_refused", || {
            let image = temp_image("garbage", &[0x42; 4096])?;
            activm_run(&image, &[], &[])?
                .expect_code(1)?
                .stderr_has("not an ELF file")?;
            Ok(())
        }),
        Trial::test("aarch64_elf_is_refused", || {
            let image = temp_image("arm", &tiny_elf(183, 0x20_0000, &[0; 64]))?;
            activm_run(&image, &[], &[])?
                .expect_code(1)?
                .stderr_has("built for aarch64")?;
            Ok(())
        }),
        Trial::test("image_without_boot_header_is_refused", || {
            let image = temp_image("nohdr", &tiny_elf(62, 0x20_0000, &[0x90; 64]))?;
            activm_run(&image, &[], &[])?
                .expect_code(1)?
                .stderr_has("not an activm guest")?;
            Ok(())
        }),
        Trial::test("bad_vcpu_count_is_refused", || {
            let image = temp_image("vcpus", &[0x42; 64])?;
            activm_run(&image, &["--vcpus", "0"], &[])?
                .expect_code(1)?
                .stderr_has("--vcpus must be")?;
            activm_run(&image, &["--vcpus", "65"], &[])?
                .expect_code(1)?
                .stderr_has("--vcpus must be")?;
            Ok(())
        }),
        Trial::test("usage_errors_exit_2", || {
            let output = Command::new(ACTIVM)
                .args(["run"])
                .output()
                .map_err(|e| e.to_string())?;
            Run::from(output).expect_code(2)?.stderr_has("Usage")?;
            Ok(())
        }),
    ]
}

/// Configuration files that are refused before any guest runs (no KVM needed).
pub(super) fn toml_input_tests() -> Vec<Trial> {
    vec![
        Trial::test("toml_bad_files_are_refused", || {
            let dir = TempDir::new("toml-bad")?;
            let path = |name: &str| dir.0.join(name).display().to_string();
            let cases: [(&str, &str, i32, String); 8] = [
                (
                    "unknown.toml",
                    "pcpus = 1\n[[guest]]\nimage = \"demo\"\nvcpu = 2\n",
                    2,
                    format!("{}:4:1: guest[0].vcpu: unknown field `vcpu`", path("unknown.toml")),
                ),
                (
                    "unknown-top.toml",
                    "pcpu = 1\n[[guest]]\nimage = \"demo\"\n",
                    2,
                    format!("{}:1:1: pcpu: unknown field `pcpu`", path("unknown-top.toml")),
                ),
                (
                    "type.toml",
                    "[[guest]]\nimage = \"demo\"\n[[guest]]\nimage = \"demo\"\nargs = \"exit 3\"\n",
                    2,
                    format!(
                        "{}:5:8: guest[1].args: invalid type: string \"exit 3\", expected a sequence",
                        path("type.toml")
                    ),
                ),
                (
                    "noimage.toml",
                    "[[guest]]\nvcpus = 2\n",
                    2,
                    format!("{}:1:1: guest[0]: missing field `image`", path("noimage.toml")),
                ),
                (
                    "empty.toml",
                    "pcpus = 2\n",
                    2,
                    format!("{}: no [[guest]] table", path("empty.toml")),
                ),
                (
                    "syntax.toml",
                    "[[guest]\nimage = \"demo\"\n",
                    2,
                    format!("{}:1:", path("syntax.toml")),
                ),
                (
                    "vcpus.toml",
                    "[[guest]]\nimage = \"demo\"\nname = \"zero\"\nvcpus = 0\n",
                    1,
                    format!(
                        "{}: guest[0] (\"zero\"): vcpus must be between 1 and 64, not 0",
                        path("vcpus.toml")
                    ),
                ),
                (
                    "missing-image.toml",
                    "[[guest]]\nimage = \"no-such-guest.elf\"\n",
                    1,
                    format!("cannot read guest image {}", path("no-such-guest.elf")),
                ),
            ];
            for (name, text, code, message) in cases {
                let file = dir.file(name, text)?;
                activm(&["--config".as_ref(), file.as_os_str()])?
                    .expect_code(code)?
                    .stderr_has(&format!("activm: error: {message}"))?;
            }
            activm(&["--config".as_ref(), dir.0.join("absent.toml").as_os_str()])?
                .expect_code(2)?
                .stderr_has("cannot read the configuration")?;
            Ok(())
        }),
        Trial::test("toml_per_guest_flags_are_refused_with_a_file", || {
            let dir = TempDir::new("toml-flags")?;
            let file = dir.file("run.toml", "[[guest]]\nimage = \"demo\"\n")?;
            let config = file.as_os_str();
            activm(&[
                "--config".as_ref(),
                config,
                "--vcpus".as_ref(),
                "2".as_ref(),
            ])?
            .expect_code(2)?
            .stderr_has("--vcpus cannot be given with a configuration file: set `vcpus`")?;
            activm(&[config, "--".as_ref(), "exit".as_ref()])?
                .expect_code(2)?
                .stderr_has("GUEST_ARGS (after --) cannot be given with a configuration file")?;
            activm(&["--config".as_ref(), config, "a.elf".as_ref()])?
                .expect_code(2)?
                .stderr_has("GUEST images cannot be given with --config")?;
            activm(&["a.elf".as_ref(), config])?
                .expect_code(2)?
                .stderr_has("looks like a configuration file: give it alone, or with --config")?;
            Ok(())
        }),
    ]
}
