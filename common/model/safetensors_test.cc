#include "common/model/safetensors.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/model/dtype.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace treespec {
namespace {

using ::testing::HasSubstr;

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}
float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// ---- bf16 ------------------------------------------------------------------------------------

// Independent reference: the nearer of the two bf16 neighbours by exact double arithmetic,
// ties to the even mantissa; past the largest finite bf16 the upper neighbour is infinity.
uint16_t ReferenceBf16(float x) {
  const uint32_t u = Bits(x);
  const uint16_t down = static_cast<uint16_t>(u >> 16);  // truncation toward zero
  if ((u & 0xffffu) == 0) return down;
  const uint16_t up = static_cast<uint16_t>(down + 1);  // next magnitude (may be inf)
  const double xd = x;
  const double lo = Bf16BitsToFloat(down);
  // The value "up" would have with an unbounded exponent: for 0x7f7f -> 0x7f80 that is 2^128.
  const double hi = ((up & 0x7fffu) == 0x7f80u) ? std::copysign(std::ldexp(1.0, 128), xd)
                                                : static_cast<double>(Bf16BitsToFloat(up));
  const double dlo = std::abs(xd - lo);
  const double dhi = std::abs(hi - xd);
  if (dlo < dhi) return down;
  if (dhi < dlo) return up;
  return (down & 1u) ? up : down;
}

TEST(DTypeTest, Bf16ToFloatIsExactForAllPatterns) {
  for (uint32_t b = 0; b < 0x10000u; ++b) {
    const float f = Bf16BitsToFloat(static_cast<uint16_t>(b));
    EXPECT_EQ(Bits(f), b << 16);
    if (!std::isnan(f)) {
      ASSERT_EQ(FloatToBf16Bits(f), b) << std::hex << b;
    } else {
      ASSERT_TRUE(std::isnan(Bf16BitsToFloat(FloatToBf16Bits(f))));
    }
  }
}

TEST(DTypeTest, FloatToBf16RoundsToNearestEven) {
  // Exact ties: 1 + 2^-8 lies halfway between 1 and 1 + 2^-7 -> even (1.0);
  // 1 + 3 * 2^-8 halfway between 1 + 2^-7 (odd) and 1 + 2^-6 (even) -> up.
  EXPECT_EQ(FloatToBf16Bits(1.0f + 0x1p-8f), 0x3f80u);
  EXPECT_EQ(FloatToBf16Bits(1.0f + 3 * 0x1p-8f), 0x3f82u);
  EXPECT_EQ(FloatToBf16Bits(-(1.0f + 3 * 0x1p-8f)), 0xbf82u);
  // Just above a tie rounds up.
  EXPECT_EQ(FloatToBf16Bits(FromBits(0x3f808001u)), 0x3f81u);
  // Largest finite bf16 and overflow to infinity at the halfway point.
  EXPECT_EQ(FloatToBf16Bits(FromBits(0x7f7f7fffu)), 0x7f7fu);
  EXPECT_EQ(FloatToBf16Bits(FromBits(0x7f7f8000u)), 0x7f80u);
  EXPECT_EQ(FloatToBf16Bits(std::numeric_limits<float>::max()), 0x7f80u);
  EXPECT_EQ(FloatToBf16Bits(std::numeric_limits<float>::infinity()), 0x7f80u);
  EXPECT_EQ(FloatToBf16Bits(-std::numeric_limits<float>::infinity()), 0xff80u);
  EXPECT_EQ(FloatToBf16Bits(-0.0f), 0x8000u);
  // fp32 subnormals round within bf16's subnormals.
  EXPECT_EQ(FloatToBf16Bits(FromBits(0x00008000u)), 0x0000u);  // tie -> even (0)
  EXPECT_EQ(FloatToBf16Bits(FromBits(0x00018000u)), 0x0002u);  // tie -> even (2)
  EXPECT_EQ(FloatToBf16Bits(FromBits(0x00008001u)), 0x0001u);
  // NaN stays NaN, keeping its sign.
  const uint16_t nan = FloatToBf16Bits(std::numeric_limits<float>::quiet_NaN());
  EXPECT_TRUE(std::isnan(Bf16BitsToFloat(nan)));
  const uint16_t low_payload_nan =
      FloatToBf16Bits(FromBits(0xff800001u));  // payload only in low bits
  EXPECT_TRUE(std::isnan(Bf16BitsToFloat(low_payload_nan)));
  EXPECT_EQ(low_payload_nan & 0x8000u, 0x8000u);

  std::mt19937 rng(7);
  for (int i = 0; i < 2000000; ++i) {
    float x = FromBits(static_cast<uint32_t>(rng()));
    if (std::isnan(x)) continue;
    ASSERT_EQ(FloatToBf16Bits(x), ReferenceBf16(x)) << std::hex << Bits(x);
  }
}

