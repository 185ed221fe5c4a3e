#include "tests/generate_client.h"

#include <chrono>

#include "common/rpc/bearer_auth.h"

namespace treespec::testing {

Outcome Generate(v1::Generation::Stub* stub, const v1::GenerateRequest& request, double timeout_s,
                 const std::string& bearer_token) {
  Outcome out;
  grpc::ClientContext ctx;
  AddBearerToken(bearer_token, &ctx);
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1e3)));
  auto reader = stub->Generate(&ctx, request);
  v1::GenerateResponse response;
  while (reader->Read(&response)) {
    out.ids.insert(out.ids.end(), response.token_ids().begin(), response.token_ids().end());
    out.text += response.text();
    out.last = response;
  }
  out.status = reader->Finish();
  return out;
}

v1::GenerateRequest TextRequest(const std::string& text, v1::SpeculationMode mode, int max_new) {
  v1::GenerateRequest r;
  r.set_text(text);
  r.set_return_text(true);
  r.mutable_sampling()->set_max_new_tokens(max_new);
  r.mutable_sampling()->set_ignore_eos(true);
  r.mutable_speculation()->set_mode(mode);
  return r;
}

const std::vector<std::string>& CodePrompts() {
  static const std::vector<std::string> prompts = {
      "import os\nimport sys\n\n\ndef main(argv):\n    ",
      "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, x):\n",
      "for i in range(10):\n    if i % 2 == 0:\n        print(",
      "def read_config(path):\n    with open(path) as f:\n        return json.",
      "    def __repr__(self):\n        return '%s(%r)' % (self.__class__.__name__, ",
      "try:\n    import threading\nexcept ImportError:\n    ",
  };
  return prompts;
}

}  // namespace treespec::testing
