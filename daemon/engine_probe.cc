#include "daemon/engine_probe.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <vector>

#include "engine/base/error.h"

extern char** environ;

namespace kvpr {

namespace {

// The last line of `text` that is not blank.
std::string last_line(const std::string& text) {
  size_t end = text.find_last_not_of(" \n\r\t");
  if (end == std::string::npos) return "";
  size_t begin = text.rfind('\n', end);
  return text.substr(begin == std::string::npos ? 0 : begin + 1, end + 1 - (begin == std::string::npos ? 0 : begin + 1));
}

// Reads the child's stdout and stderr (each kept to 1 MiB) until both close or `timeout_s` passes
// (false: it passed, or the pipes could not be waited on). Closes both descriptors.
bool read_both(int out_fd, int err_fd, double timeout_s, std::string text[2]) {
  pollfd fds[2] = {{out_fd, POLLIN, 0}, {err_fd, POLLIN, 0}};
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  bool done = true;
  int open = 2;
  while (open > 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      done = false;
      break;
    }
    const int r = ::poll(fds, 2, static_cast<int>(std::min<int64_t>(left.count(), 1000)));
    if (r < 0 && errno != EINTR) {
      done = false;  // cannot wait for it: it goes
      break;
    }
    if (r <= 0) continue;  // (revents are fresh only when poll reported some)
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      char buf[4096];
      const ssize_t n = ::read(fds[i].fd, buf, sizeof buf);
      if (n > 0 && text[i].size() < (1u << 20)) {
        text[i].append(buf, static_cast<size_t>(n));
      } else if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN)) {
        ::close(fds[i].fd);
        fds[i].fd = -1;
        --open;
      }
    }
  }
  for (auto& f : fds)
    if (f.fd >= 0) ::close(f.fd);
  return done;
}

}  // namespace

EngineDescription probe_engine(const std::string& worker_binary, const DaemonConfig& cfg, double timeout_s) {
  std::vector<std::string> args = {worker_binary, "--describe", "--model", cfg.model, "--backend", cfg.backend};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  int out[2], err[2];
  KVPR_CHECK(::pipe2(out, O_CLOEXEC) == 0, "pipe failed: ", std::strerror(errno));
  if (::pipe2(err, O_CLOEXEC) != 0) {
    ::close(out[0]);
    ::close(out[1]);
    KVPR_THROW("pipe failed: ", std::strerror(errno));
  }
  const pid_t pid = ::fork();
  if (pid < 0) {
    for (int fd : {out[0], out[1], err[0], err[1]}) ::close(fd);
    KVPR_THROW("fork failed: ", std::strerror(errno));
  }
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlives a kvprd stopped while it asks
    ::dup2(out[1], 1);
    ::dup2(err[1], 2);
    ::execve(argv[0], argv.data(), environ);
    const char msg[] = "exec failed\n";
    ssize_t ignored = ::write(2, msg, sizeof msg - 1);
    (void)ignored;
    ::_exit(127);
  }
  ::close(out[1]);
  ::close(err[1]);
  for (int fd : {out[0], err[0]}) ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  std::string text[2];
  const bool timed_out = !read_both(out[0], err[0], timeout_s, text);
  if (timed_out) ::kill(pid, SIGKILL);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  KVPR_CHECK(!timed_out, worker_binary, " --describe did not answer within ", timeout_s, " s (or could not be waited for)");
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::string why = last_line(text[1]);
    // The worker's own one-line error (the model cannot be read): as it says it.
    const std::string own = "kvpr-worker: ";
    if (WIFEXITED(status) && WEXITSTATUS(status) == 2 && why.rfind(own, 0) == 0) KVPR_THROW(why.substr(own.size()));
    if (why.empty()) why = WIFSIGNALED(status) ? "killed by signal " + std::to_string(WTERMSIG(status))
                                                : "exit status " + std::to_string(WEXITSTATUS(status));
    KVPR_THROW(worker_binary, " --describe failed (", why, "): is it this kvprd's worker?");
  }
  try {
    return decode_description(json::parse(last_line(text[0])));
  } catch (const std::exception& e) {
    KVPR_THROW(worker_binary, " --describe answered what kvprd cannot read (", e.what(), "): is it this kvprd's worker?");
  }
}

}  // namespace kvpr
