#include "common/metrics/metrics_http_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/metrics/exposition.h"

namespace treespec {
namespace {

constexpr size_t kMaxRequestBytes = 8192;

// Writes all of `data` (a scraper that stops reading just loses its answer).
void WriteAll(int fd, const std::string& data) {
  for (size_t at = 0; at < data.size();) {
    const ssize_t n = send(fd, data.data() + at, data.size() - at, MSG_NOSIGNAL);
    if (n <= 0) return;
    at += static_cast<size_t>(n);
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    const std::string& host, int port, const prometheus::Collectable* metrics) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (port < 0 || port > 65535 || inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics address ", host, ":", port, ": expected an IPv4 address and a port"));
  }
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("socket: ", std::strerror(errno)));
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  socklen_t len = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || listen(fd, 16) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const int error = errno;
    close(fd);
    return absl::UnavailableError(
        absl::StrCat("cannot serve metrics on ", host, ":", port, ": ", std::strerror(error)));
  }
  return std::unique_ptr<MetricsHttpServer>(
      new MetricsHttpServer(fd, ntohs(addr.sin_port), metrics));
}

MetricsHttpServer::MetricsHttpServer(int listen_fd, int port,
                                     const prometheus::Collectable* metrics)
    : listen_fd_(listen_fd), port_(port), metrics_(metrics), thread_([this] { Serve(); }) {}

MetricsHttpServer::~MetricsHttpServer() {
  stopping_ = true;
  shutdown(listen_fd_, SHUT_RDWR);  // wakes the poll
  thread_.join();
  close(listen_fd_);
}

void MetricsHttpServer::Serve() {
  while (!stopping_) {
    pollfd p{listen_fd_, POLLIN, 0};
    if (poll(&p, 1, 200) <= 0) continue;  // timeout: re-check stopping_
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    Answer(fd);
    close(fd);
  }
}

void MetricsHttpServer::Answer(int fd) {
  // A slow or silent client must not hold the only thread: 2 s to send its request.
  timeval timeout{2, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  std::string request;
  char buffer[1024];
  while (request.size() < kMaxRequestBytes && request.find("\r\n\r\n") == std::string::npos) {
    const ssize_t n = recv(fd, buffer, sizeof(buffer), 0);
    if (n <= 0) break;
    request.append(buffer, static_cast<size_t>(n));
  }
  std::string status = "200 OK", type = "text/plain; version=0.0.4; charset=utf-8", body;
  if (absl::StartsWith(request, "GET /metrics ") || absl::StartsWith(request, "GET /metrics?")) {
    body = TextExposition(*metrics_);
  } else {
    status = "404 Not Found";
    type = "text/plain; charset=utf-8";
    body = "GET /metrics\n";
  }
  WriteAll(fd, absl::StrCat("HTTP/1.0 ", status, "\r\nContent-Type: ", type, "\r\nContent-Length: ",
                            body.size(), "\r\nConnection: close\r\n\r\n", body));
}

}  // namespace treespec
