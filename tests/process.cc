#include "tests/process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>

namespace treespec::testing {

ChildProcess::ChildProcess(const std::vector<std::string>& argv, const std::string& stderr_path)
    : stderr_path_(stderr_path) {
  int out[2];
  if (pipe(out) != 0) return;
  pid_ = fork();
  if (pid_ == 0) {
    dup2(out[1], STDOUT_FILENO);
    int err = open(stderr_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (err >= 0) dup2(err, STDERR_FILENO);
    close(out[0]);
    close(out[1]);
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  close(out[1]);
  stdout_fd_ = out[0];
}

ChildProcess::~ChildProcess() {
  if (pid_ > 0 && exit_status_ < 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  if (stdout_fd_ >= 0) close(stdout_fd_);
}

std::string ChildProcess::WaitForLine(const std::string& needle, double timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (std::chrono::steady_clock::now() < deadline) {
    size_t nl;
    while ((nl = buffer_.find('\n')) != std::string::npos) {
      std::string line = buffer_.substr(0, nl);
      buffer_.erase(0, nl + 1);
      if (line.find(needle) != std::string::npos) return line;
    }
    pollfd p{stdout_fd_, POLLIN, 0};
    if (poll(&p, 1, 100) > 0) {
      char buf[4096];
      const ssize_t n = read(stdout_fd_, buf, sizeof(buf));
      if (n <= 0) return "";  // the child closed stdout (exited)
      buffer_.append(buf, n);
    }
  }
  return "";
}

std::string ChildProcess::WaitForAddress(double timeout_s) {
  const std::string line = WaitForLine("listening on ", timeout_s);
  const size_t at = line.find("listening on ");
  return at == std::string::npos ? "" : line.substr(at + 13);
}

void ChildProcess::Signal(int sig) {
  if (pid_ > 0 && exit_status_ < 0) kill(pid_, sig);
}

int ChildProcess::Wait(double timeout_s) {
  if (exit_status_ >= 0) return exit_status_;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (std::chrono::steady_clock::now() < deadline) {
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      exit_status_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      return exit_status_;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return -1;
}

std::string ChildProcess::Stderr() const {
  std::ifstream in(stderr_path_);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace treespec::testing
