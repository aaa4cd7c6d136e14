#include "common/tokenizer/bpe_model.h"

#include <cstdio>
#include <queue>

#include "absl/strings/str_cat.h"
#include "common/tokenizer/utf8.h"

namespace lamina {

absl::StatusOr<BpeModel> BpeModel::Create(const nlohmann::json& json, const std::string& label) {
  auto bad = [&](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat(label, ": model ", what));
  };
  if (!json.is_object()) return bad("is not an object");
  const std::string type = json.value("type", "BPE");
  if (type != "BPE") return bad(absl::StrCat("type '", type, "' is not supported (only BPE)"));
  if (!json.contains("vocab") || !json["vocab"].is_object()) return bad("has no object 'vocab'");
  if (!json.contains("merges") || !json["merges"].is_array()) return bad("has no list 'merges'");
  if (json.contains("continuing_subword_prefix") && !json["continuing_subword_prefix"].is_null()) {
    return bad("uses continuing_subword_prefix, which is not supported");
  }
  if (json.contains("end_of_word_suffix") && !json["end_of_word_suffix"].is_null()) {
    return bad("uses end_of_word_suffix, which is not supported");
  }

  BpeModel model;
  for (auto it = json["vocab"].begin(); it != json["vocab"].end(); ++it) {
    if (!it->is_number_integer() || it->get<int64_t>() < 0 || it->get<int64_t>() > (1 << 24)) {
      return bad(absl::StrCat("vocab entry '", it.key(), "' has no valid id"));
    }
    int32_t id = it->get<int32_t>();
    model.vocab_[it.key()] = id;
    if (static_cast<size_t>(id) >= model.id_to_token_.size()) model.id_to_token_.resize(id + 1);
    model.id_to_token_[id] = it.key();
  }

  int32_t rank = 0;
  for (const auto& entry : json["merges"]) {
    std::string left, right;
    if (entry.is_string()) {  // Older files: "left right".
      const std::string text = entry;
      size_t space = text.find(' ', 1);
      if (space == std::string::npos) return bad(absl::StrCat("merge ", rank, " ('", text, "') has no space"));
      left = text.substr(0, space);
      right = text.substr(space + 1);
    } else if (entry.is_array() && entry.size() == 2 && entry[0].is_string() && entry[1].is_string()) {
      left = entry[0];
      right = entry[1];
    } else {
      return bad(absl::StrCat("merge ", rank, " is neither \"a b\" nor [\"a\", \"b\"]"));
    }
    auto l = model.vocab_.find(left), r = model.vocab_.find(right), m = model.vocab_.find(left + right);
    if (l == model.vocab_.end() || r == model.vocab_.end() || m == model.vocab_.end()) {
      return bad(absl::StrCat("merge ", rank, " ('", left, "' + '", right,
                              "') uses a token missing from the vocab"));
    }
    model.merges_.emplace(PairKey(l->second, r->second), Merge{rank, m->second});
    ++rank;
  }

  if (json.contains("unk_token") && json["unk_token"].is_string()) {
    auto it = model.vocab_.find(json["unk_token"].get<std::string>());
    if (it == model.vocab_.end()) return bad("unk_token is not in the vocab");
    model.unk_id_ = it->second;
  }
  model.fuse_unk_ = json.value("fuse_unk", false);
  model.byte_fallback_ = json.value("byte_fallback", false);
  model.ignore_merges_ = json.value("ignore_merges", false);
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    auto it = model.vocab_.find(name);
    model.byte_ids_[b] = model.byte_fallback_ && it != model.vocab_.end() ? it->second : -1;
  }
  return model;
}

std::optional<int32_t> BpeModel::TokenId(const std::string& token) const {
  auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

void BpeModel::AppendUnknownOrBytes(const std::string& character, std::vector<int32_t>* symbols) const {
  if (byte_fallback_) {
    bool all_bytes = true;
    for (unsigned char b : character) all_bytes &= byte_ids_[b] >= 0;
    if (all_bytes) {
      for (unsigned char b : character) symbols->push_back(byte_ids_[b]);
      return;
    }
  }
  if (!unk_id_) return;  // tokenizers drops the character when there is no unk token.
  if (fuse_unk_ && !symbols->empty() && symbols->back() == *unk_id_) return;
  symbols->push_back(*unk_id_);
}

void BpeModel::Encode(const std::string& piece, std::vector<int32_t>* ids) const {
  if (ignore_merges_) {
    auto it = vocab_.find(piece);
    if (it != vocab_.end()) {
      ids->push_back(it->second);
      return;
    }
  }
  std::vector<int32_t> symbols;
  for (std::string_view c : utf8::SplitChars(piece)) {
    auto it = vocab_.find(absl::string_view(c.data(), c.size()));
    if (it != vocab_.end()) {
      symbols.push_back(it->second);
    } else {
      AppendUnknownOrBytes(std::string(c), &symbols);
    }
  }

  // Doubly linked symbols and a min-heap of candidate merges (rank, left position).
  const int n = static_cast<int>(symbols.size());
  std::vector<int> prev(n), next(n);
  for (int i = 0; i < n; ++i) {
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  struct Candidate {
    int32_t rank;
    int pos;
    int32_t merged_id;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap;
  auto push_pair = [&](int left) {
    if (left < 0 || next[left] < 0) return;
    auto it = merges_.find(PairKey(symbols[left], symbols[next[left]]));
    if (it != merges_.end()) heap.push({it->second.rank, left, it->second.merged_id});
  };
  for (int i = 0; i + 1 < n; ++i) push_pair(i);

  std::vector<bool> alive(n, true);
  while (!heap.empty()) {
    Candidate top = heap.top();
    heap.pop();
    int left = top.pos;
    if (!alive[left] || next[left] < 0) continue;
    int right = next[left];
    auto it = merges_.find(PairKey(symbols[left], symbols[right]));
    if (it == merges_.end() || it->second.merged_id != top.merged_id || it->second.rank != top.rank) {
      continue;  // Stale: one side changed since this candidate was pushed.
    }
    symbols[left] = top.merged_id;
    alive[right] = false;
    next[left] = next[right];
    if (next[right] >= 0) prev[next[right]] = left;
    push_pair(prev[left]);
    push_pair(left);
  }
  for (int i = 0; i < n; ++i) {
    if (alive[i]) ids->push_back(symbols[i]);
  }
}

}  // namespace lamina
