// The HTTP side of kvprd: a Boost.Beast server on one io_context thread serving the
// OpenAI-compatible API. Requests become engine requests on the worker pool; their events
// come back on the same thread, so nothing here needs a lock.
#pragma once

#include <boost/asio.hpp>
#include <memory>
#include <string>

#include "daemon/config.h"
#include "daemon/worker_pool.h"
#include "engine/generation_config.h"
#include "engine/tokenizer.h"

namespace kvpr {

class Server {
 public:
  Server(boost::asio::io_context& io, const DaemonConfig& cfg, WorkerPool& pool, const Tokenizer& tok,
         int64_t max_model_len, std::string chat_template, int64_t vocab_size, const SamplingDefaults& defaults);
  ~Server();
  // Binds and starts accepting. Throws kvpr::Error when the address cannot be bound.
  void listen();
  // New requests get 503 from now on; in-flight ones finish.
  void begin_drain();
  bool draining() const;
  int64_t in_flight_requests() const;
  // Closes the listener.
  void close();

  struct State;

 private:
  static void accept_next(std::shared_ptr<State> st);
  std::shared_ptr<State> st_;
};

}  // namespace kvpr
