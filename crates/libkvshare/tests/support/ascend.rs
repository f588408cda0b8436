//! Helpers of the Ascend end-to-end tests (`ascend.rs`, `ascend_kv.rs`): the last error, the
//! tolerance check against the CPU backend, the decode case they use, the CPU backend's output
//! and the KV write case.

use std::ffi::c_void;

use kvshare::attn_args::{kvs_kv_layout, kvs_kv_write_args};
use kvshare::backend::kvs_backend;
use kvshare::enums::kvs_status;

use super::attention::{new_backend, Built, Case, Data, Rng, BF16};
use super::cann_emu::*;

pub fn last_error() -> String {
    super::attention::last_error()
}

pub fn assert_close(dtype: u32, got: &Data, want: &Data, what: &str) {
    let rtol = if dtype == BF16 { 2e-2 } else { 2e-3 };
    assert_eq!(got.len(), want.len());
    for i in 0..got.len() {
        let (g, w) = (got.get(i), want.get(i));
        assert!(
            (g - w).abs() <= rtol * w.abs() + rtol / 10.0,
            "{what}: element {i}: ascend {g}, cpu {w}"
        );
    }
}

/// A decode case as these tests use it: two KV heads, seed 7.
pub fn decode(
    dtype: u32,
    group: usize,
    head_dim: usize,
    page_size: usize,
    ctx: Vec<usize>,
) -> Case {
    Case {
        seed: 7,
        ..Case::decode(dtype, group, head_dim, page_size, ctx)
    }
}

/// The CPU backend's output for a built case (what the Ascend output is compared with), into a
/// copy of the output buffer: `b.out` stays as built, so a device copy of it starts unwritten.
pub fn cpu_output(b: &Built) -> Data {
    let cpu = new_backend(1);
    let mut out = b.out.clone();
    let a = b.args_over(
        b.query.ptr(),
        out.ptr_mut(),
        b.k.ptr(),
        b.v.ptr(),
        b.block_table.as_ptr(),
    );
    assert_eq!(
        unsafe { kvs_backend::kvs_attention_launch(cpu, &a, std::ptr::null_mut()) },
        kvs_status::Ok,
        "{}",
        last_error()
    );
    unsafe { kvs_backend::kvs_backend_free(cpu) };
    out
}

/// The CPU backend's output for a built case read over other caches (`k`, `v`: host buffers of
/// `b.layout`'s dtype, e.g. int8 codes) with dequantization scales, into a copy of `b.out`.
pub fn cpu_output_scaled(
    b: &Built,
    k: *const c_void,
    v: *const c_void,
    scales: &kvshare::attn_args::kvs_kv_scales,
) -> Data {
    let cpu = new_backend(1);
    let mut out = b.out.clone();
    let a = b.args_over(b.query.ptr(), out.ptr_mut(), k, v, b.block_table.as_ptr());
    assert_eq!(
        unsafe { kvs_backend::kvs_attention_launch_scaled(cpu, &a, scales, std::ptr::null_mut()) },
        kvs_status::Ok,
        "{}",
        last_error()
    );
    unsafe { kvs_backend::kvs_backend_free(cpu) };
    out
}

pub fn expect_status(got: kvs_status, want: kvs_status, needle: &str) {
    let m = last_error();
    assert_eq!(got, want, "{m}");
    assert!(
        m.contains(needle),
        "message {m:?} does not mention {needle:?}"
    );
}

/// A KV write case: `t` new tokens of `[t, kv_heads, d]` into a `[6, 16, kv_heads, d]` cache.
pub struct WriteCase {
    pub dtype: u32,
    pub layout: kvs_kv_layout,
    pub key: Data,
    pub value: Data,
    pub kc: Data,
    pub vc: Data,
    pub slots: Vec<i64>,
}

impl WriteCase {
    pub fn new(dtype: u32, t: usize) -> WriteCase {
        let mut rng = Rng(11);
        let layout = kvs_backend::kvs_kv_layout_dense(dtype, 6, 16, 2, 32);
        let n = 6 * 16 * 2 * 32;
        let mut all: Vec<i64> = (0..96).collect();
        rng.shuffle(&mut all);
        WriteCase {
            dtype,
            layout,
            key: Data::random(dtype, t * 64, &mut rng),
            value: Data::random(dtype, t * 64, &mut rng),
            kc: Data::random(dtype, n, &mut rng),
            vc: Data::random(dtype, n, &mut rng),
            slots: all[..t].to_vec(),
        }
    }

    pub fn args(
        &self,
        k: *const c_void,
        v: *const c_void,
        kc: *mut c_void,
        vc: *mut c_void,
        slots: *const c_void,
        ty: u32,
    ) -> kvs_kv_write_args {
        kvs_kv_write_args {
            num_tokens: self.slots.len() as u32,
            key: k,
            value: v,
            src_dtype: self.dtype,
            src_token_stride: 0,
            src_head_stride: 0,
            key_cache: kc,
            value_cache: vc,
            cache: self.layout,
            slot_mapping: slots,
            slot_mapping_type: ty,
        }
    }

    pub fn slot_bytes(&self, ty: u32) -> Vec<u8> {
        if ty == 1 {
            bytes(&self.slots)
        } else {
            bytes(&self.slots.iter().map(|&s| s as i32).collect::<Vec<_>>())
        }
    }

    pub fn upload<'e>(&self, emu: &'e Emu) -> [DevBuf<'e>; 6] {
        [
            emu.upload(&data_bytes(&self.key)),
            emu.upload(&data_bytes(&self.value)),
            emu.upload(&data_bytes(&self.kc)),
            emu.upload(&data_bytes(&self.vc)),
            emu.upload(&self.slot_bytes(0)),
            emu.upload(&self.slot_bytes(1)),
        ]
    }

    pub fn launch(
        &self,
        be: *mut kvs_backend,
        d: &[DevBuf<'_>; 6],
        stream: *mut c_void,
        ty: u32,
    ) -> kvs_status {
        let a = self.args(
            d[0].ptr,
            d[1].ptr,
            d[2].ptr,
            d[3].ptr,
            d[4 + ty as usize].ptr,
            ty,
        );
        unsafe { kvs_backend::kvs_kv_write(be, &a, stream) }
    }

    pub fn cpu(&self) -> (Data, Data) {
        let cpu = new_backend(1);
        let (mut kc, mut vc) = (self.kc.clone(), self.vc.clone());
        let a = self.args(
            self.key.ptr(),
            self.value.ptr(),
            kc.ptr_mut(),
            vc.ptr_mut(),
            self.slots.as_ptr().cast(),
            1,
        );
        assert_eq!(
            unsafe { kvs_backend::kvs_kv_write(cpu, &a, std::ptr::null_mut()) },
            kvs_status::Ok
        );
        unsafe { kvs_backend::kvs_backend_free(cpu) };
        (kc, vc)
    }
}
