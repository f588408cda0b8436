//! What bounds a decode launch (`arithmetic_check`) and paired bandwidth fractions
//! (`Paired`) for `kvshare-bench attention`.

use super::*;

/// What bounds decode on this machine: the paged launch `p` (group `p.group()`) and the same
/// launch with one query head per kv head (the first of each group: the same K/V bytes read,
/// 1/group of the score and value arithmetic), best of alternating rounds so that both see the
/// machine's moment. `None` for group 1. Seconds: (group 1, the launch's group).
pub(super) fn arithmetic_check(
    o: &Opts,
    p: AttnParams,
    mut launch: impl FnMut(AttnParams) -> Result<(), String>,
) -> Result<Option<(f64, f64)>, String> {
    let group = p.group();
    if group <= 1 {
        return Ok(None);
    }
    // The first head of each group: a head stride `group` times the launch's.
    let first_of_group = |s: TokenStrides| TokenStrides {
        token: s.token,
        head: group * s.head,
    };
    let p1 = AttnParams {
        num_heads: p.cache.num_kv_heads,
        query_strides: first_of_group(p.query_strides),
        output_strides: first_of_group(p.output_strides),
        ..p
    };
    let (mut g1, mut gg) = (f64::INFINITY, f64::INFINITY);
    for _ in 0..o.iters.max(3) {
        let t = Instant::now();
        launch(p1)?;
        g1 = g1.min(t.elapsed().as_secs_f64());
        let t = Instant::now();
        launch(p)?;
        gg = gg.min(t.elapsed().as_secs_f64());
    }
    Ok(Some((g1, gg)))
}

/// Bandwidth fractions of single launches, each against the mean of the streaming reads just
/// before and after it. This VM's bandwidth moves with other tenants (25-52 GB/s within minutes
/// of each other), and the best-of-all fraction divides the best launch by the luckiest streaming
/// sample; a launch and its neighbours share the conditions of the moment, so their median
/// is the steadier estimate. Both are printed.
pub(super) struct Paired {
    pub(super) median: f64,
    pub(super) min: f64,
    pub(super) max: f64,
    pub(super) n: usize,
}

impl Paired {
    pub(super) fn of(mut fracs: Vec<f64>) -> Self {
        fracs.sort_by(f64::total_cmp);
        let n = fracs.len();
        let median = match n {
            0 => f64::NAN,
            _ if n % 2 == 1 => fracs[n / 2],
            _ => (fracs[n / 2 - 1] + fracs[n / 2]) / 2.0,
        };
        Paired {
            median,
            min: fracs.first().copied().unwrap_or(f64::NAN),
            max: fracs.last().copied().unwrap_or(f64::NAN),
            n,
        }
    }
}
