// The HTTP side of kvprd: a Boost.Beast server on one io_context thread serving the
// OpenAI-compatible API. Requests become engine requests on the worker pool; their events
// come back on the same thread, so nothing here needs a lock.
#pragma once

#include <boost/asio.hpp>
#include <memory>
#include <string>

#include "daemon/config.h"
#include "daemon/worker_pool.h"
#include "engine/decode/generation_config.h"
#include "engine/text/tokenizer.h"

namespace kvpr {

// What kvprd serves, as decided at start from the model and the flags.
class Session;

struct ServedModel {
  int64_t max_model_len = 0;  // context: prompt + max_tokens
  int64_t vocab_size = 0;     // the model's: prompt ids at or beyond it cannot be embedded
  std::string chat_template;  // a name of render_chat's
  std::string default_system; // chatml: the template's own system message, if any
  SamplingDefaults defaults;  // generation_config.json's, for fields a request leaves out
  std::string tool_call_parser = "none";  // none, hermes or llama3_json (auto resolved)
};

class Server {
 public:
  Server(boost::asio::io_context& io, const DaemonConfig& cfg, WorkerPool& pool, const Tokenizer& tok,
         const ServedModel& served);
  ~Server();
  // Binds and starts accepting. Throws kvpr::Error when the address cannot be bound.
  void listen();
  // New requests get 503 from now on; in-flight ones finish.
  void begin_drain();
  bool draining() const;
  int64_t in_flight_requests() const;
  // Closes the listener.
  void close();
  // The drain timeout has passed: requests still generating end now (an error event and
  // [DONE] for a stream, a 503 otherwise); in_flight_requests() falls as their ends are written.
  void abandon_in_flight();
  // SIGHUP: the settings that change live (apply_live_config's), for requests from now on.
  void apply_config(const DaemonConfig& live);

  struct State;

 private:
  static void accept_next(std::shared_ptr<State> st);
  std::shared_ptr<State> st_;
};

}  // namespace kvpr
