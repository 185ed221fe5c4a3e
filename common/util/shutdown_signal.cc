#include "common/util/shutdown_signal.h"

#include <pthread.h>
#include <signal.h>

namespace treespec {

namespace {
sigset_t ShutdownSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  return set;
}
}  // namespace

void BlockShutdownSignals() {
  const sigset_t set = ShutdownSignals();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

int WaitForShutdownSignal() {
  const sigset_t set = ShutdownSignals();
  int sig = 0;
  sigwait(&set, &sig);
  return sig;
}

}  // namespace treespec
