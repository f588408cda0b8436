// The drop-in entry point: MindIE's scheduler creates its block manager through
// `mindie_llm::BlockManagerFactory::CreateBlockSpaceManager`, defined in MindIE's
// libmindie_block_manager.so. A library built from this file and the adapter, installed in place
// of that library (or preloaded before it), hands every self-attention block manager to kvshare.
// Do not link this file into a MindIE build that keeps its own factory (use
// kvshare_mindie::CreateKvshareBlockManager from the patched factory instead; see README.md).
#include <memory>
#include <stdexcept>

#include "kvshare_mindie.h"

namespace mindie_llm {

BlockSpaceManagerSPtr BlockManagerFactory::CreateBlockSpaceManager(BlockManagerType type,
                                                                   const BlockManagerConfig &config,
                                                                   size_t localDPRank) {
    switch (type) {
        case BlockManagerType::SELFATTNBLOCKMANAGER:
            return kvshare_mindie::CreateKvshareBlockManager(config, localDPRank);
        case BlockManagerType::LWDSELFATTNBLOCKMANAGER:
            throw kvshare_mindie::Unsupported("layerwise cloud block manager (LWDSELFATTNBLOCKMANAGER)");
        default:
            // MindIE's own factory refuses the other types the same way.
            throw std::invalid_argument("Invalid block manager type");
    }
}

}  // namespace mindie_llm
