//! The prefix index: exact longest-prefix matching of token pages.
//!
//! Each full page of a token sequence gets a chain digest
//!
//! ```text
//! h_0 = ROOT
//! h_i = xxh3_128( h_{i-1} as 16 LE bytes ‖ e_i as 16 LE bytes ‖ page i's tokens as int32 LE )
//! ```
//!
//! where `e_i` is the page's extra-key digest ([`ExtraKeys::page_digest`]: LoRA id, cache salt
//! and the multimodal items overlapping the page; 0 when there are none). The index maps `h_i`
//! to the page holding that KV. A lookup verifies the stored tokens and the extra digest of the
//! page itself, so a hit needs the page's own tokens to be equal and the whole earlier prefix to
//! have the same 128-bit xxh3 digest. xxh3-128 (XXH3_128bits, seed 0) is the specified
//! algorithm; routers can recompute `h_i` from token ids alone (see docs/design.md, "Prefix keys").
//!
//! ## Groups
//!
//! One index serves every KV-cache group of a pool (groups of equal page bytes share pages): a
//! page is registered for at most one group, and a group's entries are keyed apart from the
//! others' by [`PrefixIndex::key`] (group 0's key is the digest itself). A lookup names its group
//! and verifies it with the tokens, so one group never finds another's page.
//!
//! ## Hits finer than a page (`match_unit`)
//!
//! With a match unit `u` smaller than the page size (a divisor of it), each registered page `i`
//! also gets one *unit key* per proper unit prefix of its tokens, chained like the pages:
//!
//! ```text
//! g_0 = h_{i-1}
//! g_k = xxh3_128( g_{k-1} as 16 LE bytes ‖ e_i as 16 LE bytes ‖ unit k's tokens as int32 LE )
//! ```
//!
//! for `k` in `1..page_size/u` (the whole page is `h_i`'s job). Several pages may share a unit
//! prefix (siblings diverging inside a page), and the caller may refuse some of them as copy
//! sources (the cache takes only unreferenced ones; see `State::walk_units`), so every page
//! keeps every one of its keys: a second map holds `g_k ->` the list of pages with that key,
//! a doubly linked list threaded through two flat arrays indexed by `(k, page)` (the next and
//! previous page of the page's key-`k` node), oldest first. Registering or removing a page
//! links or unlinks its nodes in O(1) each (removal recomputes its keys from its stored
//! tokens). A lookup (after the page walk stops at page `i`) hashes the query's units of page
//! `i`, probes from the longest down, walks each key's list until a page the caller accepts,
//! and verifies that page's parent digest, extra digest and first `k·u` tokens, so a unit hit
//! is as exact as a page hit, and no cached page is hidden by a sibling the caller refuses.
//!
//! A sequence's last page, never full, would hold a conversation's tail that its next turn
//! repeats: when a sequence ends, that page is kept as a *partial entry* with its whole units
//! ([`PrefixIndex::insert_partial`]): it has unit keys only, no `h_i` (a full-page walk never
//! finds it and no `Stored` event publishes it), is cached and evicted like any registered
//! page, and is never demoted.
//!
//! ## Children
//!
//! A full-attention hit walks pages from the first one, so a page is worth keeping only while
//! its parent is. For a *chained* group (full attention: a window, a chunk or a state checkpoint
//! does not need the pages before it), registering an entry (a full page or a partial one) finds
//! its parent's page by the parent digest (one probe of the map, whose line the prefix walk has
//! usually just read) and counts the entry there; the entry remembers that page and the
//! page's registration number, so removing it uncounts it with no probe. An entry whose parent
//! is in no page yet (a host tier receives a chain last page first: demotion evicts leaves
//! first) waits in a second map, keyed by the parent digest, until its parent registers and
//! adopts it; a parent that leaves puts its children back there. [`PrefixIndex::has_child`] (an
//! array read) tells the pool which cached pages to evict only after their children, and
//! [`PrefixIndex::remove`] reports the parent page whose last child just left.
//!
//! Costs: registering or removing a page hashes its tokens once more (the unit chain is linear
//! in the page, not quadratic) and touches `page_size/u - 1` map slots and list nodes; a lookup
//! adds at most `page_size/u - 1` unit hashes and map probes to the page walk, plus one step per
//! refused sibling it walks past. The lists take 8 bytes per page and unit key
//! (`(page_size/u - 1) · 8` per page, allocated with the index). With `u = page_size` there are
//! no unit keys and nothing changes.

