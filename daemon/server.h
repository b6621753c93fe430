// kvprd's API server: the HTTP transport (daemon/http_server.h) with the routes
// (daemon/routes.h) behind it, on one io_context thread. Requests become engine requests on the
// worker pool; their events come back on the same thread, so nothing here needs a lock.
#pragma once

#include <boost/asio/io_context.hpp>
#include <memory>

#include "daemon/config.h"
#include "daemon/worker_pool.h"
#include "engine/text/tokenizer.h"
#include "openai/request.h"

namespace kvpr {

class HttpServer;
class Routes;
struct DaemonMetrics;

class Server {
 public:
  Server(boost::asio::io_context& io, const DaemonConfig& cfg, WorkerPool& pool, const Tokenizer& tok,
         const ServedModel& served);
  ~Server();
  // Binds and starts accepting. Throws kvpr::Error when the address cannot be bound.
  void listen();
  // New requests get 503 from now on; in-flight ones finish.
  void begin_drain();
  int64_t in_flight_requests() const;
  // Closes the listener.
  void close();
  // The drain timeout has passed: requests still generating end now (an error event and
  // [DONE] for a stream, a 503 otherwise); in_flight_requests() falls as their ends are written.
  void abandon_in_flight();
  // SIGHUP: the settings that change live (apply_live_config's), for requests from now on.
  void apply_config(const DaemonConfig& live);

 private:
  DaemonConfig cfg_;
  std::unique_ptr<DaemonMetrics> metrics_;
  std::unique_ptr<HttpServer> http_;
  std::unique_ptr<HttpServer> health_http_;  // --health-port: /health and /metrics alone
  std::shared_ptr<Routes> routes_;
};

}  // namespace kvpr
