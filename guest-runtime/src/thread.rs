//! Threads, shaped like `std::thread`: [`spawn`], [`Builder`] (name, stack size),
//! [`JoinHandle::join`], [`scope`] (scoped threads), [`yield_now`], [`sleep`], [`current`]
//! (id, name), [`park`], [`park_timeout`] and [`Thread::unpark`], [`available_parallelism`],
//! and thread-local storage ([`LocalKey`], `thread_local!`).
//!
//! Spawning allocates nothing but the TCB (pooled) when the closure and its result fit in
//! [`crate::tcb::INLINE_PACKET`] bytes; the stack is bound when the thread first runs.
//! A panicking thread ends the whole guest (panic = abort), with the thread's name in the
//! message; `join` therefore always returns `Ok`.

use alloc::boxed::Box;
use alloc::string::String;
use alloc::sync::Arc;
use core::alloc::Layout;
use core::any::Any;
use core::fmt;
use core::marker::PhantomData;
use core::mem::ManuallyDrop;
use core::num::{NonZeroU64, NonZeroUsize};
use core::sync::atomic::Ordering;
use core::time::Duration;

use crate::io;
use crate::sync::timed;
use crate::tcb::{self, Tcb};
use crate::{sched, timer};

mod scope;

pub use crate::tls::{AccessError, LocalKey};
pub use scope::{scope, Scope, ScopedJoinHandle};

/// `std::thread::Result`: `join`'s result (always `Ok` here: a panic ends the guest).
pub type Result<T> = core::result::Result<T, Box<dyn Any + Send + 'static>>;

/// A thread's unique id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ThreadId(NonZeroU64);

impl ThreadId {
    pub fn as_u64(&self) -> NonZeroU64 {
        self.0
    }
}

/// A handle to a thread (`std::thread::Thread`).
pub struct Thread {
    tcb: &'static Tcb,
    id: ThreadId,
}

impl Thread {
    fn from_tcb(tcb: &'static Tcb) -> Thread {
        tcb.add_ref();
        Thread {
            tcb,
            id: ThreadId(NonZeroU64::new(tcb.id.get()).expect("thread ids start at 1")),
        }
    }

    pub fn id(&self) -> ThreadId {
        self.id
    }

    /// The TCB's address (the runtime's identity for the thread).
    #[cfg(feature = "sim")]
    pub(crate) fn tcb_addr(&self) -> u64 {
        self.tcb as *const Tcb as u64
    }

    /// The thread's name, if it has one (the first thread is "main").
    pub fn name(&self) -> Option<&str> {
        // The handle's reference keeps the TCB (and its name) from being recycled.
        self.tcb.name()
    }

    /// Makes the thread's token available (see [`park`]).
    pub fn unpark(&self) {
        let t = self.tcb;
        loop {
            match t.token.load(Ordering::Acquire) {
                tcb::TOKEN_NOTIFIED => return,
                tcb::TOKEN_EMPTY => {
                    if t.token
                        .compare_exchange(
                            tcb::TOKEN_EMPTY,
                            tcb::TOKEN_NOTIFIED,
                            Ordering::AcqRel,
                            Ordering::Acquire,
                        )
                        .is_ok()
                    {
                        return;
                    }
                }
                _ => {
                    if t.token
                        .compare_exchange(
                            tcb::TOKEN_PARKED,
                            tcb::TOKEN_EMPTY,
                            Ordering::AcqRel,
                            Ordering::Acquire,
                        )
                        .is_ok()
                    {
                        // A timed park (`park_timeout`) may have been woken by its timer.
                        if timed::claim(t) {
                            sched::wake(t);
                        }
                        return;
                    }
                }
            }
        }
    }
}

impl Clone for Thread {
    fn clone(&self) -> Thread {
        self.tcb.add_ref();
        Thread {
            tcb: self.tcb,
            id: self.id,
        }
    }
}

impl Drop for Thread {
    fn drop(&mut self) {
        tcb::release(self.tcb);
    }
}

impl fmt::Debug for Thread {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Thread")
            .field("id", &self.id)
            .field("name", &self.name())
            .finish()
    }
}

/// The calling thread.
pub fn current() -> Thread {
    Thread::from_tcb(sched::current())
}

/// The calling thread's spare word and its id: one pointer a layer above the runtime may keep
/// per thread without a thread-local (activm-std keeps its emulated-TLS table there). The word
/// is never read, cleared or freed by the runtime and stays with the thread's control block when
/// that is pooled and reused, so a later thread finds the word a finished one left: compare the
/// id kept with it to tell them apart (ids are never reused).
#[inline]
pub fn spare_word() -> (&'static core::cell::Cell<*mut u8>, u64) {
    let t = sched::current();
    (&t.spare, t.id.get())
}

/// Gives up the processor to another runnable thread, if there is one.
pub fn yield_now() {
    // With nothing else runnable a yield returns at once; but reports the VMM left for the
    // scheduler loop would then wait behind a thread that only yields (a busy vCPU is not
    // interrupted for them), so such a yield goes through the loop.
    if !sched::runnable_elsewhere()
        && (crate::blk::completions_ready() || crate::net::completions_ready())
    {
        sched::yield_through_loop();
    } else {
        sched::yield_current();
    }
}

