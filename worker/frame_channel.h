// The controller <-> worker protocol's transport: frames of a 4-byte little-endian length
// followed by that many bytes of UTF-8 JSON (one object per frame), over a local stream
// socket. See PROTOCOL.md for the messages.
#pragma once

#include <mutex>
#include <stdexcept>
#include <string>

#include "engine/base/json.h"

namespace kvpr {

class ChannelClosed : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class FrameChannel {
 public:
  static constexpr uint32_t kMaxFrame = 64u << 20;

  explicit FrameChannel(int fd);  // takes ownership of fd
  ~FrameChannel();
  FrameChannel(const FrameChannel&) = delete;
  FrameChannel& operator=(const FrameChannel&) = delete;

  // Sends one message. Thread-safe. Throws ChannelClosed when the peer is gone.
  void send(const json::Value& msg) { send_frame(frame(msg)); }
  // The same in two halves: a message as its frame (length and JSON), and a frame sent whole.
  static std::string frame(const json::Value& msg);
  void send_frame(const std::string& frame);
  // Waits up to timeout_ms (-1: forever) for one message. Returns false on timeout; throws
  // ChannelClosed at end of stream, kvpr::Error on a malformed frame. One reader at a time.
  bool recv(json::Value* msg, int timeout_ms);
  int fd() const { return fd_; }
  // Makes a blocked recv() return (ChannelClosed) and later sends fail.
  void shutdown();

 private:
  bool pop_frame(json::Value* msg);
  int fd_;
  std::mutex send_mu_;
  std::string inbox_;
};

}  // namespace kvpr
