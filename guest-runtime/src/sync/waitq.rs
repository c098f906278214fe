//! An intrusive FIFO of waiting threads, linked through `Tcb::link` (a thread waits in at most
//! one list at a time), always used under its owner's `SpinLock`.

use crate::tcb::{self, Tcb};

#[derive(Debug)]
pub(crate) struct WaitList {
    head: *const Tcb,
    tail: *const Tcb,
    len: usize,
}

// SAFETY: the pointers are TCBs (never freed), used under the owner's lock.
unsafe impl Send for WaitList {}

impl WaitList {
    pub const fn new() -> WaitList {
        WaitList {
            head: core::ptr::null(),
            tail: core::ptr::null(),
            len: 0,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// Appends `t` (a thread about to wait) with `tag`.
    pub fn push(&mut self, t: &Tcb, tag: usize) {
        t.link.set(core::ptr::null());
        t.tag.set(tag);
        if self.tail.is_null() {
            self.head = t;
        } else {
            // SAFETY: the tail is a TCB in this list; its link belongs to the list.
            unsafe { tcb::from_raw(self.tail) }.link.set(t);
        }
        self.tail = t;
        self.len += 1;
    }

    /// Removes the oldest waiter.
    pub fn pop(&mut self) -> Option<&'static Tcb> {
        if self.head.is_null() {
            return None;
        }
        // SAFETY: the head is a TCB in this list.
        let t = unsafe { tcb::from_raw(self.head) };
        self.head = t.link.get();
        if self.head.is_null() {
            self.tail = core::ptr::null();
        }
        self.len -= 1;
        Some(t)
    }

    /// Whether a waiter was pushed with `tag`.
    pub fn contains_tag(&self, tag: usize) -> bool {
        let mut cur = self.head;
        while !cur.is_null() {
            // SAFETY: a TCB in this list.
            let c = unsafe { tcb::from_raw(cur) };
            if c.tag.get() == tag {
                return true;
            }
            cur = c.link.get();
        }
        false
    }

    /// Removes `t` if it is in the list; says whether it was.
    pub fn remove(&mut self, t: &Tcb) -> bool {
        let target = t as *const Tcb;
        let mut prev: *const Tcb = core::ptr::null();
        let mut cur = self.head;
        while !cur.is_null() {
            // SAFETY: a TCB in this list.
            let c = unsafe { tcb::from_raw(cur) };
            let next = c.link.get();
            if cur == target {
                if prev.is_null() {
                    self.head = next;
                } else {
                    // SAFETY: as above.
                    unsafe { tcb::from_raw(prev) }.link.set(next);
                }
                if self.tail == target {
                    self.tail = prev;
                }
                self.len -= 1;
                return true;
            }
            prev = cur;
            cur = next;
        }
        false
    }

    /// Removes up to `max` waiters whose tag is `tag`, oldest first, into a new list.
    pub fn take_tagged(&mut self, tag: usize, max: usize) -> WaitList {
        let mut taken = WaitList::new();
        let mut prev: *const Tcb = core::ptr::null();
        let mut cur = self.head;
        while !cur.is_null() && taken.len < max {
            // SAFETY: a TCB in this list.
            let c = unsafe { tcb::from_raw(cur) };
            let next = c.link.get();
            if c.tag.get() == tag {
                if prev.is_null() {
                    self.head = next;
                } else {
                    // SAFETY: as above.
                    unsafe { tcb::from_raw(prev) }.link.set(next);
                }
                if self.tail == cur {
                    self.tail = prev;
                }
                self.len -= 1;
                taken.push(c, tag);
            } else {
                prev = cur;
            }
            cur = next;
        }
        taken
    }

    /// Takes every waiter.
    pub fn take_all(&mut self) -> WaitList {
        core::mem::replace(self, WaitList::new())
    }
}

impl Iterator for WaitList {
    type Item = &'static Tcb;
    fn next(&mut self) -> Option<&'static Tcb> {
        self.pop()
    }
}
