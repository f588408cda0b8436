//! Bad input through the C ABI for every argument of every attention export: each call must
//! return the right status, name the field in `kvs_last_error_message()`, and write nothing.

// The `unsafe` blocks of these tests call the C ABI (or the emulator) with buffers the test
// owns, sized as each call documents: the export contract, met the same way at every call.
#![allow(clippy::undocumented_unsafe_blocks)]

mod support;

use kvshare::attn_args::{kvs_attention_args, kvs_kv_copy_args, kvs_kv_write_args};
use kvshare::backend::kvs_backend;
use kvshare::enums::{kvs_dtype, kvs_status};
use kvshare::types::kvs_copy;
use support::attention::*;

use kvs_status::{AttnInvalidArgument as INVALID, NullArgument as NULL};

/// The first value that is no `kvs_dtype`.
const NOT_A_DTYPE: u32 = kvs_dtype::Int8PerTokenHead as u32 + 1;

const NP: usize = 6; // pages
const PS: usize = 4; // page size
const HK: usize = 2; // kv heads
const H: usize = 4; // query heads
const D: usize = 8; // head dim
const CAP: usize = 16; // query/output token capacity of the buffers

/// Buffers of a valid decode launch (2 sequences); larger than needed so mutated shapes still
/// point at valid memory.
struct Fix {
    q: Data,
    k: Data,
    v: Data,
    out: Data,
    bt: Vec<i32>,
    ctx: Vec<i32>,
    qsl: Vec<i32>,
}

impl Fix {
    fn new() -> Fix {
        let mut rng = Rng(1);
        Fix {
            q: Data::random(F16, CAP * H * D, &mut rng),
            k: Data::random(F16, NP * PS * HK * D, &mut rng),
            v: Data::random(F16, NP * PS * HK * D, &mut rng),
            out: Data::filled(F16, CAP * H * D, 7.0),
            bt: vec![1, 4, -1, 0, 2, -1],
            ctx: vec![5, 8],
            qsl: vec![0, 1, 2],
        }
    }

    fn args(&mut self) -> kvs_attention_args {
        kvs_attention_args {
            num_seqs: 2,
            num_tokens: 2,
            num_heads: H as u32,
            query: self.q.ptr(),
            query_dtype: F16,
            query_token_stride: 0,
            query_head_stride: 0,
            output: self.out.ptr_mut(),
            output_dtype: F16,
            output_token_stride: 0,
            output_head_stride: 0,
            key_cache: self.k.ptr(),
            value_cache: self.v.ptr(),
            cache: kvs_backend::kvs_kv_layout_dense(F16, NP as u32, PS as u32, HK as u32, D as u32),
            block_table: self.bt.as_ptr(),
            max_pages_per_seq: 3,
            block_table_stride: 0,
            context_lens: self.ctx.as_ptr(),
            query_start_loc: std::ptr::null(),
            scale: 0.35,
            softcap: 0.0,
            sliding_window: 0,
        }
    }
}

type Mutation = Box<dyn Fn(&mut kvs_attention_args, &mut Fix)>;

fn case(
    status: kvs_status,
    field: &'static str,
    m: impl Fn(&mut kvs_attention_args, &mut Fix) + 'static,
) -> (kvs_status, &'static str, Mutation) {
    (status, field, Box::new(m))
}

