//! Locks that keep working after a panic.
//!
//! A std lock is poisoned when a thread panics while holding it, and `lock()` then returns an
//! error for ever after. Every lock of the service guards state that a panic cannot leave half
//! written (a map insert or removal, one assignment), so the guard is taken either way: a panic
//! in one request (a 500, caught by the HTTP layer) must not turn every later request that
//! takes the same lock into a 500 too.

use std::sync::{Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// [`Mutex::lock`], poisoned or not.
pub(crate) trait Guard<T: ?Sized> {
    fn guard(&self) -> MutexGuard<'_, T>;
}

impl<T: ?Sized> Guard<T> for Mutex<T> {
    fn guard(&self) -> MutexGuard<'_, T> {
        self.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// [`RwLock::read`] and [`RwLock::write`], poisoned or not.
pub(crate) trait Guards<T: ?Sized> {
    fn read_guard(&self) -> RwLockReadGuard<'_, T>;
    fn write_guard(&self) -> RwLockWriteGuard<'_, T>;
}

impl<T: ?Sized> Guards<T> for RwLock<T> {
    fn read_guard(&self) -> RwLockReadGuard<'_, T> {
        self.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write_guard(&self) -> RwLockWriteGuard<'_, T> {
        self.write().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_lock_poisoned_by_a_panic_is_still_taken() {
        let m = Arc::new(Mutex::new(1));
        let l = Arc::new(RwLock::new(1));
        let (m2, l2) = (m.clone(), l.clone());
        let _ = std::thread::spawn(move || {
            let _g = m2.lock();
            let _w = l2.write();
            panic!("a request panics holding both locks");
        })
        .join();
        assert!(m.is_poisoned() && l.is_poisoned());
        *m.guard() += 1;
        *l.write_guard() += 1;
        assert_eq!((*m.guard(), *l.read_guard()), (2, 2));
    }
}