// ---- f16 -------------------------------------------------------------------------------------
// The compiler's _Float16 (IEEE binary16, round to nearest even) is the oracle.

TEST(DTypeTest, HalfToFloatMatchesCompilerForAllPatterns) {
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    _Float16 ref;
    const uint16_t bits = static_cast<uint16_t>(h);
    std::memcpy(&ref, &bits, sizeof(ref));
    const float want = static_cast<float>(ref);
    const float got = HalfBitsToFloat(bits);
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got)) << std::hex << h;
      EXPECT_EQ(std::signbit(got), std::signbit(want));
      EXPECT_TRUE(std::isnan(HalfBitsToFloat(FloatToHalfBits(got))));
    } else {
      ASSERT_EQ(Bits(got), Bits(want)) << std::hex << h;
      ASSERT_EQ(FloatToHalfBits(got), bits) << std::hex << h;  // exact round trip
    }
  }
}

uint16_t CompilerHalf(float x) {
  const _Float16 h = static_cast<_Float16>(x);
  uint16_t bits;
  std::memcpy(&bits, &h, sizeof(bits));
  return bits;
}

TEST(DTypeTest, FloatToHalfRoundsLikeIeee) {
  std::vector<float> cases = {0.0f,
                              -0.0f,
                              1.0f,
                              -1.0f,
                              65504.0f,
                              65519.996f,
                              65520.0f,
                              -65520.0f,
                              65536.0f,
                              1e10f,
                              std::numeric_limits<float>::infinity(),
                              -std::numeric_limits<float>::infinity(),
                              std::numeric_limits<float>::max(),
                              0x1p-14f,
                              0x1p-24f,
                              0x1p-25f,
                              -0x1p-25f,
                              FromBits(Bits(0x1p-25f) + 1),
                              3 * 0x1p-26f,
                              5 * 0x1p-26f,
                              0x1.ff8p-15f,
                              0x1.ffcp-15f,
                              0x1.ffep-15f,
                              1.0f + 0x1p-11f,
                              1.0f + 3 * 0x1p-11f,
                              2049.0f,
                              2051.0f,
                              1e-8f,
                              1e-30f,
                              std::numeric_limits<float>::denorm_min(),
                              0.1f,
                              3.14159265f};
  // Every exact tie and its neighbours between consecutive halves near each exponent.
  for (int e = -26; e <= 16; ++e) {
    for (int m : {0, 1, 2, 511, 1022, 1023}) {
      const float base = std::ldexp(1.0f + m / 1024.0f, e);
      const float tie = std::ldexp(1.0f + (m + 0.5f) / 1024.0f, e);
      cases.insert(cases.end(),
                   {base, tie, std::nextafter(tie, 0.0f), std::nextafter(tie, 1e30f), -tie});
    }
  }
  for (float x : cases) {
    ASSERT_EQ(FloatToHalfBits(x), CompilerHalf(x)) << x << " bits " << std::hex << Bits(x);
  }
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> exponent(-30, 17);
  for (int i = 0; i < 2000000; ++i) {
    // Random mantissas across the interesting exponent range, plus fully random bit patterns.
    float x = (i % 2 == 0) ? std::ldexp(std::uniform_real_distribution<float>(1.0f, 2.0f)(rng),
                                        exponent(rng))
                           : FromBits(static_cast<uint32_t>(rng()));
    if (rng() & 1) x = -x;
    if (std::isnan(x)) continue;
    ASSERT_EQ(FloatToHalfBits(x), CompilerHalf(x)) << x << " bits " << std::hex << Bits(x);
  }
  // NaN in, NaN out, sign kept.
  const uint16_t nan = FloatToHalfBits(-std::numeric_limits<float>::quiet_NaN());
  EXPECT_TRUE(std::isnan(HalfBitsToFloat(nan)));
  EXPECT_EQ(nan & 0x8000u, 0x8000u);
  EXPECT_TRUE(std::isnan(HalfBitsToFloat(FloatToHalfBits(FromBits(0x7f800001u)))));  // signalling
}

