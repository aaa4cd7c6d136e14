// A small command-line parser for the `lamina` subcommands and the daemons: `--name value` or `--name=value`,
// repeatable flags, and boolean switches. Errors name the flag.
// Thread-compatible.
#ifndef LAMINA_COMMON_FLAGS_FLAGS_H_
#define LAMINA_COMMON_FLAGS_FLAGS_H_

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace lamina::cli {

class Flags {
 public:
  // `with_value` lists flags that take a value, `switches` those that take none (names without
  // dashes). Anything else is an error naming it.
  static absl::StatusOr<Flags> Parse(const std::vector<std::string>& args,
                                     const std::set<std::string>& with_value,
                                     const std::set<std::string>& switches);

  bool Has(const std::string& name) const { return values_.count(name) != 0; }
  // Every value given for `name`, in order.
  std::vector<std::string> All(const std::string& name) const;
  std::string String(const std::string& name, const std::string& fallback) const;
  absl::StatusOr<int64_t> Int(const std::string& name, int64_t fallback) const;
  absl::StatusOr<double> Double(const std::string& name, double fallback) const;

 private:
  std::map<std::string, std::vector<std::string>> values_;
};

// Parses "1,2,3" into ids; InvalidArgument names `flag` and the bad item.
absl::StatusOr<std::vector<int32_t>> ParseIdList(const std::string& flag, const std::string& text);

}  // namespace lamina::cli

#endif  // LAMINA_COMMON_FLAGS_FLAGS_H_
