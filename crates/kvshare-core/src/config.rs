//! Cache geometry and options, and their validation.

use std::fmt;

use super::error::{Error, Result};

/// Element type of the KV cache (and of attention inputs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    /// IEEE 754 binary32.
    F32,
    /// IEEE 754 binary16.
    F16,
    /// bfloat16.
    BF16,
}

impl DType {
    /// Bytes per element.
    pub fn size_bytes(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::BF16 => 2,
        }
    }
}

/// Where a page lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Tier {
    /// Accelerator memory (HBM): the pages attention reads.
    Device,
    /// Host memory (DDR): swapped-out sequences and, later, demoted cached pages.
    Host,
}

impl fmt::Display for Tier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Tier::Device => "device",
            Tier::Host => "host",
        })
    }
}

/// Largest page size accepted (tokens per page). CANN and MindIE stop at 128 for most modes;
/// 1024 leaves room for CPU-only use.
pub const MAX_PAGE_SIZE: u32 = 1024;
/// Largest page count per tier; page ids must fit `i32` block tables with room to spare.
pub const MAX_PAGES: u32 = 1 << 30;

/// Geometry and options of one cache. See `kvs_config` in the C header for field meanings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Tokens per page.
    pub page_size: u32,
    /// Pages in the device tier (including the padding page when reserved).
    pub num_device_pages: u32,
    /// Pages in the host tier (0: no host tier).
    pub num_host_pages: u32,
    /// Transformer layers (for byte sizes only).
    pub num_layers: u32,
    /// KV heads per layer (for byte sizes only).
    pub num_kv_heads: u32,
    /// Head dimension (for byte sizes only).
    pub head_dim: u32,
    /// KV element type (for byte sizes only).
    pub dtype: DType,
    /// Register full pages in the prefix index and match prompts against it.
    pub enable_prefix_caching: bool,
    /// Reserve device page 0 as the padding/null page (vLLM's `null_block`); never allocated.
    pub reserve_null_page: bool,
    /// Pages that fill up become matchable only after [`State::commit`](crate::State::commit)
    /// (MindIE's `MarkBlocksAsComputed`); otherwise as soon as they are full.
    pub defer_commit: bool,
    /// A prompt shares every cached full page, even the ones holding tokens past
    /// `max_match_tokens` that the engine recomputes (for the last token's logits); the slot
    /// mapping then marks those already-cached slots -1 so the recomputation never writes into a
    /// shared page. Turn it off for engines that build their own slot mapping (vLLM): such pages
    /// are then allocated fresh and recomputed, as vLLM does.
    pub skip_cached_writes: bool,
    /// With host pages: a cached device page chosen for eviction is copied to a host page and
    /// stays matchable there (promoted back on a hit) instead of being dropped.
    pub demote_to_host: bool,
    /// Queue an event for every page stored in / removed from a tier's index and every clear.
    pub enable_events: bool,
    /// Granularity of prefix hits in tokens: a divisor of `page_size`, or 0 for the page size
    /// (the default). Equal to `page_size`, a hit covers whole pages; smaller, a prompt that ends or diverges inside a
    /// cached page also takes that page's first whole units, copied into a new page of its own
    /// (one partial copy queued for `take_copies`). Engines that cannot execute copies keep the
    /// page size.
    pub match_unit: u32,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            page_size: 16,
            num_device_pages: 1024,
            num_host_pages: 0,
            num_layers: 1,
            num_kv_heads: 1,
            head_dim: 128,
            dtype: DType::F16,
            enable_prefix_caching: true,
            reserve_null_page: false,
            defer_commit: false,
            skip_cached_writes: true,
            demote_to_host: true,
            enable_events: false,
            match_unit: 0,
        }
    }
}