// ---- files -----------------------------------------------------------------------------------

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           ("safetensors_test_" +
            std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Path(const std::string& name) const { return (dir_ / name).string(); }

  // A raw file: 8-byte header length, header text, data bytes.
  std::string WriteRaw(const std::string& name, const std::string& header, const std::string& data,
                       std::optional<uint64_t> header_len = std::nullopt) {
    const std::string path = Path(name);
    std::ofstream out(path, std::ios::binary);
    const uint64_t len = header_len.value_or(header.size());
    for (int i = 0; i < 8; ++i) out.put(static_cast<char>(len >> (8 * i)));
    out << header << data;
    return path;
  }

  std::filesystem::path dir_;
};

std::vector<float> TestValues(size_t n) {
  std::vector<float> v(n);
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (auto& x : v) x = normal(rng);
  // Special values in every tensor large enough to hold them.
  const float specials[] = {0.0f,
                            -0.0f,
                            1.0f,
                            65504.0f,
                            1e-7f,
                            0x1p-24f,
                            3e38f,
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity()};
  for (size_t i = 0; i < std::size(specials) && i < n; ++i) v[i] = specials[i];
  return v;
}

TEST_F(SafetensorsTest, RoundTripEachDType) {
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(DTypeSafetensorsName(dtype));
    Tensor a({3, 5}, TestValues(15));
    Tensor b({7}, TestValues(7));
    Tensor scalar(std::vector<int64_t>{}, {42.5f});
    Tensor empty({0, 4});
    const std::string path =
        Path(std::string("rt_") + DTypeSafetensorsName(dtype) + ".safetensors");
    ASSERT_TRUE(WriteSafetensors(
                    path, {{"a.weight", &a}, {"b", &b}, {"s", &scalar}, {"empty", &empty}}, dtype)
                    .ok());

    absl::StatusOr<std::unique_ptr<SafetensorsFile>> f = SafetensorsFile::Open(path);
    ASSERT_TRUE(f.ok()) << f.status();
    EXPECT_EQ((*f)->metadata().at("format"), "pt");
    ASSERT_EQ((*f)->tensors().size(), 4u);
    for (const auto& [name, t] : std::vector<std::pair<std::string, const Tensor*>>{
             {"a.weight", &a}, {"b", &b}, {"s", &scalar}, {"empty", &empty}}) {
      const SafetensorsTensorInfo* info = (*f)->Find(name);
      ASSERT_NE(info, nullptr) << name;
      EXPECT_EQ(info->dtype_name, DTypeSafetensorsName(dtype));
      EXPECT_EQ(info->shape, t->shape());
      absl::StatusOr<Tensor> got = (*f)->Read(name);
      ASSERT_TRUE(got.ok()) << got.status();
      ASSERT_EQ(got->shape(), t->shape());
      // Exactly the storage rounding, element by element.
      std::vector<uint8_t> stored(t->numel() * DTypeSize(dtype));
      ConvertFromFloat(dtype, t->span(), stored.data());
      std::vector<float> want(t->numel());
      ConvertToFloat(dtype, stored.data(), absl::MakeSpan(want));
      for (int64_t i = 0; i < t->numel(); ++i) {
        EXPECT_EQ(Bits(got->data()[i]), Bits(want[i])) << name << "[" << i << "]";
        if (dtype == DType::kF32) {
          EXPECT_EQ(Bits(got->data()[i]), Bits(t->data()[i]));
        }
      }
      // The stored bytes are the documented encodings.
      absl::Span<const uint8_t> raw = (*f)->RawBytes(*info);
      ASSERT_EQ(raw.size(), stored.size());
      EXPECT_TRUE(stored.empty() || std::memcmp(raw.data(), stored.data(), stored.size()) == 0);
    }
    if (dtype == DType::kF16) {
      absl::StatusOr<Tensor> a16 = (*f)->Read("a.weight");
      EXPECT_EQ(a16->data()[3], 65504.0f);
      EXPECT_EQ(a16->data()[5], 0x1p-24f);      // smallest subnormal survives
      EXPECT_TRUE(std::isinf(a16->data()[6]));  // 3e38 overflows half
      EXPECT_EQ(a16->data()[4], HalfBitsToFloat(FloatToHalfBits(1e-7f)));  // subnormal rounding
    }
  }
}

