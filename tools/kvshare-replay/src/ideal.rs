//! The ideal page count, computed from token ids alone (no cache-manager state, no digests).
//!
//! At any moment, the pages live sequences need if every distinct token prefix were stored
//! exactly once at page granularity:
//!
//! * one page per distinct full page, a full page being identified by its whole token prefix
//!   (`tokens[0 .. (i+1)*page_size]`) and the sequence's extra keys (salt, LoRA id): a trie of
//!   pages interned exactly (parent node, page tokens), so no hash can collide;
//! * one page per distinct partial tail page, a tail being identified by its request, its
//!   prefix and its tokens: forked samples of one request share their tail until they diverge,
//!   but two requests never share a partially filled page (a page is matchable only once full).
//!
//! A trie node lives while a live sequence holds it (its id is then reused), so the tracker's
//! memory follows the live sequences, not the trace.

use std::collections::HashMap;

#[derive(Debug)]
struct Tracked {
    group: u64,
    tokens: Vec<i32>,
    /// Trie node of each full page.
    nodes: Vec<u32>,
    root: u32,
}

impl Tracked {
    fn parent(&self) -> u32 {
        self.nodes.last().copied().unwrap_or(self.root)
    }
}

/// Tracks the sequences resident on the device and the ideal page count they imply.
#[derive(Debug)]
pub struct IdealTracker {
    ps: usize,
    roots: HashMap<(String, u64), u32>,
    nodes: HashMap<(u32, Box<[i32]>), u32>,
    /// Live sequences holding each node (index = node id).
    holders: Vec<u32>,
    /// Each interned node's key in `nodes` (`None`: a root, or a free id).
    keys: Vec<Option<(u32, Box<[i32]>)>>,
    /// Node ids free for reuse.
    free: Vec<u32>,
    distinct_full: usize,
    /// (request group, parent node, tail tokens) → live sequences holding that tail.
    tails: HashMap<(u64, u32, Box<[i32]>), u32>,
    seqs: HashMap<u64, Tracked>,
}

impl IdealTracker {
    /// An empty tracker for pages of `page_size` tokens.
    pub fn new(page_size: usize) -> Self {
        IdealTracker {
            ps: page_size,
            roots: HashMap::new(),
            nodes: HashMap::new(),
            holders: Vec::new(),
            keys: Vec::new(),
            free: Vec::new(),
            distinct_full: 0,
            tails: HashMap::new(),
            seqs: HashMap::new(),
        }
    }

    fn new_node(&mut self) -> u32 {
        if let Some(n) = self.free.pop() {
            return n;
        }
        self.holders.push(0);
        self.keys.push(None);
        (self.holders.len() - 1) as u32
    }

    fn hold(&mut self, node: u32) {
        let h = &mut self.holders[node as usize];
        *h += 1;
        if *h == 1 {
            self.distinct_full += 1;
        }
    }

    /// Drops a holder; a node nobody holds is forgotten (a sequence holding a node holds its
    /// parent, so its children go with it, in the same removal).
    fn unhold(&mut self, node: u32) {
        let h = &mut self.holders[node as usize];
        *h -= 1;
        if *h == 0 {
            self.distinct_full -= 1;
            if let Some(k) = self.keys[node as usize].take() {
                self.nodes.remove(&k);
                self.free.push(node);
            }
        }
    }

    fn intern(&mut self, parent: u32, page: &[i32]) -> u32 {
        if let Some(&n) = self.nodes.get(&(parent, page.into())) {
            return n;
        }
        let n = self.new_node();
        let key: (u32, Box<[i32]>) = (parent, page.into());
        self.nodes.insert(key.clone(), n);
        self.keys[n as usize] = Some(key);
        n
    }

    /// Trie nodes interned now (tests: the tracker forgets what nobody holds).
    pub fn interned(&self) -> usize {
        self.nodes.len()
    }

    fn tail_key(&self, t: &Tracked) -> Option<(u64, u32, Box<[i32]>)> {
        let full = t.nodes.len() * self.ps;
        (t.tokens.len() > full).then(|| (t.group, t.parent(), t.tokens[full..].into()))
    }

    fn add_tail(&mut self, key: Option<(u64, u32, Box<[i32]>)>) {
        if let Some(k) = key {
            *self.tails.entry(k).or_insert(0) += 1;
        }
    }

    fn remove_tail(&mut self, key: Option<(u64, u32, Box<[i32]>)>) {
        if let Some(k) = key {
            let c = self.tails.get_mut(&k).expect("tail tracked");
            *c -= 1;
            if *c == 0 {
                self.tails.remove(&k);
            }
        }
    }

