//! Intrusive doubly linked lists threaded through page indices, with sentinel nodes.
//!
//! One `Links` array holds several lists (one sentinel each) over the same `n` items; an item
//! is in at most one list at a time. Push/pop at either end and removal from the middle are O(1)
//! and allocate nothing.

use super::alloc::try_vec;
use super::error::Result;

const NONE: u32 = u32::MAX;

/// Links for `n` items plus `lists` sentinels (item ids `0..n`, sentinel of list `k` is `n + k`).
#[derive(Debug, Clone)]
pub struct Links {
    prev: Vec<u32>,
    next: Vec<u32>,
    len: Vec<usize>,
    n: u32,
}

impl Links {
    /// `n` unlinked items and `lists` empty lists; `OutOfMemory` naming `what` when the links
    /// cannot be allocated.
    pub fn new(n: u32, lists: u32, what: &'static str) -> Result<Self> {
        let total = n as usize + lists as usize;
        let mut l = Links {
            prev: try_vec(total, NONE, what)?,
            next: try_vec(total, NONE, what)?,
            len: try_vec(lists as usize, 0, what)?,
            n,
        };
        for k in 0..lists {
            let s = n + k;
            l.prev[s as usize] = s;
            l.next[s as usize] = s;
        }
        Ok(l)
    }

    fn sentinel(&self, list: usize) -> u32 {
        self.n + list as u32
    }

    /// Whether `item` is linked into some list.
    pub fn is_linked(&self, item: u32) -> bool {
        self.next[item as usize] != NONE
    }

    /// Items in `list`.
    pub fn len(&self, list: usize) -> usize {
        self.len[list]
    }

    fn insert_after(&mut self, at: u32, item: u32) {
        debug_assert!(!self.is_linked(item), "item {item} already linked");
        let nx = self.next[at as usize];
        self.prev[item as usize] = at;
        self.next[item as usize] = nx;
        self.next[at as usize] = item;
        self.prev[nx as usize] = item;
    }

    /// Links `item` at the front (head) of `list`.
    #[inline]
    pub fn push_front(&mut self, list: usize, item: u32) {
        self.insert_after(self.sentinel(list), item);
        self.len[list] += 1;
    }

    /// Links `item` at the back (tail) of `list`.
    #[inline]
    pub fn push_back(&mut self, list: usize, item: u32) {
        let s = self.sentinel(list);
        self.insert_after(self.prev[s as usize], item);
        self.len[list] += 1;
    }

    /// Unlinks `item` from `list` (which it must be in).
    #[inline]
    pub fn remove(&mut self, list: usize, item: u32) {
        let (p, nx) = (self.prev[item as usize], self.next[item as usize]);
        debug_assert!(p != NONE, "item {item} not linked");
        self.next[p as usize] = nx;
        self.prev[nx as usize] = p;
        self.prev[item as usize] = NONE;
        self.next[item as usize] = NONE;
        self.len[list] -= 1;
    }

    /// The head of `list`, if any.
    pub fn front(&self, list: usize) -> Option<u32> {
        let s = self.sentinel(list);
        let h = self.next[s as usize];
        (h != s).then_some(h)
    }

    /// Unlinks and returns the head of `list`.
    #[inline]
    pub fn pop_front(&mut self, list: usize) -> Option<u32> {
        let h = self.front(list)?;
        self.remove(list, h);
        Some(h)
    }

    /// Walks `list` from head to tail; `None` if the links are corrupt (a cycle or a broken back
    /// link), for the invariant checker.
    pub fn collect(&self, list: usize) -> Option<Vec<u32>> {
        let s = self.sentinel(list);
        let mut out = Vec::with_capacity(self.len[list]);
        let mut cur = s;
        loop {
            let nx = self.next[cur as usize];
            if nx == NONE || self.prev[nx as usize] != cur {
                return None;
            }
            if nx == s {
                return Some(out);
            }
            if nx >= self.n || out.len() > self.n as usize {
                return None;
            }
            out.push(nx);
            cur = nx;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn push_pop_remove() {
        let mut l = Links::new(5, 2, "test").unwrap();
        l.push_back(0, 1);
        l.push_back(0, 2);
        l.push_front(0, 3);
        l.push_back(1, 4);
        assert_eq!(l.collect(0).unwrap(), vec![3, 1, 2]);
        assert_eq!(l.collect(1).unwrap(), vec![4]);
        l.remove(0, 1);
        assert_eq!(l.collect(0).unwrap(), vec![3, 2]);
        assert_eq!(l.pop_front(0), Some(3));
        assert_eq!(l.pop_front(0), Some(2));
        assert_eq!(l.pop_front(0), None);
        assert_eq!(l.len(0), 0);
        assert_eq!(l.len(1), 1);
        assert!(!l.is_linked(1));
        assert!(l.is_linked(4));
    }
}