TEST_F(SafetensorsTest, HeaderIsAlignedAndParsesAsJson) {
  Tensor a({2, 3}, {1, 2, 3, 4, 5, 6});
  const std::string path = Path("aligned.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, {{"x", &a}}, DType::kBF16).ok());
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  uint64_t len = 0;
  for (int i = 7; i >= 0; --i) len = (len << 8) | static_cast<uint8_t>(bytes[i]);
  EXPECT_EQ((8 + len) % 8, 0u);
  EXPECT_EQ(bytes.size(), 8 + len + 12);
  nlohmann::json header = nlohmann::json::parse(bytes.substr(8, len));
  EXPECT_EQ(header["x"]["dtype"], "BF16");
  EXPECT_EQ(header["x"]["shape"], nlohmann::json({2, 3}));
  EXPECT_EQ(header["x"]["data_offsets"], nlohmann::json({0, 12}));
  EXPECT_EQ(header["__metadata__"]["format"], "pt");
}

TEST_F(SafetensorsTest, StreamingAppendCrossesTensorBoundaries) {
  const std::string path = Path("stream.safetensors");
  auto w = SafetensorsWriter::Create(
      path, {{"a", DType::kF32, {2, 2}}, {"z", DType::kF32, {0}}, {"b", DType::kF16, {3}}});
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_TRUE((*w)->Append(std::vector<float>{1, 2, 3}).ok());
  ASSERT_TRUE((*w)->Append(std::vector<float>{4, 5, 6, 7}).ok());
  // One value too many is an error.
  EXPECT_FALSE((*w)->Append(std::vector<float>{8}).ok());
  ASSERT_TRUE((*w)->Finish().ok());
  auto f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_THAT((*f)->Read("a")->span(), ::testing::ElementsAre(1, 2, 3, 4));
  EXPECT_THAT((*f)->Read("b")->span(), ::testing::ElementsAre(5, 6, 7));
  EXPECT_EQ((*f)->Read("z")->numel(), 0);
}

TEST_F(SafetensorsTest, UnfinishedWriterNamesTensorAndLeavesNoFile) {
  const std::string path = Path("short.safetensors");
  {
    auto w = SafetensorsWriter::Create(path, {{"a", DType::kF32, {4}}, {"b", DType::kF32, {2}}});
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE((*w)->Append(std::vector<float>{1, 2, 3, 4, 5}).ok());
    absl::Status s = (*w)->Finish();
    ASSERT_FALSE(s.ok());
    EXPECT_THAT(std::string(s.message()), HasSubstr("'b'"));
    EXPECT_THAT(std::string(s.message()), HasSubstr(path));
  }
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_FALSE(std::filesystem::exists(path + ".partial"));
}

// Opens `path` expecting failure; returns the message.
std::string OpenError(const std::string& path) {
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> f = SafetensorsFile::Open(path);
  EXPECT_FALSE(f.ok());
  return f.ok() ? "" : std::string(f.status().message());
}

TEST_F(SafetensorsTest, TruncatedDataNamesFileAndTensor) {
  Tensor a({4, 4}, TestValues(16));
  Tensor b({8, 8}, TestValues(64));
  const std::string path = Path("trunc.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, {{"model.a", &a}, {"model.layers.0.mlp.up_proj.weight", &b}},
                               DType::kF32)
                  .ok());
  std::filesystem::resize_file(path, std::filesystem::file_size(path) - 10);
  const std::string msg = OpenError(path);
  EXPECT_THAT(msg, HasSubstr(path));
  EXPECT_THAT(msg, HasSubstr("'model.layers.0.mlp.up_proj.weight'"));
  EXPECT_THAT(msg, HasSubstr("data_offsets [64, 320)"));
  EXPECT_THAT(msg, HasSubstr("310 data bytes"));
  EXPECT_THAT(msg, HasSubstr("truncated"));
}

