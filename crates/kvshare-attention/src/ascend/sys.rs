//! The CANN C API as kvshare calls it: types, enum values, status codes and the function
//! pointer types of every symbol the backend resolves. Every item is copied from CANN's
//! headers (acl_base.h, acl_rt.h, acl_meta.h and the aclnn op headers); nothing here links
//! against CANN.

use std::ffi::{c_char, c_int, c_void};

/// `aclError` (runtime) and `aclnnStatus` (nnopbase / ops) are both 32-bit ints.
pub type AclError = c_int;
/// `aclrtStream`.
pub type AclrtStream = *mut c_void;

/// Opaque `aclTensor`.
#[repr(C)]
pub struct AclTensor {
    _p: [u8; 0],
}
/// Opaque `aclIntArray`.
#[repr(C)]
pub struct AclIntArray {
    _p: [u8; 0],
}
/// Opaque `aclTensorList`.
#[repr(C)]
pub struct AclTensorList {
    _p: [u8; 0],
}
/// Opaque `aclOpExecutor`.
#[repr(C)]
pub struct AclOpExecutor {
    _p: [u8; 0],
}

/// `ACL_SUCCESS`.
pub(crate) const ACL_SUCCESS: AclError = 0;
/// `ACL_ERROR_REPEAT_INITIALIZE`: a second `aclInit`; treated as success.
pub(crate) const ACL_ERROR_REPEAT_INITIALIZE: AclError = 100002;
/// `ACLNN_ERR_PARAM_NULLPTR`.
pub(crate) const ACLNN_ERR_PARAM_NULLPTR: AclError = 161001;
/// `ACLNN_ERR_PARAM_INVALID`.
pub(crate) const ACLNN_ERR_PARAM_INVALID: AclError = 161002;
/// `ACLNN_ERR_RUNTIME_ERROR`.
pub(crate) const ACLNN_ERR_RUNTIME_ERROR: AclError = 361001;
/// `561003`: kernel not found (operator binary package not installed).
pub(crate) const ACLNN_ERR_INNER_FIND_KERNEL_ERROR: AclError = 561003;

/// `aclDataType` values used here.
pub(crate) const ACL_FLOAT16: c_int = 1;
/// `ACL_INT8`.
pub(crate) const ACL_INT8: c_int = 2;
/// `ACL_INT32`.
pub(crate) const ACL_INT32: c_int = 3;
/// `ACL_INT64`.
pub(crate) const ACL_INT64: c_int = 9;
/// `ACL_BF16`.
pub(crate) const ACL_BF16: c_int = 27;
/// `ACL_FORMAT_ND`.
pub(crate) const ACL_FORMAT_ND: c_int = 2;

/// `aclrtMemcpyKind`.
pub(crate) const ACL_MEMCPY_HOST_TO_DEVICE: c_int = 1;
/// `ACL_MEMCPY_DEVICE_TO_HOST`.
pub(crate) const ACL_MEMCPY_DEVICE_TO_HOST: c_int = 2;
/// `ACL_MEMCPY_DEVICE_TO_DEVICE`.
pub(crate) const ACL_MEMCPY_DEVICE_TO_DEVICE: c_int = 3;
/// `ACL_MEM_MALLOC_HUGE_FIRST`.
pub(crate) const ACL_MEM_MALLOC_HUGE_FIRST: c_int = 0;

/// A short name for a status code from the documented list, or `None`.
pub fn status_name(code: AclError) -> Option<&'static str> {
    Some(match code {
        ACL_SUCCESS => "ACL_SUCCESS",
        ACL_ERROR_REPEAT_INITIALIZE => "ACL_ERROR_REPEAT_INITIALIZE",
        ACLNN_ERR_PARAM_NULLPTR => "ACLNN_ERR_PARAM_NULLPTR",
        ACLNN_ERR_PARAM_INVALID => "ACLNN_ERR_PARAM_INVALID",
        ACLNN_ERR_RUNTIME_ERROR => "ACLNN_ERR_RUNTIME_ERROR",
        ACLNN_ERR_INNER_FIND_KERNEL_ERROR => "ACLNN_ERR_INNER_FIND_KERNEL_ERROR",
        _ => return None,
    })
}

