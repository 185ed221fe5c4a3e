// Floating-point storage types of checkpoints and their conversions to and from fp32.
// Conversions to the narrow types round to nearest, ties to even (as PyTorch does); NaN stays a
// (quiet) NaN with its sign, infinities stay infinities, and values past the largest finite
// half overflow to infinity.
#ifndef TREESPEC_COMMON_MODEL_DTYPE_H_
#define TREESPEC_COMMON_MODEL_DTYPE_H_

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace treespec {

// The storage types we read and write; everything is fp32 once loaded.
enum class DType { kF32, kF16, kBF16 };

// Safetensors spelling: "F32", "F16", "BF16".
const char* DTypeSafetensorsName(DType dtype);
// "F32" -> kF32, ...; nullopt for any other safetensors dtype (I64, F64, F8_E4M3, ...).
std::optional<DType> DTypeFromSafetensorsName(absl::string_view name);
// Hugging Face config.json `torch_dtype` spelling: "float32", "float16", "bfloat16".
const char* DTypeTorchName(DType dtype);
int DTypeSize(DType dtype);  // bytes per element

inline float Bf16BitsToFloat(uint16_t bits) {
  const uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

inline uint16_t FloatToBf16Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    return static_cast<uint16_t>((u >> 16) | 0x0040u);  // NaN: keep sign and top payload, quiet
  }
  // Round to nearest even: add 0x7fff plus the lowest kept bit; a carry into the exponent is
  // the correct result (up to infinity for values past the largest finite bf16).
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

float HalfBitsToFloat(uint16_t bits);
uint16_t FloatToHalfBits(float f);

// Bulk conversions of little-endian storage bytes to fp32. `src` holds out.size() elements of
// the given type and need not be aligned.
void ConvertToFloat(DType dtype, const uint8_t* src, absl::Span<float> out);
// fp32 -> storage bytes; `dst` has room for in.size() * DTypeSize(dtype) bytes.
void ConvertFromFloat(DType dtype, absl::Span<const float> in, uint8_t* dst);

}  // namespace treespec

#endif  // TREESPEC_COMMON_MODEL_DTYPE_H_
