// Bearer tokens on the verifier's public API over the real binaries on loopback (issue 5):
//   - with --auth_token_file, Generation calls without a token, or with one the file does not
//     hold, get UNAUTHENTICATED saying what to send (never echoing the token); either token of
//     the file works; grpc.health.v1 answers without one (Kubernetes probes);
//   - treespec-cli and treespec-loadgen send the first token of their --auth_token_file;
//   - a missing or empty token file stops the verifier at start naming the flag;
//   - the verifier's log (INFO, the default level) holds neither the prompt's text nor its ids.
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "tests/generate_client.h"
#include "tests/process.h"
#include "treespec/v1/generation.grpc.pb.h"

namespace treespec {
namespace {

namespace fs = std::filesystem;
using testing::ChildProcess;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::Outcome;
using testing::TextRequest;

const std::string kRoot = TREESPEC_SOURCE_DIR;
const std::string kBin = TREESPEC_BIN_DIR;
// Both lines of the verifier's token file; clients send the first line of theirs.
const std::string kNewToken = "new-token-7f3a9c";
const std::string kOldToken = "old-token-19c2e4";
// A prompt that appears nowhere else, by text and by ids.
const std::string kSecretText = "def treespec_secret_marker_4417(x):\n    return ";
const std::vector<int32_t> kSecretIds = {311, 127, 409, 283, 167};

class AuthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/treespec-auth-XXXXXX";
    dir_ = mkdtemp(pattern);
    std::ofstream(File("tokens")) << kNewToken << "\n" << kOldToken << "\n";
    std::ofstream(File("old_token")) << kOldToken << "\n";
    std::ofstream(File("wrong_token")) << kNewToken << "x\n";
    std::ofstream(File("empty")) << "\n";
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string File(const std::string& name) const { return dir_ + "/" + name; }

  // The exit status of a shell command whose output goes to `log`; the output in `*output`.
  int Shell(const std::string& command, const std::string& log, std::string* output) const {
    const int status = std::system((command + " > " + File(log) + " 2>&1").c_str());
    std::ifstream in(File(log));
    output->assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

  std::string dir_;
};

grpc::health::v1::HealthCheckResponse::ServingStatus Health(const std::string& address) {
  auto health = grpc::health::v1::Health::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  grpc::health::v1::HealthCheckResponse response;
  const grpc::Status status =
      health->Check(&context, grpc::health::v1::HealthCheckRequest(), &response);
  EXPECT_TRUE(status.ok()) << status.error_message();
  return response.status();
}

TEST_F(AuthTest, GenerationNeedsAnAcceptedTokenAndHealthDoesNot) {
  ChildProcess verifier({kBin + "/treespec-verifier", "--model=" + kRoot + "/models/tiny-target",
                         "--port=0", "--metrics_port=-1", "--auth_token_file=" + File("tokens")},
                        File("verifier.log"));
  const std::string address = verifier.WaitForAddress(60);
  ASSERT_FALSE(address.empty()) << verifier.Stderr();
  auto stub =
      v1::Generation::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  const v1::GenerateRequest request = TextRequest(kSecretText, v1::SPECULATION_MODE_OFF, 8);

  EXPECT_EQ(Health(address), grpc::health::v1::HealthCheckResponse::SERVING);

  const Outcome none = testing::Generate(stub.get(), request, 30);
  EXPECT_EQ(none.status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(none.status.error_message(), HasSubstr("authorization: Bearer <token>"));
  EXPECT_TRUE(none.ids.empty());
  grpc::ClientContext info_context;
  v1::ModelInfo info;
  EXPECT_EQ(stub->GetModelInfo(&info_context, v1::GetModelInfoRequest(), &info).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  const Outcome wrong = testing::Generate(stub.get(), request, 30, kNewToken + "x");
  EXPECT_EQ(wrong.status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(wrong.status.error_message(), Not(HasSubstr(kNewToken)));

  for (const std::string& token : {kNewToken, kOldToken}) {
    const Outcome ok = testing::Generate(stub.get(), request, 30, token);
    EXPECT_TRUE(ok.status.ok()) << token << ": " << ok.status.error_message();
    EXPECT_EQ(ok.ids.size(), 8u) << token;
  }
  v1::GenerateRequest by_ids = request;
  by_ids.mutable_token_ids()->mutable_ids()->Add(kSecretIds.begin(), kSecretIds.end());
  EXPECT_TRUE(testing::Generate(stub.get(), by_ids, 30, kNewToken).status.ok());

  // The CLI and the load harness send the first line of their file (the CLI's is the verifier's
  // second token); with a wrong token or none they are refused.
  std::string out;
  const std::string cli = kBin + "/treespec-cli info --target=" + address;
  EXPECT_EQ(Shell(cli + " --auth_token_file=" + File("old_token"), "cli.out", &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("model_name"));
  EXPECT_EQ(Shell(cli + " --auth_token_file=" + File("wrong_token"), "cli.out", &out), 1) << out;
  EXPECT_THAT(out, HasSubstr("bearer token is not accepted"));
  const std::string loadgen = kBin + "/treespec-loadgen --target=" + address +
                              " --num_prompts=4 --random_input_len=8 --random_output_len=4" +
                              " --progress=false --result_json=" + File("loadgen.json");
  EXPECT_EQ(Shell(loadgen + " --auth_token_file=" + File("tokens"), "loadgen.out", &out), 0) << out;
  std::ifstream summary(File("loadgen.json"));
  EXPECT_THAT(std::string(std::istreambuf_iterator<char>(summary), {}),
              HasSubstr("\"completed\": 4"));
  EXPECT_EQ(Shell(loadgen, "loadgen.out", &out), 1) << out;
  EXPECT_THAT(out, HasSubstr("UNAUTHENTICATED"));

  verifier.Signal(SIGTERM);
  EXPECT_EQ(verifier.Wait(30), 0) << verifier.Stderr();
  // The requests were logged (one line each), but not what they asked or which token came.
  const std::string log = verifier.Stderr();
  EXPECT_THAT(log, HasSubstr(" done: "));
  EXPECT_THAT(log, Not(HasSubstr("treespec_secret_marker_4417")));
  std::string ids_in_any_format;  // the ids in order, a few non-digits apart
  for (int32_t id : kSecretIds) {
    ids_in_any_format += (ids_in_any_format.empty() ? "" : "\\D{1,12}") + std::to_string(id);
  }
  EXPECT_FALSE(std::regex_search(log, std::regex(ids_in_any_format))) << log;
  EXPECT_THAT(log, Not(HasSubstr(kNewToken)));
  EXPECT_THAT(log, Not(HasSubstr(kOldToken)));
}

TEST_F(AuthTest, UnusableTokenFileStopsTheVerifierNamingTheFlag) {
  for (const auto& [file, message] : {std::pair{File("missing"), ": cannot read the file"},
                                      std::pair{File("empty"), ": no token in the file"}}) {
    SCOPED_TRACE(file);
    ChildProcess verifier({kBin + "/treespec-verifier", "--model=" + kRoot + "/models/tiny-target",
                           "--port=0", "--auth_token_file=" + file},
                          File("verifier.log"));
    EXPECT_NE(verifier.Wait(60), 0);
    EXPECT_THAT(verifier.Stderr(), HasSubstr("--auth_token_file=" + file + message));
  }
}

}  // namespace
}  // namespace treespec
