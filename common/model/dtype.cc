#include "common/model/dtype.h"

#include <bit>

namespace treespec {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; conversions assume a little-endian host");

const char* DTypeSafetensorsName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "F32";
    case DType::kF16:
      return "F16";
    case DType::kBF16:
      return "BF16";
  }
  return "?";
}

std::optional<DType> DTypeFromSafetensorsName(absl::string_view name) {
  if (name == "F32") return DType::kF32;
  if (name == "F16") return DType::kF16;
  if (name == "BF16") return DType::kBF16;
  return std::nullopt;
}

const char* DTypeTorchName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "float32";
    case DType::kF16:
      return "float16";
    case DType::kBF16:
      return "bfloat16";
  }
  return "?";
}

int DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return 4;
    case DType::kF16:
    case DType::kBF16:
      return 2;
  }
  return 0;
}

float HalfBitsToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  uint32_t u;
  if (exponent == 0) {
    if (mantissa == 0) {
      u = sign;
    } else {
      // Subnormal half: mantissa * 2^-24, exact in fp32.
      const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
      std::memcpy(&u, &magnitude, sizeof(u));
      u |= sign;
    }
  } else if (exponent == 0x1f) {
    u = sign | 0x7f800000u | (mantissa << 13);  // infinity, or NaN with its payload
  } else {
    u = sign | ((exponent + (127 - 15)) << 23) | (mantissa << 13);
  }
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

uint16_t FloatToHalfBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) {
    // NaN: quiet it and keep the top of the payload.
    return static_cast<uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
  }
  if (a >= 0x477ff000u) {
    // >= 65520 (halfway between the largest half, 65504, and 2^16) rounds to infinity.
    return static_cast<uint16_t>(sign | 0x7c00u);
  }
  if (a >= 0x38800000u) {
    // Normal half (>= 2^-14): rebias the exponent, round the 13 dropped bits to nearest even;
    // a carry out of the mantissa correctly bumps the exponent.
    uint32_t h = a - ((127u - 15u) << 23);
    h += 0x0fffu + ((h >> 13) & 1u);
    return static_cast<uint16_t>(sign | (h >> 13));
  }
  if (a <= 0x33000000u) {
    // <= 2^-25, half of the smallest subnormal: rounds (ties to even) to zero.
    return sign;
  }
  // Subnormal half: count units of 2^-24, rounding to nearest even. The result may be 0x400,
  // which is exactly the smallest normal half.
  const uint32_t biased_exponent = a >> 23;               // 102 .. 112 here
  const uint32_t mantissa = (a & 0x7fffffu) | 0x800000u;  // with the implicit bit
  const uint32_t shift = 126u - biased_exponent;          // 14 .. 24
  uint32_t q = mantissa >> shift;
  const uint32_t rem = mantissa & ((1u << shift) - 1u);
  const uint32_t halfway = 1u << (shift - 1);
  if (rem > halfway || (rem == halfway && (q & 1u))) ++q;
  return static_cast<uint16_t>(sign | q);
}

void ConvertToFloat(DType dtype, const uint8_t* src, absl::Span<float> out) {
  const size_t n = out.size();
  float* dst = out.data();
  switch (dtype) {
    case DType::kF32:
      if (n > 0) std::memcpy(dst, src, n * sizeof(float));  // empty spans may hold null
      return;
    case DType::kBF16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t bits;
        std::memcpy(&bits, src + 2 * i, sizeof(bits));
        dst[i] = Bf16BitsToFloat(bits);
      }
      return;
    case DType::kF16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t bits;
        std::memcpy(&bits, src + 2 * i, sizeof(bits));
        dst[i] = HalfBitsToFloat(bits);
      }
      return;
  }
}

void ConvertFromFloat(DType dtype, absl::Span<const float> in, uint8_t* dst) {
  const size_t n = in.size();
  switch (dtype) {
    case DType::kF32:
      if (n > 0) std::memcpy(dst, in.data(), n * sizeof(float));  // empty spans may hold null
      return;
    case DType::kBF16:
      for (size_t i = 0; i < n; ++i) {
        const uint16_t bits = FloatToBf16Bits(in[i]);
        std::memcpy(dst + 2 * i, &bits, sizeof(bits));
      }
      return;
    case DType::kF16:
      for (size_t i = 0; i < n; ++i) {
        const uint16_t bits = FloatToHalfBits(in[i]);
        std::memcpy(dst + 2 * i, &bits, sizeof(bits));
      }
      return;
  }
}

}  // namespace treespec