// ---- libascendcl.so ----
pub type AclInit = unsafe extern "C" fn(config_path: *const c_char) -> AclError;
pub type AclrtSetDevice = unsafe extern "C" fn(device_id: i32) -> AclError;
pub type AclrtGetDevice = unsafe extern "C" fn(device_id: *mut i32) -> AclError;
pub type AclrtMalloc =
    unsafe extern "C" fn(dev_ptr: *mut *mut c_void, size: usize, policy: c_int) -> AclError;
pub type AclrtFree = unsafe extern "C" fn(dev_ptr: *mut c_void) -> AclError;
pub type AclrtMemcpy = unsafe extern "C" fn(
    dst: *mut c_void,
    dest_max: usize,
    src: *const c_void,
    count: usize,
    kind: c_int,
) -> AclError;
pub type AclrtMemcpyAsync = unsafe extern "C" fn(
    dst: *mut c_void,
    dest_max: usize,
    src: *const c_void,
    count: usize,
    kind: c_int,
    stream: AclrtStream,
) -> AclError;
pub type AclGetRecentErrMsg = unsafe extern "C" fn() -> *const c_char;

// ---- libnnopbase.so ----
pub type AclCreateTensor = unsafe extern "C" fn(
    view_dims: *const i64,
    view_dims_num: u64,
    data_type: c_int,
    stride: *const i64,
    offset: i64,
    format: c_int,
    storage_dims: *const i64,
    storage_dims_num: u64,
    tensor_data: *mut c_void,
) -> *mut AclTensor;
pub type AclCreateIntArray = unsafe extern "C" fn(value: *const i64, size: u64) -> *mut AclIntArray;
pub type AclCreateTensorList =
    unsafe extern "C" fn(value: *const *const AclTensor, size: u64) -> *mut AclTensorList;
pub type AclDestroyTensor = unsafe extern "C" fn(t: *const AclTensor) -> AclError;
pub type AclDestroyIntArray = unsafe extern "C" fn(a: *const AclIntArray) -> AclError;
pub type AclDestroyTensorList = unsafe extern "C" fn(l: *const AclTensorList) -> AclError;
pub type AclDestroyAclOpExecutor = unsafe extern "C" fn(e: *mut AclOpExecutor) -> AclError;

// ---- aclnn ops (libopapi*.so) ----
/// The execute half of every aclnn op.
pub type AclnnExecute = unsafe extern "C" fn(
    workspace: *mut c_void,
    workspace_size: u64,
    executor: *mut AclOpExecutor,
    stream: AclrtStream,
) -> AclError;

type T = *const AclTensor;
type L = *const AclTensorList;
type A = *const AclIntArray;

/// `aclnnFusedInferAttentionScoreV2GetWorkspaceSize`.
pub type FiaV2GetWs = unsafe extern "C" fn(
    query: T,
    key: L,
    value: L,
    pse_shift: T,
    atten_mask: T,
    actual_seq_lengths: A,
    actual_seq_lengths_kv: A,
    deq_scale1: T,
    quant_scale1: T,
    deq_scale2: T,
    quant_scale2: T,
    quant_offset2: T,
    antiquant_scale: T,
    antiquant_offset: T,
    block_table: T,
    query_padding_size: T,
    kv_padding_size: T,
    key_antiquant_scale: T,
    key_antiquant_offset: T,
    value_antiquant_scale: T,
    value_antiquant_offset: T,
    key_shared_prefix: T,
    value_shared_prefix: T,
    actual_shared_prefix_len: A,
    num_heads: i64,
    scale_value: f64,
    pre_tokens: i64,
    next_tokens: i64,
    input_layout: *mut c_char,
    num_key_value_heads: i64,
    sparse_mode: i64,
    inner_precise: i64,
    block_size: i64,
    antiquant_mode: i64,
    softmax_lse_flag: bool,
    key_antiquant_mode: i64,
    value_antiquant_mode: i64,
    attention_out: T,
    softmax_lse: T,
    workspace_size: *mut u64,
    executor: *mut *mut AclOpExecutor,
) -> AclError;

