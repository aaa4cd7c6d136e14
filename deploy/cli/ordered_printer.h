// Streams several requests' output to one stream without interleaving: request 0's text is
// written as it arrives; the others' is held until every request before them has finished, then
// written (and from then on streamed). Each request's output ends with a newline.
// Thread-compatible.
#ifndef LAMINA_DEPLOY_CLI_ORDERED_PRINTER_H_
#define LAMINA_DEPLOY_CLI_ORDERED_PRINTER_H_

#include <cstdio>
#include <string>
#include <vector>

namespace lamina::cli {

class OrderedPrinter {
 public:
  OrderedPrinter(size_t num_requests, std::FILE* out)
      : pending_(num_requests), finished_(num_requests, false), out_(out) {}

  void Write(size_t request, const std::string& text);
  void Finish(size_t request);

 private:
  void Emit(const std::string& text);

  std::vector<std::string> pending_;
  std::vector<bool> finished_;
  size_t current_ = 0;  // the request being streamed live
  std::FILE* out_;
};

}  // namespace lamina::cli

#endif  // LAMINA_DEPLOY_CLI_ORDERED_PRINTER_H_
