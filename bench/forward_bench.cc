// treespec-forward-bench: wall time of one CPU verify forward — a single token and trees of n
// nodes — after a committed prefix of several lengths, on a real model directory.
//
//   treespec-forward-bench [--model=models/tiny-target] [--contexts=128,1024]
//                          [--nodes=1,5,17] [--reps=30] [--tp=1] [--json=out.json]
//
// Trees are random (each node's parent drawn among earlier nodes); the prefix is prefilled
// once per context and the tree slots are truncated after every repetition, so each run
// measures the same work. Prints min and median over --reps.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "common/model/causal_lm.h"

ABSL_FLAG(std::string, model, "models/tiny-target", "model directory");
ABSL_FLAG(std::vector<std::string>, contexts, std::vector<std::string>({"128", "1024"}),
          "committed prefix lengths");
ABSL_FLAG(std::vector<std::string>, nodes, std::vector<std::string>({"1", "5", "17"}),
          "tree sizes (bonus included)");
ABSL_FLAG(int, reps, 30, "timed repetitions per point");
ABSL_FLAG(int, tp, 1, "tensor-parallel ranks (threads)");
ABSL_FLAG(std::string, json, "", "write the results here as JSON");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("Wall time of one CPU verify forward by tree size and context.");
  absl::ParseCommandLine(argc, argv);
  treespec::LmOptions options;
  options.tensor_parallel = absl::GetFlag(FLAGS_tp);
  options.max_batch = 2;
  auto lm = treespec::LoadCpuCausalLm(absl::GetFlag(FLAGS_model), options);
  if (!lm.ok()) {
    std::fprintf(stderr, "%s\n", lm.status().ToString().c_str());
    return 1;
  }
  treespec::CausalLm& model = **lm;
  const int vocab = model.config().vocab_size;
  std::mt19937 rng(1);
  nlohmann::json results = nlohmann::json::array();
  for (const std::string& c : absl::GetFlag(FLAGS_contexts)) {
    const int context = std::stoi(c);
    const treespec::SeqId seq = model.CreateSequence();
    treespec::SeqTree prefix;
    prefix.seq = seq;
    for (int i = 0; i < context; ++i) {
      prefix.tokens.push_back(static_cast<int32_t>(rng() % vocab));
      prefix.parents.push_back(i - 1);
    }
    if (!model.Forward({prefix}).ok()) return 1;
    for (const std::string& n_text : absl::GetFlag(FLAGS_nodes)) {
      const int n = std::stoi(n_text);
      treespec::SeqTree tree;
      tree.seq = seq;
      tree.committed_len = context;
      for (int i = 0; i < n; ++i) {
        tree.tokens.push_back(static_cast<int32_t>(rng() % vocab));
        tree.parents.push_back(i == 0 ? -1 : static_cast<int32_t>(rng() % i));
      }
      std::vector<double> ms;
      for (int r = 0; r < absl::GetFlag(FLAGS_reps) + 3; ++r) {
        const auto start = std::chrono::steady_clock::now();
        if (!model.Forward({tree}).ok()) return 1;
        const auto end = std::chrono::steady_clock::now();
        model.Truncate(seq, context);
        if (r >= 3) ms.push_back(std::chrono::duration<double, std::milli>(end - start).count());
      }
      std::sort(ms.begin(), ms.end());
      const double min = ms.front(), median = ms[ms.size() / 2];
      std::printf("context %5d  nodes %3d  min %7.3f ms  median %7.3f ms\n", context, n, min,
                  median);
      results.push_back({{"context", context},
                         {"nodes", n},
                         {"min_ms", min},
                         {"median_ms", median},
                         {"tp", absl::GetFlag(FLAGS_tp)}});
    }
    model.FreeSequence(seq);
  }
  if (!absl::GetFlag(FLAGS_json).empty()) {
    std::ofstream(absl::GetFlag(FLAGS_json)) << results.dump(1) << "\n";
  }
  return 0;
}
