// The Abseil shipped with Debian 12 (20220623) has no status macros; these are ours.
#ifndef TREESPEC_COMMON_UTIL_STATUS_MACROS_H_
#define TREESPEC_COMMON_UTIL_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define TREESPEC_CONCAT_INNER_(a, b) a##b
#define TREESPEC_CONCAT_(a, b) TREESPEC_CONCAT_INNER_(a, b)

// Returns the status of `expr` from the enclosing function when it is not OK.
#define RETURN_IF_ERROR(expr)                        \
  do {                                               \
    ::absl::Status treespec_status_ = (expr);        \
    if (!treespec_status_.ok()) return treespec_status_; \
  } while (0)

// ASSIGN_OR_RETURN(auto x, FnReturningStatusOr()); declares/assigns `x` or returns the error.
#define ASSIGN_OR_RETURN(lhs, expr) \
  TREESPEC_ASSIGN_OR_RETURN_IMPL_(TREESPEC_CONCAT_(treespec_statusor_, __LINE__), lhs, expr)
#define TREESPEC_ASSIGN_OR_RETURN_IMPL_(var, lhs, expr) \
  auto var = (expr);                                    \
  if (!var.ok()) return std::move(var).status();        \
  lhs = std::move(var).value()

#endif  // TREESPEC_COMMON_UTIL_STATUS_MACROS_H_