impl Config {
    /// Checks every field; the error names the first bad one.
    pub fn validate(&self) -> Result<()> {
        let bad = |field: &'static str, reason: String| Err(Error::InvalidConfig { field, reason });
        if self.page_size == 0 || self.page_size > MAX_PAGE_SIZE {
            return bad(
                "page_size",
                format!("{} is not in 1..={MAX_PAGE_SIZE}", self.page_size),
            );
        }
        let min_device = 1 + u32::from(self.reserve_null_page);
        if self.num_device_pages < min_device || self.num_device_pages > MAX_PAGES {
            return bad(
                "num_device_pages",
                format!(
                    "{} is not in {min_device}..={MAX_PAGES}",
                    self.num_device_pages
                ),
            );
        }
        if self.num_host_pages > MAX_PAGES {
            return bad(
                "num_host_pages",
                format!("{} exceeds {MAX_PAGES}", self.num_host_pages),
            );
        }
        if (self.num_device_pages as u64) * (self.page_size as u64) > i64::MAX as u64 / 2 {
            return bad("num_device_pages", "slot ids would overflow int64".into());
        }
        for (field, v) in [
            ("num_layers", self.num_layers),
            ("num_kv_heads", self.num_kv_heads),
            ("head_dim", self.head_dim),
        ] {
            if v == 0 {
                return bad(field, "must be at least 1".into());
            }
        }
        if self.page_bytes().is_none() {
            return bad("head_dim", "bytes per page overflow u64".into());
        }
        if self.match_unit != 0 && !self.page_size.is_multiple_of(self.match_unit) {
            return bad(
                "match_unit",
                format!(
                    "{} does not divide page_size {}",
                    self.match_unit, self.page_size
                ),
            );
        }
        if self.defer_commit && !self.enable_prefix_caching {
            return bad("defer_commit", "needs enable_prefix_caching".into());
        }
        Ok(())
    }

    /// Bytes of K plus V for one page across all layers, or `None` on overflow.
    pub fn page_bytes(&self) -> Option<u64> {
        2u64.checked_mul(self.num_layers as u64)?
            .checked_mul(self.page_size as u64)?
            .checked_mul(self.num_kv_heads as u64)?
            .checked_mul(self.head_dim as u64)?
            .checked_mul(self.dtype.size_bytes() as u64)
    }

    /// Number of pages in a tier.
    pub fn num_pages(&self, tier: Tier) -> u32 {
        match tier {
            Tier::Device => self.num_device_pages,
            Tier::Host => self.num_host_pages,
        }
    }

    /// Tokens per match unit: `match_unit`, or the page size when it is 0.
    pub fn unit(&self) -> usize {
        match self.match_unit {
            0 => self.page_size as usize,
            u => u as usize,
        }
    }

    /// Pages of `tier` that can ever hold KV (the padding page excluded).
    pub fn usable_pages(&self, tier: Tier) -> u32 {
        match tier {
            Tier::Device => self.num_device_pages - u32::from(self.reserve_null_page),
            Tier::Host => self.num_host_pages,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_valid() {
        Config::default().validate().unwrap();
    }

    #[test]
    fn bad_fields_are_named() {
        type Mutation = Box<dyn Fn(&mut Config)>;
        let cases: Vec<(&str, Mutation)> = vec![
            ("page_size", Box::new(|c| c.page_size = 0)),
            ("page_size", Box::new(|c| c.page_size = MAX_PAGE_SIZE + 1)),
            ("num_device_pages", Box::new(|c| c.num_device_pages = 0)),
            (
                "num_device_pages",
                Box::new(|c| {
                    c.num_device_pages = 1;
                    c.reserve_null_page = true;
                }),
            ),
            (
                "num_host_pages",
                Box::new(|c| c.num_host_pages = MAX_PAGES + 1),
            ),
            ("num_layers", Box::new(|c| c.num_layers = 0)),
            ("num_kv_heads", Box::new(|c| c.num_kv_heads = 0)),
            ("head_dim", Box::new(|c| c.head_dim = 0)),
            ("match_unit", Box::new(|c| c.match_unit = 5)),
            ("match_unit", Box::new(|c| c.match_unit = 32)),
            (
                "defer_commit",
                Box::new(|c| {
                    c.defer_commit = true;
                    c.enable_prefix_caching = false;
                }),
            ),
        ];
        for (field, mutate) in cases {
            let mut c = Config::default();
            mutate(&mut c);
            match c.validate() {
                Err(Error::InvalidConfig { field: f, .. }) => assert_eq!(f, field),
                other => panic!("{field}: expected InvalidConfig, got {other:?}"),
            }
        }
    }

    #[test]
    fn page_bytes() {
        let c = Config {
            num_layers: 2,
            num_kv_heads: 8,
            head_dim: 128,
            page_size: 16,
            ..Config::default()
        };
        assert_eq!(c.page_bytes(), Some(2 * 2 * 16 * 8 * 128 * 2));
        assert_eq!(c.usable_pages(Tier::Device), 1024);
        let c = Config {
            reserve_null_page: true,
            ..c
        };
        assert_eq!(c.usable_pages(Tier::Device), 1023);
    }
}
