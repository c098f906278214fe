//! [`OnceLock`] (`std::sync::OnceLock`) and [`LazyLock`] (`std::sync::LazyLock`), built on
//! [`Once`]: a thread that finds the value being initialised parks until it is there.

use core::cell::UnsafeCell;
use core::fmt;
use core::mem::MaybeUninit;
use core::ops::Deref;

use super::once::Once;

/// A cell written once, then shared (`std::sync::OnceLock`).
pub struct OnceLock<T> {
    once: Once,
    value: UnsafeCell<MaybeUninit<T>>,
}

// SAFETY: the value is written once (inside `Once`, exclusively) and only shared after that;
// sharing the cell shares `&T` (so `T: Sync`) and may move a `T` in from another thread
// (`T: Send`).
unsafe impl<T: Sync + Send> Sync for OnceLock<T> {}
// SAFETY: moving the cell moves the `T`.
unsafe impl<T: Send> Send for OnceLock<T> {}

impl<T> OnceLock<T> {
    pub const fn new() -> OnceLock<T> {
        OnceLock {
            once: Once::new(),
            value: UnsafeCell::new(MaybeUninit::uninit()),
        }
    }

    /// The value, if it was set (never waits).
    pub fn get(&self) -> Option<&T> {
        if self.once.is_completed() {
            // SAFETY: completed means written, and it is never written again.
            Some(unsafe { (*self.value.get()).assume_init_ref() })
        } else {
            None
        }
    }

    pub fn get_mut(&mut self) -> Option<&mut T> {
        if self.once.is_completed() {
            // SAFETY: written, and `&mut self` is exclusive.
            Some(unsafe { self.value.get_mut().assume_init_mut() })
        } else {
            None
        }
    }

    /// Waits until the value is set (by another thread), then returns it.
    pub fn wait(&self) -> &T {
        self.once.wait();
        self.get().expect("a completed OnceLock holds its value")
    }

    /// Sets the value if it was not set; else gives `value` back.
    pub fn set(&self, value: T) -> Result<(), T> {
        match self.try_insert(value) {
            Ok(_) => Ok(()),
            Err((_, value)) => Err(value),
        }
    }

    /// Sets the value if it was not set and returns it; else gives the current one and `value`.
    pub fn try_insert(&self, value: T) -> Result<&T, (&T, T)> {
        let mut value = Some(value);
        let set = self.get_or_init(|| value.take().expect("the value is used once"));
        match value {
            None => Ok(set),
            Some(value) => Err((set, value)),
        }
    }

    /// The value, set by `f` first if it was not set. Exactly one `f` runs; callers that come
    /// while it runs wait for it.
    pub fn get_or_init<F: FnOnce() -> T>(&self, f: F) -> &T {
        if let Some(v) = self.get() {
            return v;
        }
        self.once.call_once_force(|_| {
            // SAFETY: inside `Once`: this is the only writer, and no reader looks before it
            // completes.
            unsafe { (*self.value.get()).write(f()) };
        });
        self.get().expect("a completed OnceLock holds its value")
    }

    /// The value, if it was set.
    pub fn into_inner(mut self) -> Option<T> {
        self.take()
    }

    /// Takes the value out, leaving the cell unset.
    pub fn take(&mut self) -> Option<T> {
        if self.once.is_completed() {
            self.once = Once::new();
            // SAFETY: it was written; the `Once` is reset so it is not read or dropped again.
            Some(unsafe { self.value.get_mut().assume_init_read() })
        } else {
            None
        }
    }
}

impl<T> Default for OnceLock<T> {
    fn default() -> OnceLock<T> {
        OnceLock::new()
    }
}

impl<T> From<T> for OnceLock<T> {
    fn from(value: T) -> OnceLock<T> {
        let cell = OnceLock::new();
        let _ = cell.set(value);
        cell
    }
}

impl<T: Clone> Clone for OnceLock<T> {
    fn clone(&self) -> OnceLock<T> {
        match self.get() {
            Some(v) => OnceLock::from(v.clone()),
            None => OnceLock::new(),
        }
    }
}

impl<T: PartialEq> PartialEq for OnceLock<T> {
    fn eq(&self, other: &OnceLock<T>) -> bool {
        self.get() == other.get()
    }
}

impl<T: Eq> Eq for OnceLock<T> {}

impl<T: fmt::Debug> fmt::Debug for OnceLock<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.get() {
            Some(v) => f.debug_tuple("OnceLock").field(v).finish(),
            None => f.write_str("OnceLock(<uninit>)"),
        }
    }
}

impl<T> Drop for OnceLock<T> {
    fn drop(&mut self) {
        drop(self.take());
    }
}

/// A value computed on first use (`std::sync::LazyLock`): the first thread to deref it runs
/// the initialiser, others that come meanwhile wait for it.
pub struct LazyLock<T, F = fn() -> T> {
    cell: OnceLock<T>,
    init: UnsafeCell<Option<F>>,
}

// SAFETY: `init` is taken exactly once, inside the cell's `Once` (exclusive); after that only
// `&T` is shared. The initialiser may run on any thread (`F: Send`).
unsafe impl<T: Sync + Send, F: Send> Sync for LazyLock<T, F> {}

impl<T, F: FnOnce() -> T> LazyLock<T, F> {
    pub const fn new(f: F) -> LazyLock<T, F> {
        LazyLock {
            cell: OnceLock::new(),
            init: UnsafeCell::new(Some(f)),
        }
    }

    /// Runs the initialiser if nobody did yet, and returns the value.
    pub fn force(this: &LazyLock<T, F>) -> &T {
        this.cell.get_or_init(|| {
            // SAFETY: inside the cell's `Once`: nobody else touches `init` meanwhile, and it is
            // never read again once the value is set.
            let f = unsafe { (*this.init.get()).take() };
            f.expect("LazyLock initialiser already used")()
        })
    }

    /// The value, or the unused initialiser.
    pub fn into_inner(this: LazyLock<T, F>) -> Result<T, F> {
        let LazyLock { mut cell, init } = this;
        match cell.take() {
            Some(v) => Ok(v),
            None => Err(init
                .into_inner()
                .expect("an unused LazyLock keeps its initialiser")),
        }
    }
}

impl<T, F: FnOnce() -> T> Deref for LazyLock<T, F> {
    type Target = T;
    fn deref(&self) -> &T {
        LazyLock::force(self)
    }
}

impl<T: Default> Default for LazyLock<T> {
    fn default() -> LazyLock<T> {
        LazyLock::new(T::default)
    }
}

impl<T: fmt::Debug, F> fmt::Debug for LazyLock<T, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.cell.get() {
            Some(v) => f.debug_tuple("LazyLock").field(v).finish(),
            None => f.write_str("LazyLock(<uninit>)"),
        }
    }
}
