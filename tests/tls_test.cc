// TLS and mutual TLS over the real binaries on loopback (issue 5): certificates are made at
// test time with the openssl command (a test CA, a server certificate for 127.0.0.1, a client
// certificate, and a second CA that signed neither).
//   - the drafter requires client certificates (mTLS) and the verifier reaches it with one:
//     speculation works end to end; a client of the verifier over TLS gets its tokens;
//   - a client that trusts the wrong CA, a plaintext client, and (with --tls_client_ca on the
//     verifier) a client without a certificate are all refused;
//   - flag mistakes (a certificate without its key, a missing file) stop the binary at start
//     with a message naming the flag.
#include "common/rpc/tls.h"

#include <grpcpp/grpcpp.h>
#include <signal.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/generate_client.h"
#include "tests/process.h"
#include "treespec/v1/generation.grpc.pb.h"

namespace treespec {
namespace {

namespace fs = std::filesystem;
using testing::ChildProcess;
using testing::CodePrompts;
using ::testing::HasSubstr;
using testing::Outcome;
using testing::TextRequest;

const std::string kRoot = TREESPEC_SOURCE_DIR;
const std::string kBin = TREESPEC_BIN_DIR;

class TlsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    char pattern[] = "/tmp/treespec-tls-XXXXXX";
    dir_ = new std::string(mkdtemp(pattern));
    const std::string d = *dir_;
    const std::string ec = " -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
    auto run = [](const std::string& cmd) {
      ASSERT_EQ(std::system((cmd + " > /dev/null 2>&1").c_str()), 0) << cmd;
    };
    for (const std::string ca : {"ca", "other_ca"}) {
      run("openssl req -x509" + ec + " -days 2 -subj /CN=treespec-test-" + ca + " -keyout " + d +
          "/" + ca + ".key -out " + d + "/" + ca + ".pem");
    }
    std::ofstream(d + "/san.ext") << "subjectAltName=IP:127.0.0.1,DNS:localhost\n";
    for (const std::string who : {"server", "client"}) {
      run("openssl req" + ec + " -subj /CN=treespec-" + who + " -keyout " + d + "/" + who +
          ".key -out " + d + "/" + who + ".csr");
      run("openssl x509 -req -days 2 -in " + d + "/" + who + ".csr -CA " + d + "/ca.pem -CAkey " +
          d + "/ca.key -CAcreateserial -extfile " + d + "/san.ext -out " + d + "/" + who + ".pem");
    }
  }
  static void TearDownTestSuite() {
    fs::remove_all(*dir_);
    delete dir_;
  }
  static std::string File(const std::string& name) { return *dir_ + "/" + name; }

  // Starts a binary and returns its address ("" if it did not come up).
  std::string Start(std::unique_ptr<ChildProcess>& p, std::vector<std::string> argv) {
    argv.push_back("--port=0");
    argv.push_back("--metrics_port=-1");
    p = std::make_unique<ChildProcess>(argv, File(fs::path(argv[0]).filename().string() + ".log"));
    const std::string address = p->WaitForAddress(60);
    EXPECT_FALSE(address.empty()) << p->Stderr();
    return address;
  }

  // One short generation through `credentials`.
  static Outcome GenerateOver(const std::string& address,
                              std::shared_ptr<grpc::ChannelCredentials> credentials,
                              v1::SpeculationMode mode = v1::SPECULATION_MODE_AUTO) {
    auto stub = v1::Generation::NewStub(grpc::CreateChannel(address, credentials));
    return testing::Generate(stub.get(), TextRequest(CodePrompts()[0], mode, 24), 30);
  }

  static std::shared_ptr<grpc::ChannelCredentials> Client(const TlsFiles& files) {
    auto credentials = MakeChannelCredentials(files);
    EXPECT_TRUE(credentials.ok()) << credentials.status();
    return credentials.ok() ? *credentials : nullptr;
  }

  static std::string* dir_;
};

std::string* TlsTest::dir_ = nullptr;

