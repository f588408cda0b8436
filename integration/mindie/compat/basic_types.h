// kvshare project: compatibility declarations for building the MindIE adapter without MindIE.
//
// This file is the kvshare project's own text (Apache-2.0, like the rest of kvshare). It declares
// the subset of names and signatures of MindIE-LLM's `src/include/basic_types.h` that the adapter
// and its tests use, written from the interface description in the project's design notes. It is
// not a copy of MindIE's header. Build against the real headers for a deployment
// (see docs/mindie.md).
#ifndef KVSHARE_MINDIE_COMPAT_BASIC_TYPES_H
#define KVSHARE_MINDIE_COMPAT_BASIC_TYPES_H

#include <cstdint>
#include <string>
#include <vector>

namespace mindie_llm {

using TokenId = long;
using BlockId = int64_t;  // global id: NPU ids first, then CPU ids offset by the NPU block count
using BlockIds = std::vector<BlockId>;
using SequenceId = long;
using RequestId = std::string;
using HashValue = uint64_t;
using TimeStamp = float;
using RefCount = long;
using PhysicalBlockId = BlockId;  // id inside one device's pool (CPU ids without the offset)

enum class DeviceType : uint8_t { CPU, NPU };

enum class AllocStatus { OK, LATER, NEVER };

constexpr BlockId INVALID_BLOCKID = static_cast<BlockId>(-1);
constexpr HashValue INVALID_HASH_VALUE = 0;
constexpr TokenId PLACEHOLDER_TOKEN = -1;

}  // namespace mindie_llm

#endif
