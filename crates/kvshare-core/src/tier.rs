//! Where a page lives.

use std::fmt;

/// A memory tier of the cache's pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Tier {
    /// Accelerator memory (HBM): the pages attention reads.
    Device,
    /// Host memory (DDR): swapped-out sequences and demoted cached pages.
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
