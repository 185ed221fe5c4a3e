// Fuzzes the safetensors reader (SafetensorsFile::Open, Read) and the weight loader on top of
// it (LoadModelWeights) with arbitrary file contents. A file that opens must have every
// tensor's bytes inside the data section and large enough for its elements, so that reading
// any tensor touches only mapped bytes and allocates no more than the file could fill; the
// loader must refuse, with a status, anything that does not fit its config.
#include <cstdint>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/model/config.h"
#include "common/model/dtype.h"
#include "common/model/safetensors.h"
#include "common/model/weights.h"
#include "tests/fuzz/fuzz_util.h"

namespace treespec {
namespace {

// The configs of the seeds in corpus/safetensors_fuzz/: llama_untied_* (a Llama with an untied
// head) and qwen3_tied_bf16 (tied, q/k norms), both 1 layer, hidden 16, vocab 32.
ModelConfig TinyConfig(bool qwen3) { return fuzz::TinyFuzzConfig(qwen3, 64); }

void CheckFile(const SafetensorsFile& file, const uint8_t* data, size_t size) {
  uint64_t header_size = 0;
  for (int i = 7; i >= 0; --i) header_size = (header_size << 8) | data[i];
  const uint64_t data_size = size - 8 - header_size;  // Open checked header_size <= size - 8
  for (const SafetensorsTensorInfo& info : file.tensors()) {
    const std::string what =
        absl::StrCat("tensor '", info.name, "' ", info.dtype_name, " [",
                     absl::StrJoin(info.shape, ", "), "] at [", info.begin, ", ", info.end, ")");
    FUZZ_CHECK(info.begin <= info.end && info.end <= data_size, what);
    for (int64_t d : info.shape) FUZZ_CHECK(d >= 0, what);
    // Every dtype has at least one bit per element; the convertible ones exactly their size.
    const unsigned __int128 bits = static_cast<unsigned __int128>(info.end - info.begin) * 8;
    FUZZ_CHECK(static_cast<unsigned __int128>(info.numel()) <= bits, what);
    FUZZ_CHECK(file.RawBytes(info).size() == info.end - info.begin, what);
    if (!info.dtype.has_value()) continue;
    FUZZ_CHECK(static_cast<unsigned __int128>(info.numel()) * DTypeSize(*info.dtype) * 8 == bits,
               what);
    absl::StatusOr<Tensor> tensor = file.Read(info.name);
    FUZZ_CHECK(tensor.ok(), std::string(tensor.status().message()));
    FUZZ_CHECK(tensor->numel() == info.numel(), what);
  }
}

}  // namespace
}  // namespace treespec

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& dir = treespec::fuzz::ScratchDir();
  const std::string path = dir + "/model.safetensors";
  treespec::fuzz::WriteFile(path, data, size);
  absl::StatusOr<std::unique_ptr<treespec::SafetensorsFile>> file =
      treespec::SafetensorsFile::Open(path);
  if (!file.ok()) return 0;
  treespec::CheckFile(**file, data, size);
  for (bool qwen3 : {false, true}) {
    // Either outcome is fine; a crash, leak or undefined behaviour is not.
    (void)treespec::LoadModelWeights(dir, treespec::TinyConfig(qwen3));
  }
  return 0;
}
