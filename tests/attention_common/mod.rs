//! Helpers shared by the attention tests: a deterministic RNG, typed buffers, and a backend.
#![allow(dead_code)]

use std::ffi::{c_void, CStr};

use half::{bf16, f16};
use kvshare::ffi::attn::kvs_backend;
use kvshare::ffi::status::kvs_status;

pub const F32: u32 = 0;
pub const F16: u32 = 1;
pub const BF16: u32 = 2;

/// xorshift64*: deterministic, no dependency.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// Uniform in [-1, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 52) as f64 - 1.0
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            v.swap(i, self.below(i + 1));
        }
    }
}

/// A host buffer of one dtype.
#[derive(Clone, Debug, PartialEq)]
pub enum Data {
    F32(Vec<f32>),
    F16(Vec<f16>),
    BF16(Vec<bf16>),
}

impl Data {
    pub fn filled(dtype: u32, n: usize, v: f64) -> Data {
        match dtype {
            F32 => Data::F32(vec![v as f32; n]),
            F16 => Data::F16(vec![f16::from_f64(v); n]),
            _ => Data::BF16(vec![bf16::from_f64(v); n]),
        }
    }
    pub fn random(dtype: u32, n: usize, rng: &mut Rng) -> Data {
        let mut d = Data::filled(dtype, n, 0.0);
        for i in 0..n {
            d.set(i, rng.unit());
        }
        d
    }
    pub fn get(&self, i: usize) -> f64 {
        match self {
            Data::F32(v) => v[i] as f64,
            Data::F16(v) => v[i].to_f64(),
            Data::BF16(v) => v[i].to_f64(),
        }
    }
    pub fn set(&mut self, i: usize, x: f64) {
        match self {
            Data::F32(v) => v[i] = x as f32,
            Data::F16(v) => v[i] = f16::from_f64(x),
            Data::BF16(v) => v[i] = bf16::from_f64(x),
        }
    }
    pub fn len(&self) -> usize {
        match self {
            Data::F32(v) => v.len(),
            Data::F16(v) => v.len(),
            Data::BF16(v) => v.len(),
        }
    }
    pub fn ptr(&self) -> *const c_void {
        match self {
            Data::F32(v) => v.as_ptr().cast(),
            Data::F16(v) => v.as_ptr().cast(),
            Data::BF16(v) => v.as_ptr().cast(),
        }
    }
    pub fn ptr_mut(&mut self) -> *mut c_void {
        match self {
            Data::F32(v) => v.as_mut_ptr().cast(),
            Data::F16(v) => v.as_mut_ptr().cast(),
            Data::BF16(v) => v.as_mut_ptr().cast(),
        }
    }
}

pub fn new_backend(num_threads: u32) -> *mut kvs_backend {
    let opts = kvshare::ffi::attn::kvs_backend_options {
        num_threads,
        device_id: 0,
        library_dir: std::ptr::null(),
    };
    let mut b = std::ptr::null_mut();
    let st = kvs_backend::kvs_backend_new(0, &opts, &mut b);
    assert_eq!(st, kvs_status::Ok, "{}", last_error());
    assert!(!b.is_null());
    b
}

pub fn last_error() -> String {
    // SAFETY: the library returns a valid NUL-terminated thread-local string.
    unsafe { CStr::from_ptr(kvs_status::kvs_last_error_message()) }
        .to_string_lossy()
        .into_owned()
}