/// Puts the current thread to sleep for at least `dur`.
pub fn sleep(dur: Duration) {
    crate::timer::sleep(dur);
}

/// Blocks until the current thread's token is available (`Thread::unpark`), then consumes it.
/// May return spuriously, like std's.
pub fn park() {
    let me = sched::current();
    if take_token(me) {
        return;
    }
    me.prepare_wait();
    if me
        .token
        .compare_exchange(
            tcb::TOKEN_EMPTY,
            tcb::TOKEN_PARKED,
            Ordering::AcqRel,
            Ordering::Acquire,
        )
        .is_err()
    {
        // Notified meanwhile.
        me.token.store(tcb::TOKEN_EMPTY, Ordering::Release);
        return;
    }
    sched::wait(me);
}

/// Like [`park`], but returns after `dur` at the latest (`std::thread::park_timeout`); it may
/// also return spuriously. The thread waits on the sleepers' list as well as on its token: an
/// `unpark` and the timer claim its wake-up (`sync::timed`), so exactly one wakes it.
pub fn park_timeout(dur: Duration) {
    let me = sched::current();
    if take_token(me) {
        return;
    }
    let deadline = timer::deadline_in(dur);
    timed::arm(me, deadline);
    if me
        .token
        .compare_exchange(
            tcb::TOKEN_EMPTY,
            tcb::TOKEN_PARKED,
            Ordering::AcqRel,
            Ordering::Acquire,
        )
        .is_err()
    {
        // Notified meanwhile: consume the token, and the timeout is not needed.
        me.token.store(tcb::TOKEN_EMPTY, Ordering::Release);
        timed::disarm(me);
        return;
    }
    timed::wait(me, deadline, || {
        let untouched = me
            .token
            .compare_exchange(
                tcb::TOKEN_PARKED,
                tcb::TOKEN_EMPTY,
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok();
        if !untouched {
            // An `unpark` took the token first and is about to claim our wake-up: let it
            // finish with our TCB before the next wait reuses `timed`.
            timer::spin_until(u64::MAX, || timed::notified(me));
        }
        untouched
    });
}

/// Consumes the current thread's token if it is there.
fn take_token(me: &Tcb) -> bool {
    me.token
        .compare_exchange(
            tcb::TOKEN_NOTIFIED,
            tcb::TOKEN_EMPTY,
            Ordering::AcqRel,
            Ordering::Acquire,
        )
        .is_ok()
}

/// The number of vCPUs (`std::thread::available_parallelism`; never fails here).
pub fn available_parallelism() -> io::Result<NonZeroUsize> {
    NonZeroUsize::new(crate::percpu::nr_vcpus() as usize)
        .ok_or(io::Error::new(io::ErrorKind::Other, "no vCPUs known yet"))
}

/// Spawns a thread (default stack: one guard-paged slot).
pub fn spawn<F, T>(f: F) -> JoinHandle<T>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    Builder::new().spawn(f).expect("spawn")
}

/// Thread configuration (`std::thread::Builder`).
#[derive(Debug, Default)]
pub struct Builder {
    name: Option<String>,
    stack_size: Option<usize>,
}

impl Builder {
    pub fn new() -> Builder {
        Builder::default()
    }

    /// The name must not contain a NUL byte: `spawn` fails with `InvalidInput` if it does (std's
    /// panics).
    pub fn name(mut self, name: String) -> Builder {
        self.name = Some(name);
        self
    }

    /// Stack size in bytes; more than a slot ([`crate::stack::slot_usable`]) gets a heap stack
    /// without a guard page.
    pub fn stack_size(mut self, size: usize) -> Builder {
        self.stack_size = Some(size);
        self
    }

    pub fn spawn<F, T>(self, f: F) -> io::Result<JoinHandle<T>>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        // SAFETY: `F` and `T` are 'static: nothing they borrow can go away.
        unsafe { self.spawn_unchecked(f) }
    }

    /// `spawn` without the 'static bounds.
    ///
    /// # Safety
    /// Whatever `f` and its result borrow outlives the thread's use of them (the scoped
    /// threads' `Scope` waits for that).
    pub(crate) unsafe fn spawn_unchecked<F, T>(self, f: F) -> io::Result<JoinHandle<T>>
    where
        F: FnOnce() -> T + Send,
        T: Send,
    {
        if self.name.as_deref().is_some_and(|n| n.contains('\0')) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "thread name may not contain interior null bytes",
            ));
        }
        let t = tcb::alloc(2);
        if let Some(name) = self.name {
            // SAFETY: the TCB is not visible to anyone else yet.
            unsafe { *t.name.get() = Some(Arc::from(name)) };
        }
        t.stack_size.set(self.stack_size.unwrap_or(0));
        // SAFETY: the packet storage is the new TCB's; nobody else touches it.
        unsafe { init_packet::<F, T>(t, f) };
        sched::make_next(t);
        Ok(JoinHandle {
            tcb: t,
            _result: PhantomData,
        })
    }
}

