//! Threads: std's `sys_spawn2`/`sys_join`/`sys_yield`/`sys_usleep` on activm-rt's M:N user
//! threads. A thread id (`Tid`) is a slot, +1, in a table of `JoinHandle`s until `sys_join`
//! takes it (the slot is then reused: no allocation per thread once the table has grown).
//!
//! The table is behind a spinlock (one locked instruction to take it, a plain store to release
//! it; activm-rt's `Mutex` costs two), held for a few instructions that never allocate: the
//! table grows with the lock dropped, and the list of free slots always has room for every slot.

use alloc::vec::Vec;
use core::time::Duration;

use activm_rt::thread::{self, JoinHandle};
use activm_stub::sync::SpinLock;

use crate::errno::{fail, EINVAL, ESRCH};
use crate::sys::Timespec;

/// hermit-abi's `Tid`.
pub type Tid = u32;

/// std's default stack request (`DEFAULT_MIN_STACK_SIZE` for hermit): such threads get the
/// runtime's default guard-paged stack slot; larger requests get a stack of that size.
const STD_DEFAULT_STACK: usize = 1 << 20;

/// Unjoined threads by slot, and the free slots (`free.capacity() >= slots.capacity()`, so
/// `free.push` never allocates).
struct Table {
    slots: Vec<Option<JoinHandle<()>>>,
    free: Vec<usize>,
}

static THREADS: SpinLock<Table> = SpinLock::new(Table {
    slots: Vec::new(),
    free: Vec::new(),
});

/// Slots the table first grows to.
const FIRST_SLOTS: usize = 16;

/// Files `handle` in a free slot; returns its id.
fn insert(handle: JoinHandle<()>) -> Tid {
    loop {
        let mut table = THREADS.lock();
        let slot = match table.free.pop() {
            Some(slot) => slot,
            None if table.slots.len() < table.slots.capacity() => {
                table.slots.push(None);
                table.slots.len() - 1
            }
            None => {
                let want = (2 * table.slots.capacity()).max(FIRST_SLOTS);
                drop(table);
                grow(want);
                continue;
            }
        };
        // The slot was empty: nothing is dropped under the lock.
        table.slots[slot] = Some(handle);
        return slot as Tid + 1;
    }
}

/// Gives the table room for `want` slots: allocates with the lock dropped, moves the slots
/// under it (no allocation), frees the old vectors after it.
fn grow(want: usize) {
    let mut slots = Vec::with_capacity(want);
    let mut free = Vec::with_capacity(want);
    {
        let mut table = THREADS.lock();
        if table.slots.capacity() >= want {
            return; // another thread grew it meanwhile
        }
        slots.append(&mut table.slots);
        free.append(&mut table.free);
        core::mem::swap(&mut table.slots, &mut slots);
        core::mem::swap(&mut table.free, &mut free);
    }
}

/// Takes thread `tid`'s handle out of its slot, if it is there.
fn take(tid: Tid) -> Option<JoinHandle<()>> {
    let slot = (tid as usize).checked_sub(1)?;
    let mut table = THREADS.lock();
    let handle = table.slots.get_mut(slot)?.take()?;
    table.free.push(slot);
    Some(handle)
}

/// `Tid sys_spawn2(void (*func)(usize), usize arg, u8 prio, usize stack_size, isize core_id)`:
/// starts `func(arg)` in a new user thread. Priority and core are ignored (the scheduler
/// balances threads over the vCPUs). Returns the thread's id, never 0.
#[unsafe(no_mangle)]
pub extern "C" fn sys_spawn2(
    func: extern "C" fn(usize),
    arg: usize,
    _prio: u8,
    stack_size: usize,
    _core_id: isize,
) -> Tid {
    let mut builder = thread::Builder::new();
    if stack_size > STD_DEFAULT_STACK {
        builder = builder.stack_size(stack_size);
    }
    match builder.spawn(move || func(arg)) {
        Ok(handle) => insert(handle),
        Err(_) => 0,
    }
}

/// `int sys_spawn(Tid *id, void (*func)(usize), usize arg, u8 prio, isize core_id)`: like
/// `sys_spawn2` with the default stack; 0 or `-errno`.
///
/// # Safety
/// `id` is null or points to a writable `Tid`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sys_spawn(
    id: *mut Tid,
    func: extern "C" fn(usize),
    arg: usize,
    prio: u8,
    core_id: isize,
) -> i32 {
    let tid = sys_spawn2(func, arg, prio, 0, core_id);
    if !id.is_null() {
        // SAFETY: the caller passes a writable `Tid`.
        unsafe { id.write(tid) };
    }
    0
}

/// `int sys_join(Tid id)`: waits for thread `id` to finish; 0, or `-ESRCH` for an unknown (or
/// already joined) id.
#[unsafe(no_mangle)]
pub extern "C" fn sys_join(id: Tid) -> i32 {
    match take(id) {
        Some(handle) => {
            let _ = handle.join();
            0
        }
        None => fail(ESRCH),
    }
}

/// `void sys_yield(void)`.
#[unsafe(no_mangle)]
pub extern "C" fn sys_yield() {
    thread::yield_now();
}

/// `void sys_usleep(u64 usecs)`: the calling thread sleeps (other threads run).
#[unsafe(no_mangle)]
pub extern "C" fn sys_usleep(usecs: u64) {
    thread::sleep(Duration::from_micros(usecs));
}

/// `int sys_nanosleep(const timespec *req)`: 0, or `-EINVAL` for a bad request.
///
/// # Safety
/// `req` is null or points to a `timespec`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sys_nanosleep(req: *const Timespec) -> i32 {
    // SAFETY: the caller passes a readable timespec or null.
    match unsafe { req.as_ref() }.and_then(Timespec::duration) {
        Some(d) => {
            thread::sleep(d);
            0
        }
        None => fail(EINVAL),
    }
}

/// `usize sys_available_parallelism(void)`: the number of vCPUs.
#[unsafe(no_mangle)]
pub extern "C" fn sys_available_parallelism() -> usize {
    thread::available_parallelism().map_or(1, |n| n.get())
}

/// `usize sys_get_processor_count(void)`: the number of vCPUs.
#[unsafe(no_mangle)]
pub extern "C" fn sys_get_processor_count() -> usize {
    thread::available_parallelism().map_or(1, |n| n.get())
}

/// `pid_t sys_getpid(void)`: the guest is one process.
#[unsafe(no_mangle)]
pub extern "C" fn sys_getpid() -> i32 {
    1
}
