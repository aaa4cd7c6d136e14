// The source tree's layering, read from its #include lines: each top-level module includes only
// the modules below it (siblings of one layer never include each other), and no two folders
// reach each other through includes (no cycle among folders). tests/ is exempt.
//
// Layers, lowest first:
//   the generated protocol headers (lamina/v1/...)
//   common
//   kernels
//   data_plane
//   kv
//   compute_node, memory_node
//   coordinator
//   deploy
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "gtest/gtest.h"

namespace lamina {
namespace {

namespace fs = std::filesystem;

const std::map<std::string, int>& Layers() {
  static const auto* layers = new std::map<std::string, int>{
      {"lamina", -1}, {"common", 0},      {"kernels", 1},     {"data_plane", 2},
      {"kv", 3},     {"compute_node", 4}, {"memory_node", 4}, {"coordinator", 5},
      {"deploy", 6}};
  return *layers;
}

// The folder a path is in, two levels deep ("common/transport"), or its module alone for a file
// directly in one.
std::string Folder(const std::string& path) {
  const size_t first = path.find('/');
  if (first == std::string::npos) return path;
  const size_t second = path.find('/', first + 1);
  return second == std::string::npos ? path.substr(0, first) : path.substr(0, second);
}

std::string Module(const std::string& path) { return path.substr(0, path.find('/')); }

struct Include {
  std::string file;      // relative to the source root
  std::string included;  // as written
};

std::vector<Include> ProjectIncludes() {
  const fs::path root(LAMINA_SOURCE_DIR);
  std::vector<Include> out;
  const std::regex include_line(R"(^\s*#\s*include\s+"([^"]+)\")");
  for (const auto& [module, layer] : Layers()) {
    if (!fs::is_directory(root / module)) continue;
    for (const fs::directory_entry& entry : fs::recursive_directory_iterator(root / module)) {
      const std::string ext = entry.path().extension().string();
      if (!entry.is_regular_file() || (ext != ".h" && ext != ".cc" && ext != ".cu" && ext != ".cuh")) continue;
      const std::string file = fs::relative(entry.path(), root).string();
      std::ifstream in(entry.path());
      std::string line;
      std::smatch match;
      while (std::getline(in, line)) {
        if (std::regex_search(line, match, include_line) && Layers().count(Module(match[1].str()))) {
          out.push_back({file, match[1].str()});
        }
      }
    }
  }
  return out;
}

TEST(LayeringTest, ModulesIncludeOnlyTheLayersBelowThem) {
  const std::vector<Include> includes = ProjectIncludes();
  ASSERT_GT(includes.size(), 500u) << "the tree was not found at " << LAMINA_SOURCE_DIR;
  std::vector<std::string> wrong;
  for (const Include& i : includes) {
    const std::string from = Module(i.file), to = Module(i.included);
    if (from != to && Layers().at(to) >= Layers().at(from)) wrong.push_back(i.file + " -> " + i.included);
  }
  EXPECT_TRUE(wrong.empty()) << "includes of a module of the same or a higher layer:\n" << absl::StrJoin(wrong, "\n");
}

TEST(LayeringTest, NoFoldersReachEachOtherThroughIncludes) {
  std::map<std::string, std::set<std::string>> edges;  // folder -> folders it includes from
  std::map<std::pair<std::string, std::string>, std::string> example;
  for (const Include& i : ProjectIncludes()) {
    const std::string from = Folder(i.file), to = Folder(i.included);
    if (from == to) continue;
    edges[from].insert(to);
    example.emplace(std::make_pair(from, to), i.file + " -> " + i.included);
  }
  // A folder on a cycle reaches itself: search from each.
  std::vector<std::string> cycles;
  for (const auto& [start, unused] : edges) {
    std::map<std::string, std::string> parent;
    std::vector<std::string> stack = {start};
    bool found = false;
    while (!stack.empty() && !found) {
      const std::string at = stack.back();
      stack.pop_back();
      for (const std::string& next : edges[at]) {
        if (next == start) {
          std::vector<std::string> path = {example[{at, start}]};
          for (std::string node = at; node != start; node = parent[node]) {
            path.insert(path.begin(), example[{parent[node], node}]);
          }
          cycles.push_back(absl::StrJoin(path, "; "));
          found = true;
          break;
        }
        if (parent.emplace(next, at).second) stack.push_back(next);
      }
    }
  }
  EXPECT_TRUE(cycles.empty()) << "folders that include each other:\n" << absl::StrJoin(cycles, "\n");
}

}  // namespace
}  // namespace lamina
