//! Starting one asynchronous request, for `blk_submit` and for the submission ring alike.

use std::cmp::Reverse;
use std::mem::offset_of;
use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;
use std::time::Instant;

use protocol::blk::{
    BlkRing, BLK_IN_FLIGHT, BLK_OP_FLUSH, BLK_OP_READ, BLK_OP_WRITE, BLK_RING_CAPACITY,
};

use super::{publish, read_u32, ring_field, wake_for_completions, Shared};
use crate::devices::blk::{Op, Pending, Request};
use crate::guest::Guest;

impl Shared {
    /// Start the request `(sector, gpa, op << 32 | count, tag)`. From `blk_submit`: the result
    /// now, or `BLK_IN_FLIGHT`. From the submission ring (`ring`: when it was submitted, and
    /// whether it is taken in an exit): always `BLK_IN_FLIGHT`, an immediate result is posted to
    /// the completion ring at once. `Err` is a violation.
    pub(super) fn start_request(
        &self,
        guest: &Arc<Guest>,
        args: [u64; 4],
        ring_request: Option<(Instant, bool)>,
    ) -> Result<u64, String> {
        let from_ring = ring_request.is_some();
        // `at_exit`: from an exit whose vCPU goes to its scheduler next.
        let (submitted, at_exit) = ring_request.unwrap_or_else(|| (Instant::now(), true));
        let (req, tag) = parse_request(args)?;
        let Some(disk) = &guest.disk else {
            return Ok(protocol::blk::BLK_ERR_NO_DEVICE);
        };
        let ring = self.lock().ring;
        let Some(ring) = ring else {
            return Err("no completion ring: call blk_ring_setup first".into());
        };
        let (mut result_now, pending) = match disk.check(&guest.plan, &req)? {
            Err(code) => (Some(code), None),
            Ok(()) => match disk.start_at(&guest.ram, &req, submitted) {
                Ok((result, waited)) => {
                    if !from_ring {
                        disk.count_immediate(waited);
                        return Ok(result);
                    }
                    (Some(result), None)
                }
                Err(pending) => (None, Some(pending)),
            },
        };
        if let (Some(result), false) = (result_now, from_ring) {
            return Ok(result);
        }
        let busy = super::timer::busy(guest, at_exit);
        let mut state = self.lock();
        // Read under the lock, so no completion is published meanwhile: read before it, on a
        // busy host, the tail could lag far behind a head that moved on.
        let tail = read_u32(guest, ring_field(ring, offset_of!(BlkRing, tail)))?;
        let bit = 1u64 << tag;
        if state.in_flight & bit != 0 {
            return Err(format!("tag {tag} is in flight already"));
        }
        let unconsumed = state.head.wrapping_sub(tail) as usize;
        if unconsumed > BLK_RING_CAPACITY {
            return Err(format!(
                "the completion ring's tail ({tail}) is not within {BLK_RING_CAPACITY} of its head ({})",
                state.head
            ));
        }
        if state.in_flight.count_ones() as usize + unconsumed >= BLK_RING_CAPACITY {
            return Err(format!(
                "more than {BLK_RING_CAPACITY} requests in flight or unconsumed"
            ));
        }
        if !state.started {
            if !from_ring {
                return Ok(protocol::blk::BLK_ERR_IO);
            }
            result_now = Some(protocol::blk::BLK_ERR_IO);
        }
        state.in_flight |= bit;
        if let Some(result) = result_now {
            // From the ring: the completion goes where every other one goes.
            disk.stats.asynchronous.fetch_add(1, Ordering::Relaxed);
            let posted = publish(&mut state, guest, tag as u32, result, !at_exit);
            disk.stats
                .posted_when_taken
                .fetch_add(u64::from(posted), Ordering::Relaxed);
            self.retime(&mut state, guest, busy);
            drop(state);
            // (A vCPU on its way to its scheduler takes it there.)
            if posted && !at_exit {
                fence(Ordering::SeqCst);
                wake_for_completions(guest);
            }
            return Ok(BLK_IN_FLIGHT);
        }
        disk.stats.asynchronous.fetch_add(1, Ordering::Relaxed);
        if let Some(Pending::Latency { result, due }) = pending {
            state.delayed.push(Reverse((due, tag as u32, result)));
            if from_ring {
                self.retime(&mut state, guest, busy);
            } else {
                // An exit the vCPU made anyway: what is due goes out now. The thread parks
                // (`BLK_IN_FLIGHT`) and its vCPU's scheduler takes them at once.
                self.post_at_exit(&mut state, guest, busy);
            }
            return Ok(BLK_IN_FLIGHT);
        }
        state.jobs.push_back((req, tag as u32));
        drop(state);
        self.work.notify_one();
        Ok(BLK_IN_FLIGHT)
    }
}

/// The request `(sector, gpa, op << 32 | count, tag)` of `blk_submit` or a submission slot,
/// with its tag; `Err` is a violation (the buffer is checked later, against the disk).
pub fn parse_request(args: [u64; 4]) -> Result<(Request, u64), String> {
    let [sector, gpa, op_count, tag] = args;
    let op = match op_count >> 32 {
        BLK_OP_READ => Op::Read,
        BLK_OP_WRITE => Op::Write,
        BLK_OP_FLUSH => Op::Flush,
        other => return Err(format!("unknown operation {other}")),
    };
    if tag >= BLK_RING_CAPACITY as u64 {
        return Err(format!("tag {tag} is not below {BLK_RING_CAPACITY}"));
    }
    let req = Request {
        op,
        sector,
        gpa,
        count: op_count & 0xffff_ffff,
    };
    Ok((req, tag))
}
