/*
 * Emulated libnnopbase.so: aclCreateTensor / aclCreateIntArray / aclCreateTensorList, their
 * destroy functions and aclDestroyAclOpExecutor. Every object is counted while alive; using or
 * destroying a dead object is a fault.
 *
 * aclCreateTensor enforces: 1..8 dims, non-negative dims and strides, a known dtype, format ND,
 * a 1-D storage of at least the view's extent, data 32-byte aligned and inside one aclrtMalloc
 * allocation (device memory) that holds the whole storage.
 */
#include "emu.h"

#define TENSOR_MAGIC 0x7E45u
#define ARRAY_MAGIC 0xA77Au
#define LIST_MAGIC 0x1157u
#define EXEC_MAGIC 0xE8ECu

static aclTensor *fail_null(const char *msg) {
    emu_set_error("EZ1001: aclCreateTensor: %s", msg);
    return NULL;
}

EMU_API aclTensor *aclCreateTensor(const int64_t *viewDims, uint64_t viewDimsNum, int dataType,
                                   const int64_t *stride, int64_t offset, int format,
                                   const int64_t *storageDims, uint64_t storageDimsNum,
                                   void *tensorData) {
    if (emu_enter("aclCreateTensor")) return NULL;
    if (emu_thread_device() < 0) return fail_null("no device set on this thread");
    if (!viewDims || viewDimsNum == 0 || viewDimsNum > EMU_MAX_DIMS)
        return fail_null("view dims NULL or count not in 1..8");
    if (!stride) return fail_null("strides NULL");
    if (emu_dtype_size(dataType) == 0) return fail_null("unknown dtype");
    if (format != FORMAT_ND) return fail_null("format is not ACL_FORMAT_ND");
    if (!storageDims || storageDimsNum == 0 || storageDimsNum > EMU_MAX_DIMS)
        return fail_null("storage dims NULL or count not in 1..8");
    if (offset < 0) return fail_null("negative offset");
    int64_t storage = 1;
    for (uint64_t i = 0; i < storageDimsNum; i++) {
        if (storageDims[i] < 0) return fail_null("negative storage dim");
        storage *= storageDims[i];
    }
    int64_t extent = offset + 1, numel = 1;
    for (uint64_t i = 0; i < viewDimsNum; i++) {
        if (viewDims[i] < 0 || stride[i] < 0) return fail_null("negative view dim or stride");
        numel *= viewDims[i];
        if (viewDims[i] > 0) extent += (viewDims[i] - 1) * stride[i];
    }
    if (numel > 0 && extent > storage) {
        emu_set_error("EZ1001: aclCreateTensor: view reaches element %lld, storage has %lld",
                      (long long)extent, (long long)storage);
        return NULL;
    }
    if (!tensorData) return fail_null("tensorData NULL");
    if ((uintptr_t)tensorData % 32) return fail_null("tensorData is not 32-byte aligned");
    size_t bytes = (size_t)storage * emu_dtype_size(dataType);
    emu_alloc *a = emu_find_alloc(tensorData, bytes ? bytes : 1);
    if (!a || a->host) {
        emu_set_error("EZ1001: aclCreateTensor: tensorData %p (+%zu bytes) is not inside device "
                      "memory from aclrtMalloc", tensorData, bytes);
        return NULL;
    }
    aclTensor *t = calloc(1, sizeof *t);
    t->magic = TENSOR_MAGIC;
    t->alive = 1;
    t->ndim = (int)viewDimsNum;
    memcpy(t->dims, viewDims, viewDimsNum * 8);
    memcpy(t->strides, stride, viewDimsNum * 8);
    t->offset = offset;
    t->storage_numel = storage;
    t->dtype = dataType;
    t->format = format;
    t->data = tensorData;
    S()->live_tensors++;
    return t; /* never freed: a dead tensor stays recognisable */
}

EMU_API int aclDestroyTensor(const aclTensor *tensor) {
    int inj = emu_enter("aclDestroyTensor");
    if (inj) return inj;
    aclTensor *t = (aclTensor *)tensor;
    if (!t) return ACLNN_ERR_PARAM_NULLPTR;
    if (t->magic != TENSOR_MAGIC || !t->alive) {
        emu_fault("aclDestroyTensor(%p): not a live tensor (double destroy?)", (void *)t);
        return ACLNN_ERR_PARAM_INVALID;
    }
    if (t->in_list) {
        emu_fault("aclDestroyTensor(%p): the tensor belongs to a tensor list, which destroys it",
                  (void *)t);
        return ACLNN_ERR_PARAM_INVALID;
    }
    t->alive = 0;
    S()->live_tensors--;
    return ACL_SUCCESS;
}

