#include "coordinator/scheduler/prefix_cache.h"

#include <algorithm>

#include "absl/hash/hash.h"

namespace lamina {

std::vector<uint64_t> PrefixCache::BlockHashes(absl::Span<const int32_t> prompt, int64_t blocks) const {
  std::vector<uint64_t> hashes;
  uint64_t h = 0;
  for (int64_t k = 0; k < blocks; ++k) {
    absl::Span<const int32_t> block = prompt.subspan(k * block_size_, block_size_);
    h = absl::HashOf(h, std::vector<int32_t>(block.begin(), block.end()));
    hashes.push_back(h);
  }
  return hashes;
}

int64_t PrefixCache::CacheableLength(absl::Span<const int32_t> prompt) const {
  if (prompt.size() < 2) return 0;
  return static_cast<int64_t>(prompt.size() - 1) / block_size_ * block_size_;
}

std::optional<PrefixCache::Match> PrefixCache::Longest(const std::string& node, absl::Span<const int32_t> prompt) {
  auto n = nodes_.find(node);
  if (n == nodes_.end()) return std::nullopt;
  NodeCache& cache = n->second;
  const int64_t blocks = CacheableLength(prompt) / block_size_;
  const std::vector<uint64_t> hashes = BlockHashes(prompt, blocks);
  for (int64_t k = blocks; k >= 1; --k) {
    auto hit = cache.by_prefix.find(hashes[k - 1]);
    if (hit == cache.by_prefix.end()) continue;
    auto entry = hit->second;
    const int64_t length = k * block_size_;
    if (static_cast<int64_t>(entry->tokens.size()) < length ||
        !std::equal(prompt.begin(), prompt.begin() + length, entry->tokens.begin())) {
      continue;  // a hash collision
    }
    cache.entries.splice(cache.entries.begin(), cache.entries, entry);  // now the most recent
    return Match{entry->cache_seq, length};
  }
  return std::nullopt;
}

bool PrefixCache::Contains(const std::string& node, absl::Span<const int32_t> prefix) const {
  auto n = nodes_.find(node);
  if (n == nodes_.end() || prefix.empty()) return false;
  const std::vector<uint64_t> hashes = BlockHashes(prefix, static_cast<int64_t>(prefix.size()) / block_size_);
  auto hit = n->second.by_prefix.find(hashes.back());
  return hit != n->second.by_prefix.end() && hit->second->tokens.size() >= prefix.size() &&
         std::equal(prefix.begin(), prefix.end(), hit->second->tokens.begin());
}

void PrefixCache::Insert(const std::string& node, SequenceId cache_seq, absl::Span<const int32_t> prefix) {
  NodeCache& cache = nodes_[node];
  cache.entries.push_front({cache_seq, std::vector<int32_t>(prefix.begin(), prefix.end())});
  cache.slots += static_cast<int64_t>(prefix.size());
  const std::vector<uint64_t> hashes = BlockHashes(prefix, static_cast<int64_t>(prefix.size()) / block_size_);
  // Every block boundary points at the newest entry that covers it.
  for (uint64_t h : hashes) cache.by_prefix[h] = cache.entries.begin();
}

std::optional<SequenceId> PrefixCache::EvictOldest(const std::string& node) {
  auto n = nodes_.find(node);
  if (n == nodes_.end() || n->second.entries.empty()) return std::nullopt;
  NodeCache& cache = n->second;
  auto victim = std::prev(cache.entries.end());
  const SequenceId seq = victim->cache_seq;
  cache.slots -= static_cast<int64_t>(victim->tokens.size());
  // Re-point (or drop) the prefixes that led to the victim.
  const std::vector<uint64_t> hashes =
      BlockHashes(victim->tokens, static_cast<int64_t>(victim->tokens.size()) / block_size_);
  for (uint64_t h : hashes) {
    auto it = cache.by_prefix.find(h);
    if (it != cache.by_prefix.end() && it->second == victim) cache.by_prefix.erase(it);
  }
  cache.entries.erase(victim);
  return seq;
}

std::vector<SequenceId> PrefixCache::DropNode(const std::string& node) {
  std::vector<SequenceId> dropped;
  auto n = nodes_.find(node);
  if (n == nodes_.end()) return dropped;
  for (const Entry& entry : n->second.entries) dropped.push_back(entry.cache_seq);
  nodes_.erase(n);
  return dropped;
}

int64_t PrefixCache::CachedSlots(const std::string& node) const {
  auto n = nodes_.find(node);
  return n == nodes_.end() ? 0 : n->second.slots;
}

std::map<std::string, PrefixCache::Use> PrefixCache::Usage() const {
  std::map<std::string, Use> usage;
  for (const auto& [node, cache] : nodes_) usage[node] = {static_cast<int64_t>(cache.entries.size()), cache.slots};
  return usage;
}

}  // namespace lamina
