//! Threads: std's `sys_spawn2`/`sys_join`/`sys_yield`/`sys_usleep` on activm-rt's M:N user
//! threads. A thread id (`Tid`) is a slot, +1, in a table that holds the thread's `JoinHandle`
//! while it runs and only a "finished" mark after that, until `sys_join` frees the slot (which
//! is then reused: no allocation per thread once the table has grown).
//!
//! std's Hermit port never tells the OS that it dropped a `JoinHandle`, so a detached thread is
//! never joined: a finishing thread therefore detaches itself (takes its own handle out of its
//! slot and drops it), and its control block, stack and thread-locals go back to the runtime at
//! once. What such a thread keeps is its slot's 16 bytes (a server with a thread per connection
//! ran out of a 128 MiB guest after ~17,000 connections when the slot kept the handle).
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

/// A slot's state.
enum Slot {
    /// Free, or taken by `sys_spawn2` before the thread's handle is filed.
    Empty,
    /// The thread may still run: its handle.
    Running(JoinHandle<()>),
    /// The thread finished (its handle dropped); `sys_join` returns at once.
    Finished,
}

/// Thread slots (with a generation, so a finishing thread knows its slot was not reused) and
/// the free slots (`free.capacity() >= slots.capacity()`, so `free.push` never allocates).
struct Table {
    slots: Vec<(u32, Slot)>,
    free: Vec<usize>,
}

static THREADS: SpinLock<Table> = SpinLock::new(Table {
    slots: Vec::new(),
    free: Vec::new(),
});

/// Slots the table first grows to.
const FIRST_SLOTS: usize = 16;

/// Takes a free slot (state `Empty`); returns it and its generation.
fn reserve() -> (usize, u32) {
    loop {
        let mut table = THREADS.lock();
        let slot = match table.free.pop() {
            Some(slot) => slot,
            None if table.slots.len() < table.slots.capacity() => {
                table.slots.push((0, Slot::Empty));
                table.slots.len() - 1
            }
            None => {
                let want = (2 * table.slots.capacity()).max(FIRST_SLOTS);
                drop(table);
                grow(want);
                continue;
            }
        };
        return (slot, table.slots[slot].0);
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

/// Files the new thread's handle in its reserved slot, unless the thread finished already;
/// the handle is then dropped (with the lock released).
fn file(slot: usize, handle: JoinHandle<()>) {
    let mut table = THREADS.lock();
    let state = &mut table.slots[slot].1;
    if matches!(state, Slot::Empty) {
        *state = Slot::Running(handle);
    } else {
        drop(table);
        drop(handle);
    }
}

/// The thread in `slot` (of `generation`) finishes: marks it, and takes its handle out to be
/// dropped (with the lock released): it detaches itself.
fn finish(slot: usize, generation: u32) {
    let mut table = THREADS.lock();
    let (g, state) = &mut table.slots[slot];
    if *g != generation {
        return; // joined already (the joiner waits on the handle it took)
    }
    let old = core::mem::replace(state, Slot::Finished);
    drop(table);
    drop(old);
}

/// Frees thread `tid`'s slot; its handle if it may still run (`Ok(None)`: it finished).
fn take(tid: Tid) -> Result<Option<JoinHandle<()>>, ()> {
    let slot = (tid as usize).checked_sub(1).ok_or(())?;
    let mut table = THREADS.lock();
    let (generation, state) = table.slots.get_mut(slot).ok_or(())?;
    let handle = match core::mem::replace(state, Slot::Empty) {
        Slot::Running(handle) => Some(handle),
        Slot::Finished => None,
        Slot::Empty => return Err(()),
    };
    *generation = generation.wrapping_add(1);
    table.free.push(slot);
    Ok(handle)
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
    let (slot, generation) = reserve();
    match builder.spawn(move || {
        func(arg);
        finish(slot, generation);
    }) {
        Ok(handle) => {
            file(slot, handle);
            slot as Tid + 1
        }
        Err(_) => {
            let mut table = THREADS.lock();
            table.slots[slot].0 = generation.wrapping_add(1);
            table.free.push(slot);
            0
        }
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
        Ok(Some(handle)) => {
            let _ = handle.join();
            0
        }
        Ok(None) => 0,
        Err(()) => fail(ESRCH),
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
