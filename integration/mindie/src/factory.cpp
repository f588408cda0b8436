// The drop-in entry point: MindIE's scheduler creates its block manager through
// `mindie_llm::BlockManagerFactory::CreateBlockSpaceManager`, defined in MindIE's
// libmindie_block_manager.so. A library built from this file and the adapter, installed in place
// of that library (or preloaded before it), hands every self-attention block manager to kvshare.
// Do not link this file into a MindIE build that keeps its own factory (use
// kvshare_mindie::CreateKvshareBlockManager from the patched factory instead; see docs/mindie.md).
#include <memory>
#include <stdexcept>

#include "kvshare_mindie.h"

namespace mindie_llm {

using kvshare_mindie::BlockManagerConfig;

BlockSpaceManagerSPtr BlockManagerFactory::CreateBlockSpaceManager(BlockManagerType type,
                                                                   const BlockManagerConfig &config,
                                                                   size_t localDPRank) {
    switch (type) {
        case BlockManagerType::SELFATTNBLOCKMANAGER:
            // By the config's cacheType, as the patched factory (patches/) does.
            return kvshare_mindie::CreateKvshareBlockManager(config, localDPRank);
        case BlockManagerType::COMPOSITEBLOCKMANAGER:
            // "If empty, COMPOSITEBLOCKMANAGER creation will fail fast" (MindIE's header).
            if (config.subManagers.empty()) {
                throw std::invalid_argument("COMPOSITEBLOCKMANAGER needs subManagers");
            }
            return kvshare_mindie::CreateKvshareHybridBlockManager(config, localDPRank);
        case BlockManagerType::REQUESTSLIDINGWINDOWBLOCKMANAGER: {
            BlockManagerConfig window = config;
            window.cacheType = KvCacheType::SLIDING_WINDOW;
            return kvshare_mindie::CreateKvshareHybridBlockManager(window, localDPRank);
        }
        case BlockManagerType::LWDSELFATTNBLOCKMANAGER:
            throw kvshare_mindie::Unsupported("layerwise cloud block manager (LWDSELFATTNBLOCKMANAGER)");
        default:
            // REQUESTSINGLEBLOCKMANAGER (one block per request) and unknown values: MindIE's own
            // factory refuses them the same way.
            throw std::invalid_argument("Invalid block manager type");
    }
}

}  // namespace mindie_llm
