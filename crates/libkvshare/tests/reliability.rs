//! Regression tests that need a process of their own or many sequences: allocation failure at
//! `kvs_cache_new` (one group, and groups with a pool each) under an address-space limit, and
//! sequence ids crafted against a fixed, unseeded id hash.

// The `unsafe` blocks of these tests call the C ABI (or the emulator) with buffers the test
// owns, sized as each call documents: the export contract, met the same way at every call.
#![allow(clippy::undocumented_unsafe_blocks)]

use std::ffi::CStr;
use std::hash::BuildHasher;
use std::time::Instant;

use kvshare::cache::{kvs_cache, kvs_config};
use kvshare::enums::{kvs_group_kind, kvs_status};
use kvshare::groups::kvs_group;
use kvshare_core::hashing::IdMap;

fn last_error() -> String {
    unsafe { CStr::from_ptr(kvs_status::kvs_last_error_message()) }
        .to_string_lossy()
        .into_owned()
}

const OOM_CHILD: &str = "KVS_OOM_CHILD";

/// Runs test `name` again in a child process and checks that it passed there: returns false in
/// the parent (the test is done), true in the child, which runs under a 2 GiB address-space
/// limit that nothing else shares.
fn in_oom_child(name: &str) -> bool {
    if std::env::var_os(OOM_CHILD).is_none() {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", name, "--nocapture", "--test-threads=1"])
            .env(OOM_CHILD, "1")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "child failed ({:?}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        return false;
    }
    let limit = libc::rlimit {
        rlim_cur: 2 << 30,
        rlim_max: 2 << 30,
    };
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_AS, &limit) }, 0);
    true
}

/// Configurations the validator accepts but whose metadata cannot be allocated must not abort
/// the process (as an infallible allocation would: "memory allocation of 68719476736 bytes
/// failed"). Under a
/// 2 GiB address-space limit (set in a child process, so nothing else shares it) each must fail
/// with `KVS_STATUS_OUT_OF_MEMORY` naming the field, leave `*cache_out` alone, and a small cache
/// must still work afterwards.
#[test]
fn cache_new_reports_allocation_failure() {
    if !in_oom_child("cache_new_reports_allocation_failure") {
        return;
    }
    let default = kvs_cache::kvs_config_default();
    let cases = [
        (
            "num_device_pages",
            kvs_config {
                num_device_pages: 1 << 30,
                ..default
            },
        ),
        (
            "num_device_pages",
            kvs_config {
                page_size: 1024,
                num_device_pages: 1 << 22,
                ..default
            },
        ),
        (
            "num_host_pages",
            kvs_config {
                num_host_pages: 1 << 30,
                ..default
            },
        ),
    ];
    for (field, cfg) in cases {
        let sentinel = 0x10 as *mut kvs_cache;
        let mut c = sentinel;
        let st = unsafe { kvs_cache::kvs_cache_new(&cfg, &mut c) };
        let msg = last_error();
        assert_eq!(st, kvs_status::OutOfMemory, "{field}: {msg}");
        assert!(msg.contains(field), "{msg}");
        assert_eq!(c, sentinel);
    }
    let mut c = std::ptr::null_mut();
    assert_eq!(
        unsafe { kvs_cache::kvs_cache_new(&default, &mut c) },
        kvs_status::Ok
    );
    assert_eq!(unsafe { kvs_cache::kvs_cache_check(c) }, kvs_status::Ok);
    unsafe { kvs_cache::kvs_cache_free(c) };
}

/// The same for a cache of groups with a pool each (their page bytes differ): the error names
/// `num_device_pages`, also when the first pool fits and the second does not, and nothing of
/// the first stays allocated (a small cache works afterwards).
#[test]
fn groups_new_reports_allocation_failure() {
    if !in_oom_child("groups_new_reports_allocation_failure") {
        return;
    }
    let groups = [
        kvs_group {
            kind: kvs_group_kind::Full as u32,
            window: 0,
            page_bytes: 4096,
            flags: 0,
        },
        kvs_group {
            kind: kvs_group_kind::SlidingWindow as u32,
            window: 64,
            page_bytes: 2048,
            flags: 0,
        },
    ];
    let cfg = |page_size, num_device_pages, num_groups| kvs_config {
        page_size,
        num_device_pages,
        reserve_null_page: true,
        groups: groups.as_ptr(),
        num_groups,
        ..kvs_cache::kvs_config_default()
    };
    let new = |c: &kvs_config| {
        let sentinel = 0x10 as *mut kvs_cache;
        let mut out = sentinel;
        let st = unsafe { kvs_cache::kvs_cache_new(c, &mut out) };
        (st, out, sentinel)
    };
    // One pool of 2^23 pages fits under the limit; two do not.
    let (st, one, _) = new(&cfg(16, 1 << 23, 1));
    assert_eq!(st, kvs_status::Ok, "{}", last_error());
    unsafe { kvs_cache::kvs_cache_free(one) };
    for c in [
        cfg(16, 1 << 30, 1),
        cfg(16, 1 << 30, 2),
        cfg(1024, 1 << 22, 2),
        cfg(16, 1 << 23, 2),
    ] {
        let (st, out, sentinel) = new(&c);
        let msg = last_error();
        assert_eq!(st, kvs_status::OutOfMemory, "{msg}");
        assert!(msg.contains("`num_device_pages`"), "{msg}");
        assert_eq!(out, sentinel);
    }
    let (st, small, _) = new(&cfg(16, 64, 2));
    assert_eq!(st, kvs_status::Ok, "{}", last_error());
    assert_eq!(unsafe { kvs_cache::kvs_cache_check(small) }, kvs_status::Ok);
    unsafe { kvs_cache::kvs_cache_free(small) };
}

