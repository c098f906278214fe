//! The guest's environment variables (`--env KEY=VALUE`, `env = { KEY = "VALUE" }`): only what
//! the user lists; the host's own environment is never passed.

use std::fmt;

use protocol::boot::MAX_ARGS_LEN;

/// One environment variable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EnvVar {
    pub key: String,
    pub value: String,
}

impl fmt::Display for EnvVar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}", self.key, self.value)
    }
}

/// Parse `--env KEY=VALUE` (the key ends at the first `=`; the value may be empty or hold `=`).
pub fn parse_env(text: &str) -> Result<EnvVar, String> {
    let (key, value) = text
        .split_once('=')
        .ok_or_else(|| format!("{text:?} is not KEY=VALUE"))?;
    let var = EnvVar {
        key: key.into(),
        value: value.into(),
    };
    check_var(&var)?;
    Ok(var)
}

/// A variable std can read back: a non-empty key without `=`, no NUL byte anywhere.
fn check_var(var: &EnvVar) -> Result<(), String> {
    if var.key.is_empty() {
        return Err(format!("{:?}: the key is empty", var.to_string()));
    }
    if var.key.contains('=') {
        return Err(format!("key {:?} contains '='", var.key));
    }
    if var.key.contains('\0') || var.value.contains('\0') {
        return Err(format!("{:?} contains a NUL byte", var.to_string()));
    }
    Ok(())
}

/// Bytes the packed arguments and environment take in the guest's argument block (each string
/// NUL-terminated).
pub fn packed_len(args: &[String], env: &[EnvVar]) -> usize {
    args.iter().map(|a| a.len() + 1).sum::<usize>()
        + env
            .iter()
            .map(|v| v.key.len() + 1 + v.value.len() + 1)
            .sum::<usize>()
}

/// Check every variable, that no key is given twice, and that the arguments and the
/// environment fit the argument block together.
pub fn check_env(args: &[String], env: &[EnvVar]) -> Result<(), String> {
    for (i, var) in env.iter().enumerate() {
        check_var(var)?;
        if env[..i].iter().any(|v| v.key == var.key) {
            return Err(format!("{:?} is given twice", var.key));
        }
    }
    let len = packed_len(args, env);
    if len > MAX_ARGS_LEN {
        return Err(format!(
            "makes the guest arguments and environment take {len} bytes; the limit is {MAX_ARGS_LEN}"
        ));
    }
    Ok(())
}
