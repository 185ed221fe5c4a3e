// Reading and writing the safetensors format:
//   [8 bytes: little-endian u64 N][N bytes: JSON header][data bytes]
// The header maps tensor names to {"dtype", "shape", "data_offsets": [begin, end)} with offsets
// relative to the start of the data bytes; "__metadata__" holds string pairs.
// Reading maps the file read-only; tensors are converted to fp32 on request.
#ifndef TREESPEC_COMMON_MODEL_SAFETENSORS_H_
#define TREESPEC_COMMON_MODEL_SAFETENSORS_H_

#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/model/dtype.h"
#include "common/model/tensor.h"

namespace treespec {

struct SafetensorsTensorInfo {
  std::string name;
  std::string dtype_name;      // as written: "BF16", "I64", ...
  std::optional<DType> dtype;  // nullopt when we cannot convert it to fp32
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // data_offsets, relative to the data section
  uint64_t end = 0;
  int64_t numel() const;
};

// A safetensors file mapped read-only. The header is validated on Open: header length within
// the file, JSON well formed, every tensor's offsets inside the data section, byte length equal
// to numel * itemsize, no two tensors overlapping. Every error names the file (and the tensor).
class SafetensorsFile {
 public:
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  // Sorted by name.
  const std::vector<SafetensorsTensorInfo>& tensors() const { return tensors_; }
  // nullptr when absent.
  const SafetensorsTensorInfo* Find(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // The tensor converted to fp32; errors for absent tensors and dtypes other than F32/F16/BF16.
  absl::StatusOr<Tensor> Read(const std::string& name) const;
  // Converts into `out`, which must hold exactly numel() floats.
  absl::Status ReadInto(const SafetensorsTensorInfo& info, absl::Span<float> out) const;
  // The stored bytes of a tensor. [end - begin]
  absl::Span<const uint8_t> RawBytes(const SafetensorsTensorInfo& info) const;

 private:
  SafetensorsFile() = default;

  std::string path_;
  const uint8_t* map_ = nullptr;  // whole file
  size_t map_size_ = 0;
  const uint8_t* data_ = nullptr;  // data section inside map_
  uint64_t data_size_ = 0;
  std::vector<SafetensorsTensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

// One tensor to write: name, storage type and shape.
struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
};

// Writes a safetensors file tensor by tensor, so memory stays bounded by what the caller holds:
// the header (all names, shapes, offsets) goes first, then Append() streams fp32 values that
// fill the tensors in the order given, converted to each tensor's dtype. Finish() checks that
// every tensor was filled and closes the file. The header carries {"format": "pt"} metadata,
// which transformers requires.
class SafetensorsWriter {
 public:
  static absl::StatusOr<std::unique_ptr<SafetensorsWriter>> Create(
      const std::string& path, std::vector<SafetensorsEntry> entries,
      const std::map<std::string, std::string>& metadata = {{"format", "pt"}});
  ~SafetensorsWriter();
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  // Appends values to the current tensor, moving on to the next when it is full; a span may
  // cross tensor boundaries.
  absl::Status Append(absl::Span<const float> values);
  absl::Status Finish();

  // Bytes of tensor data (excluding the header) for `entries`.
  static uint64_t DataBytes(const std::vector<SafetensorsEntry>& entries);

 private:
  SafetensorsWriter() = default;
  absl::Status WriteBytes(const void* data, size_t size);

  std::string path_;
  std::FILE* file_ = nullptr;
  std::vector<SafetensorsEntry> entries_;
  size_t current_ = 0;           // entry being filled
  int64_t filled_ = 0;           // elements of entries_[current_] already written
  std::vector<uint8_t> buffer_;  // conversion scratch
  bool finished_ = false;
};

// Convenience: writes whole tensors at once. `tensors` pairs names with fp32 tensors.
absl::Status WriteSafetensors(const std::string& path,
                              const std::vector<std::pair<std::string, const Tensor*>>& tensors,
                              DType dtype);

}  // namespace treespec

#endif  // TREESPEC_COMMON_MODEL_SAFETENSORS_H_
