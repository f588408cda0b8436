// The C header must compile on its own as C++17 (no C-only constructs, extern "C" linkage,
// the status enum with its fixed underlying type). tests/c_harness.rs: header_cxx17.
#include "kvshare.h"

#include <cstdint>
#include <type_traits>

static_assert(std::is_same<std::underlying_type<kvs_status>::type, uint32_t>::value,
              "kvs_status is a uint32_t enum in C++");
static_assert(KVS_STATUS_OK == 0, "OK is 0");
static_assert(KVS_ABI_VERSION >= 1, "ABI version macro");
static_assert(std::is_standard_layout<kvs_config>::value && std::is_trivially_copyable<kvs_config>::value,
              "kvs_config is a plain C struct");
static_assert(std::is_standard_layout<kvs_stats>::value, "kvs_stats is a plain C struct");
static_assert(sizeof(kvs_copy) == 5 * sizeof(uint32_t), "kvs_copy is five uint32_t");
static_assert(std::is_same<decltype(&kvs_cache_new), kvs_status (*)(const kvs_config *, kvs_cache **)>::value,
              "kvs_cache_new signature");

int main() {
    kvs_config cfg = kvs_config_default();
    return cfg.page_size == 0 ? 1 : 0;
}
