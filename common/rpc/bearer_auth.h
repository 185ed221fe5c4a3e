// Bearer-token authentication of the public API (issue 5). A call carries the metadata
// `authorization: Bearer <token>`; the server accepts it when the token is one of those in its
// token file. The file holds one token a line, so a new token can be added next to the old one
// while clients move over, then the old one removed. Clients send the file's first token.
//
// Only the services that ask (the verifier's Generation) check tokens: grpc.health.v1 and
// reflection stay open for Kubernetes probes and tooling. Tokens travel in the clear without
// TLS (common/rpc/tls.h).
#ifndef TREESPEC_COMMON_RPC_BEARER_AUTH_H_
#define TREESPEC_COMMON_RPC_BEARER_AUTH_H_

#include <grpcpp/client_context.h>
#include <grpcpp/server_context.h>
#include <grpcpp/support/status.h>
#include <grpcpp/support/string_ref.h>

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace treespec {

// The tokens in `path`, in file order: one a line, surrounding whitespace (and a CR) trimmed,
// blank lines skipped. `flag` names the file in errors: NOT_FOUND when it cannot be read,
// INVALID_ARGUMENT when it holds no token or a line that is no token (a character outside
// printable ASCII, or a space inside; the line number is given, never its text).
absl::StatusOr<std::vector<std::string>> ReadBearerTokens(const std::string& path,
                                                          const std::string& flag);

// The tokens a server accepts; none: authentication is off and every call passes.
class BearerTokens {
 public:
  BearerTokens() = default;
  explicit BearerTokens(std::vector<std::string> tokens) : tokens_(std::move(tokens)) {}

  // Reads `path` (ReadBearerTokens); an empty path means authentication off.
  static absl::StatusOr<BearerTokens> Load(const std::string& path, const std::string& flag);

  bool enabled() const { return !tokens_.empty(); }

  // OK when authentication is off or the first `authorization` entry is "Bearer <token>" with
  // an accepted token; UNAUTHENTICATED otherwise, with a message saying what to send (never
  // the token that came). Takes as long whichever accepted token matches, and however much of
  // a wrong one matches.
  grpc::Status Check(const std::multimap<grpc::string_ref, grpc::string_ref>& metadata) const;
  grpc::Status Check(const grpc::ServerContextBase& context) const {
    return Check(context.client_metadata());
  }

 private:
  std::vector<std::string> tokens_;
};

// Clients: the first token of `path`, or "" (send none) when `path` is empty.
absl::StatusOr<std::string> LoadClientBearerToken(const std::string& path, const std::string& flag);

// Adds `authorization: Bearer <token>` to a call, unless `token` is empty.
void AddBearerToken(const std::string& token, grpc::ClientContext* context);

}  // namespace treespec

#endif  // TREESPEC_COMMON_RPC_BEARER_AUTH_H_
