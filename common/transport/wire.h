// Little-endian encoding of plain values into message payloads, with bounds-checked reading.
// Thread-compatible.
#ifndef LAMINA_COMMON_TRANSPORT_WIRE_H_
#define LAMINA_COMMON_TRANSPORT_WIRE_H_

#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace lamina {

// Appends to a byte vector (whose capacity the owner keeps between messages).
class WireWriter {
 public:
  explicit WireWriter(std::vector<uint8_t>* out) : out_(out) {}
  template <typename T>
  void Put(T value) {
    static_assert(std::is_trivially_copyable_v<T>, "plain values only");
    PutBytes(&value, sizeof(value));
  }
  void PutBytes(const void* data, size_t size) {
    const auto* bytes = static_cast<const uint8_t*>(data);
    out_->insert(out_->end(), bytes, bytes + size);
  }
  void PutString(const std::string& s) {
    Put<uint32_t>(static_cast<uint32_t>(s.size()));
    PutBytes(s.data(), s.size());
  }

 private:
  std::vector<uint8_t>* out_;
};

// Reads what a WireWriter wrote; DataLoss when the message is shorter than its contents claim.
class WireReader {
 public:
  WireReader(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  template <typename T>
  absl::Status Get(T* value) {
    static_assert(std::is_trivially_copyable_v<T>, "plain values only");
    const uint8_t* bytes = nullptr;
    absl::Status status = GetBytes(sizeof(T), &bytes);
    if (status.ok()) std::memcpy(value, bytes, sizeof(T));
    return status;
  }
  // Points `bytes` at the next `size` bytes of the message (no copy).
  absl::Status GetBytes(size_t size, const uint8_t** bytes) {
    if (size > size_ - pos_) {
      return absl::DataLossError(absl::StrCat("message too short: ", size, " bytes wanted, ", size_ - pos_, " left"));
    }
    *bytes = data_ + pos_;
    pos_ += size;
    return absl::OkStatus();
  }
  absl::Status GetString(std::string* s) {
    uint32_t size;
    absl::Status status = Get(&size);
    const uint8_t* bytes = nullptr;
    if (status.ok()) status = GetBytes(size, &bytes);
    if (status.ok()) s->assign(reinterpret_cast<const char*>(bytes), size);
    return status;
  }
  size_t remaining() const { return size_ - pos_; }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

}  // namespace lamina

#endif  // LAMINA_COMMON_TRANSPORT_WIRE_H_
