//! Thread-local storage: `thread_local!` and [`LocalKey`], like std's.
//!
//! CPL3 cannot set `%fs` here (no FSGSBASE, and the base would have to follow a thread from
//! vCPU to vCPU), so a key is an index into a per-thread table of lazily initialised boxed
//! values, found through the current thread's TCB. Values are dropped when their thread exits.

use alloc::boxed::Box;
use core::cell::{Cell, RefCell};
use core::fmt;
use core::sync::atomic::{AtomicUsize, Ordering};

use crate::sched;
use crate::tcb::Tcb;

static NEXT_KEY: AtomicUsize = AtomicUsize::new(1);

/// A thread-local value, declared with [`thread_local!`](crate::thread_local).
pub struct LocalKey<T: 'static> {
    /// Index in every thread's table, +1 (0: not assigned yet).
    index: AtomicUsize,
    init: fn() -> T,
}

impl<T: 'static> fmt::Debug for LocalKey<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocalKey").finish_non_exhaustive()
    }
}

/// The current thread has no value here any more (its destructors are running).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AccessError;

impl fmt::Display for AccessError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("already destroyed")
    }
}

impl core::error::Error for AccessError {}

unsafe fn drop_boxed<T>(p: *mut u8) {
    // SAFETY: `p` came from `Box::<T>::into_raw` in `LocalKey::slot`.
    drop(unsafe { Box::from_raw(p as *mut T) });
}

impl<T: 'static> LocalKey<T> {
    #[doc(hidden)]
    pub const fn new(init: fn() -> T) -> LocalKey<T> {
        LocalKey {
            index: AtomicUsize::new(0),
            init,
        }
    }

    fn index(&self) -> usize {
        let i = self.index.load(Ordering::Acquire);
        if i != 0 {
            return i - 1;
        }
        let new = NEXT_KEY.fetch_add(1, Ordering::Relaxed);
        match self
            .index
            .compare_exchange(0, new, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => new - 1,
            Err(other) => other - 1,
        }
    }

    fn slot(&'static self, t: &Tcb) -> Result<*const T, AccessError> {
        let i = self.index();
        // SAFETY: a thread's table is only touched by the thread itself (here and when it
        // exits), and by nobody once it is recycled.
        let table = unsafe { &mut *t.tls.get() };
        if i >= table.len() {
            table.resize(i + 1, None);
        }
        if let Some((p, _)) = table[i] {
            return Ok(p as *const T);
        }
        let value = Box::into_raw(Box::new((self.init)()));
        // SAFETY: as above (the initialiser may itself have used other keys and grown the
        // table, so index it again).
        let table = unsafe { &mut *t.tls.get() };
        if i >= table.len() {
            table.resize(i + 1, None);
        }
        table[i] = Some((value as *mut u8, drop_boxed::<T>));
        Ok(value)
    }

    /// Runs `f` with a reference to this thread's value (initialised on first use).
    pub fn with<F, R>(&'static self, f: F) -> R
    where
        F: FnOnce(&T) -> R,
    {
        self.try_with(f)
            .expect("thread-local value already destroyed")
    }

    /// Like [`with`](Self::with), failing instead of panicking.
    pub fn try_with<F, R>(&'static self, f: F) -> Result<R, AccessError>
    where
        F: FnOnce(&T) -> R,
    {
        let t = sched::current();
        let p = self.slot(t)?;
        // SAFETY: the value lives until the thread exits, which cannot happen during `f`.
        Ok(f(unsafe { &*p }))
    }
}

impl<T: Copy + 'static> LocalKey<Cell<T>> {
    pub fn get(&'static self) -> T {
        self.with(Cell::get)
    }

    pub fn set(&'static self, value: T) {
        self.with(|c| c.set(value))
    }
}

impl<T: 'static> LocalKey<RefCell<T>> {
    pub fn with_borrow<F, R>(&'static self, f: F) -> R
    where
        F: FnOnce(&T) -> R,
    {
        self.with(|c| f(&c.borrow()))
    }

    pub fn with_borrow_mut<F, R>(&'static self, f: F) -> R
    where
        F: FnOnce(&mut T) -> R,
    {
        self.with(|c| f(&mut c.borrow_mut()))
    }

    pub fn set(&'static self, value: T) {
        self.with(|c| *c.borrow_mut() = value)
    }

    pub fn take(&'static self) -> T
    where
        T: Default,
    {
        self.with(|c| c.take())
    }

    pub fn replace(&'static self, value: T) -> T {
        self.with(|c| c.replace(value))
    }
}

/// Drops every thread-local value of `t` (which is exiting), newest key first.
pub fn run_destructors(t: &Tcb) {
    loop {
        // SAFETY: only the exiting thread touches its table.
        let table = unsafe { &mut *t.tls.get() };
        let Some(i) = table.iter().rposition(Option::is_some) else {
            return;
        };
        let (p, dtor) = table[i].take().expect("slot is set");
        // SAFETY: the pointer and destructor were stored together by `LocalKey::slot`; the
        // table entry is cleared, so it runs once. A destructor may use other keys.
        unsafe { dtor(p) };
    }
}

/// Declares thread-local values, like std's:
/// `activm_rt::thread_local!(static COUNT: Cell<u32> = Cell::new(0));`
#[macro_export]
macro_rules! thread_local {
    () => {};
    ($(#[$attr:meta])* $vis:vis static $name:ident: $t:ty = const { $init:expr }; $($rest:tt)*) => {
        $crate::thread_local!($(#[$attr])* $vis static $name: $t = $init; $($rest)*);
    };
    ($(#[$attr:meta])* $vis:vis static $name:ident: $t:ty = const { $init:expr }) => {
        $crate::thread_local!($(#[$attr])* $vis static $name: $t = $init);
    };
    ($(#[$attr:meta])* $vis:vis static $name:ident: $t:ty = $init:expr; $($rest:tt)*) => {
        $(#[$attr])* $vis static $name: $crate::thread::LocalKey<$t> = {
            fn __init() -> $t {
                $init
            }
            $crate::thread::LocalKey::new(__init)
        };
        $crate::thread_local!($($rest)*);
    };
    ($(#[$attr:meta])* $vis:vis static $name:ident: $t:ty = $init:expr) => {
        $crate::thread_local!($(#[$attr])* $vis static $name: $t = $init;);
    };
}