/// Why `Builder::spawn` failed (only a name with a NUL byte: allocation failure aborts).
pub type SpawnError = io::Error;

/// The closure, then (after it ran) its result, in the same storage.
union Packet<F, T> {
    f: ManuallyDrop<F>,
    t: ManuallyDrop<T>,
}

/// Stores `f` in `t`'s packet and the functions that run it and drop an unjoined result.
///
/// # Safety
/// `t` is a fresh TCB nobody else uses yet; what `f` and its result borrow outlives the thread.
pub(crate) unsafe fn init_packet<F, T>(t: &Tcb, f: F)
where
    F: FnOnce() -> T + Send,
    T: Send,
{
    let at = t.alloc_packet(Layout::new::<Packet<F, T>>()) as *mut Packet<F, T>;
    // SAFETY: `alloc_packet` returned storage for a `Packet<F, T>`.
    unsafe {
        at.write(Packet {
            f: ManuallyDrop::new(f),
        })
    };
    t.run.set(Some(run_packet::<F, T>));
    t.drop_result.set(Some(drop_packet_result::<F, T>));
}

/// Runs the closure in the packet and leaves its result there.
///
/// # Safety
/// `t`'s packet holds an `F` (set by `init_packet::<F, T>`), not yet taken.
unsafe fn run_packet<F, T>(t: &Tcb)
where
    F: FnOnce() -> T,
{
    let at = t.packet_ptr() as *mut Packet<F, T>;
    // SAFETY: the packet holds the closure; it is moved out exactly once.
    let f = unsafe { ManuallyDrop::take(&mut (*at).f) };
    let result = f();
    // SAFETY: the closure is gone; the storage now holds the result.
    unsafe {
        at.write(Packet {
            t: ManuallyDrop::new(result),
        })
    };
}

/// Drops a result nobody joined.
///
/// # Safety
/// `p` is a packet holding a `T` (the thread finished).
unsafe fn drop_packet_result<F, T>(p: *mut u8) {
    let at = p as *mut Packet<F, T>;
    // SAFETY: the caller guarantees the packet holds the result.
    unsafe { ManuallyDrop::drop(&mut (*at).t) };
}

/// An owned permission to join a thread (`std::thread::JoinHandle`).
pub struct JoinHandle<T> {
    tcb: &'static Tcb,
    _result: PhantomData<T>,
}

// SAFETY: the handle only moves a `T: Send` out of the finished thread.
unsafe impl<T: Send> Send for JoinHandle<T> {}
// SAFETY: `&JoinHandle` only reads the thread's identity.
unsafe impl<T> Sync for JoinHandle<T> {}

impl<T> fmt::Debug for JoinHandle<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JoinHandle")
            .field("id", &self.tcb.id.get())
            .finish()
    }
}

impl<T> JoinHandle<T> {
    /// The thread.
    pub fn thread(&self) -> Thread {
        Thread::from_tcb(self.tcb)
    }

    /// Whether the thread has finished.
    pub fn is_finished(&self) -> bool {
        self.tcb.join.load(Ordering::Acquire) == tcb::JOIN_FINISHED
    }

    /// Waits for the thread to finish and returns its result.
    pub fn join(self) -> Result<T> {
        let t = self.tcb;
        if t.join.load(Ordering::Acquire) == tcb::JOIN_RUNNING && sched::take_next_if(t) {
            // It waits in this vCPU's `next` slot (typically not started yet): ours now, so it
            // runs here at once, in our time slice, while we wait for it (a hand-off: no queue,
            // no other vCPU).
            let me = sched::current();
            me.prepare_wait();
            // It cannot finish before it runs: nobody else writes its join word meanwhile.
            t.join.store(me as *const Tcb as usize, Ordering::Release);
            sched::park_and_run(me, t);
            sched::wait(me);
        }
        loop {
            if t.join.load(Ordering::Acquire) == tcb::JOIN_FINISHED {
                break;
            }
            let me = sched::current();
            me.prepare_wait();
            if t.join
                .compare_exchange(
                    tcb::JOIN_RUNNING,
                    me as *const Tcb as usize,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                )
                .is_ok()
            {
                sched::wait(me);
            }
        }
        t.drop_result.set(None);
        // The storage is a `Packet<F, T>`, a union: `T` is at its start whatever F was.
        // SAFETY: the thread finished, so its packet holds the result, which only this
        // (consumed) handle takes.
        let result = unsafe { core::ptr::read(t.packet_ptr() as *const T) };
        let t = self.tcb;
        core::mem::forget(self);
        tcb::release(t);
        Ok(result)
    }
}

impl<T> Drop for JoinHandle<T> {
    fn drop(&mut self) {
        // Detach: the thread drops its own result if it finishes later.
        tcb::release(self.tcb);
    }
}

pub use crate::tcb::{describe, DescribeThread};
