// Child processes for tests that drive the real binaries.
#ifndef TREESPEC_TESTS_PROCESS_H_
#define TREESPEC_TESTS_PROCESS_H_

#include <string>
#include <vector>

namespace treespec::testing {

class ChildProcess {
 public:
  // Starts `argv` with stdout captured; stderr goes to `stderr_path`.
  ChildProcess(const std::vector<std::string>& argv, const std::string& stderr_path);
  ~ChildProcess();  // SIGKILLs the child if it still runs
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  // Reads stdout until a line containing `needle` arrives (returns it) or timeout ("" then).
  std::string WaitForLine(const std::string& needle, double timeout_s);
  // The "HOST:PORT" of a "... listening on HOST:PORT" line, or "".
  std::string WaitForAddress(double timeout_s);
  void Signal(int sig);
  // Waits for exit; returns the exit status (128 + signal when killed), or -1 on timeout.
  int Wait(double timeout_s);
  std::string Stderr() const;
  int pid() const { return pid_; }

 private:
  int pid_ = -1;
  int stdout_fd_ = -1;
  std::string buffer_;
  std::string stderr_path_;
  int exit_status_ = -1;
};

}  // namespace treespec::testing

#endif  // TREESPEC_TESTS_PROCESS_H_
