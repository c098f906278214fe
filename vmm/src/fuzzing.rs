//! What the fuzz targets (`fuzz/`) reach that is not public otherwise: the hypercall argument
//! checks that read guest memory. Built only with the `fuzzing` feature.

pub use crate::devices::net::TxArea;
pub use crate::vcpu::hypercalls::read_buffer;