TEST_F(SafetensorsTest, HeaderLengthPastEndOfFile) {
  const std::string path =
      WriteRaw("hlen.safetensors", R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
               std::string(4, '\0'), /*header_len=*/1000);
  const std::string msg = OpenError(path);
  EXPECT_THAT(msg, HasSubstr(path));
  EXPECT_THAT(msg, HasSubstr("header length 1000"));
}

TEST_F(SafetensorsTest, TooShortForHeaderLength) {
  const std::string path = Path("tiny.safetensors");
  std::ofstream(path) << "abc";
  const std::string msg = OpenError(path);
  EXPECT_THAT(msg, HasSubstr(path));
  EXPECT_THAT(msg, HasSubstr("3 bytes"));
}

TEST_F(SafetensorsTest, MissingFileNamesPath) {
  const std::string path = Path("absent.safetensors");
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> f = SafetensorsFile::Open(path);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(f.status().message()), HasSubstr(path));
}

TEST_F(SafetensorsTest, BadJsonHeader) {
  const std::string path = WriteRaw("badjson.safetensors", R"({"a":{"dtype":"F32",)", "");
  const std::string msg = OpenError(path);
  EXPECT_THAT(msg, HasSubstr(path));
  EXPECT_THAT(msg, HasSubstr("not valid JSON"));
}

TEST_F(SafetensorsTest, UnsupportedDTypeNamesTensorOnRead) {
  const std::string path = WriteRaw(
      "i64.safetensors",
      R"({"ids":{"dtype":"I64","shape":[2],"data_offsets":[0,16]},"w":{"dtype":"F32","shape":[1],"data_offsets":[16,20]}})",
      std::string(20, '\0'));
  auto f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();  // the header is valid
  EXPECT_TRUE((*f)->Read("w").ok());
  absl::StatusOr<Tensor> t = (*f)->Read("ids");
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(std::string(t.status().message()), HasSubstr(path));
  EXPECT_THAT(std::string(t.status().message()), HasSubstr("'ids'"));
  EXPECT_THAT(std::string(t.status().message()), HasSubstr("I64"));
}

TEST_F(SafetensorsTest, UnknownDTypeNamesTensor) {
  const std::string path =
      WriteRaw("q4.safetensors", R"({"w":{"dtype":"Q4_K","shape":[2],"data_offsets":[0,1]}})",
               std::string(1, '\0'));
  const std::string msg = OpenError(path);
  EXPECT_THAT(msg, HasSubstr(path));
  EXPECT_THAT(msg, HasSubstr("'w'"));
  EXPECT_THAT(msg, HasSubstr("Q4_K"));
}

TEST_F(SafetensorsTest, ShapeByteCountMismatchNamesTensor) {
  const std::string path =
      WriteRaw("mismatch.safetensors",
               R"({"model.norm.weight":{"dtype":"BF16","shape":[3, 4],"data_offsets":[0,20]}})",
               std::string(20, '\0'));
  const std::string msg = OpenError(path);
  EXPECT_THAT(msg, HasSubstr(path));
  EXPECT_THAT(msg, HasSubstr("'model.norm.weight'"));
  EXPECT_THAT(msg, HasSubstr("[3, 4]"));
  EXPECT_THAT(msg, HasSubstr("24 bytes"));
  EXPECT_THAT(msg, HasSubstr("20 bytes"));
}

TEST_F(SafetensorsTest, OverlappingTensorsNameBoth) {
  const std::string path = WriteRaw(
      "overlap.safetensors",
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
      std::string(12, '\0'));
  const std::string msg = OpenError(path);
  EXPECT_THAT(msg, HasSubstr(path));
  EXPECT_THAT(msg, HasSubstr("'a'"));
  EXPECT_THAT(msg, HasSubstr("'b'"));
  EXPECT_THAT(msg, HasSubstr("overlap"));
}

