// The coordinator's index of prompt prefixes kept on memory nodes (automatic prefix caching).
//
// After a prompt is prefilled, its first whole blocks (block_size tokens each, leaving at least
// one token to compute) are kept on its memory node as a cache sequence that shares the prompt's
// slots. A later prompt that starts with the same blocks is forked from that sequence and only
// its remaining tokens are computed. Prefixes are found by hashing the prompt block by block;
// a hit is checked token by token, so a hash collision cannot return the wrong prefix. Entries no
// request holds are evicted least recently used first when a node needs room.
// Thread-compatible: used on the scheduler's thread.
#ifndef LAMINA_COORDINATOR_SCHEDULER_PREFIX_CACHE_H_
#define LAMINA_COORDINATOR_SCHEDULER_PREFIX_CACHE_H_

#include <cstdint>
#include <list>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/types/span.h"
#include "common/attention/attention_service.h"

namespace lamina {

class PrefixCache {
 public:
  explicit PrefixCache(int64_t block_size = 16) : block_size_(block_size) {}

  struct Match {
    SequenceId cache_seq;
    int64_t length;  // tokens shared, a multiple of the block size
  };
  // The longest cached prefix of `prompt` on `node` that leaves at least one token to compute.
  // A hit counts as a use (for eviction order).
  std::optional<Match> Longest(const std::string& node, absl::Span<const int32_t> prompt);
  // How many tokens of `prompt` are worth caching: whole blocks, one token left over.
  int64_t CacheableLength(absl::Span<const int32_t> prompt) const;
  // True when `node` already caches exactly this prefix (no new entry needed).
  bool Contains(const std::string& node, absl::Span<const int32_t> prefix) const;
  // Records that `cache_seq` on `node` holds `prefix` (a whole number of blocks).
  void Insert(const std::string& node, SequenceId cache_seq, absl::Span<const int32_t> prefix);
  // Removes the least recently used entry of `node` and returns its sequence (to free on the
  // node), or nothing when the node caches nothing.
  std::optional<SequenceId> EvictOldest(const std::string& node);
  // Forgets every entry of a node (declared dead) and returns their cache sequences, which the node
  // still holds if it comes back.
  std::vector<SequenceId> DropNode(const std::string& node);
  // Slots the node's entries hold (counting shared ones once per entry).
  int64_t CachedSlots(const std::string& node) const;
  // Each node's entries (sequences held for the cache) and their slots.
  struct Use {
    int64_t sequences = 0;
    int64_t slots = 0;
  };
  std::map<std::string, Use> Usage() const;

 private:
  struct Entry {
    SequenceId cache_seq;
    std::vector<int32_t> tokens;
  };
  struct NodeCache {
    std::list<Entry> entries;  // most recently used first
    // Hash of the first k blocks -> the entry holding them (its tokens are checked on a hit).
    absl::flat_hash_map<uint64_t, std::list<Entry>::iterator> by_prefix;
    int64_t slots = 0;
  };
  // Hashes of prompt[0 : k * block_size] for k = 1 .. blocks.
  std::vector<uint64_t> BlockHashes(absl::Span<const int32_t> prompt, int64_t blocks) const;

  int64_t block_size_;
  std::map<std::string, NodeCache> nodes_;
};

}  // namespace lamina

#endif  // LAMINA_COORDINATOR_SCHEDULER_PREFIX_CACHE_H_