use xxhash_rust::xxh3::xxh3_128;

use super::alloc::try_vec;
use super::error::{Error, Result};
use super::hashing::DigestMap;

/// Chain digest of the empty prefix: `xxh3_128(b"kvshare-prefix-v1")`.
pub fn root_hash() -> u128 {
    xxh3_128(b"kvshare-prefix-v1")
}

/// A multimodal input placed in the token sequence (its placeholder tokens span
/// `offset..offset+length`), identified by a 128-bit content hash from the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MmItem {
    /// Content hash of the item (e.g. of the image bytes).
    pub hash: u128,
    /// First token position of the item.
    pub offset: u32,
    /// Number of token positions it covers.
    pub length: u32,
}

/// Extra keys that are part of every page's identity besides its tokens.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExtraKeys {
    /// LoRA adapter id (0: base model).
    pub lora_id: u64,
    /// Cache salt: sequences with different salts never share pages.
    pub salt: Vec<u8>,
    /// Multimodal items, in any order.
    pub mm: Vec<MmItem>,
}

impl ExtraKeys {
    /// Whether no extra key is set.
    pub fn is_empty(&self) -> bool {
        self.lora_id == 0 && self.salt.is_empty() && self.mm.is_empty()
    }

    /// The extra digest `e_i` of page `page_index`: 0 when no LoRA id, no salt and no item
    /// overlapping the page; otherwise `xxh3_128(b"kvs-extra-v1" ‖ lora_id u64 LE ‖ salt length
    /// u64 LE ‖ salt ‖ for each overlapping item in the given order: hash 16 LE bytes ‖ (offset -
    /// page start) i64 LE ‖ length u32 LE)`.
    pub fn page_digest(&self, page_index: usize, page_size: usize) -> u128 {
        if self.is_empty() {
            return 0;
        }
        let start = (page_index * page_size) as i64;
        let end = start + page_size as i64;
        let overlapping = self.mm.iter().filter(|m| {
            let (a, b) = (m.offset as i64, m.offset as i64 + m.length as i64);
            a < end && b > start
        });
        if self.lora_id == 0 && self.salt.is_empty() && overlapping.clone().next().is_none() {
            return 0;
        }
        let mut buf = Vec::with_capacity(32 + self.salt.len());
        buf.extend_from_slice(b"kvs-extra-v1");
        buf.extend_from_slice(&self.lora_id.to_le_bytes());
        buf.extend_from_slice(&(self.salt.len() as u64).to_le_bytes());
        buf.extend_from_slice(&self.salt);
        for m in overlapping {
            buf.extend_from_slice(&m.hash.to_le_bytes());
            buf.extend_from_slice(&(m.offset as i64 - start).to_le_bytes());
            buf.extend_from_slice(&m.length.to_le_bytes());
        }
        xxh3_128(&buf)
    }
}

/// Whether `tokens` holds a placeholder (a negative id, whose KV is not known yet). An OR of
/// every id's sign bit, without a branch per token, so that it vectorises: the prefix walk asks it
/// for every page it hashes.
#[inline]
pub(crate) fn has_placeholder(tokens: &[i32]) -> bool {
    tokens.iter().fold(0i32, |acc, &t| acc | t) < 0
}

/// `h_i` from `h_{i-1}`, the page's extra digest and its tokens. `scratch` is reused to avoid
/// an allocation per page.
pub fn chain_hash(parent: u128, extra: u128, tokens: &[i32], scratch: &mut Vec<u8>) -> u128 {
    scratch.resize(32 + 4 * tokens.len(), 0);
    scratch[..16].copy_from_slice(&parent.to_le_bytes());
    scratch[16..32].copy_from_slice(&extra.to_le_bytes());
    for (dst, t) in scratch[32..].chunks_exact_mut(4).zip(tokens) {
        dst.copy_from_slice(&t.to_le_bytes());
    }
    xxh3_128(scratch)
}

type IndexMap = DigestMap<u32>;

/// End of a unit key's page list.
const NONE: u32 = u32::MAX;
/// A `prev` link marking a node that is in no list.
const UNLINKED: u32 = u32::MAX - 1;

