// The scrape's HTTP side: address forms, refusals naming the address, and GET against the
// services' own /metrics server on loopback (200 with the exposition, 404 as an error, a
// closed port as UNAVAILABLE).
#include "tools/loadgen/http_get.h"

#include <prometheus/counter.h>
#include <prometheus/registry.h>

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/metrics/metrics_http_server.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace treespec::loadgen {
namespace {

using ::testing::HasSubstr;

TEST(ParseHttpUrlTest, AcceptsTheAddressForms) {
  const absl::StatusOr<HttpUrl> plain = ParseHttpUrl("127.0.0.1:9090");
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->host, "127.0.0.1");
  EXPECT_EQ(plain->port, 9090);
  EXPECT_EQ(plain->path, "/metrics");
  const absl::StatusOr<HttpUrl> full = ParseHttpUrl("http://verifier-0.svc:8080/stats?x=1");
  ASSERT_TRUE(full.ok()) << full.status();
  EXPECT_EQ(full->host, "verifier-0.svc");
  EXPECT_EQ(full->port, 8080);
  EXPECT_EQ(full->path, "/stats?x=1");
  const absl::StatusOr<HttpUrl> v6 = ParseHttpUrl("[::1]:7000");
  ASSERT_TRUE(v6.ok()) << v6.status();
  EXPECT_EQ(v6->host, "::1");
  EXPECT_EQ(v6->port, 7000);
  EXPECT_EQ(ParseHttpUrl("localhost:1", "/other")->path, "/other");
}

TEST(ParseHttpUrlTest, RefusesOtherFormsNamingTheAddress) {
  const std::pair<const char*, const char*> cases[] = {
      {"localhost", "no port"},
      {"https://a:1", "https is not supported"},
      {":9090", "no host"},
      {"a:0", "port '0' is not in 1..65535"},
      {"a:70000", "not in 1..65535"},
      {"a:http", "port 'http'"},
      {"[::1]7000", "expected [IPv6]:PORT"},
  };
  for (const auto& [address, message] : cases) {
    const absl::StatusOr<HttpUrl> url = ParseHttpUrl(address);
    EXPECT_EQ(url.status().code(), absl::StatusCode::kInvalidArgument) << address;
    EXPECT_THAT(url.status().message(), HasSubstr(absl::StrCat("'", address, "'"))) << address;
    EXPECT_THAT(url.status().message(), HasSubstr(message)) << address;
  }
}

TEST(HttpGetTest, ScrapesTheServicesMetricsServer) {
  prometheus::Registry registry;
  prometheus::BuildCounter()
      .Name("loadgen_test_total")
      .Help("a test counter")
      .Register(registry)
      .Add({})
      .Increment(42);
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> server =
      MetricsHttpServer::Start("127.0.0.1", 0, &registry);
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string address = "127.0.0.1:" + std::to_string((*server)->port());

  const absl::StatusOr<std::string> body = HttpGet(*ParseHttpUrl(address));
  ASSERT_TRUE(body.ok()) << body.status();
  EXPECT_THAT(*body, HasSubstr("loadgen_test_total 42"));

  const absl::StatusOr<std::string> missing = HttpGet(*ParseHttpUrl(address + "/nothing"));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(missing.status().message(), HasSubstr("HTTP 404"));
  EXPECT_THAT(missing.status().message(), HasSubstr(address + "/nothing"));
  // HttpFetch hands over any answer: the 404's body names the path that exists.
  const absl::StatusOr<HttpResponse> fetched = HttpFetch(*ParseHttpUrl(address + "/nothing"));
  ASSERT_TRUE(fetched.ok()) << fetched.status();
  EXPECT_EQ(fetched->status_code, 404);
  EXPECT_THAT(fetched->body, HasSubstr("GET /metrics"));

  server->reset();  // nothing listens there now
  const absl::StatusOr<std::string> closed = HttpGet(*ParseHttpUrl(address), absl::Seconds(2));
  EXPECT_EQ(closed.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(closed.status().message(), HasSubstr(address));
}

}  // namespace
}  // namespace treespec::loadgen
