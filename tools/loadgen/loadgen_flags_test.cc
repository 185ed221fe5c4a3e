// treespec-loadgen as a user meets it: every bad flag ends with a message naming it and a
// non-zero exit (never a crash), and so do an unreadable dataset, an unwritable output and a
// target that does not answer.
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace treespec::loadgen {
namespace {

using ::testing::HasSubstr;

struct Exit {
  int code = -1;       // the exit status, or 128 + signal
  std::string output;  // stdout and stderr
};

Exit RunLoadgen(const std::string& flags) {
  const std::string command =
      std::string(TREESPEC_BIN_DIR) + "/treespec-loadgen --progress=false " + flags + " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  Exit e;
  if (pipe == nullptr) return e;
  std::array<char, 4096> buffer;
  for (size_t n; (n = fread(buffer.data(), 1, buffer.size(), pipe)) > 0;) {
    e.output.append(buffer.data(), n);
  }
  const int status = pclose(pipe);
  e.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return e;
}

TEST(LoadgenFlagsTest, BadFlagsExitTwoNamingTheFlag) {
  const std::pair<const char*, const char*> cases[] = {
      {"--num_prompts=0", "--num_prompts: 0: must be >= 1"},
      {"--request_rate=-1", "--request_rate: -1"},
      {"--arrival=weibull", "--arrival: arrival process \"weibull\""},
      {"--burstiness=0 --arrival=gamma", "--burstiness: 0"},
      {"--mode=fast", "--mode: 'fast'"},
      {"--goodput=ttft", "--goodput: 'ttft'"},
      {"--goodput=latency:5", "unknown metric 'latency'"},
      {"--percentiles=200", "--percentiles: '200'"},
      {"--dataset_name=sharegpt", "--dataset_name: 'sharegpt'"},
      {"--dataset_name=jsonl", "--dataset_path: required"},
      {"--random_range_ratio=1.5", "--random_range_ratio: 1.5"},
      {"--max_concurrency=-1", "--max_concurrency: -1"},
      {"--check_metrics", "--check_metrics: needs --metrics_urls"},
      {"--metrics_urls=nohost", "--metrics_urls: metrics address 'nohost'"},
      {"--target=", "--target"},
      {"--workload=chat", "--workload: 'chat'"},
      {"--workload=conversation --turns=0", "--turns: 0: must be >= 1"},
      {"--workload=conversation --dataset_path=x.jsonl", "--workload: conversation sends"},
      {"--workload=conversation --think_time_ms=-5", "--think_time_ms: -5"},
      {"--workload=mixed --streams=0", "--streams: 0: must be >= 1"},
      {"extra", "unexpected argument 'extra'"},
  };
  for (const auto& [flags, message] : cases) {
    const Exit e = RunLoadgen(flags);
    EXPECT_EQ(e.code, 2) << flags << "\n" << e.output;
    EXPECT_THAT(e.output, HasSubstr(message)) << flags;
  }
}

TEST(LoadgenFlagsTest, UnparsableValuesAreRefusedByTheFlagParser) {
  for (const char* flags : {"--request_rate=fast", "--num_prompts=1e3x", "--no_such_flag=1"}) {
    const Exit e = RunLoadgen(flags);
    EXPECT_NE(e.code, 0) << flags;
    EXPECT_LT(e.code, 128) << flags << " crashed:\n" << e.output;
    EXPECT_THAT(e.output, HasSubstr(std::string(flags).substr(2, 8))) << flags;
  }
}

TEST(LoadgenFlagsTest, UnusableInputsAndTargetsExitOneNamingThem) {
  Exit e = RunLoadgen("--dataset_path=/nonexistent/prompts.jsonl");
  EXPECT_EQ(e.code, 1) << e.output;
  EXPECT_THAT(e.output, HasSubstr("cannot read the dataset /nonexistent/prompts.jsonl"));
  e = RunLoadgen("--result_json=/nonexistent-dir/out.json");
  EXPECT_EQ(e.code, 1) << e.output;
  EXPECT_THAT(e.output, HasSubstr("cannot write /nonexistent-dir/out.json"));
  // Port 1 on loopback: nothing listens there.
  e = RunLoadgen("--target=127.0.0.1:1 --connect_timeout_s=1 --num_prompts=1");
  EXPECT_EQ(e.code, 1) << e.output;
  EXPECT_THAT(e.output, HasSubstr("target 127.0.0.1:1: GetModelInfo"));
}

}  // namespace
}  // namespace treespec::loadgen
