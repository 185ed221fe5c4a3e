#include "tools/loadgen/http_get.h"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace treespec::loadgen {
namespace {

std::string Describe(const HttpUrl& url) {
  const bool v6 = absl::StrContains(url.host, ':');
  return absl::StrCat("http://", v6 ? "[" : "", url.host, v6 ? "]" : "", ":", url.port, url.path);
}

// Milliseconds left until `deadline` for poll(), at least 0.
int MillisLeft(absl::Time deadline) {
  return static_cast<int>(std::max<int64_t>(0, absl::ToInt64Milliseconds(deadline - absl::Now())));
}

// Waits until `fd` is ready for `events`; false on timeout or error.
bool WaitFor(int fd, int16_t events, absl::Time deadline) {
  pollfd p{fd, events, 0};
  while (true) {
    const int n = poll(&p, 1, MillisLeft(deadline));
    if (n > 0) return true;
    if (n == 0 || errno != EINTR) return false;
  }
}

// A connected socket to `url` (every resolved address tried in turn) or the last error.
absl::StatusOr<int> Connect(const HttpUrl& url, absl::Time deadline) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string port = absl::StrCat(url.port);
  if (const int rc = getaddrinfo(url.host.c_str(), port.c_str(), &hints, &found); rc != 0) {
    return absl::UnavailableError(
        absl::StrCat(Describe(url), ": cannot resolve ", url.host, ": ", gai_strerror(rc)));
  }
  std::string last_error = "no address";
  int connected = -1;
  for (addrinfo* a = found; a != nullptr && connected < 0; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
      last_error = std::strerror(errno);
      continue;
    }
    if (connect(fd, a->ai_addr, a->ai_addrlen) != 0 && errno != EINPROGRESS) {
      last_error = std::strerror(errno);
      close(fd);
      continue;
    }
    int error = 0;
    socklen_t len = sizeof(error);
    if (!WaitFor(fd, POLLOUT, deadline)) {
      last_error = "connect timed out";
    } else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &len) != 0 || error != 0) {
      last_error = std::strerror(error != 0 ? error : errno);
    } else {
      connected = fd;
      continue;
    }
    close(fd);
  }
  freeaddrinfo(found);
  if (connected < 0) return absl::UnavailableError(absl::StrCat(Describe(url), ": ", last_error));
  return connected;
}

}  // namespace

absl::StatusOr<HttpUrl> ParseHttpUrl(absl::string_view address, absl::string_view default_path) {
  absl::string_view rest = absl::StripAsciiWhitespace(address);
  auto invalid = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics address '", address, "': ", why,
                     " (expected HOST:PORT, HOST:PORT/path or http://HOST:PORT/path)"));
  };
  if (absl::StartsWith(rest, "https://")) return invalid("https is not supported");
  absl::ConsumePrefix(&rest, "http://");
  HttpUrl url;
  const size_t slash = rest.find('/');
  url.path = slash == absl::string_view::npos ? std::string(default_path)
                                              : std::string(rest.substr(slash));
  rest = rest.substr(0, slash);
  absl::string_view port;
  if (absl::ConsumePrefix(&rest, "[")) {  // [v6]:port
    const size_t close = rest.find("]:");
    if (close == absl::string_view::npos) return invalid("expected [IPv6]:PORT");
    url.host = std::string(rest.substr(0, close));
    port = rest.substr(close + 2);
  } else {
    const size_t colon = rest.rfind(':');
    if (colon == absl::string_view::npos) return invalid("no port");
    url.host = std::string(rest.substr(0, colon));
    port = rest.substr(colon + 1);
  }
  if (url.host.empty()) return invalid("no host");
  if (!absl::SimpleAtoi(port, &url.port) || url.port < 1 || url.port > 65535) {
    return invalid(absl::StrCat("port '", port, "' is not in 1..65535"));
  }
  return url;
}

absl::StatusOr<HttpResponse> HttpFetch(const HttpUrl& url, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::StatusOr<int> fd = Connect(url, deadline);
  if (!fd.ok()) return fd.status();
  const bool v6 = absl::StrContains(url.host, ':');
  const std::string request =
      absl::StrCat("GET ", url.path, " HTTP/1.0\r\nHost: ", v6 ? "[" : "", url.host, v6 ? "]" : "",
                   ":", url.port, "\r\nAccept: text/plain\r\n\r\n");
  std::string response;
  std::string error;
  for (size_t sent = 0; sent < request.size();) {
    if (!WaitFor(*fd, POLLOUT, deadline)) {
      error = "timed out sending the request";
      break;
    }
    const ssize_t n = send(*fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) {
      error = std::strerror(errno);
      break;
    }
    sent += static_cast<size_t>(n);
  }
  // HTTP/1.0: the server closes the connection after the body.
  while (error.empty()) {
    if (!WaitFor(*fd, POLLIN, deadline)) {
      error = "timed out reading the answer";
      break;
    }
    char buffer[16384];
    const ssize_t n = read(*fd, buffer, sizeof(buffer));
    if (n == 0) break;
    if (n < 0) {
      if (errno != EINTR && errno != EAGAIN) error = std::strerror(errno);
      continue;
    }
    response.append(buffer, static_cast<size_t>(n));
  }
  close(*fd);
  if (!error.empty()) return absl::UnavailableError(absl::StrCat(Describe(url), ": ", error));
  const size_t header_end = response.find("\r\n\r\n");
  const size_t line_end = response.find("\r\n");
  if (header_end == std::string::npos || !absl::StartsWith(response, "HTTP/")) {
    return absl::InternalError(absl::StrCat(Describe(url), ": not an HTTP answer"));
  }
  const absl::string_view status_line = absl::string_view(response).substr(0, line_end);
  const size_t space = status_line.find(' ');
  HttpResponse answer;
  if (space == absl::string_view::npos ||
      !absl::SimpleAtoi(status_line.substr(space + 1, 3), &answer.status_code)) {
    return absl::InternalError(
        absl::StrCat(Describe(url), ": malformed status line '", status_line, "'"));
  }
  answer.body = response.substr(header_end + 4);
  return answer;
}

absl::StatusOr<std::string> HttpGet(const HttpUrl& url, absl::Duration timeout) {
  absl::StatusOr<HttpResponse> answer = HttpFetch(url, timeout);
  if (!answer.ok()) return answer.status();
  if (answer->status_code != 200) {
    return absl::InternalError(
        absl::StrCat(Describe(url), ": answered HTTP ", answer->status_code, " (not 200)"));
  }
  return std::move(answer->body);
}

}  // namespace treespec::loadgen
