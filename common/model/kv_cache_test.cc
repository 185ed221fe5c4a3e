#include "common/model/kv_cache.h"

#include <vector>

#include "gtest/gtest.h"

namespace treespec {
namespace {

TEST(PagedKvCacheTest, ReserveTruncateFreeAccounting) {
  PagedKvCache cache(/*num_pages=*/10, /*page_size=*/16);
  EXPECT_EQ(cache.free_pages(), 10);
  const SeqId a = cache.CreateSequence(), b = cache.CreateSequence();
  EXPECT_NE(a, b);
  EXPECT_EQ(cache.num_reserved_slots(a), 0);

  ASSERT_TRUE(cache.Reserve(a, 1).ok());
  EXPECT_EQ(cache.num_reserved_slots(a), 16);
  EXPECT_EQ(cache.free_pages(), 9);
  ASSERT_TRUE(cache.Reserve(a, 16).ok());  // already covered
  EXPECT_EQ(cache.free_pages(), 9);
  ASSERT_TRUE(cache.Reserve(a, 33).ok());
  EXPECT_EQ(cache.num_reserved_slots(a), 48);
  EXPECT_EQ(cache.free_pages(), 7);
  ASSERT_TRUE(cache.Reserve(b, 20).ok());
  EXPECT_EQ(cache.free_pages(), 5);

  // Locate follows the page table.
  const std::vector<int> pages = cache.Pages(a);
  ASSERT_EQ(pages.size(), 3u);
  EXPECT_EQ(cache.Locate(a, 0), std::make_pair(pages[0], 0));
  EXPECT_EQ(cache.Locate(a, 17), std::make_pair(pages[1], 1));
  EXPECT_EQ(cache.Locate(a, 47), std::make_pair(pages[2], 15));

  cache.Truncate(a, 17);  // keeps the page holding slot 16
  EXPECT_EQ(cache.num_reserved_slots(a), 32);
  EXPECT_EQ(cache.free_pages(), 6);
  cache.Truncate(a, 32);  // nothing wholly beyond 32
  EXPECT_EQ(cache.num_reserved_slots(a), 32);
  cache.Truncate(a, 0);
  EXPECT_EQ(cache.num_reserved_slots(a), 0);
  EXPECT_EQ(cache.free_pages(), 8);

  cache.Free(b);
  EXPECT_EQ(cache.free_pages(), 10);
  EXPECT_EQ(cache.Reserve(b, 1).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(cache.Reserve(a, -1).code(), absl::StatusCode::kInvalidArgument);
}

TEST(PagedKvCacheTest, ExhaustionIsAllOrNothingAndCacheStaysUsable) {
  PagedKvCache cache(4, 8);
  const SeqId a = cache.CreateSequence(), b = cache.CreateSequence();
  ASSERT_TRUE(cache.Reserve(a, 24).ok());       // 3 pages
  const absl::Status s = cache.Reserve(b, 17);  // needs 3, 1 free
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_EQ(cache.num_reserved_slots(b), 0);  // no partial reservation
  EXPECT_EQ(cache.free_pages(), 1);
  ASSERT_TRUE(cache.Reserve(b, 8).ok());
  EXPECT_EQ(cache.free_pages(), 0);
  EXPECT_EQ(cache.Reserve(a, 25).code(), absl::StatusCode::kResourceExhausted);
  cache.Free(a);
  ASSERT_TRUE(cache.Reserve(b, 32).ok());
  EXPECT_EQ(cache.free_pages(), 0);
}

// Fills element e of every slot s of layer l with s * 100 + l * 10 + e (K) and its negation (V).
void Stamp(PagedKvCache& cache, KvPool& pool, SeqId seq, int layers, int slots) {
  for (int l = 0; l < layers; ++l) {
    for (int s = 0; s < slots; ++s) {
      auto [page, off] = cache.Locate(seq, s);
      for (int e = 0; e < 2 * 3; ++e) {
        pool.K(l, page, off)[e] = s * 100 + l * 10 + e;
        pool.V(l, page, off)[e] = -(s * 100 + l * 10 + e);
      }
    }
  }
}

TEST(CommitPathTest, MovesAcceptedSlotsInEveryPoolAndTruncates) {
  const int layers = 2, ps = 4;
  PagedKvCache cache(8, ps);
  KvPool pool0(layers, 8, ps, /*kv_heads=*/2, /*head_dim=*/3);
  KvPool pool1(layers, 8, ps, 2, 3);
  const SeqId seq = cache.CreateSequence();
  const int L = 5, n = 12;
  ASSERT_TRUE(cache.Reserve(seq, L + n).ok());
  Stamp(cache, pool0, seq, layers, L + n);
  Stamp(cache, pool1, seq, layers, L + n);
  const std::vector<int> path = {0, 1, 4, 9, 10};  // j=1 stays, then 4->2, 9->3, 10->4
  KvPool* pools[] = {&pool0, &pool1};
  CommitPath(cache, pools, seq, L, path);
  EXPECT_EQ(cache.num_reserved_slots(seq), 12);  // L + k + 1 = 10 slots -> 3 pages
  for (KvPool* pool : pools) {
    for (int l = 0; l < layers; ++l) {
      for (int s = 0; s < L + 5; ++s) {
        const int src = s < L ? s : L + path[s - L];  // committed slots never move
        auto [page, off] = cache.Locate(seq, s);
        EXPECT_EQ(pool->K(l, page, off)[5], src * 100 + l * 10 + 5) << "slot " << s;
        EXPECT_EQ(pool->V(l, page, off)[0], -(src * 100 + l * 10)) << "slot " << s;
      }
    }
  }
}

TEST(KvPoolTest, CopySlotCopiesEveryLayerOnly) {
  KvPool pool(3, 2, 2, 1, 4);
  for (int l = 0; l < 3; ++l) {
    for (int e = 0; e < 4; ++e) {
      pool.K(l, 1, 1)[e] = l + e;
      pool.V(l, 1, 1)[e] = -(l + e);
    }
  }
  pool.CopySlot(1, 1, 0, 0);
  for (int l = 0; l < 3; ++l) {
    for (int e = 0; e < 4; ++e) {
      EXPECT_EQ(pool.K(l, 0, 0)[e], l + e);
      EXPECT_EQ(pool.V(l, 0, 0)[e], -(l + e));
      EXPECT_EQ(pool.K(l, 0, 1)[e], 0.0f);  // neighbours untouched
    }
  }
}

}  // namespace
}  // namespace treespec

namespace treespec {
namespace {

std::vector<int32_t> Tokens(int n, int32_t first = 100) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = first + i;
  return t;
}

// A finished sequence leaves its full pages of final tokens for the next one to attach.
TEST(PrefixCacheTest, AttachesTheCachedPagesOfALongestPrefix) {
  PagedKvCache cache(10, 16);
  const std::vector<int32_t> tokens = Tokens(40);
  const SeqId a = cache.CreateSequence();
  ASSERT_TRUE(cache.Reserve(a, 40).ok());
  const std::vector<int> pages_a = cache.Pages(a);
  cache.CachePages(a, tokens);  // pages 0 and 1 are full; page 2 holds 8 tokens
  EXPECT_EQ(cache.cached_pages(), 2);
  cache.Free(a);
  EXPECT_EQ(cache.free_pages(), 10);  // cached pages count as free: they can be evicted
  EXPECT_EQ(cache.evictable_pages(), 2);

  const SeqId b = cache.CreateSequence();
  EXPECT_EQ(cache.AttachCachedPrefix(b, tokens), 32);
  EXPECT_EQ(cache.Pages(b), std::vector<int>(pages_a.begin(), pages_a.begin() + 2));
  EXPECT_EQ(cache.evictable_pages(), 0);
  EXPECT_EQ(cache.free_pages(), 8);
  // A prompt that differs in its second page reuses the first only; one that is exactly two
  // pages long keeps its last token to compute, so it too reuses one page.
  std::vector<int32_t> other = tokens;
  other[20] = 7;
  const SeqId c = cache.CreateSequence(), d = cache.CreateSequence();
  EXPECT_EQ(cache.AttachCachedPrefix(c, other), 16);
  EXPECT_EQ(cache.AttachCachedPrefix(d, Tokens(32)), 16);
  EXPECT_EQ(cache.AttachCachedPrefix(cache.CreateSequence(), Tokens(40, 5)), 0);
  // Three holders of page 0: freeing two keeps it held.
  cache.Free(c);
  cache.Free(d);
  EXPECT_EQ(cache.evictable_pages(), 0);
  cache.Free(b);
  EXPECT_EQ(cache.evictable_pages(), 2);
}

TEST(PrefixCacheTest, EvictsLeastRecentlyReleasedAndNeverAHeldPage) {
  PagedKvCache cache(4, 4);
  const std::vector<int32_t> first = Tokens(9), second = Tokens(9, 500);
  for (const auto& tokens : {first, second}) {
    const SeqId s = cache.CreateSequence();
    ASSERT_TRUE(cache.Reserve(s, 8).ok());
    cache.CachePages(s, tokens);
    cache.Free(s);
  }
  EXPECT_EQ(cache.evictable_pages(), 4);
  // Three pages: the first prefix goes (its last page, then its first), then the second's last
  // page; the second prefix's first page survives.
  const SeqId big = cache.CreateSequence();
  ASSERT_TRUE(cache.Reserve(big, 12).ok());
  EXPECT_EQ(cache.AttachCachedPrefix(cache.CreateSequence(), first), 0);
  const SeqId holder = cache.CreateSequence();
  EXPECT_EQ(cache.AttachCachedPrefix(holder, second), 4);
  // The held page is not evictable: a request for it fails instead.
  EXPECT_EQ(cache.free_pages(), 0);
  EXPECT_EQ(cache.Reserve(cache.CreateSequence(), 1).code(), absl::StatusCode::kResourceExhausted);
  cache.Free(big);
  EXPECT_EQ(cache.free_pages(), 3);
}

// Two sequences that computed the same prefix: the first one's pages are cached, the second's
// go back to the free list when it ends.
TEST(PrefixCacheTest, ADuplicatePrefixStaysOutOfTheCache) {
  PagedKvCache cache(8, 4);
  const std::vector<int32_t> tokens = Tokens(8);
  const SeqId a = cache.CreateSequence(), b = cache.CreateSequence();
  ASSERT_TRUE(cache.Reserve(a, 8).ok());
  ASSERT_TRUE(cache.Reserve(b, 8).ok());
  cache.CachePages(a, tokens);
  cache.CachePages(b, tokens);
  EXPECT_EQ(cache.cached_pages(), 2);
  cache.Free(b);
  EXPECT_EQ(cache.evictable_pages(), 0);
  cache.Free(a);
  EXPECT_EQ(cache.evictable_pages(), 2);
  const SeqId c = cache.CreateSequence();
  EXPECT_EQ(cache.AttachCachedPrefix(c, Tokens(9)), 8);
  // A sequence that attached its prefix and grew caches its own later pages after them.
  ASSERT_TRUE(cache.Reserve(c, 12).ok());
  cache.CachePages(c, Tokens(12));
  EXPECT_EQ(cache.cached_pages(), 3);
  cache.Free(c);
  EXPECT_EQ(cache.AttachCachedPrefix(cache.CreateSequence(), Tokens(13)), 12);
}

// CachePages as pages complete: each call goes on from the last, and the result is what one
// call at the end gives. A chain that stood on another sequence's page which was evicted and
// reused since starts again from the first page, so its later pages still match.
TEST(PrefixCacheTest, CachingAsPagesCompleteEqualsCachingAtTheEnd) {
  PagedKvCache cache(12, 4);
  const std::vector<int32_t> tokens = Tokens(20);
  const SeqId a = cache.CreateSequence();
  for (int n = 1; n <= 20; ++n) {
    ASSERT_TRUE(cache.Reserve(a, n).ok());
    cache.CachePages(a, absl::MakeConstSpan(tokens).subspan(0, n));
    EXPECT_EQ(cache.cached_pages(), n / 4) << n;
  }
  cache.Free(a);
  EXPECT_EQ(cache.AttachCachedPrefix(cache.CreateSequence(), Tokens(21)), 20);

  // b walks its first page onto a's cached page 0 (unheld), which is then evicted and reused;
  // b's later pages are still cached under its own first page.
  PagedKvCache small(3, 4);
  const SeqId first = small.CreateSequence();
  ASSERT_TRUE(small.Reserve(first, 4).ok());
  small.CachePages(first, Tokens(4));
  small.Free(first);  // its page is cached, unheld
  const SeqId b = small.CreateSequence();
  ASSERT_TRUE(small.Reserve(b, 4).ok());
  small.CachePages(b, Tokens(4));  // found under `first`'s page: b's own page stays out
  const SeqId hog = small.CreateSequence();
  ASSERT_TRUE(small.Reserve(hog, 8).ok());  // evicts the cached page for new contents
  small.Free(hog);
  ASSERT_TRUE(small.Reserve(b, 8).ok());
  small.CachePages(b, Tokens(8));
  small.Free(b);
  EXPECT_EQ(small.AttachCachedPrefix(small.CreateSequence(), Tokens(9)), 8);
}

TEST(PrefixIndexTest, MatchesOnlyTheSameTokensAfterTheSameParentContents) {
  PrefixIndex index(4);
  const std::vector<int32_t> root = {1, 2}, child = {3, 4};
  const uint64_t root_key = PrefixIndex::Key(PrefixIndex::kRootKey, root);
  const uint64_t child_key = PrefixIndex::Key(root_key, child);
  index.Insert(0, root_key, -1, root);
  index.Insert(1, child_key, 0, child);
  EXPECT_EQ(index.Find(root_key, -1, root), 0);
  EXPECT_EQ(index.Find(child_key, 0, child), 1);
  // A key that matches with other tokens (a collision) is a miss.
  EXPECT_EQ(index.Find(root_key, -1, std::vector<int32_t>{1, 9}), -1);
  // The parent page handed out for other contents: its old children no longer match.
  index.Erase(0);
  index.NewGeneration(0);
  index.Insert(0, root_key, -1, root);
  EXPECT_EQ(index.Find(child_key, 0, child), -1);
}

}  // namespace
}  // namespace treespec