#[test]
fn attention_launch_bad_inputs() {
    let null = std::ptr::null();
    let cases: Vec<(kvs_status, &str, Mutation)> = vec![
        case(NULL, "query", move |a, _| a.query = null),
        case(NULL, "output", |a, _| a.output = std::ptr::null_mut()),
        case(NULL, "key_cache", move |a, _| a.key_cache = null),
        case(NULL, "value_cache", move |a, _| a.value_cache = null),
        case(NULL, "block_table", |a, _| a.block_table = std::ptr::null()),
        case(NULL, "context_lens", |a, _| {
            a.context_lens = std::ptr::null()
        }),
        case(INVALID, "num_seqs", |a, _| a.num_seqs = 0),
        case(INVALID, "num_seqs", |a, _| a.num_seqs = u32::MAX),
        case(INVALID, "num_tokens", |a, _| a.num_tokens = 0),
        case(INVALID, "num_tokens", |a, _| a.num_tokens = u32::MAX),
        case(INVALID, "num_tokens", |a, _| a.num_tokens = 3), // decode needs one per sequence
        case(INVALID, "num_heads", |a, _| a.num_heads = 0),
        case(INVALID, "num_heads", |a, _| a.num_heads = 3), // not a multiple of 2 kv heads
        case(INVALID, "num_heads", |a, _| a.num_heads = 100_000),
        case(INVALID, "num_kv_heads", |a, _| a.cache.num_kv_heads = 0),
        case(INVALID, "num_heads", |a, _| {
            a.cache = kvs_backend::kvs_kv_layout_dense(F16, NP as u32, PS as u32, 3, D as u32);
        }),
        case(INVALID, "cache_slot_stride", |a, _| {
            a.cache.num_kv_heads = 3
        }), // strides say 2
        case(INVALID, "head_dim", |a, _| a.cache.head_dim = 0),
        case(INVALID, "head_dim", |a, _| a.cache.head_dim = 4096),
        case(INVALID, "page_size", |a, _| a.cache.page_size = 0),
        case(INVALID, "page_size", |a, _| a.cache.page_size = u32::MAX),
        case(INVALID, "num_pages", |a, _| a.cache.num_pages = 0),
        case(INVALID, "num_pages", |a, _| a.cache.num_pages = u32::MAX),
        case(INVALID, "query_dtype", |a, _| a.query_dtype = NOT_A_DTYPE),
        case(INVALID, "output_dtype", |a, _| a.output_dtype = 99),
        case(INVALID, "cache.dtype", |a, _| a.cache.dtype = 7),
        case(INVALID, "query_head_stride", |a, _| {
            a.query_head_stride = D - 1
        }),
        case(INVALID, "query_token_stride", |a, _| {
            a.query_token_stride = D
        }),
        case(INVALID, "output_token_stride", |a, _| {
            a.output_token_stride = 1
        }),
        case(INVALID, "output_head_stride", |a, _| {
            a.output_head_stride = 2
        }),
        case(INVALID, "cache_head_stride", |a, _| a.cache.head_stride = 1),
        case(INVALID, "cache_slot_stride", |a, _| a.cache.slot_stride = 3),
        case(INVALID, "cache_page_stride", |a, _| {
            a.cache.page_stride = 10
        }),
        case(INVALID, "max_pages_per_seq", |a, _| a.max_pages_per_seq = 0),
        case(INVALID, "max_pages_per_seq", |a, _| {
            a.max_pages_per_seq = u32::MAX
        }),
        case(INVALID, "block_table_stride", |a, _| {
            a.block_table_stride = 2
        }),
        case(INVALID, "block_table", |_, f| f.bt[1] = NP as i32), // page id out of range
        case(INVALID, "block_table", |_, f| f.bt[3] = -1),        // used entry is padding
        case(INVALID, "context_lens", |_, f| {
            f.ctx[1] = (3 * PS + 1) as i32
        }),
        case(INVALID, "context_lens", |_, f| f.ctx[0] = -1),
        case(INVALID, "query_start_loc", |a, f| {
            f.qsl = vec![1, 1, 2];
            a.query_start_loc = f.qsl.as_ptr();
        }),
        case(INVALID, "query_start_loc", |a, f| {
            f.qsl = vec![0, 2, 1];
            a.query_start_loc = f.qsl.as_ptr();
        }),
        case(INVALID, "query_start_loc", |a, f| {
            f.qsl = vec![0, 1, 3]; // ends past num_tokens
            a.query_start_loc = f.qsl.as_ptr();
        }),
        case(INVALID, "context_lens", |a, f| {
            f.qsl = vec![0, 6, 7]; // 6 query tokens, context 5
            a.num_tokens = 7;
            a.query_start_loc = f.qsl.as_ptr();
        }),
        case(INVALID, "scale", |a, _| a.scale = 0.0),
        case(INVALID, "scale", |a, _| a.scale = f32::NAN),
        case(INVALID, "scale", |a, _| a.scale = f32::INFINITY),
        case(INVALID, "softcap", |a, _| a.softcap = -1.0),
        case(INVALID, "softcap", |a, _| a.softcap = f32::NAN),
        case(INVALID, "output", |a, f| a.output = f.q.ptr_mut()), // in place: aliases query
        case(INVALID, "output", |a, f| a.key_cache = f.out.ptr()),
        case(INVALID, "query", |a, f| {
            a.query = f.q.ptr().cast::<u8>().wrapping_add(1).cast()
        }), // misaligned
    ];
    let be = new_backend(2);
    for (i, (status, field, mutate)) in cases.iter().enumerate() {
        let mut f = Fix::new();
        let mut a = f.args();
        mutate(&mut a, &mut f);
        let (q0, k0, v0) = (f.q.clone(), f.k.clone(), f.v.clone());
        let st = unsafe { kvs_backend::kvs_attention_launch(be, &a, std::ptr::null_mut()) };
        let msg = last_error();
        assert_eq!(st, *status, "case {i} ({field}): {msg}");
        assert!(
            msg.contains(field),
            "case {i}: message `{msg}` does not name `{field}`"
        );
        assert!(
            f.out == Data::filled(F16, CAP * H * D, 7.0),
            "case {i} ({field}) wrote the output"
        );
        assert!(
            f.q == q0 && f.k == k0 && f.v == v0,
            "case {i} changed an input"
        );
    }
    // The baseline itself is valid, so every failure above came from its one mutation.
    let mut f = Fix::new();
    let a = f.args();
    assert_eq!(
        unsafe { kvs_backend::kvs_attention_launch(be, &a, std::ptr::null_mut()) },
        kvs_status::Ok,
        "{}",
        last_error()
    );
    assert!(f.out != Data::filled(F16, CAP * H * D, 7.0));
    // Handles.
    assert_eq!(
        unsafe { kvs_backend::kvs_attention_launch(std::ptr::null(), &a, std::ptr::null_mut()) },
        NULL
    );
    assert!(last_error().contains("backend"));
    assert_eq!(
        unsafe { kvs_backend::kvs_attention_launch(be, std::ptr::null(), std::ptr::null_mut()) },
        NULL
    );
    assert!(last_error().contains("args"));
    unsafe { kvs_backend::kvs_backend_free(be) };
}

