/*
 * Regression: kvshare.h must not define names outside its KVS_/kvs_ prefix.
 * It used to #define ACL_SUCCESS, ACL_FLOAT16, ACL_MEMCPY_*, ACLNN_ERR_*, MAX_BATCH, MAX_HEADS,
 * PRIORITIES, ... (about 29 macros), so a translation unit including kvshare.h and then CANN's
 * headers did not compile. The declarations below mirror CANN's acl/acl_base.h, acl/acl_rt.h and
 * aclnn/acl_meta.h (values as CANN 8.0 defines them), plus the kind of limits an engine names
 * for itself; with a leaking macro this file fails to compile.
 */
#include "kvs_test.h"

/* acl/acl_base.h */
typedef int aclError;
static const int ACL_SUCCESS = 0;
static const int ACL_ERROR_REPEAT_INITIALIZE = 100002;
typedef enum {
    ACL_DT_UNDEFINED = -1,
    ACL_FLOAT = 0,
    ACL_FLOAT16 = 1,
    ACL_INT8 = 2,
    ACL_INT32 = 3,
    ACL_UINT8 = 4,
    ACL_INT16 = 6,
    ACL_UINT16 = 7,
    ACL_UINT32 = 8,
    ACL_INT64 = 9,
    ACL_BF16 = 27
} aclDataType;
typedef enum {
    ACL_FORMAT_UNDEFINED = -1,
    ACL_FORMAT_NCHW = 0,
    ACL_FORMAT_NHWC = 1,
    ACL_FORMAT_ND = 2
} aclFormat;
/* acl/acl_rt.h */
typedef enum aclrtMemcpyKind {
    ACL_MEMCPY_HOST_TO_HOST,
    ACL_MEMCPY_HOST_TO_DEVICE,
    ACL_MEMCPY_DEVICE_TO_HOST,
    ACL_MEMCPY_DEVICE_TO_DEVICE
} aclrtMemcpyKind;
typedef enum aclrtMemMallocPolicy {
    ACL_MEM_MALLOC_HUGE_FIRST,
    ACL_MEM_MALLOC_HUGE_ONLY,
    ACL_MEM_MALLOC_NORMAL_ONLY
} aclrtMemMallocPolicy;
/* aclnn/acl_meta.h */
static const int ACLNN_ERR_PARAM_NULLPTR = 161001;
static const int ACLNN_ERR_PARAM_INVALID = 161002;
static const int ACLNN_ERR_RUNTIME_ERROR = 361001;
static const int ACLNN_ERR_INNER_FIND_KERNEL_ERROR = 561003;
/* An engine's own limits. */
enum { MAX_BATCH = 256, MAX_HEADS = 64, MAX_GROUP = 8, MAX_HEAD_DIM = 256, PRIORITIES = 3 };
enum { MAX_QUEUED_EVENTS = 16, MASK_SIDE = 1, DEVICE_ALIGN = 64, MAX_TND_SEQS = 2 };
enum { MAX_BNBSH_H = 1, MAX_DECODE_HEADS = 1, MAX_DECODE_BATCH = 1, FIA_PREFERENCE = 1 };

int main(void) {
    CHECK_EQ(KVS_ABI_VERSION, kvs_abi_version());
    CHECK_EQ(ACL_SUCCESS + ACL_FLOAT16 + ACL_FORMAT_ND + ACL_MEMCPY_DEVICE_TO_DEVICE, 6);
    CHECK_EQ(ACL_ERROR_REPEAT_INITIALIZE + ACLNN_ERR_PARAM_NULLPTR + ACLNN_ERR_PARAM_INVALID +
                 ACLNN_ERR_RUNTIME_ERROR + ACLNN_ERR_INNER_FIND_KERNEL_ERROR,
             100002 + 161001 + 161002 + 361001 + 561003);
    CHECK_EQ(MAX_BATCH + MAX_HEADS + MAX_GROUP + MAX_HEAD_DIM + PRIORITIES, 256 + 64 + 8 + 256 + 3);
    CHECK_EQ(KVS_NUM_PRIORITIES, 4);
    CHECK_EQ(ACL_INT8 + ACL_INT32 + ACL_INT64 + ACL_BF16 + ACL_MEM_MALLOC_HUGE_FIRST, 41);
    CHECK_EQ(ACL_MEMCPY_HOST_TO_DEVICE + ACL_MEMCPY_DEVICE_TO_HOST, 3);
    CHECK_EQ(MAX_QUEUED_EVENTS + MASK_SIDE + DEVICE_ALIGN + MAX_TND_SEQS + MAX_BNBSH_H +
                 MAX_DECODE_HEADS + MAX_DECODE_BATCH + FIA_PREFERENCE,
             16 + 1 + 64 + 2 + 4);
    printf("header_cann_names: ok\n");
    return 0;
}
