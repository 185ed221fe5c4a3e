// GET /metrics over HTTP/1.0 for Prometheus: the text exposition of a prometheus-cpp
// Collectable, one connection at a time on one thread. Ours rather than prometheus-cpp's
// Exposer because its civetweb starts worker threads with a fixed small stack, and with
// cuBLASLt's static TLS loaded (the CUDA backend) that thread creation fails ("Cannot create
// first worker thread"); a scrape every few seconds needs no thread pool.
#ifndef TREESPEC_COMMON_METRICS_METRICS_HTTP_SERVER_H_
#define TREESPEC_COMMON_METRICS_METRICS_HTTP_SERVER_H_

#include <prometheus/collectable.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"

namespace treespec {

class MetricsHttpServer {
 public:
  // Listens on host:port (an IPv4 address; port 0 picks a free one) and serves `metrics`, which
  // must outlive the server. UNAVAILABLE when the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(
      const std::string& host, int port, const prometheus::Collectable* metrics);
  ~MetricsHttpServer();  // stops serving and joins the thread
  MetricsHttpServer(const MetricsHttpServer&) = delete;
  MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;

  int port() const { return port_; }

 private:
  MetricsHttpServer(int listen_fd, int port, const prometheus::Collectable* metrics);
  void Serve();
  void Answer(int fd);

  const int listen_fd_;
  const int port_;
  const prometheus::Collectable* const metrics_;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

}  // namespace treespec

#endif  // TREESPEC_COMMON_METRICS_METRICS_HTTP_SERVER_H_