struct WriteFix {
    key: Data,
    value: Data,
    kc: Data,
    vc: Data,
    slots32: Vec<i32>,
    slots64: Vec<i64>,
}

type WriteMutation = Box<dyn Fn(&mut kvs_kv_write_args, &mut WriteFix)>;

fn wcase(
    status: kvs_status,
    field: &'static str,
    m: impl Fn(&mut kvs_kv_write_args, &mut WriteFix) + 'static,
) -> (kvs_status, &'static str, WriteMutation) {
    (status, field, Box::new(m))
}

#[test]
fn kv_write_bad_inputs() {
    let n = 3usize;
    let fresh = || {
        let mut rng = Rng(2);
        WriteFix {
            key: Data::random(F32, n * HK * D, &mut rng),
            value: Data::random(F32, n * HK * D, &mut rng),
            kc: Data::filled(F32, NP * PS * HK * D, 9.0),
            vc: Data::filled(F32, NP * PS * HK * D, 9.0),
            slots32: vec![3, -1, 20],
            slots64: vec![3, -1, 20],
        }
    };
    let args = |f: &mut WriteFix| kvs_kv_write_args {
        num_tokens: n as u32,
        key: f.key.ptr(),
        value: f.value.ptr(),
        src_dtype: F32,
        src_token_stride: 0,
        src_head_stride: 0,
        key_cache: f.kc.ptr_mut(),
        value_cache: f.vc.ptr_mut(),
        cache: kvs_backend::kvs_kv_layout_dense(F32, NP as u32, PS as u32, HK as u32, D as u32),
        slot_mapping: f.slots32.as_ptr().cast(),
        slot_mapping_type: 0,
    };
    let cases: Vec<(kvs_status, &str, WriteMutation)> = vec![
        wcase(NULL, "key", |a, _| a.key = std::ptr::null()),
        wcase(NULL, "value", |a, _| a.value = std::ptr::null()),
        wcase(NULL, "key_cache", |a, _| a.key_cache = std::ptr::null_mut()),
        wcase(NULL, "value_cache", |a, _| {
            a.value_cache = std::ptr::null_mut()
        }),
        wcase(NULL, "slot_mapping", |a, _| {
            a.slot_mapping = std::ptr::null()
        }),
        wcase(INVALID, "num_tokens", |a, _| a.num_tokens = 0),
        wcase(INVALID, "num_tokens", |a, _| a.num_tokens = u32::MAX),
        wcase(INVALID, "src_dtype", |a, _| a.src_dtype = NOT_A_DTYPE),
        wcase(INVALID, "cache.dtype", |a, _| a.cache.dtype = NOT_A_DTYPE),
        wcase(INVALID, "slot_mapping_type", |a, _| a.slot_mapping_type = 2),
        wcase(INVALID, "slot_mapping", |_, f| {
            f.slots32[2] = (NP * PS) as i32
        }), // one past the end
        wcase(INVALID, "slot_mapping", |a, f| {
            f.slots64[0] = i64::MAX;
            a.slot_mapping = f.slots64.as_ptr().cast();
            a.slot_mapping_type = 1;
        }),
        wcase(INVALID, "src_head_stride", |a, _| a.src_head_stride = 2),
        wcase(INVALID, "src_token_stride", |a, _| a.src_token_stride = 1),
        wcase(INVALID, "head_dim", |a, _| a.cache.head_dim = 0),
        wcase(INVALID, "page_size", |a, _| a.cache.page_size = 0),
        wcase(INVALID, "num_kv_heads", |a, _| {
            a.cache.num_kv_heads = u32::MAX
        }),
        wcase(INVALID, "cache_slot_stride", |a, _| a.cache.slot_stride = 1),
        wcase(INVALID, "value_cache", |a, _| a.value_cache = a.key_cache), // aliases key_cache
        // One element past key_cache: the dense caches share all but one element.
        wcase(INVALID, "value_cache", |a, _| {
            a.value_cache = unsafe { a.key_cache.cast::<f32>().add(1) }.cast()
        }),
        // Heads-major caches [pages, heads, 2 * page_size, dim] interleave without a shared
        // element with V `page_size * dim` elements in (accepted); one row less and V's first
        // row is K's last.
        wcase(INVALID, "value_cache", |a, _| {
            a.cache.num_pages = (NP / 2) as u32;
            a.cache.slot_stride = D;
            a.cache.head_stride = 2 * PS * D;
            a.cache.page_stride = HK * 2 * PS * D;
            a.value_cache = unsafe { a.key_cache.cast::<f32>().add((PS - 1) * D) }.cast()
        }),
        wcase(INVALID, "key_cache", |a, f| a.key = f.kc.ptr()), // input inside the cache
    ];
    let be = new_backend(1);
    for (i, (status, field, mutate)) in cases.iter().enumerate() {
        let mut f = fresh();
        let mut a = args(&mut f);
        mutate(&mut a, &mut f);
        let st = unsafe { kvs_backend::kvs_kv_write(be, &a, std::ptr::null_mut()) };
        let msg = last_error();
        assert_eq!(st, *status, "case {i} ({field}): {msg}");
        assert!(
            msg.contains(field),
            "case {i}: message `{msg}` does not name `{field}`"
        );
        let untouched = Data::filled(F32, NP * PS * HK * D, 9.0);
        assert!(
            f.kc == untouched && f.vc == untouched,
            "case {i} ({field}) wrote a cache"
        );
    }
    let mut f = fresh();
    let a = args(&mut f);
    assert_eq!(
        unsafe { kvs_backend::kvs_kv_write(be, &a, std::ptr::null_mut()) },
        kvs_status::Ok,
        "{}",
        last_error()
    );
    assert_eq!(
        unsafe { kvs_backend::kvs_kv_write(std::ptr::null(), &a, std::ptr::null_mut()) },
        NULL
    );
    assert!(last_error().contains("backend"));
    assert_eq!(
        unsafe { kvs_backend::kvs_kv_write(be, std::ptr::null(), std::ptr::null_mut()) },
        NULL
    );
    assert!(last_error().contains("args"));
    unsafe { kvs_backend::kvs_backend_free(be) };
}

