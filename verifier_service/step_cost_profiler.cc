#include "verifier_service/step_cost_profiler.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/util/status_macros.h"

namespace treespec {
namespace {

absl::Status CheckOptions(const StepCostProfileOptions& o) {
  if (o.max_batch < 1) return absl::InvalidArgumentError("step cost profile: max_batch < 1");
  if (o.max_tree_nodes < 0) {
    return absl::InvalidArgumentError("step cost profile: max_tree_nodes < 0");
  }
  if (o.max_step_rows < 2 * o.max_batch) {
    return absl::InvalidArgumentError(absl::StrCat(
        "step cost profile: max_step_rows ", o.max_step_rows, " must be at least twice max_batch (",
        o.max_batch, "), so that every batch size is timed with and without a drafted node"));
  }
  if (o.max_context < 0) return absl::InvalidArgumentError("step cost profile: max_context < 0");
  if (o.reps < 1) return absl::InvalidArgumentError("step cost profile: reps < 1");
  if (!(o.max_seconds > 0)) {
    return absl::InvalidArgumentError("step cost profile: max_seconds must be positive");
  }
  if (!o.now) return absl::InvalidArgumentError("step cost profile: no clock");
  return absl::OkStatus();
}

// The verify tree of one sequence: the bonus and `drafted` nodes, a binary tree in breadth-first
// order (node i's parent is (i - 1) / 2), so the depth grows with the log of the size as a
// DDTree's bushy top does.
SeqTree ProfileTree(SeqId seq, int committed_len, int drafted, int vocab) {
  SeqTree tree;
  tree.seq = seq;
  tree.committed_len = committed_len;
  for (int i = 0; i <= drafted; ++i) {
    tree.tokens.push_back(static_cast<int32_t>((static_cast<int64_t>(i) * 7919 + seq) % vocab));
    tree.parents.push_back(i == 0 ? -1 : (i - 1) / 2);
  }
  return tree;
}

// The order a pair times the drafted points 0 .. last: 0 and 1 (cheap, and always timed), then
// the largest, then the middles of the spans between timed points, breadth first. A pair cut
// short by its time share after the largest still spans the whole axis (a step's cost is flat
// while the GEMMs stream the weights, then grows with the rows: extending the smallest trees
// would miss that bend); one cut short before it extends its first two.
std::vector<size_t> CoarseToFine(size_t last) {
  std::vector<size_t> order = {0};
  if (last >= 1) order.push_back(1);
  if (last <= 1) return order;
  order.push_back(last);
  std::vector<std::pair<size_t, size_t>> spans = {{1, last}};
  for (size_t next = 0; next < spans.size(); ++next) {
    const auto [lo, hi] = spans[next];
    if (hi - lo < 2) continue;
    const size_t mid = (lo + hi) / 2;
    order.push_back(mid);
    spans.push_back({lo, mid});
    spans.push_back({mid, hi});
  }
  return order;
}

// The (batch bi, context ci) pair's drafted points that were not timed: those between two timed
// points by the straight line between them; those past the last timed point (above
// max_step_rows, where a step's cost is linear in its rows) by the least-squares slope of the
// last (up to) four timed points, never decreasing: one noisy point cannot bend the extension
// as a two-point slope would.
void FillUntimed(const StepCostGrid& grid, size_t bi, size_t ci, const std::vector<bool>& timed,
                 std::vector<double>& ms) {
  auto at = [&](size_t di) -> double& { return ms[grid.Index(bi, di, ci)]; };
  std::vector<size_t> points;
  for (size_t di = 0; di < timed.size(); ++di) {
    if (timed[di]) points.push_back(di);
  }
  for (size_t k = 0; k + 1 < points.size(); ++k) {
    const size_t lo = points[k], hi = points[k + 1];
    const double d_lo = grid.drafted[lo], d_hi = grid.drafted[hi];
    for (size_t di = lo + 1; di < hi; ++di) {
      at(di) = at(lo) + (at(hi) - at(lo)) * (grid.drafted[di] - d_lo) / (d_hi - d_lo);
    }
  }
  const size_t last = points.back();
  if (last + 1 == timed.size()) return;
  const size_t first_fit = points.size() > 4 ? points.size() - 4 : 0;
  double mean_d = 0, mean_v = 0;
  for (size_t k = first_fit; k < points.size(); ++k) {
    mean_d += grid.drafted[points[k]];
    mean_v += at(points[k]);
  }
  const double n = static_cast<double>(points.size() - first_fit);
  mean_d /= n;
  mean_v /= n;
  double sdv = 0, sdd = 0;
  for (size_t k = first_fit; k < points.size(); ++k) {
    const double dd = grid.drafted[points[k]] - mean_d;
    sdv += dd * (at(points[k]) - mean_v);
    sdd += dd * dd;
  }
  const double slope = sdd > 0 ? std::max(0.0, sdv / sdd) : 0.0;
  for (size_t di = last + 1; di < timed.size(); ++di) {
    at(di) = at(last) + slope * (grid.drafted[di] - grid.drafted[last]);
  }
}

// Frees the profile's sequences however the profile ends.
class Sequences {
 public:
  Sequences(CausalLm& model, int count) : model_(model) {
    for (int i = 0; i < count; ++i) ids_.push_back(model.CreateSequence());
  }
  ~Sequences() {
    for (SeqId s : ids_) model_.FreeSequence(s);
  }
  SeqId operator[](int i) const { return ids_[i]; }

