#include "common/util/log.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace treespec {

LogLevel MinLogLevel() {
  static const LogLevel level = [] {
    const char* env = std::getenv("TREESPEC_LOG_LEVEL");
    if (env == nullptr) return LogLevel::kInfo;
    if (std::strcmp(env, "debug") == 0) return LogLevel::kDebug;
    if (std::strcmp(env, "warning") == 0) return LogLevel::kWarning;
    if (std::strcmp(env, "error") == 0) return LogLevel::kError;
    return LogLevel::kInfo;
  }();
  return level;
}

void LogLine(LogLevel level, const char* file, int line, const std::string& message) {
  static std::mutex mu;
  static const char kTags[] = {'D', 'I', 'W', 'E'};
  const char* base = std::strrchr(file, '/');
  const double secs = std::chrono::duration<double>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
  std::lock_guard<std::mutex> lock(mu);
  std::fprintf(stderr, "%c %.3f %s:%d] %s\n", kTags[static_cast<int>(level)], secs,
               base ? base + 1 : file, line, message.c_str());
}

}  // namespace treespec
