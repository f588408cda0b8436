//! The state kind of a `kvs_hybrid` (Mamba / linear-attention layers): its modes and the two
//! per-step calls a state group adds — the start of a scheduler step and the page holding a
//! sequence's running state.
//!
//! A state group is a `kvs_group` of kind `KVS_GROUP_KIND_STATE` whose `window` field carries a
//! `kvs_state_mode` (an additive use of an existing field: no struct layout changes).

use super::enums::{kvs_state_mode, kvs_status};
use super::hybrid::{kvs_hybrid, lock};
use super::panic::guard;
use super::slice::try_out;

use kvshare_core::groups::StateMode;

impl From<StateMode> for kvs_state_mode {
    fn from(m: StateMode) -> Self {
        match m {
            StateMode::None => kvs_state_mode::None,
            StateMode::All => kvs_state_mode::All,
            StateMode::Align => kvs_state_mode::Align,
        }
    }
}

impl kvs_hybrid {
    /// Starts a scheduler step (vLLM's `KVCacheManager.new_step_starts`): state checkpoints
    /// registered before this call may now be hit. Until then a `kvs_hybrid_seq_begin` whose
    /// hit ends at a state page registered in the current step fails with
    /// `KVS_STATUS_NO_SPACE` (vLLM does not schedule such a request in that step: the state is
    /// written by the step's own forward pass). Call it once at the start of every step; a
    /// cache without state groups ignores it.
    ///
    /// **Failure:** `KVS_STATUS_NULL_ARGUMENT` for a NULL `hybrid`, `KVS_STATUS_POISONED` after
    /// a panic inside the library: nothing changes. (A freed handle cannot be told from a live
    /// one: passing one is undefined behaviour, as for every call taking a handle.)
    /// **Thread safety:** safe concurrently with any call but `kvs_hybrid_free`.
    #[no_mangle]
    pub unsafe extern "C" fn kvs_hybrid_new_step(hybrid: *mut kvs_hybrid) -> kvs_status {
        guard(|| {
            lock(hybrid)?.new_step();
            Ok(())
        })
    }

    /// Writes the page holding sequence `seq_id`'s running state in state group `group` (the
    /// last non-null entry of its block table) to `*page_out`. In mode none that is the
    /// group's only page (vLLM's block table for the group is `[page]`).
    ///
    /// **Failure:** NULL `page_out`, `group` not below the group count or not a state group,
    /// unknown sequence, a sequence with no state page yet (no tokens):
    /// `KVS_STATUS_INVALID_ARGUMENT` / `KVS_STATUS_SEQ_NOT_FOUND`, `*page_out` untouched.
    /// **Thread safety:** safe concurrently with any call but `kvs_hybrid_free`.
    #[no_mangle]
    pub unsafe extern "C" fn kvs_hybrid_seq_state_page(
        hybrid: *const kvs_hybrid,
        seq_id: u64,
        group: usize,
        page_out: *mut u32,
    ) -> kvs_status {
        guard(|| {
            let h = lock(hybrid)?;
            let out = try_out(page_out, "page_out")?;
            *out = h.state_page(seq_id, group)?;
            Ok(())
        })
    }
}