/// The pages holding one unit key: the ends of its list and the key's unit count `k`
/// (1-based), which says whose links thread it.
#[derive(Debug, Clone, Copy)]
struct UnitList {
    first: u32,
    last: u32,
    k: u32,
}

/// What the index stores of a registered page besides its tokens: one 64-byte record, so that
/// registering or verifying a page touches one line of it (plus the tokens), not one per field.
#[derive(Debug, Clone, Copy, Default)]
#[repr(align(64))]
struct Meta {
    hash: u128,
    parent: u128,
    extra: u128,
    lora: u64,
    /// Tokens held: the page size, or fewer (whole units) for a partial entry.
    len: u32,
    /// The group the page is registered for.
    group: u32,
}

/// Index of one tier's registered pages.
#[derive(Debug, Clone)]
pub struct PrefixIndex {
    page_size: usize,
    /// Match unit in tokens (divides `page_size`).
    unit: usize,
    map: IndexMap,
    /// Unit keys `g_k` of registered pages -> the pages holding them (empty when
    /// `unit == page_size`).
    units: DigestMap<UnitList>,
    /// Per unit count `k` (1..page_size/unit) and page, at `(k - 1) * num_pages + page`: the next
    /// and previous page of its key-`k` list (`NONE` at the ends, `prev` `UNLINKED` when in no
    /// list). Empty when `unit == page_size`.
    unit_next: Vec<u32>,
    unit_prev: Vec<u32>,
    num_pages: usize,
    /// Reused buffer for hashing unit keys at insert and remove.
    scratch: Vec<u8>,
    /// Pages registered as partial entries (unit keys only).
    partial: usize,
    meta: Vec<Meta>,
    /// Registered full pages per group.
    per_group: Vec<usize>,
    /// Groups whose pages depend on their parent (bit `g`: full attention).
    chained: u32,
    /// Per page: its children and its link to its parent (one record: a registration touches
    /// one line).
    links: Vec<Kin>,
    /// `key(group, parent digest)` -> registered entries of a chained group waiting for a page
    /// with that digest to adopt them.
    orphans: DigestMap<u32>,
    /// Kept apart from `meta`: releases read it for every page, and a byte per page stays cached.
    registered: Vec<bool>,
    tokens: Vec<i32>,
}

/// Everything stored for a registered page (to move it between tiers and to report events).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry<'a> {
    /// Chain digest `h_i`.
    pub hash: u128,
    /// Chain digest of the previous page (`root_hash()` for the first page).
    pub parent: u128,
    /// Extra-key digest `e_i`.
    pub extra: u128,
    /// LoRA id of the sequence that registered it (for events).
    pub lora: u64,
    /// The page's token ids.
    pub tokens: &'a [i32],
}

/// A registered page's entry, with the group it is registered for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stored<'a> {
    /// The group.
    pub group: u32,
    /// Chain digest `h_i`.
    pub hash: u128,
    /// Chain digest of the previous page.
    pub parent: u128,
    /// Extra-key digest `e_i`.
    pub extra: u128,
    /// LoRA id of the sequence that registered it.
    pub lora: u64,
    /// The page's token ids.
    pub tokens: &'a [i32],
}

/// Mixes a group id into a digest (an odd 128-bit constant times the group): group 0's key is
/// the digest itself.
const GROUP_MIX: u128 = 0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835;

/// A page's family in the index (see "Children" in the module doc).
#[derive(Debug, Clone, Copy)]
struct Kin {
    /// Registered entries counted as its children.
    kids: u32,
    /// Registrations of this page so far (a link with an older number is stale).
    epoch: u32,
    /// The page its entry was counted at (`NONE`: not counted) and that page's epoch then.
    up: u32,
    up_epoch: u32,
}

impl Default for Kin {
    fn default() -> Self {
        Kin {
            kids: 0,
            epoch: 0,
            up: NONE,
            up_epoch: 0,
        }
    }
}

/// What [`PrefixIndex::remove`] did besides dropping the entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Removed {
    /// The registered page the removed entry hung off, when that was its last child: a leaf now.
    pub parent_leaf: Option<u32>,
}

/// A prefix hit ending inside a page: `page` holds the queried parent and extra digests and
/// the first `tokens` (a multiple of the match unit, less than a page) of the queried tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnitHit {
    /// The page whose first `tokens` slots hold the matched KV.
    pub page: u32,
    /// Matched tokens (whole units, fewer than a page).
    pub tokens: usize,
}