TEST_F(TlsTest, MutualTlsToTheDrafterAndTlsToTheVerifier) {
  std::unique_ptr<ChildProcess> drafter, verifier;
  const std::string drafter_address =
      Start(drafter, {kBin + "/treespec-drafter", "--draft_model=" + kRoot + "/models/tiny-draft",
                      "--tls_cert=" + File("server.pem"), "--tls_key=" + File("server.key"),
                      "--tls_client_ca=" + File("ca.pem")});
  ASSERT_FALSE(drafter_address.empty());
  const std::string address =
      Start(verifier, {kBin + "/treespec-verifier", "--model=" + kRoot + "/models/tiny-target",
                       "--drafter=" + drafter_address, "--drafter_tls_ca=" + File("ca.pem"),
                       "--drafter_tls_cert=" + File("client.pem"),
                       "--drafter_tls_key=" + File("client.key"), "--draft_timeout_ms=2000",
                       "--tls_cert=" + File("server.pem"), "--tls_key=" + File("server.key")});
  ASSERT_FALSE(address.empty());

  // Over TLS, with speculation: the verifier's trees came from the drafter over mutual TLS.
  const Outcome ok = GenerateOver(address, Client({.ca = File("ca.pem")}));
  ASSERT_TRUE(ok.status.ok()) << ok.status.error_message();
  EXPECT_EQ(ok.ids.size(), 24u);
  EXPECT_GT(ok.last.speculation().accepted_tokens(), 0) << "no accepted draft: no drafter link";
  EXPECT_EQ(ok.last.speculation().fallback_steps(), 0);

  // The load harness over TLS too (its summary counts the completed requests). Its output
  // (the sanitizers' reports among it) goes into the failure message.
  const std::string summary = File("loadgen.json");
  ChildProcess loadgen({kBin + "/treespec-loadgen", "--target=" + address,
                        "--tls_ca=" + File("ca.pem"), "--num_prompts=4", "--random_input_len=16",
                        "--random_output_len=8", "--progress=false", "--result_json=" + summary},
                       File("loadgen.log"));
  EXPECT_EQ(loadgen.Wait(120), 0) << loadgen.Stderr();
  std::ifstream summary_file(summary);
  std::string text((std::istreambuf_iterator<char>(summary_file)),
                   std::istreambuf_iterator<char>());
  EXPECT_THAT(text, HasSubstr("\"completed\": 4"));

  // Refused: a client trusting another CA, and a plaintext client. (gRPC logs the refused
  // handshake in this test's output: "certificate verify failed" is this check, not a failure.)
  const Outcome wrong_ca = GenerateOver(address, Client({.ca = File("other_ca.pem")}));
  EXPECT_EQ(wrong_ca.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  const Outcome plaintext = GenerateOver(address, grpc::InsecureChannelCredentials());
  EXPECT_EQ(plaintext.status.error_code(), grpc::StatusCode::UNAVAILABLE);

  verifier->Signal(SIGTERM);
  EXPECT_EQ(verifier->Wait(30), 0) << verifier->Stderr();
  drafter->Signal(SIGTERM);
  EXPECT_EQ(drafter->Wait(30), 0) << drafter->Stderr();
}

TEST_F(TlsTest, VerifierRequiresClientCertificatesWithClientCa) {
  std::unique_ptr<ChildProcess> verifier;
  const std::string address =
      Start(verifier, {kBin + "/treespec-verifier", "--model=" + kRoot + "/models/tiny-target",
                       "--tls_cert=" + File("server.pem"), "--tls_key=" + File("server.key"),
                       "--tls_client_ca=" + File("ca.pem")});
  ASSERT_FALSE(address.empty());
  const Outcome with_cert = GenerateOver(
      address,
      Client({.cert = File("client.pem"), .key = File("client.key"), .ca = File("ca.pem")}),
      v1::SPECULATION_MODE_OFF);
  EXPECT_TRUE(with_cert.status.ok()) << with_cert.status.error_message();
  EXPECT_EQ(with_cert.ids.size(), 24u);
  const Outcome without_cert =
      GenerateOver(address, Client({.ca = File("ca.pem")}), v1::SPECULATION_MODE_OFF);
  EXPECT_EQ(without_cert.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  verifier->Signal(SIGTERM);
  EXPECT_EQ(verifier->Wait(30), 0) << verifier->Stderr();
}

TEST_F(TlsTest, FlagMistakesStopTheBinaryWithTheFlagsName) {
  struct Case {
    std::vector<std::string> argv;
    std::string message;
  };
  const std::string target = "--model=" + kRoot + "/models/tiny-target";
  const std::vector<Case> cases = {
      {{kBin + "/treespec-verifier", target, "--tls_cert=" + File("server.pem")},
       "--tls_cert and --tls_key go together"},
      {{kBin + "/treespec-verifier", target, "--tls_client_ca=" + File("ca.pem")},
       "--tls_client_ca checks client certificates"},
      {{kBin + "/treespec-drafter", "--tls_cert=" + File("missing.pem"),
        "--tls_key=" + File("server.key")},
       "--tls_cert=" + File("missing.pem") + ": cannot read the file"},
      {{kBin + "/treespec-verifier", target, "--drafter=127.0.0.1:1",
        "--drafter_tls_ca=" + File("san.ext")},
       "--drafter_tls_ca=" + File("san.ext") + ": not a PEM file"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.message);
    ChildProcess p(c.argv, File("mistake.log"));
    EXPECT_NE(p.Wait(60), 0);
    EXPECT_THAT(p.Stderr(), HasSubstr(c.message));
  }
}

}  // namespace
}  // namespace treespec
