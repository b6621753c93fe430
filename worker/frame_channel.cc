#include "worker/frame_channel.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "engine/base/error.h"

namespace kvpr {

FrameChannel::FrameChannel(int fd) : fd_(fd) {}

FrameChannel::~FrameChannel() {
  if (fd_ >= 0) ::close(fd_);
}

void FrameChannel::shutdown() { ::shutdown(fd_, SHUT_RDWR); }

std::string FrameChannel::frame(const json::Value& msg) {
  std::string body = msg.dump();
  KVPR_CHECK(body.size() <= kMaxFrame, "frame of ", body.size(), " bytes is too large");
  uint32_t n = static_cast<uint32_t>(body.size());
  std::string frame(4, '\0');
  std::memcpy(frame.data(), &n, 4);  // little-endian hosts only (x86-64, arm64)
  frame += body;
  return frame;
}

void FrameChannel::send_frame(const std::string& frame) {
  std::lock_guard<std::mutex> lock(send_mu_);
  size_t off = 0;
  while (off < frame.size()) {
    ssize_t w = ::send(fd_, frame.data() + off, frame.size() - off, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) throw ChannelClosed(std::string("channel closed: ") + std::strerror(errno));
    off += static_cast<size_t>(w);
  }
}

bool FrameChannel::pop_frame(json::Value* msg) {
  if (inbox_.size() < 4) return false;
  uint32_t n;
  std::memcpy(&n, inbox_.data(), 4);
  KVPR_CHECK(n <= kMaxFrame, "frame of ", n, " bytes is too large");
  if (inbox_.size() < 4 + static_cast<size_t>(n)) return false;
  json::Value v;
  try {
    v = json::parse(std::string_view(inbox_).substr(4, n));
  } catch (...) {
    inbox_.erase(0, 4 + static_cast<size_t>(n));  // consumed even when it does not parse
    throw;
  }
  inbox_.erase(0, 4 + static_cast<size_t>(n));
  *msg = std::move(v);
  return true;
}

bool FrameChannel::recv(json::Value* msg, int timeout_ms) {
  if (pop_frame(msg)) return true;
  while (true) {
    pollfd p{fd_, POLLIN, 0};
    int r = ::poll(&p, 1, timeout_ms);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) throw ChannelClosed(std::string("poll failed: ") + std::strerror(errno));
    if (r == 0) return false;
    char buf[65536];
    ssize_t got = ::read(fd_, buf, sizeof buf);
    if (got < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (got <= 0) throw ChannelClosed("channel closed by peer");
    inbox_.append(buf, static_cast<size_t>(got));
    if (pop_frame(msg)) return true;
  }
}

}  // namespace kvpr
