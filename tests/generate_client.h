// The client side shared by the cross-service tests: one streaming Generate call collected.
#ifndef TREESPEC_TESTS_GENERATE_CLIENT_H_
#define TREESPEC_TESTS_GENERATE_CLIENT_H_

#include <grpcpp/grpcpp.h>

#include <string>
#include <vector>

#include "treespec/v1/generation.grpc.pb.h"

namespace treespec::testing {

struct Outcome {
  grpc::Status status;
  std::vector<int32_t> ids;   // all streamed token ids
  std::string text;           // all streamed text
  v1::GenerateResponse last;  // the final message (usage, stats)
};

// Runs one Generate call to the end, with `bearer_token` as its authorization unless empty.
Outcome Generate(v1::Generation::Stub* stub, const v1::GenerateRequest& request,
                 double timeout_s = 300, const std::string& bearer_token = "");

// A text prompt, greedy, ignoring EOS so every run has the same length, with text deltas.
v1::GenerateRequest TextRequest(const std::string& text, v1::SpeculationMode mode, int max_new);

// Short Python snippets in the style the tiny pair was trained on (a function, not a global,
// so other translation units may use it during static initialisation).
const std::vector<std::string>& CodePrompts();

}  // namespace treespec::testing

#endif  // TREESPEC_TESTS_GENERATE_CLIENT_H_