TEST_F(SafetensorsTest, MalformedEntriesNameTensor) {
  struct Case {
    std::string header;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {R"({"t":{"shape":[1],"data_offsets":[0,4]}})", "dtype"},
      {R"({"t":{"dtype":"F32","data_offsets":[0,4]}})", "shape"},
      {R"({"t":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", "shape"},
      {R"({"t":{"dtype":"F32","shape":[1]}})", "data_offsets"},
      {R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}})", "reversed"},
      {R"({"t":[1,2]})", "not an object"},
  };
  int i = 0;
  for (const Case& c : cases) {
    const std::string path =
        WriteRaw("bad" + std::to_string(i++) + ".safetensors", c.header, std::string(4, '\0'));
    const std::string msg = OpenError(path);
    EXPECT_THAT(msg, HasSubstr(path)) << c.header;
    EXPECT_THAT(msg, HasSubstr("'t'")) << c.header;
    EXPECT_THAT(msg, HasSubstr(c.expect)) << c.header;
  }
}

// Inputs of regressions/safetensors_fuzz/ (tests/fuzz): element counts whose byte size wraps
// past 2^64 to 0 matched an empty data range, so Open accepted a tensor of 2^61 or 2^62 elements
// in no bytes and Read tried to allocate it (the verifier aborted loading a tied model with such
// an lm_head.weight); a dimension >= 2^63 beside a zero became a negative int64 in the shape.
TEST_F(SafetensorsTest, ShapesPastTheByteCountAreRefused) {
  const std::vector<std::string> headers = {
      R"({"t":{"dtype":"U8","shape":[2305843009213693952],"data_offsets":[0,0]}})",
      R"({"t":{"dtype":"F32","shape":[4611686018427387904],"data_offsets":[0,0]}})",
      R"({"t":{"dtype":"I64","shape":[1152921504606846976, 2],"data_offsets":[0,0]}})",
      R"({"t":{"dtype":"F32","shape":[0, 9223372036854775808],"data_offsets":[0,0]}})",
  };
  int i = 0;
  for (const std::string& header : headers) {
    const std::string path = WriteRaw("huge" + std::to_string(i++) + ".safetensors", header, "");
    const std::string msg = OpenError(path);
    EXPECT_THAT(msg, HasSubstr("'t'")) << header;
    EXPECT_THAT(msg, HasSubstr("too large")) << header;
  }
}

TEST_F(SafetensorsTest, ReadsUnalignedData) {
  // A header length that leaves the data section at an odd offset.
  std::vector<uint8_t> data(1 + 3 * 2);
  const uint16_t h[3] = {FloatToHalfBits(1.5f), FloatToHalfBits(-2.0f), FloatToHalfBits(0.25f)};
  std::memcpy(data.data() + 1, h, sizeof(h));
  const std::string header =
      R"({"pad":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"h":{"dtype":"F16","shape":[3],"data_offsets":[1,7]}})";
  const std::string path =
      WriteRaw("unaligned.safetensors", header, std::string(data.begin(), data.end()));
  auto f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_THAT((*f)->Read("h")->span(), ::testing::ElementsAre(1.5f, -2.0f, 0.25f));
  absl::StatusOr<Tensor> missing = (*f)->Read("nope");
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("'nope'"));
}

TEST_F(SafetensorsTest, LargeTensorParallelConversion) {
  // Above the parallel-conversion threshold; every element checked.
  const int64_t n = (int64_t{1} << 22) * 3 + 17;
  std::vector<float> values(n);
  for (int64_t i = 0; i < n; ++i) values[i] = static_cast<float>(i % 4099) * 0.5f - 1000.0f;
  Tensor t({n}, values);
  const std::string path = Path("large.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, {{"big", &t}}, DType::kBF16).ok());
  auto f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok());
  absl::StatusOr<Tensor> got = (*f)->Read("big");
  ASSERT_TRUE(got.ok());
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(got->data()[i], Bf16BitsToFloat(FloatToBf16Bits(values[i]))) << i;
  }
}

}  // namespace
}  // namespace treespec