/// `aclnnFusedInferAttentionScoreV3GetWorkspaceSize`: V2 plus `queryRope`, `keyRope`,
/// `keyRopeAntiquantScale` after `actualSharedPrefixLen`.
pub type FiaV3GetWs = unsafe extern "C" fn(
    query: T,
    key: L,
    value: L,
    pse_shift: T,
    atten_mask: T,
    actual_seq_lengths: A,
    actual_seq_lengths_kv: A,
    deq_scale1: T,
    quant_scale1: T,
    deq_scale2: T,
    quant_scale2: T,
    quant_offset2: T,
    antiquant_scale: T,
    antiquant_offset: T,
    block_table: T,
    query_padding_size: T,
    kv_padding_size: T,
    key_antiquant_scale: T,
    key_antiquant_offset: T,
    value_antiquant_scale: T,
    value_antiquant_offset: T,
    key_shared_prefix: T,
    value_shared_prefix: T,
    actual_shared_prefix_len: A,
    query_rope: T,
    key_rope: T,
    key_rope_antiquant_scale: T,
    num_heads: i64,
    scale_value: f64,
    pre_tokens: i64,
    next_tokens: i64,
    input_layout: *mut c_char,
    num_key_value_heads: i64,
    sparse_mode: i64,
    inner_precise: i64,
    block_size: i64,
    antiquant_mode: i64,
    softmax_lse_flag: bool,
    key_antiquant_mode: i64,
    value_antiquant_mode: i64,
    attention_out: T,
    softmax_lse: T,
    workspace_size: *mut u64,
    executor: *mut *mut AclOpExecutor,
) -> AclError;

/// `aclnnFusedInferAttentionScoreV4GetWorkspaceSize`: V3 plus `dequantScaleQuery`,
/// `learnableSink` before `numHeads` and `queryQuantMode` after `valueAntiquantMode`.
pub type FiaV4GetWs = unsafe extern "C" fn(
    query: T,
    key: L,
    value: L,
    pse_shift: T,
    atten_mask: T,
    actual_seq_lengths: A,
    actual_seq_lengths_kv: A,
    deq_scale1: T,
    quant_scale1: T,
    deq_scale2: T,
    quant_scale2: T,
    quant_offset2: T,
    antiquant_scale: T,
    antiquant_offset: T,
    block_table: T,
    query_padding_size: T,
    kv_padding_size: T,
    key_antiquant_scale: T,
    key_antiquant_offset: T,
    value_antiquant_scale: T,
    value_antiquant_offset: T,
    key_shared_prefix: T,
    value_shared_prefix: T,
    actual_shared_prefix_len: A,
    query_rope: T,
    key_rope: T,
    key_rope_antiquant_scale: T,
    dequant_scale_query: T,
    learnable_sink: T,
    num_heads: i64,
    scale_value: f64,
    pre_tokens: i64,
    next_tokens: i64,
    input_layout: *mut c_char,
    num_key_value_heads: i64,
    sparse_mode: i64,
    inner_precise: i64,
    block_size: i64,
    antiquant_mode: i64,
    softmax_lse_flag: bool,
    key_antiquant_mode: i64,
    value_antiquant_mode: i64,
    query_quant_mode: i64,
    attention_out: T,
    softmax_lse: T,
    workspace_size: *mut u64,
    executor: *mut *mut AclOpExecutor,
) -> AclError;

/// `aclnnScatterPaKvCacheGetWorkspaceSize`.
pub type ScatterPaKvCacheGetWs = unsafe extern "C" fn(
    key: T,
    key_cache_ref: *mut AclTensor,
    slot_mapping: T,
    value: T,
    value_cache_ref: *mut AclTensor,
    compress_lens: T,
    compress_seq_offset: T,
    seq_lens: T,
    cache_mode: *mut c_char,
    scatter_mode: *mut c_char,
    strides: A,
    offsets: A,
    workspace_size: *mut u64,
    executor: *mut *mut AclOpExecutor,
) -> AclError;
