// One request of a load test as the driver saw it: the figures the summary uses (RequestRecord)
// and what identifies it in the per-request JSONL.
#ifndef TREESPEC_TOOLS_LOADGEN_REQUEST_RESULT_H_
#define TREESPEC_TOOLS_LOADGEN_REQUEST_RESULT_H_

#include <string>

#include "tools/loadgen/cancel_plan.h"
#include "tools/loadgen/serving_stats.h"

namespace treespec::loadgen {

struct RequestResult {
  RequestRecord record;
  int index = 0;              // position in the dataset
  std::string request_id;     // as sent (and echoed by the verifier)
  std::string target;         // the verifier that answered last
  int attempts = 0;           // > 1 when a refusal sent it on to another target
  double send_s = 0;          // when it was sent, seconds from the run's start
  double send_unix_s = 0;     // the same on the wall clock (to line up with logs and signals)
  std::string finish_reason;  // FINISH_REASON_* name, empty for a failure
  std::string error;          // "CODE: message" for a failure, empty otherwise
  CancelPoint cancel;         // when the client meant to cancel it (--cancel_fraction)
};

}  // namespace treespec::loadgen

#endif  // TREESPEC_TOOLS_LOADGEN_REQUEST_RESULT_H_
