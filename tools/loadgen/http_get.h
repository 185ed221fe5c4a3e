// A plain HTTP/1.0 GET, enough to scrape a Prometheus /metrics endpoint (the services' own
// server, common/metrics/metrics_http_server.h, answers one HTTP/1.0 request per connection).
#ifndef TREESPEC_TOOLS_LOADGEN_HTTP_GET_H_
#define TREESPEC_TOOLS_LOADGEN_HTTP_GET_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace treespec::loadgen {

struct HttpUrl {
  std::string host;  // a name, an IPv4 address, or an IPv6 address without brackets
  int port = 0;
  std::string path;  // starts with '/'
};

// "HOST:PORT", "HOST:PORT/path", "http://HOST:PORT[/path]" or "[v6addr]:PORT"; the path is
// `default_path` when none is given. InvalidArgument naming the address for anything else
// (https, no port, a port outside 1..65535).
absl::StatusOr<HttpUrl> ParseHttpUrl(absl::string_view address,
                                     absl::string_view default_path = "/metrics");

struct HttpResponse {
  int status_code = 0;  // 200, 404, ...
  std::string body;
};

// GET `url`: whatever HTTP answer comes; UNAVAILABLE (connect, timeout, read) or INTERNAL (not
// an HTTP answer) naming the URL. `timeout` bounds the whole exchange.
absl::StatusOr<HttpResponse> HttpFetch(const HttpUrl& url,
                                       absl::Duration timeout = absl::Seconds(10));

// The body of a 200 answer to GET `url`; HttpFetch's errors, or INTERNAL naming the URL and the
// status line for another status.
absl::StatusOr<std::string> HttpGet(const HttpUrl& url, absl::Duration timeout = absl::Seconds(10));

}  // namespace treespec::loadgen

#endif  // TREESPEC_TOOLS_LOADGEN_HTTP_GET_H_
