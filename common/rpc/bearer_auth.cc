#include "common/rpc/bearer_auth.h"

#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace treespec {
namespace {

constexpr absl::string_view kScheme = "Bearer ";

// Printable ASCII without spaces: what a gRPC metadata value can carry as one token.
bool IsTokenText(absl::string_view token) {
  for (char c : token) {
    if (c <= ' ' || c > '~') return false;
  }
  return true;
}

// 1 when `presented` equals `accepted` (never empty), else 0. The loop runs over the
// presented bytes whatever they are, so its time says nothing about how much of an accepted
// token a guess got right, nor about the accepted token's length.
unsigned Matches(absl::string_view presented, absl::string_view accepted) {
  unsigned diff = presented.size() != accepted.size() ? 1 : 0;
  for (size_t i = 0; i < presented.size(); ++i) {
    diff |= static_cast<unsigned char>(presented[i] ^ accepted[i % accepted.size()]);
  }
  return diff == 0 ? 1 : 0;
}

grpc::Status Unauthenticated(absl::string_view why) {
  return grpc::Status(
      grpc::StatusCode::UNAUTHENTICATED,
      absl::StrCat(why,
                   ": send the metadata 'authorization: Bearer <token>' with a token this server "
                   "accepts (treespec-cli and treespec-loadgen: --auth_token_file)"));
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ReadBearerTokens(const std::string& path,
                                                          const std::string& flag) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(flag, "=", path, ": cannot read the file"));
  std::vector<std::string> tokens;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    const absl::string_view token = absl::StripAsciiWhitespace(line);
    if (token.empty()) continue;
    if (!IsTokenText(token)) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, "=", path, ": line ", number,
                       " is not a token (one token a line, printable ASCII without spaces)"));
    }
    tokens.emplace_back(token);
  }
  if (in.bad()) return absl::NotFoundError(absl::StrCat(flag, "=", path, ": cannot read the file"));
  if (tokens.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, "=", path, ": no token in the file (one token a line)"));
  }
  return tokens;
}

absl::StatusOr<BearerTokens> BearerTokens::Load(const std::string& path, const std::string& flag) {
  if (path.empty()) return BearerTokens();
  absl::StatusOr<std::vector<std::string>> tokens = ReadBearerTokens(path, flag);
  if (!tokens.ok()) return tokens.status();
  return BearerTokens(*std::move(tokens));
}

grpc::Status BearerTokens::Check(
    const std::multimap<grpc::string_ref, grpc::string_ref>& metadata) const {
  if (tokens_.empty()) return grpc::Status::OK;
  const auto [found, end] = metadata.equal_range("authorization");
  if (found == end) return Unauthenticated("this server requires a bearer token");
  const absl::string_view value(found->second.data(), found->second.size());
  // The scheme is case-insensitive (RFC 7235); the token is everything after it.
  if (!absl::StartsWithIgnoreCase(value, kScheme)) {
    return Unauthenticated("the 'authorization' metadata is not of the Bearer scheme");
  }
  const absl::string_view presented = absl::StripAsciiWhitespace(value.substr(kScheme.size()));
  unsigned matched = 0;
  for (const std::string& accepted : tokens_) matched |= Matches(presented, accepted);
  if (matched == 0) return Unauthenticated("the bearer token is not accepted");
  return grpc::Status::OK;
}

absl::StatusOr<std::string> LoadClientBearerToken(const std::string& path,
                                                  const std::string& flag) {
  if (path.empty()) return std::string();
  absl::StatusOr<std::vector<std::string>> tokens = ReadBearerTokens(path, flag);
  if (!tokens.ok()) return tokens.status();
  return std::move(tokens->front());
}

void AddBearerToken(const std::string& token, grpc::ClientContext* context) {
  if (!token.empty()) context->AddMetadata("authorization", absl::StrCat(kScheme, token));
}

}  // namespace treespec