EMU_API aclIntArray *aclCreateIntArray(const int64_t *value, uint64_t size) {
    if (emu_enter("aclCreateIntArray")) return NULL;
    if (!value && size) {
        emu_set_error("EZ1001: aclCreateIntArray: NULL values");
        return NULL;
    }
    aclIntArray *a = calloc(1, sizeof *a);
    a->magic = ARRAY_MAGIC;
    a->alive = 1;
    a->size = size;
    a->values = malloc((size ? size : 1) * 8);
    if (size) memcpy(a->values, value, size * 8); /* host values, copied */
    S()->live_int_arrays++;
    return a;
}

EMU_API int aclDestroyIntArray(const aclIntArray *array) {
    int inj = emu_enter("aclDestroyIntArray");
    if (inj) return inj;
    aclIntArray *a = (aclIntArray *)array;
    if (!a) return ACLNN_ERR_PARAM_NULLPTR;
    if (a->magic != ARRAY_MAGIC || !a->alive) {
        emu_fault("aclDestroyIntArray(%p): not a live int array", (void *)a);
        return ACLNN_ERR_PARAM_INVALID;
    }
    a->alive = 0;
    S()->live_int_arrays--;
    return ACL_SUCCESS;
}

EMU_API aclTensorList *aclCreateTensorList(const aclTensor *const *value, uint64_t size) {
    if (emu_enter("aclCreateTensorList")) return NULL;
    if (!value || size == 0) {
        emu_set_error("EZ1001: aclCreateTensorList: empty");
        return NULL;
    }
    for (uint64_t i = 0; i < size; i++) {
        const aclTensor *t = value[i];
        if (!t || t->magic != TENSOR_MAGIC || !t->alive || t->in_list) {
            emu_set_error("EZ1001: aclCreateTensorList: item %llu is not a free live tensor",
                          (unsigned long long)i);
            return NULL;
        }
    }
    aclTensorList *l = calloc(1, sizeof *l);
    l->magic = LIST_MAGIC;
    l->alive = 1;
    l->size = size;
    l->items = malloc(size * sizeof *l->items);
    for (uint64_t i = 0; i < size; i++) {
        l->items[i] = (aclTensor *)value[i];
        l->items[i]->in_list = 1;
    }
    S()->live_lists++;
    return l;
}

EMU_API int aclDestroyTensorList(const aclTensorList *array) {
    int inj = emu_enter("aclDestroyTensorList");
    if (inj) return inj;
    aclTensorList *l = (aclTensorList *)array;
    if (!l) return ACLNN_ERR_PARAM_NULLPTR;
    if (l->magic != LIST_MAGIC || !l->alive) {
        emu_fault("aclDestroyTensorList(%p): not a live tensor list", (void *)l);
        return ACLNN_ERR_PARAM_INVALID;
    }
    for (uint64_t i = 0; i < l->size; i++) {
        l->items[i]->alive = 0; /* the list owns its tensors */
        S()->live_tensors--;
    }
    l->alive = 0;
    S()->live_lists--;
    return ACL_SUCCESS;
}

EMU_API int aclDestroyAclOpExecutor(aclOpExecutor *executor) {
    int inj = emu_enter("aclDestroyAclOpExecutor");
    if (inj) return inj;
    if (!executor) return ACLNN_ERR_PARAM_NULLPTR;
    if (executor->magic != EXEC_MAGIC || !executor->alive) {
        emu_fault("aclDestroyAclOpExecutor(%p): not a live executor (already run or destroyed)",
                  (void *)executor);
        return ACLNN_ERR_PARAM_INVALID;
    }
    executor->alive = 0;
    free(executor->op.q_start);
    free(executor->op.q_len);
    free(executor->op.kv_len);
    S()->live_executors--;
    return ACL_SUCCESS;
}

EMU_API int aclnnInit(const char *configPath) {
    (void)configPath;
    return emu_enter("aclnnInit");
}

EMU_API int aclSetAclOpExecutorRepeatable(aclOpExecutor *executor) {
    (void)executor;
    emu_set_error("EZ1001: aclSetAclOpExecutorRepeatable: not modelled by the emulator");
    return ACLNN_ERR_PARAM_INVALID;
}
