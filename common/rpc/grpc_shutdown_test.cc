// AwaitGrpcShutdown after the last gRPC object went on one of gRPC's own threads: the case
// where gRPC shuts down on a detached thread that would otherwise race the process exit.
#include "common/rpc/grpc_shutdown.h"

#include <grpc/grpc.h>
#include <grpcpp/alarm.h>

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "gtest/gtest.h"

namespace treespec {
namespace {

TEST(AwaitGrpcShutdownTest, WaitsForTheShutdownALastReleaseOnAGrpcThreadStarted) {
  ASSERT_EQ(grpc_is_initialized(), 0) << "a gRPC object outlived the start of the test";
  // The alarm is the process's only gRPC object. Its callback runs on one of gRPC's executor
  // threads and deletes it there, the way a channel's core is torn down after the program let
  // go of it: gRPC's shutdown then starts on a detached thread of its own.
  std::mutex mu;
  std::condition_variable cv;
  bool released = false;
  auto* alarm = new grpc::Alarm;
  alarm->Set(std::chrono::system_clock::now() + std::chrono::milliseconds(10), [&](bool) {
    delete alarm;
    std::lock_guard<std::mutex> lock(mu);
    released = true;
    cv.notify_all();
  });
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(30), [&] { return released; }));
  }
  EXPECT_TRUE(AwaitGrpcShutdown(absl::Seconds(30)));
  EXPECT_EQ(grpc_is_initialized(), 0);
}

TEST(AwaitGrpcShutdownTest, ReturnsAtOnceWhenGrpcWasNeverUsed) {
  EXPECT_TRUE(AwaitGrpcShutdown(absl::ZeroDuration()));
}

}  // namespace
}  // namespace treespec
