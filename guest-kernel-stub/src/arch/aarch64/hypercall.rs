//! TODO(aarch64): the hypercall instruction, `ldr x0, [addr]` with arguments in x0-x3
//! (see `protocol::hypercall`).
