// TLS and mutual TLS for every gRPC endpoint (issue 5): credentials from PEM files named by
// flags. No files: plaintext (the default on loopback and inside a pod network).
//   server: cert + key serve TLS; with client_ca as well, every client must present a
//           certificate signed by that CA (mutual TLS) or the handshake fails;
//   client: ca verifies the server (TLS); cert + key as well present a client certificate.
#ifndef TREESPEC_COMMON_RPC_TLS_H_
#define TREESPEC_COMMON_RPC_TLS_H_

#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace treespec {

// PEM file paths, and the flag names to quote in errors.
struct TlsFiles {
  std::string cert, key, ca;
  std::string cert_flag = "--tls_cert", key_flag = "--tls_key", ca_flag = "--tls_ca";
};

// INVALID_ARGUMENT naming the flag: a cert without its key (or the reverse), a client CA
// without a server certificate; NOT_FOUND / INVALID_ARGUMENT naming the file: unreadable or
// not PEM.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsFiles& files);

// INVALID_ARGUMENT: a client certificate without a CA to check the server with, a cert without
// its key (or the reverse); file errors as above.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const TlsFiles& files);

}  // namespace treespec

#endif  // TREESPEC_COMMON_RPC_TLS_H_
