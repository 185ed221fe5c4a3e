#include "common/rpc/bearer_auth.h"

#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace treespec {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using Metadata = std::multimap<grpc::string_ref, grpc::string_ref>;

// A token file in the test's temporary directory with `text` in it.
std::string TokenFile(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + "/bearer_auth_test_" + name;
  std::ofstream(path) << text;
  return path;
}

BearerTokens TwoTokens() {
  absl::StatusOr<BearerTokens> tokens =
      BearerTokens::Load(TokenFile("two", "\n  current-token-1 \r\nnext.token_2~+/=\n\n"), "--f");
  EXPECT_TRUE(tokens.ok()) << tokens.status();
  return tokens.ok() ? *std::move(tokens) : BearerTokens();
}

grpc::Status CheckWith(const BearerTokens& tokens, const std::string& authorization) {
  return tokens.Check(Metadata{{"authorization", authorization}});
}

TEST(BearerAuthTest, AcceptsEveryTokenOfTheFile) {
  const BearerTokens tokens = TwoTokens();
  ASSERT_TRUE(tokens.enabled());
  EXPECT_TRUE(CheckWith(tokens, "Bearer current-token-1").ok());
  EXPECT_TRUE(CheckWith(tokens, "Bearer next.token_2~+/=").ok());  // the second line
  EXPECT_TRUE(CheckWith(tokens, "bearer next.token_2~+/=").ok());  // the scheme's case is free
}

TEST(BearerAuthTest, RefusesWithUnauthenticatedSayingWhatToSend) {
  const BearerTokens tokens = TwoTokens();
  const grpc::Status missing = tokens.Check(Metadata{{"x-other", "Bearer current-token-1"}});
  EXPECT_EQ(missing.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(missing.error_message(), HasSubstr("requires a bearer token"));
  EXPECT_THAT(missing.error_message(), HasSubstr("authorization: Bearer <token>"));
  EXPECT_THAT(missing.error_message(), HasSubstr("--auth_token_file"));

  const grpc::Status basic = CheckWith(tokens, "Basic current-token-1");
  EXPECT_EQ(basic.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(basic.error_message(), HasSubstr("not of the Bearer scheme"));

  for (const std::string wrong : {"current-token-2", "current-token-1x", "current-token-",
                                  "next.token_2~+/=current-token-1", ""}) {
    SCOPED_TRACE(wrong);
    const grpc::Status refused = CheckWith(tokens, "Bearer " + wrong);
    EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_THAT(refused.error_message(), HasSubstr("bearer token is not accepted"));
    if (!wrong.empty()) EXPECT_THAT(refused.error_message(), Not(HasSubstr(wrong)));
  }
  EXPECT_EQ(CheckWith(tokens, "Bearercurrent-token-1").error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
}

TEST(BearerAuthTest, NoTokensMeansAuthenticationOff) {
  absl::StatusOr<BearerTokens> off = BearerTokens::Load("", "--f");
  ASSERT_TRUE(off.ok());
  EXPECT_FALSE(off->enabled());
  EXPECT_TRUE(off->Check(Metadata{}).ok());
}

TEST(BearerAuthTest, FileMistakesNameTheFlagAndNeverTheText) {
  const absl::StatusOr<BearerTokens> missing = BearerTokens::Load("/nonexistent/tokens", "--f");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("--f=/nonexistent/tokens: cannot read"));

  const absl::StatusOr<BearerTokens> empty = BearerTokens::Load(TokenFile("empty", " \n\n"), "--f");
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(empty.status().message(), HasSubstr("no token in the file"));

  const absl::StatusOr<BearerTokens> spaced =
      BearerTokens::Load(TokenFile("spaced", "good\nsecret with-space\n"), "--f");
  EXPECT_EQ(spaced.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(spaced.status().message(), HasSubstr("line 2 is not a token"));
  EXPECT_THAT(spaced.status().message(), Not(HasSubstr("secret")));
}

TEST(BearerAuthTest, ClientsSendTheFirstToken) {
  absl::StatusOr<std::string> first =
      LoadClientBearerToken(TokenFile("client", "\nnew-token\nold-token\n"), "--f");
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(*first, "new-token");
  absl::StatusOr<std::string> none = LoadClientBearerToken("", "--f");
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(*none, "");
}

}  // namespace
}  // namespace treespec