/// A fixed, unseeded id hash (`IdHasher::write_u64` on a fresh hasher, as sequence maps once
/// used): a multiply by an odd constant and an xor-shift, both invertible.
fn old_hash(v: u64) -> u64 {
    let m = v.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    m ^ (m >> 29)
}

/// Ids whose old hash is `i << 32`: the low 32 bits, which pick the bucket, are all zero.
fn crafted_ids(n: u64) -> Vec<u64> {
    const K: u64 = 0x9e37_79b9_7f4a_7c15;
    // Inverse of K modulo 2^64 (Newton: each step doubles the correct low bits).
    let mut inv: u64 = 1;
    for _ in 0..6 {
        inv = inv.wrapping_mul(2u64.wrapping_sub(K.wrapping_mul(inv)));
    }
    assert_eq!(K.wrapping_mul(inv), 1);
    (1..=n)
        .map(|i| {
            let h = i << 32;
            let m = h ^ (h >> 29) ^ (h >> 58); // inverts m ^ (m >> 29)
            m.wrapping_mul(inv)
        })
        .collect()
}

/// Ids crafted against the old, fixed hash all fall in one bucket of the old
/// map (each lookup probes past every one of them), while the per-cache seeded map spreads the
/// same ids like random ones. The bound is on what a probe costs: the most ids sharing a bucket
/// of a table sized for them. Not timed: `adversarial_ids_timing` measures begin/free.
#[test]
fn crafted_ids_do_not_collide_in_a_seeded_map() {
    const N: u64 = 20_000;
    let ids = crafted_ids(N);
    let mask = (1u64 << 15) - 1; // the bucket mask of a table holding 20,000 ids
    assert!(
        ids.iter().all(|&id| old_hash(id) & mask == 0),
        "the crafted ids collapse under the old hash"
    );
    let max_load = |hash: &dyn Fn(u64) -> u64| {
        let mut load = vec![0u32; mask as usize + 1];
        for &id in &ids {
            load[(hash(id) & mask) as usize] += 1;
        }
        *load.iter().max().unwrap()
    };
    assert_eq!(max_load(&old_hash), N as u32);
    for _ in 0..3 {
        let map = IdMap::<()>::default();
        let seeded = |id: u64| map.hasher().hash_one(id);
        // 20,000 random keys in 32,768 buckets: the fullest holds about 7 (P(>= 14) < 1e-6).
        let worst = max_load(&seeded);
        assert!(
            worst < 14,
            "seeded map put {worst} crafted ids in one bucket"
        );
        let sequential: Vec<u64> = (1..=N).collect();
        let spread = sequential
            .iter()
            .map(|&id| seeded(id) & mask)
            .collect::<std::collections::HashSet<_>>()
            .len();
        assert!(spread > 10_000, "{spread}");
    }
}

fn begin_free(ids: &[u64]) -> (f64, f64) {
    let cfg = kvs_config {
        page_size: 16,
        num_device_pages: 1 << 16,
        ..kvs_cache::kvs_config_default()
    };
    let mut c = std::ptr::null_mut();
    assert_eq!(
        unsafe { kvs_cache::kvs_cache_new(&cfg, &mut c) },
        kvs_status::Ok
    );
    let tok = [7i32];
    let t = Instant::now();
    for &id in ids {
        let st = unsafe {
            kvs_cache::kvs_seq_begin(
                c,
                id,
                tok.as_ptr(),
                1,
                std::ptr::null(),
                0,
                0,
                std::ptr::null_mut(),
            )
        };
        assert_eq!(st, kvs_status::Ok);
    }
    let begin = t.elapsed().as_secs_f64();
    let t = Instant::now();
    for &id in ids {
        assert_eq!(unsafe { kvs_cache::kvs_seq_free(c, id) }, kvs_status::Ok);
    }
    let free = t.elapsed().as_secs_f64();
    unsafe { kvs_cache::kvs_cache_free(c) };
    (begin, free)
}

/// Measurement, not a check (`cargo test --release --test reliability -- --ignored
/// --nocapture adversarial`): begin and free of crafted ids against sequential ids, same run.
#[test]
#[ignore]
fn adversarial_ids_timing() {
    for n in [10_000u64, 40_000] {
        let crafted = crafted_ids(n);
        let sequential: Vec<u64> = (1..=n).collect();
        let (sb, sf) = begin_free(&sequential);
        let (cb, cf) = begin_free(&crafted);
        println!(
            "{n} ids: sequential begin {sb:.4}s free {sf:.4}s; crafted begin {cb:.4}s free \
             {cf:.4}s; ratio {:.2}x",
            (cb + cf) / (sb + sf)
        );
    }
}
