//! Paged attention, KV write and page copy behind one backend trait.
