#include "common/tokenizer/bpe.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace treespec {
namespace {

// A model over single-byte tokens (id = byte) plus the given merges, whose results get ids
// 256, 257, ... in order; raw-byte strings throughout (no byte-level spelling at this layer).
BpeModel MakeModel(const std::vector<std::pair<std::string, std::string>>& merges,
                   BpeOptions options = {}, const std::vector<std::string>& extra = {}) {
  absl::flat_hash_map<std::string, int32_t> vocab;
  for (int b = 0; b < 256; ++b) {
    if (b == '#') continue;  // a byte missing from the vocab, for the unk tests
    vocab[std::string(1, static_cast<char>(b))] = b;
  }
  int32_t next = 256;
  absl::flat_hash_map<uint64_t, BpeMerge> merge_map;
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [a, b] = merges[rank];
    if (!vocab.contains(a + b)) vocab[a + b] = next++;
    merge_map[BpeModel::PairKey(vocab.at(a), vocab.at(b))] = {static_cast<int32_t>(rank),
                                                              vocab.at(a + b)};
  }
  for (const std::string& token : extra) vocab[token] = next++;
  return BpeModel(std::move(vocab), std::move(merge_map), options);
}

std::vector<int32_t> Encode(const BpeModel& model, std::string_view piece) {
  std::vector<int32_t> ids;
  model.Encode(piece, &ids);
  return ids;
}

TEST(BpeTest, LowestRankMergesFirstWhereverItIs) {
  // "ll"=256 (rank 0), "ell"=257, "he"=258, "hell"=259 (h+ell), "hello"=260.
  const BpeModel model =
      MakeModel({{"l", "l"}, {"e", "ll"}, {"h", "e"}, {"h", "ell"}, {"hell", "o"}});
  // ll first, then e+ll (rank 1) before h+e (rank 2) can take the 'e'.
  EXPECT_EQ(Encode(model, "hello"), (std::vector<int32_t>{260}));
  EXPECT_EQ(Encode(model, "help"), (std::vector<int32_t>{258, 'l', 'p'}));
  EXPECT_EQ(Encode(model, "x"), (std::vector<int32_t>{'x'}));
  EXPECT_EQ(Encode(model, ""), (std::vector<int32_t>{}));
}

TEST(BpeTest, RankOrderBlocksLaterMerges) {
  // Same merges with h+e ranked first: "he" takes the 'e', so "ell" never forms.
  const BpeModel model =
      MakeModel({{"h", "e"}, {"l", "l"}, {"e", "ll"}, {"h", "ell"}, {"hell", "o"}});
  EXPECT_EQ(Encode(model, "hello"), (std::vector<int32_t>{256, 257, 'o'}));
}

TEST(BpeTest, TiesGoLeftmost) {
  const BpeModel model = MakeModel({{"a", "a"}});
  EXPECT_EQ(Encode(model, "aaa"), (std::vector<int32_t>{256, 'a'}));
  EXPECT_EQ(Encode(model, "aaaa"), (std::vector<int32_t>{256, 256}));
  EXPECT_EQ(Encode(model, "aaaaa"), (std::vector<int32_t>{256, 256, 'a'}));
}

TEST(BpeTest, CachedResultsEqualFreshOnes) {
  const BpeModel model = MakeModel({{"a", "b"}, {"ab", "c"}, {"c", "c"}});
  for (int round = 0; round < 3; ++round) {
    EXPECT_EQ(Encode(model, "abcc"), (std::vector<int32_t>{257, 'c'})) << round;
    EXPECT_EQ(Encode(model, "ccab"), (std::vector<int32_t>{258, 256})) << round;
  }
}

TEST(BpeTest, LongPieceMergesInNLogN) {
  // 2^18 'a's with merges doubling the run: one token per 2^k block; a quadratic merge loop
  // would take minutes here.
  std::vector<std::pair<std::string, std::string>> merges;
  std::string run = "a";
  for (int k = 0; k < 18; ++k) {
    merges.emplace_back(run, run);
    run += run;
  }
  const BpeModel model = MakeModel(merges);
  EXPECT_EQ(Encode(model, run), (std::vector<int32_t>{256 + 17}));
  EXPECT_EQ(Encode(model, run + "a").size(), 2u);
}

TEST(BpeTest, UnknownBytesDroppedOrUnk) {
  EXPECT_EQ(Encode(MakeModel({}), "a##b"), (std::vector<int32_t>{'a', 'b'}));
  BpeOptions unk;
  unk.unk_id = 'U';
  EXPECT_EQ(Encode(MakeModel({}, unk), "a##b"), (std::vector<int32_t>{'a', 'U', 'U', 'b'}));
  unk.fuse_unk = true;
  EXPECT_EQ(Encode(MakeModel({}, unk), "a##b#"), (std::vector<int32_t>{'a', 'U', 'b', 'U'}));
}

TEST(BpeTest, IgnoreMergesTakesWholeVocabEntries) {
  BpeOptions options;
  options.ignore_merges = true;
  // "xyz" is in the vocab with no merges leading to it.
  EXPECT_EQ(Encode(MakeModel({}, {}, {"xyz"}), "xyz"), (std::vector<int32_t>{'x', 'y', 'z'}));
  EXPECT_EQ(Encode(MakeModel({}, options, {"xyz"}), "xyz"), (std::vector<int32_t>{256}));
}

}  // namespace
}  // namespace treespec
