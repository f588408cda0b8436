//! The panic boundary: every exported function runs its body inside [`guard`].

use std::panic::{catch_unwind, AssertUnwindSafe};

use super::status::{fail, kvs_status};
use crate::core::Error;

/// Runs `body`, mapping `Ok` to `KVS_STATUS_OK`, an error to its status (recording the message),
/// and a caught panic to `KVS_STATUS_PANIC`. Nothing unwinds across the C boundary.
pub(crate) fn guard<F: FnOnce() -> Result<(), Error>>(body: F) -> kvs_status {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => kvs_status::Ok,
        Ok(Err(e)) => fail(&e),
        Err(payload) => {
            let msg = if let Some(s) = payload.downcast_ref::<&str>() {
                (*s).to_string()
            } else if let Some(s) = payload.downcast_ref::<String>() {
                s.clone()
            } else {
                "unknown panic payload".to_string()
            };
            fail(&Error::Panic(msg))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn panics_become_status() {
        let prev = std::panic::take_hook();
        std::panic::set_hook(Box::new(|_| {}));
        let s = guard(|| panic!("boom"));
        std::panic::set_hook(prev);
        assert_eq!(s, kvs_status::Panic);
        assert_eq!(guard(|| Err(Error::SeqExists(1))), kvs_status::SeqExists);
        assert_eq!(guard(|| Ok(())), kvs_status::Ok);
    }
}
