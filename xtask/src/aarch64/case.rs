//! One case of `cargo xtask aarch64-test`: a command for the arm64 machine's `/init`, its exit
//! status and the lines its output must hold, and the helpers that build commands and read
//! counts out of an output. The list of cases is in `cases.rs` and its siblings.

/// A check of a case's whole output.
pub(super) type OutputCheck = fn(&str) -> Result<(), String>;

/// One command the arm64 `/init` runs, and what it must print.
pub(super) struct Case {
    pub(super) name: String,
    pub(super) command: String,
    pub(super) status: i32,
    /// Text the output must contain, each on some line.
    pub(super) expect: Vec<String>,
    /// A further check of the whole output (counts that must agree).
    pub(super) check: Option<OutputCheck>,
    /// The guest's whole stdout, exactly (the command prints it between [`STDOUT_BEGIN`] and
    /// [`STDOUT_END`] lines: see [`stdout_of`]).
    pub(super) stdout: Option<String>,
}

/// The lines around a guest's stdout in a case's output.
pub(super) const STDOUT_BEGIN: &str = "@@STDOUT";
pub(super) const STDOUT_END: &str = "@@STDOUT-END";

/// `/activm run OPTIONS -- GUEST_ARGS` with the guest's stdout kept in a file, printed between
/// [`STDOUT_BEGIN`] and [`STDOUT_END`] afterwards (stderr goes to the case's output as it
/// comes); the case's status is activm's.
pub(super) fn stdout_of(name: &str, options: &str, guest_args: &str) -> String {
    let out = format!("/tmp/{name}.out");
    format!(
        "/activm run {options} -- {guest_args} > {out}; s=$?; echo {STDOUT_BEGIN}; cat {out}; \
         echo {STDOUT_END}; (exit $s)"
    )
}

impl Case {
    pub(super) fn new(
        name: impl Into<String>,
        command: &str,
        status: i32,
        expect: &[&str],
    ) -> Case {
        Case {
            name: name.into(),
            command: command.into(),
            status,
            expect: expect.iter().map(|s| s.to_string()).collect(),
            check: None,
            stdout: None,
        }
    }

    /// A case whose guest stdout must be `stdout` exactly (command from [`stdout_of`]).
    pub(super) fn exact(
        name: impl Into<String>,
        command: String,
        status: i32,
        stdout: String,
    ) -> Case {
        Case {
            name: name.into(),
            command,
            status,
            expect: Vec::new(),
            check: None,
            stdout: Some(stdout),
        }
    }

    pub(super) fn checked(mut self, check: OutputCheck) -> Case {
        self.check = Some(check);
        self
    }
}

/// `NAME=count` from the `--stats` upcall line.
pub(super) fn upcalls(output: &str, name: &str) -> Option<u64> {
    let line = output.lines().find(|l| l.starts_with("upcalls:"))?;
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{name}=")))
        .and_then(|n| n.parse().ok())
}
