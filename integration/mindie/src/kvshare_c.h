// Includes kvshare's C header for the adapter, working around a defect of the committed header
// (include/kvshare.h, ABI version 1): `kvs_page_info` and `kvs_seq_info` are each declared both
// as a typedef (cbindgen style "both") and as a function, which neither C nor C++ accepts
// ("redeclared as different kind of symbol"). Reported to the kvshare maintainers; remove this
// file and include "kvshare.h" directly once the header is fixed.
//
// While the header is read, two function-like macros rename only the two function declarations
// (a macro named `f(...)` expands only where `f` is followed by `(`), leaving the struct and
// typedef names alone. The real functions are then declared again with their exact signatures
// from the header, inside a namespace: an `extern "C"` declaration in a namespace names the same C
// symbol, and the namespace keeps the function name apart from the global typedef.
#ifndef KVSHARE_MINDIE_KVSHARE_C_H
#define KVSHARE_MINDIE_KVSHARE_C_H

#define kvs_page_info(...) kvs_page_info_declaration_shadowed_(__VA_ARGS__)
#define kvs_seq_info(...) kvs_seq_info_declaration_shadowed_(__VA_ARGS__)
#include "kvshare.h"
#undef kvs_page_info
#undef kvs_seq_info

namespace kvshare_c {
extern "C" kvs_status kvs_page_info(const struct kvs_cache *cache, uint32_t tier, uint32_t page,
                                    struct kvs_page_info *info_out);
extern "C" kvs_status kvs_seq_info(const struct kvs_cache *cache, uint64_t seq_id, struct kvs_seq_info *info_out);
}  // namespace kvshare_c

#if KVS_ABI_VERSION != 1
#error "kvshare_c.h re-declares kvs_page_info/kvs_seq_info for KVS_ABI_VERSION 1: check them"
#endif

#endif