/// The unit keys `g_1 ..= g_n` of a page with parent digest `parent` and extra digest `extra`,
/// for the first `n` whole units of `tokens`, pushed to `out`.
fn unit_keys(
    parent: u128,
    extra: u128,
    tokens: &[i32],
    unit: usize,
    n: usize,
    scratch: &mut Vec<u8>,
    out: &mut Vec<u128>,
) {
    let mut g = parent;
    for chunk in tokens.chunks_exact(unit).take(n) {
        g = chain_hash(g, extra, chunk, scratch);
        out.push(g);
    }
}

impl PrefixIndex {
    /// An empty index over `num_pages` pages of `page_size` tokens matched in units of `unit`
    /// tokens (a divisor of `page_size`), counting the children of the groups whose bit is set
    /// in `chained`; `OutOfMemory` naming `what` (the tier's page-count field) when its arrays
    /// cannot be allocated.
    pub fn new(
        num_pages: u32,
        page_size: u32,
        unit: usize,
        chained: u32,
        what: &'static str,
    ) -> Result<Self> {
        debug_assert!(unit > 0 && (page_size as usize).is_multiple_of(unit));
        let n = num_pages as usize;
        let too_big = Error::OutOfMemory {
            what,
            bytes: u64::MAX,
        };
        let slots = n.checked_mul(page_size as usize).ok_or(too_big.clone())?;
        let nodes = n
            .checked_mul(page_size as usize / unit - 1)
            .ok_or(too_big)?;
        Ok(PrefixIndex {
            page_size: page_size as usize,
            unit,
            map: IndexMap::default(),
            units: DigestMap::default(),
            unit_next: try_vec(nodes, NONE, what)?,
            unit_prev: try_vec(nodes, UNLINKED, what)?,
            num_pages: n,
            scratch: Vec::new(),
            partial: 0,
            meta: try_vec(n, Meta::default(), what)?,
            per_group: Vec::new(),
            chained,
            links: try_vec(n, Kin::default(), what)?,
            orphans: DigestMap::default(),
            registered: try_vec(n, false, what)?,
            tokens: try_vec(slots, 0, what)?,
        })
    }

    /// The key of group `group`'s digest `hash` in the maps.
    pub fn key(group: u32, hash: u128) -> u128 {
        hash ^ u128::from(group).wrapping_mul(GROUP_MIX)
    }

    fn is_chained(&self, group: u32) -> bool {
        group < 32 && self.chained & (1 << group) != 0
    }

    /// Counts the entry just registered in `page` (of `group`, parent digest `parent`, its own
    /// digest `own` for a full page) at its parent's page, or among the orphans of that digest
    /// when no page holds it; a full page adopts the orphans waiting for its digest.
    fn add_child(&mut self, page: u32, group: u32, parent: u128, own: Option<u128>) {
        let k = &mut self.links[page as usize];
        k.epoch = k.epoch.wrapping_add(1);
        k.kids = 0;
        k.up = NONE;
        if !self.is_chained(group) {
            return;
        }
        if let Some(h) = own.filter(|_| !self.orphans.is_empty()) {
            if let Some(n) = self.orphans.remove(&Self::key(group, h)) {
                self.links[page as usize].kids = n;
            }
        }
        let key = Self::key(group, parent);
        match self.map.get(&key).copied() {
            Some(pp) => {
                let p = &mut self.links[pp as usize];
                p.kids += 1;
                let epoch = p.epoch;
                let k = &mut self.links[page as usize];
                k.up = pp;
                k.up_epoch = epoch;
            }
            None => *self.orphans.entry(key).or_insert(0) += 1,
        }
    }

