#include "common/rpc/tls.h"

#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace treespec {
namespace {

// The file's text, which must hold a PEM block.
absl::StatusOr<std::string> ReadPem(const std::string& path, const std::string& flag) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(flag, "=", path, ": cannot read the file"));
  std::ostringstream text;
  text << in.rdbuf();
  if (!absl::StrContains(text.str(), "-----BEGIN ")) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, "=", path, ": not a PEM file (no -----BEGIN line)"));
  }
  return text.str();
}

// The PEM texts of the certificate chain and its private key.
struct KeyAndCert {
  std::string key, cert;
};
absl::StatusOr<KeyAndCert> ReadKeyAndCert(const TlsFiles& f) {
  absl::StatusOr<std::string> key = ReadPem(f.key, f.key_flag);
  if (!key.ok()) return key.status();
  absl::StatusOr<std::string> cert = ReadPem(f.cert, f.cert_flag);
  if (!cert.ok()) return cert.status();
  return KeyAndCert{*std::move(key), *std::move(cert)};
}

absl::Status CheckPair(const TlsFiles& f) {
  if (f.cert.empty() != f.key.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(f.cert_flag, " and ", f.key_flag, " go together: give both or neither"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(const TlsFiles& f) {
  if (absl::Status s = CheckPair(f); !s.ok()) return s;
  if (f.cert.empty()) {
    if (!f.ca.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(f.ca_flag, " checks client certificates, which needs TLS: give ",
                       f.cert_flag, " and ", f.key_flag, " too"));
    }
    return grpc::InsecureServerCredentials();
  }
  grpc::SslServerCredentialsOptions options(
      f.ca.empty() ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                   : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  absl::StatusOr<KeyAndCert> pem = ReadKeyAndCert(f);
  if (!pem.ok()) return pem.status();
  options.pem_key_cert_pairs.push_back({std::move(pem->key), std::move(pem->cert)});
  if (!f.ca.empty()) {
    absl::StatusOr<std::string> ca = ReadPem(f.ca, f.ca_flag);
    if (!ca.ok()) return ca.status();
    options.pem_root_certs = *std::move(ca);
  }
  return grpc::SslServerCredentials(options);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const TlsFiles& f) {
  if (absl::Status s = CheckPair(f); !s.ok()) return s;
  if (f.ca.empty()) {
    if (!f.cert.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(f.cert_flag, " is a client certificate for TLS, which needs ", f.ca_flag,
                       " (the CA that signed the server's certificate)"));
    }
    return grpc::InsecureChannelCredentials();
  }
  grpc::SslCredentialsOptions options;
  absl::StatusOr<std::string> ca = ReadPem(f.ca, f.ca_flag);
  if (!ca.ok()) return ca.status();
  options.pem_root_certs = *std::move(ca);
  if (!f.cert.empty()) {
    absl::StatusOr<KeyAndCert> pem = ReadKeyAndCert(f);
    if (!pem.ok()) return pem.status();
    options.pem_private_key = std::move(pem->key);
    options.pem_cert_chain = std::move(pem->cert);
  }
  return grpc::SslCredentials(options);
}

}  // namespace treespec