    /// Starts tracking sequence `id` of request `group` (forked samples share the group) with
    /// `tokens` and extra keys `salt`, `lora`.
    pub fn insert(&mut self, id: u64, group: u64, salt: &str, lora: u64, tokens: &[i32]) {
        assert!(!self.seqs.contains_key(&id), "sequence {id} tracked twice");
        let root = match self.roots.get(&(salt.to_string(), lora)) {
            Some(&r) => r,
            None => {
                let r = self.new_node();
                self.roots.insert((salt.to_string(), lora), r);
                r
            }
        };
        let mut t = Tracked {
            group,
            tokens: Vec::with_capacity(tokens.len() + 256),
            nodes: Vec::new(),
            root,
        };
        for chunk in tokens.chunks(self.ps) {
            t.tokens.extend_from_slice(chunk);
            if chunk.len() == self.ps {
                let n = self.intern(t.parent(), chunk);
                self.hold(n);
                t.nodes.push(n);
            }
        }
        let key = self.tail_key(&t);
        self.add_tail(key);
        self.seqs.insert(id, t);
    }

    /// Appends one token to sequence `id`.
    pub fn push(&mut self, id: u64, token: i32) {
        let mut t = self.seqs.remove(&id).expect("sequence tracked");
        let old = self.tail_key(&t);
        self.remove_tail(old);
        t.tokens.push(token);
        if t.tokens.len().is_multiple_of(self.ps) {
            let start = t.tokens.len() - self.ps;
            let page: Vec<i32> = t.tokens[start..].to_vec();
            let n = self.intern(t.parent(), &page);
            self.hold(n);
            t.nodes.push(n);
        }
        let new = self.tail_key(&t);
        self.add_tail(new);
        self.seqs.insert(id, t);
    }

    /// Stops tracking sequence `id` (finished, or moved off the device).
    pub fn remove(&mut self, id: u64) {
        let t = self.seqs.remove(&id).expect("sequence tracked");
        for &n in &t.nodes {
            self.unhold(n);
        }
        let key = self.tail_key(&t);
        self.remove_tail(key);
    }

    /// Pages the tracked sequences need at best.
    pub fn pages(&self) -> usize {
        self.distinct_full + self.tails.len()
    }

    /// Pages the tracked sequences would hold with no sharing at all.
    pub fn unshared_pages(&self) -> usize {
        self.seqs
            .values()
            .map(|t| t.tokens.len().div_ceil(self.ps))
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_distinct_prefixes() {
        let mut t = IdealTracker::new(4);
        t.insert(1, 1, "", 0, &[1, 2, 3, 4, 5, 6]); // full [1..4], tail [5,6]
        assert_eq!(t.pages(), 2);
        t.insert(2, 2, "", 0, &[1, 2, 3, 4, 5, 6]); // same full page, own tail
        assert_eq!(t.pages(), 3);
        t.insert(3, 3, "s", 0, &[1, 2, 3, 4]); // salt: a page of its own
        assert_eq!(t.pages(), 4);
        t.insert(4, 4, "", 0, &[9, 2, 3, 4, 1, 2, 3, 4]); // same tokens, other prefix
        assert_eq!(t.pages(), 6);
        assert_eq!(t.unshared_pages(), 2 + 2 + 1 + 2);
        t.push(1, 7);
        t.push(1, 8); // page 1 of seq 1 fills: [5,6,7,8]
        assert_eq!(t.pages(), 6);
        t.push(2, 7);
        t.push(2, 8); // seq 2 fills the same page: shared at best
        assert_eq!(t.pages(), 5);
        t.remove(1);
        assert_eq!(t.pages(), 5);
        t.remove(2);
        assert_eq!(t.pages(), 3);
        t.remove(3);
        t.remove(4);
        assert_eq!(
            (t.pages(), t.interned()),
            (0, 0),
            "nothing held, nothing kept"
        );
        t.insert(5, 5, "", 0, &[1, 2, 3, 4, 5]);
        assert_eq!((t.pages(), t.interned()), (2, 1));
    }

    #[test]
    fn forked_samples_share_their_tail_until_they_diverge() {
        let mut t = IdealTracker::new(4);
        t.insert(1, 7, "", 0, &[1, 2, 3, 4, 5]);
        t.insert(2, 7, "", 0, &[1, 2, 3, 4, 5]);
        assert_eq!(t.pages(), 2);
        t.push(1, 6);
        t.push(2, 9);
        assert_eq!(t.pages(), 3);
        t.insert(3, 8, "", 0, &[1, 2, 3, 4, 5, 6]);
        assert_eq!(
            t.pages(),
            4,
            "another request's identical tail is its own page"
        );
    }
}