    /// Uncounts the entry of `page` (of record `m`, full unless `partial`), being removed, and
    /// puts its own children back among the orphans; its parent's page when that was the last
    /// child.
    fn drop_child(&mut self, page: u32, m: Meta, partial: bool) -> Option<u32> {
        let k = std::mem::take(&mut self.links[page as usize].kids);
        let (up, up_epoch) = (
            self.links[page as usize].up,
            self.links[page as usize].up_epoch,
        );
        self.links[page as usize].up = NONE;
        if !self.is_chained(m.group) {
            return None;
        }
        if k > 0 && !partial {
            *self.orphans.entry(Self::key(m.group, m.hash)).or_insert(0) += k;
        }
        let linked =
            up != NONE && self.registered[up as usize] && self.links[up as usize].epoch == up_epoch;
        let pp = if linked {
            up
        } else {
            // Counted among the orphans, or adopted by the page that holds the parent now.
            let key = Self::key(m.group, m.parent);
            if let std::collections::hash_map::Entry::Occupied(mut o) = self.orphans.entry(key) {
                *o.get_mut() -= 1;
                if *o.get() == 0 {
                    o.remove();
                }
                return None;
            }
            self.map.get(&key).copied()?
        };
        let p = &mut self.links[pp as usize];
        debug_assert!(p.kids > 0, "a counted child's parent counts it");
        p.kids -= 1;
        (p.kids == 0).then_some(pp)
    }

    /// Whether registered page `page` has a registered child counted at it.
    pub fn has_child(&self, page: u32) -> bool {
        self.links.get(page as usize).is_some_and(|k| k.kids > 0)
    }

    /// Registered full pages of `group`.
    pub fn group_len(&self, group: u32) -> usize {
        self.per_group.get(group as usize).copied().unwrap_or(0)
    }

    /// The group a registered page is registered for (0 when unregistered).
    pub fn group_of(&self, page: u32) -> u32 {
        if self.registered[page as usize] {
            self.meta[page as usize].group
        } else {
            0
        }
    }

    /// Registered full pages (partial entries: [`partial_len`](Self::partial_len)).
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether no page is registered.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Whether `page` holds an index entry.
    pub fn is_registered(&self, page: u32) -> bool {
        self.registered[page as usize]
    }

    /// The chain digest of a registered full page (`None` for a partial entry).
    pub fn hash_of(&self, page: u32) -> Option<u128> {
        (self.registered[page as usize] && !self.is_partial(page))
            .then(|| self.meta[page as usize].hash)
    }

    /// Whether `page` holds a partial entry (whole units of a page that never filled).
    pub fn is_partial(&self, page: u32) -> bool {
        self.registered[page as usize] && (self.meta[page as usize].len as usize) < self.page_size
    }

    /// Pages holding partial entries.
    pub fn partial_len(&self) -> usize {
        self.partial
    }

    fn page_tokens(&self, page: u32) -> &[i32] {
        let s = page as usize * self.page_size;
        &self.tokens[s..s + self.page_size]
    }

    /// The page registered for `group` under `hash` whose stored tokens and extra digest equal
    /// the given ones; `None` on a miss (including the astronomically unlikely digest
    /// collision).
    pub fn lookup(&self, group: u32, hash: u128, extra: u128, tokens: &[i32]) -> Option<u32> {
        self.find(group, hash)
            .filter(|&p| self.verify(p, group, extra, tokens))
    }

    /// The page registered for `group` under `hash`, unverified: [`lookup`](Self::lookup) in
    /// two halves, so that a walk can issue several finds before it reads their pages.
    pub fn find(&self, group: u32, hash: u128) -> Option<u32> {
        self.map.get(&Self::key(group, hash)).copied()
    }

    /// Whether registered page `page` belongs to `group` and stores these tokens and this extra
    /// digest.
    pub fn verify(&self, page: u32, group: u32, extra: u128, tokens: &[i32]) -> bool {
        let m = &self.meta[page as usize];
        m.extra == extra && m.group == group && self.page_tokens(page) == tokens
    }

