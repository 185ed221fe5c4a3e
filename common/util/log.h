// Minimal leveled logging to stderr (the Debian Abseil has no absl/log).
// INFO: one line per request; DEBUG (TREESPEC_LOG_LEVEL=debug): per-step detail.
#ifndef TREESPEC_COMMON_UTIL_LOG_H_
#define TREESPEC_COMMON_UTIL_LOG_H_

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/str_format.h"

namespace treespec {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

// Level from the TREESPEC_LOG_LEVEL environment variable (debug|info|warning|error), read once.
LogLevel MinLogLevel();
void LogLine(LogLevel level, const char* file, int line, const std::string& message);

// Programmer errors (a broken invariant no input can cause: a slot never reserved, a malformed
// commit path) abort with a message.
[[noreturn]] inline void Fatal(const std::string& message) {
  std::fprintf(stderr, "fatal: %s\n", message.c_str());
  std::abort();
}

}  // namespace treespec

#define TS_LOG(level, ...)                                                       \
  do {                                                                           \
    if (::treespec::LogLevel::level >= ::treespec::MinLogLevel())                \
      ::treespec::LogLine(::treespec::LogLevel::level, __FILE__, __LINE__,       \
                          ::absl::StrFormat(__VA_ARGS__));                       \
  } while (0)

#endif  // TREESPEC_COMMON_UTIL_LOG_H_
