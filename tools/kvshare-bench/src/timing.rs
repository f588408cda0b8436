//! Median-of-repeats timing.

use std::time::Instant;

/// Runs `f` (which performs `units` units of work) `repeats` times after a warm-up and returns
/// the median nanoseconds per unit.
pub fn ns_per_unit(repeats: usize, units: usize, mut f: impl FnMut()) -> f64 {
    f();
    let mut v: Vec<f64> = (0..repeats)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_nanos() as f64 / units as f64
        })
        .collect();
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}