    /// The stored entry of a registered full page (`None` for a partial entry).
    pub fn entry(&self, page: u32) -> Option<Stored<'_>> {
        let m = &self.meta[page as usize];
        self.hash_of(page).map(|_| Stored {
            group: m.group,
            hash: m.hash,
            parent: m.parent,
            extra: m.extra,
            lora: m.lora,
            tokens: self.page_tokens(page),
        })
    }

    /// Whether some page is registered for `group` under `hash`.
    pub fn contains(&self, group: u32, hash: u128) -> bool {
        self.map.contains_key(&Self::key(group, hash))
    }

    /// Registers `page` for `group` under `e.hash`. Returns false (and changes nothing) when
    /// another page already holds the digest in that group (a duplicate: the first copy stays
    /// canonical) or `page` is already registered.
    pub fn insert(&mut self, page: u32, group: u32, e: Entry<'_>) -> bool {
        let Entry {
            hash,
            parent,
            extra,
            lora,
            tokens,
        } = e;
        debug_assert_eq!(tokens.len(), self.page_size);
        let i = page as usize;
        if self.registered[i] {
            return false;
        }
        match self.map.entry(Self::key(group, hash)) {
            std::collections::hash_map::Entry::Occupied(_) => return false,
            std::collections::hash_map::Entry::Vacant(v) => v.insert(page),
        };
        self.meta[i] = Meta {
            hash,
            parent,
            extra,
            lora,
            len: self.page_size as u32,
            group,
        };
        if self.per_group.len() <= group as usize {
            self.per_group.resize(group as usize + 1, 0);
        }
        self.per_group[group as usize] += 1;
        self.registered[i] = true;
        let s = i * self.page_size;
        self.tokens[s..s + self.page_size].copy_from_slice(tokens);
        self.link_units(page);
        self.add_child(page, group, parent, Some(hash));
        true
    }

    /// Keeps page `page`, whose first `tokens.len()` slots (whole units, fewer than a page,
    /// at least one unit) hold the KV of `tokens` after a prefix with chain digest `parent`,
    /// as a partial entry: matchable by its units, never by a full-page walk. Returns false
    /// (and changes nothing) when `page` is registered already or the length is not whole
    /// units below a page.
    pub fn insert_partial(
        &mut self,
        page: u32,
        group: u32,
        parent: u128,
        extra: u128,
        lora: u64,
        tokens: &[i32],
    ) -> bool {
        let i = page as usize;
        let n = tokens.len();
        if self.registered[i] || n == 0 || n >= self.page_size || !n.is_multiple_of(self.unit) {
            return false;
        }
        self.meta[i] = Meta {
            hash: 0,
            parent,
            extra,
            lora,
            len: n as u32,
            group,
        };
        self.registered[i] = true;
        self.partial += 1;
        let s = i * self.page_size;
        self.tokens[s..s + n].copy_from_slice(tokens);
        self.link_units(page);
        self.add_child(page, group, parent, None);
        true
    }

    /// Drops `page`'s entry, if any (`None` if it had none), and reports the parent page that
    /// became a leaf.
    pub fn remove(&mut self, page: u32) -> Option<Removed> {
        let i = page as usize;
        if !self.registered[i] {
            return None;
        }
        self.unlink_units(page);
        let m = self.meta[i];
        let partial = self.is_partial(page);
        if partial {
            self.registered[i] = false;
            self.partial -= 1;
        } else {
            self.registered[i] = false;
            let removed = self.map.remove(&Self::key(m.group, m.hash));
            debug_assert_eq!(removed, Some(page));
            self.per_group[m.group as usize] -= 1;
        }
        Some(Removed {
            parent_leaf: self.drop_child(page, m, partial),
        })
    }

    /// Drops every entry, partial ones included; returns the pages that had one.
    pub fn clear(&mut self) -> Vec<u32> {
        self.units.clear();
        self.map.clear();
        self.per_group.clear();
        for k in &mut self.links {
            k.kids = 0;
            k.up = NONE;
        }
        self.orphans.clear();
        self.partial = 0;
        self.unit_next.fill(NONE);
        self.unit_prev.fill(UNLINKED);
        let mut pages = Vec::new();
        for (p, r) in self.registered.iter_mut().enumerate() {
            if std::mem::take(r) {
                pages.push(p as u32);
            }
        }
        pages
    }

    /// Every `(group, hash, page)` entry, for the invariant checker. An entry whose map key
    /// disagrees with its page's record reports the key as its hash, so the checker sees it.
    pub fn entries(&self) -> impl Iterator<Item = (u32, u128, u32)> + '_ {
        self.map.iter().map(|(&k, &p)| {
            let m = self.meta.get(p as usize).copied().unwrap_or_default();
            if Self::key(m.group, m.hash) == k {
                (m.group, m.hash, p)
            } else {
                (m.group, k, p)
            }
        })
    }

    /// Unit keys held (for the invariant checker and tests).
    pub fn unit_keys_len(&self) -> usize {
        self.units.len()
    }

    /// Count of pages flagged registered (must equal [`len`](Self::len) plus
    /// [`partial_len`](Self::partial_len)).
    pub fn registered_count(&self) -> usize {
        self.registered.iter().filter(|&&r| r).count()
    }
}

mod check;
mod units;

#[cfg(test)]
mod tests;
