#include "tests/support/prometheus_page.h"

#include <cmath>
#include <regex>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace lamina::testing {
namespace {

bool ParseValue(const std::string& text, double* value) {
  if (text == "+Inf" || text == "-Inf" || text == "NaN") {
    *value = text == "NaN" ? std::nan("") : (text[0] == '+' ? HUGE_VAL : -HUGE_VAL);
    return true;
  }
  return absl::SimpleAtod(text, value);
}

}  // namespace

absl::StatusOr<std::map<std::string, double>> ParsePrometheusPage(const std::string& page) {
  static const std::regex kComment(R"(# (HELP|TYPE) ([a-zA-Z_:][a-zA-Z0-9_:]*) (.*))");
  static const std::regex kSample(R"(([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*")"
                                  R"((?:,[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*")*\})? (\S+))");
  static const std::regex kLe(R"re(,?le="([^"]*)")re");
  std::map<std::string, double> samples;
  std::set<std::string> typed;
  std::string family, type;
  // Per histogram series (its labels without le): the last bucket's count, and the +Inf bucket's.
  std::map<std::string, double> last_bucket, inf_bucket;
  int line_number = 0;
  if (page.empty() || page.back() != '\n') return absl::InvalidArgumentError("the page does not end with a newline");
  for (absl::string_view piece : absl::StrSplit(page.substr(0, page.size() - 1), '\n')) {
    const std::string line(piece);
    ++line_number;
    auto bad = [&](const std::string& why) {
      return absl::InvalidArgumentError(absl::StrCat("line ", line_number, ": ", why, ": ", line));
    };
    std::smatch match;
    if (std::regex_match(line, match, kComment)) {
      if (match[1] == "TYPE") {
        if (!typed.insert(match[2]).second) return bad("family declared twice");
        family = match[2];
        type = match[3];
        if (type != "counter" && type != "gauge" && type != "histogram") return bad("unknown type");
      }
      continue;
    }
    if (!std::regex_match(line, match, kSample)) return bad("not a sample line");
    const std::string name = match[1], labels = match[2];
    double value = 0;
    if (!ParseValue(match[3], &value)) return bad("not a number");
    const std::string series = name + labels;
    if (!samples.emplace(series, value).second) return bad("series written twice");
    if (family.empty()) return bad("a sample before any TYPE line");
    if (type != "histogram") {
      if (name != family) return bad(absl::StrCat("a sample outside its family ", family));
      continue;
    }
    if (name == family + "_bucket") {
      std::smatch le;
      if (!std::regex_search(labels, le, kLe)) return bad("a bucket without le");
      std::string others = std::regex_replace(labels, kLe, "");
      if (others == "{}") others.clear();
      if (!others.empty() && others[1] == ',') others.erase(1, 1);  // le came first
      const std::string key = family + others;
      if (last_bucket.count(key) > 0 && value < last_bucket[key]) return bad("a bucket below the one before it");
      last_bucket[key] = value;
      if (le[1] == "+Inf") inf_bucket[key] = value;
    } else if (name == family + "_count") {
      const std::string key = family + labels;
      if (inf_bucket.count(key) == 0) return bad("_count before the +Inf bucket");
      if (inf_bucket[key] != value) return bad("_count is not the +Inf bucket");
    } else if (name != family + "_sum") {
      return bad(absl::StrCat("a sample outside its family ", family));
    }
  }
  return samples;
}

}  // namespace lamina::testing