struct CopyFix {
    kc: Data,
    vc: Data,
    hkc: Data,
    hvc: Data,
    copies: Vec<kvs_copy>,
}

type CopyMutation = Box<dyn Fn(&mut kvs_kv_copy_args, &mut CopyFix, &mut usize)>;

fn ccase(
    status: kvs_status,
    field: &'static str,
    m: impl Fn(&mut kvs_kv_copy_args, &mut CopyFix, &mut usize) + 'static,
) -> (kvs_status, &'static str, CopyMutation) {
    (status, field, Box::new(m))
}

#[test]
fn kv_copy_bad_inputs() {
    const HP: usize = 2; // host pages
    let fresh = || {
        let mut rng = Rng(3);
        CopyFix {
            kc: Data::random(BF16, NP * PS * HK * D, &mut rng),
            vc: Data::random(BF16, NP * PS * HK * D, &mut rng),
            hkc: Data::random(BF16, HP * PS * HK * D, &mut rng),
            hvc: Data::random(BF16, HP * PS * HK * D, &mut rng),
            // A valid copy first: a bad later one must stop the whole batch before it starts.
            copies: vec![
                kvs_copy {
                    src_page: 0,
                    dst_page: 1,
                    num_tokens: PS as u32,
                    kind: 0,
                    group: 0,
                },
                kvs_copy {
                    src_page: 2,
                    dst_page: 1,
                    num_tokens: 2,
                    kind: 1,
                    group: 0,
                },
            ],
        }
    };
    let args = |f: &mut CopyFix| kvs_kv_copy_args {
        key_cache: f.kc.ptr_mut(),
        value_cache: f.vc.ptr_mut(),
        cache: kvs_backend::kvs_kv_layout_dense(BF16, NP as u32, PS as u32, HK as u32, D as u32),
        host_key_cache: f.hkc.ptr_mut(),
        host_value_cache: f.hvc.ptr_mut(),
        num_host_pages: HP as u32,
    };
    let cases: Vec<(kvs_status, &str, CopyMutation)> = vec![
        ccase(NULL, "key_cache", |a, _, _| {
            a.key_cache = std::ptr::null_mut()
        }),
        ccase(NULL, "value_cache", |a, _, _| {
            a.value_cache = std::ptr::null_mut()
        }),
        ccase(NULL, "host_key_cache", |a, _, _| {
            a.host_key_cache = std::ptr::null_mut()
        }),
        ccase(NULL, "host_value_cache", |a, _, _| {
            a.host_value_cache = std::ptr::null_mut()
        }),
        ccase(NULL, "copies", |_, f, _| f.copies = Vec::new()), // NULL-ish pointer with n = 2
        ccase(INVALID, "copies", |_, f, _| f.copies[1].kind = 3),
        ccase(INVALID, "copies", |_, f, _| {
            f.copies[1].src_page = NP as u32
        }),
        ccase(INVALID, "copies", |_, f, _| {
            f.copies[1].dst_page = HP as u32
        }), // host tier is smaller
        ccase(INVALID, "copies", |_, f, _| {
            f.copies[1].num_tokens = PS as u32 + 1
        }),
        ccase(INVALID, "copies", |a, _, _| {
            a.num_host_pages = 0; // no host tier: device-to-host is impossible
            a.host_key_cache = std::ptr::null_mut();
            a.host_value_cache = std::ptr::null_mut();
        }),
        ccase(INVALID, "cache.dtype", |a, _, _| a.cache.dtype = 9),
        ccase(INVALID, "num_pages", |a, _, _| a.cache.num_pages = 0),
        ccase(INVALID, "page_size", |a, _, _| a.cache.page_size = 0),
        ccase(INVALID, "cache_page_stride", |a, _, _| {
            a.cache.page_stride = 3
        }),
        ccase(INVALID, "key_cache", |a, _, _| a.value_cache = a.key_cache),
        ccase(INVALID, "value_cache", |a, _, _| {
            a.host_key_cache = a.value_cache
        }),
        // Cache pointers that kvs_kv_write and kvs_attention_launch refuse
        // (not aligned to the element size) are refused here too.
        ccase(INVALID, "key_cache", |a, _, _| {
            a.key_cache = a.key_cache.cast::<u8>().wrapping_add(1).cast()
        }),
        ccase(INVALID, "value_cache", |a, _, _| {
            a.value_cache = a.value_cache.cast::<u8>().wrapping_add(1).cast()
        }),
        ccase(INVALID, "host_key_cache", |a, _, _| {
            a.host_key_cache = a.host_key_cache.cast::<u8>().wrapping_add(1).cast()
        }),
        ccase(INVALID, "host_value_cache", |a, _, _| {
            a.host_value_cache = a.host_value_cache.cast::<u8>().wrapping_add(1).cast()
        }),
    ];
    let be = new_backend(1);
    for (i, (status, field, mutate)) in cases.iter().enumerate() {
        let mut f = fresh();
        let mut a = args(&mut f);
        let mut n = 2usize;
        mutate(&mut a, &mut f, &mut n);
        let before = (f.kc.clone(), f.vc.clone(), f.hkc.clone(), f.hvc.clone());
        let ptr = if f.copies.is_empty() {
            std::ptr::null()
        } else {
            f.copies.as_ptr()
        };
        let st = unsafe { kvs_backend::kvs_kv_copy(be, &a, ptr, n, std::ptr::null_mut()) };
        let msg = last_error();
        assert_eq!(st, *status, "case {i} ({field}): {msg}");
        assert!(
            msg.contains(field),
            "case {i}: message `{msg}` does not name `{field}`"
        );
        assert!(
            before == (f.kc, f.vc, f.hkc, f.hvc),
            "case {i} ({field}) copied something"
        );
    }
    let mut f = fresh();
    let a = args(&mut f);
    assert_eq!(
        unsafe { kvs_backend::kvs_kv_copy(be, &a, f.copies.as_ptr(), 2, std::ptr::null_mut()) },
        kvs_status::Ok
    );
    assert_eq!(
        unsafe { kvs_backend::kvs_kv_copy(be, &a, std::ptr::null(), 0, std::ptr::null_mut()) },
        kvs_status::Ok
    );
    assert_eq!(
        unsafe {
            kvs_backend::kvs_kv_copy(
                std::ptr::null(),
                &a,
                std::ptr::null(),
                0,
                std::ptr::null_mut(),
            )
        },
        NULL
    );
    assert!(last_error().contains("backend"));
    assert_eq!(
        unsafe {
            kvs_backend::kvs_kv_copy(
                be,
                std::ptr::null(),
                std::ptr::null(),
                0,
                std::ptr::null_mut(),
            )
        },
        NULL
    );
    assert!(last_error().contains("args"));
    unsafe { kvs_backend::kvs_backend_free(be) };
}
