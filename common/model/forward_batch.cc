#include "common/model/forward_batch.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"

namespace treespec {
namespace {

// Reserves slots [0, need) of every (sequence, need), all or nothing: on the first failure the
// sequences reserved so far are truncated back.
absl::Status ReserveAll(PagedKvCache& cache, absl::Span<const std::pair<SeqId, int>> needs) {
  std::vector<int> before(needs.size());
  for (size_t b = 0; b < needs.size(); ++b) {
    before[b] = cache.num_reserved_slots(needs[b].first);
    absl::Status status = cache.Reserve(needs[b].first, needs[b].second);
    if (!status.ok()) {
      for (size_t u = 0; u < b; ++u) cache.Truncate(needs[u].first, before[u]);
      return status;
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateForwardBatch(const ModelConfig& config, PagedKvCache& cache,
                                  absl::Span<const SeqTree> batch) {
  absl::flat_hash_set<SeqId> seen;
  for (size_t b = 0; b < batch.size(); ++b) {
    const SeqTree& s = batch[b];
    const std::string where = absl::StrCat("batch entry ", b, " (sequence ", s.seq, "): ");
    if (!seen.insert(s.seq).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "sequence appears more than once in the batch"));
    }
    // Reserving 0 slots changes nothing; it only tells whether the sequence exists.
    if (!cache.Reserve(s.seq, 0).ok()) {
      return absl::InvalidArgumentError(absl::StrCat(where, "unknown sequence"));
    }
    const int n = static_cast<int>(s.tokens.size());
    if (n == 0) return absl::InvalidArgumentError(absl::StrCat(where, "empty tree"));
    if (s.parents.size() != s.tokens.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, s.tokens.size(), " tokens but ", s.parents.size(), " parents"));
    }
    for (int i = 0; i < n; ++i) {
      if (s.tokens[i] < 0 || s.tokens[i] >= config.vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat(where, "token id ", s.tokens[i], " of node ",
                                                       i, " out of range [0, ", config.vocab_size,
                                                       ")"));
      }
      if (s.parents[i] < -1 || s.parents[i] >= i) {
        return absl::InvalidArgumentError(absl::StrCat(where, "parent ", s.parents[i], " of node ",
                                                       i, " out of range [-1, ", i, ")"));
      }
    }
    if (s.first_new < 0 || s.first_new > n) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "first_new ", s.first_new, " out of range [0, ", n, "]"));
    }
    if (s.bidirectional) {
      if (s.first_new != 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, "a bidirectional tree is computed whole (first_new ", s.first_new, ", want 0)"));
      }
      for (int i = 0; i < n; ++i) {
        if (s.parents[i] != i - 1) {
          return absl::InvalidArgumentError(
              absl::StrCat(where, "a bidirectional tree is a chain, but node ", i, " has parent ",
                           s.parents[i]));
        }
      }
    }
    const int reserved = cache.num_reserved_slots(s.seq);
    if (s.committed_len < 0 || s.committed_len + s.first_new > reserved) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "committed_len ", s.committed_len, " + first_new ", s.first_new,
                       " exceeds the sequence's ", reserved, " reserved slots"));
    }
    if (static_cast<int64_t>(s.committed_len) + n > config.max_position_embeddings) {
      return absl::InvalidArgumentError(absl::StrCat(where, "committed_len ", s.committed_len,
                                                     " + ", n, " nodes exceeds the context of ",
                                                     config.max_position_embeddings, " tokens"));
    }
  }
  return absl::OkStatus();
}

absl::Status ReserveContextRows(const ModelConfig& config, PagedKvCache& cache,
                                absl::Span<const ContextRows> batch) {
  if (config.context_width == 0) {
    return absl::FailedPreconditionError(
        "context rows: this model has no context projection (not a DFlash drafter)");
  }
  absl::flat_hash_set<SeqId> seen;
  for (size_t b = 0; b < batch.size(); ++b) {
    const ContextRows& e = batch[b];
    const std::string where =
        absl::StrCat("context rows of sequence ", e.seq, " (entry ", b, "): ");
    if (e.rows == nullptr) return absl::InvalidArgumentError(absl::StrCat(where, "no rows"));
    const TargetFeatures& rows = *e.rows;
    if (rows.width != config.context_width ||
        rows.bf16.size() != static_cast<size_t>(rows.rows) * rows.width) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, rows.rows, " rows of width ", rows.width, " in ", rows.bf16.size(),
                       " values; this model reads rows of width ", config.context_width));
    }
    if (!cache.Reserve(e.seq, 0).ok()) {
      return absl::InvalidArgumentError(absl::StrCat(where, "unknown sequence"));
    }
    if (!seen.insert(e.seq).second) {
      return absl::InvalidArgumentError(absl::StrCat(where, "the sequence is in the batch twice"));
    }
    const int reserved = cache.num_reserved_slots(e.seq);
    if (e.committed_len < 0 || e.committed_len > reserved) {
      return absl::InvalidArgumentError(absl::StrCat(where, "committed_len ", e.committed_len,
                                                     " outside the sequence's ", reserved,
                                                     " reserved slots"));
    }
    if (static_cast<int64_t>(e.committed_len) + rows.rows > config.max_position_embeddings) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "committed_len ", e.committed_len, " + ", rows.rows,
                       " rows exceeds the context of ", config.max_position_embeddings, " tokens"));
    }
  }
  std::vector<std::pair<SeqId, int>> needs;
  for (const ContextRows& e : batch) needs.emplace_back(e.seq, e.committed_len + e.rows->rows);
  return ReserveAll(cache, needs);
}

absl::Status ReserveForwardBatch(PagedKvCache& cache, absl::Span<const SeqTree> batch) {
  std::vector<std::pair<SeqId, int>> needs;
  for (const SeqTree& t : batch) {
    needs.emplace_back(t.seq, t.committed_len + static_cast<int>(t.tokens.size()));
  }
  return ReserveAll(cache, needs);
}

}  // namespace treespec