 private:
  CausalLm& model_;
  std::vector<SeqId> ids_;
};

}  // namespace

StepCostGrid PlanStepCostGrid(const StepCostProfileOptions& options, int context_length,
                              int kv_pages, int page_size) {
  StepCostGrid grid;
  for (int b = 1; b < options.max_batch; b *= 2) grid.batch.push_back(b);
  grid.batch.push_back(options.max_batch);
  // 0, 1, 2, 3, then 4, 6, 8, 12, 16, 24, ...: about √2 apart.
  for (int d = 0; d < options.max_tree_nodes && d < 4; ++d) grid.drafted.push_back(d);
  for (int p = 4; p < options.max_tree_nodes; p *= 2) {
    grid.drafted.push_back(p);
    if (p + p / 2 < options.max_tree_nodes) grid.drafted.push_back(p + p / 2);
  }
  grid.drafted.push_back(options.max_tree_nodes);
  const int tree_slots = options.max_tree_nodes + 1;
  const int64_t per_sequence =
      static_cast<int64_t>(kv_pages / options.max_batch) * page_size - tree_slots;
  const int largest = static_cast<int>(std::max<int64_t>(
      0, std::min<int64_t>({options.max_context, context_length - tree_slots, per_sequence})));
  for (int c : {std::min(64, largest), largest / 8, largest}) {
    if (grid.context.empty() || c > grid.context.back()) grid.context.push_back(c);
  }
  return grid;
}

absl::StatusOr<StepCostModel> ProfileStepCost(CausalLm& model,
                                              const StepCostProfileOptions& options) {
  RETURN_IF_ERROR(CheckOptions(options));
  const ModelConfig& config = model.config();
  PagedKvCache& kv = model.kv_cache();
  const StepCostGrid grid =
      PlanStepCostGrid(options, config.max_position_embeddings, kv.num_pages(), kv.page_size());
  std::vector<double> ms(grid.size(), 0);
  const Sequences seqs(model, options.max_batch);
  const absl::Duration share = absl::Seconds(options.max_seconds) /
                               static_cast<double>(grid.batch.size() * grid.context.size());
  for (size_t bi = 0; bi < grid.batch.size(); ++bi) {
    const int batch = grid.batch[bi];
    for (size_t ci = 0; ci < grid.context.size(); ++ci) {
      const int context = grid.context[ci];
      for (int s = 0; s < batch; ++s) {
        model.Truncate(seqs[s], 0);
        RETURN_IF_ERROR(kv.Reserve(seqs[s], context));
      }
      const absl::Time pair_start = options.now();
      // The drafted points a step of `batch` may time, coarse to fine.
      size_t fit = 0;
      while (fit + 1 < grid.drafted.size() &&
             batch * (grid.drafted[fit + 1] + 1) <= options.max_step_rows) {
        ++fit;
      }
      std::vector<bool> timed(grid.drafted.size(), false);
      const std::vector<size_t> order = CoarseToFine(fit);
      for (size_t k = 0; k < order.size(); ++k) {
        const size_t di = order[k];
        if (k >= 2) {
          // Past the share, stop; a point whose steps would overrun it (by the slope of the
          // first two points, a CPU step's cost being its rows) is left to the interpolation.
          const absl::Duration left = share - (options.now() - pair_start);
          if (left <= absl::ZeroDuration()) break;
          const double at_1 = ms[grid.Index(bi, 1, ci)];
          const double per_node = std::max(0.0, at_1 - ms[grid.Index(bi, 0, ci)]);
          const double step_ms = at_1 + per_node * (grid.drafted[di] - grid.drafted[1]);
          if (absl::Milliseconds((options.reps + 1) * step_ms) > left) continue;
        }
        const int drafted = grid.drafted[di];
        std::vector<SeqTree> trees;
        for (int s = 0; s < batch; ++s) {
          trees.push_back(ProfileTree(seqs[s], context, drafted, config.vocab_size));
        }
        const std::vector<StepSpec> specs(batch);
        std::vector<double> times;
        for (int rep = 0; rep <= options.reps; ++rep) {
          const absl::Time start = options.now();
          RETURN_IF_ERROR(model.VerifyStep(trees, specs).status());
          const absl::Time end = options.now();
          for (int s = 0; s < batch; ++s) model.Truncate(seqs[s], context);
          if (rep > 0) times.push_back(absl::ToDoubleMilliseconds(end - start));
        }
        std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
        ms[grid.Index(bi, di, ci)] = std::max(times[times.size() / 2], 1e-3);
        timed[di] = true;
      }
      FillUntimed(grid, bi, ci, timed, ms);
    }
  }
  for (int s = 0; s < options.max_batch; ++s) model.Truncate(seqs[s], 0);
  return StepCostModel::Create(grid, std::move(ms));
}

absl::StatusOr<StepCostModel> LoadOrProfileStepCost(CausalLm& model,
                                                    const StepCostProfileOptions& options,
                                                    const std::string& cache_path,
                                                    const std::string& key, bool* profiled) {
  *profiled = false;
  if (!cache_path.empty()) {
    std::ifstream in(cache_path);
    if (in) {
      std::stringstream text;
      text << in.rdbuf();
      absl::StatusOr<StepCostModel> cached = StepCostModel::FromJson(text.str(), key);
      if (cached.ok()) return cached;
    }
  }
  ASSIGN_OR_RETURN(StepCostModel measured, ProfileStepCost(model, options));
  *profiled = true;
  if (!cache_path.empty()) {
    const std::string temporary = cache_path + ".tmp";
    {
      std::ofstream out(temporary, std::ios::trunc);
      out << measured.ToJson(key);
      if (!out.flush()) {
        return absl::PermissionDeniedError(
            absl::StrCat("cannot write the step cost model to ", temporary));
      }
    }
    if (std::rename(temporary.c_str(), cache_path.c_str()) != 0) {
      return absl::PermissionDeniedError(
          absl::StrCat("cannot move the step cost model to ", cache_path));
    }
  }
  return measured;
}

}  // namespace treespec
