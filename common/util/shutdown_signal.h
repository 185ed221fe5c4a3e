// Clean shutdown on SIGINT/SIGTERM for the service binaries.
#ifndef TREESPEC_COMMON_UTIL_SHUTDOWN_SIGNAL_H_
#define TREESPEC_COMMON_UTIL_SHUTDOWN_SIGNAL_H_

namespace treespec {

// Call first in main(), before any thread starts: blocks SIGINT/SIGTERM so every thread
// inherits the mask and the signals wait for WaitForShutdownSignal instead of killing us.
void BlockShutdownSignals();

// Returns once SIGINT or SIGTERM has arrived. Returns the signal number.
int WaitForShutdownSignal();

}  // namespace treespec

#endif  // TREESPEC_COMMON_UTIL_SHUTDOWN_SIGNAL_H_
