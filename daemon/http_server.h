// kvprd's HTTP transport: Boost.Beast on one io_context thread. Connections, keep-alive and
// pipelining, the idle, request and write timeouts, the body and header limits, 100-continue,
// --max-connections, Server-Sent Events over chunked encoding, and noticing a client that
// leaves while its request is generating. What a request means is not its business: each one
// goes to the handler (daemon/routes.h), which answers through its Exchange.
#pragma once

#include <boost/asio/io_context.hpp>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "engine/base/json.h"
#include "openai/api_error.h"

namespace kvpr {

struct DaemonMetrics;  // daemon/metrics.h: the connection counters it keeps

struct HttpRequest {
  std::string method;  // GET, POST, ...
  std::string target;  // as sent (origin-form, or absolute-form: http://host/path)
  std::string path;    // the target's path, less its query
  int version = 11;    // 10 or 11
  std::string authorization;
  std::string body;
};

using HttpHeaders = std::vector<std::pair<std::string, std::string>>;

// One request and its answer on a connection (requests on a connection are answered in order:
// the next is read only once this one's answer is written).
class Exchange {
 public:
  virtual ~Exchange() = default;
  virtual const HttpRequest& request() const = 0;
  // A whole response. The connection stays open for the next request unless the client, a
  // drain or close_after() says otherwise.
  virtual void respond(int status, std::string body, std::string_view content_type, HttpHeaders headers = {}) = 0;
  // A long request (a generation): counted in HttpServer::in_flight() until its last byte is
  // written or the client is gone; `on_gone` runs once if the client leaves before the answer
  // is complete (respond or end_events).
  virtual void hold(std::function<void()> on_gone) = 0;
  // Server-Sent Events: the 200 header, then one "data: <payload>" event per call (after an
  // "event: <name>" line when a name is given), then the end.
  virtual void start_events() = 0;
  virtual void send_event(std::string payload, std::string_view name = {}) = 0;
  virtual void end_events() = 0;
  virtual void close_after() = 0;  // the connection closes once this answer is written
  virtual bool gone() const = 0;   // the client left: nothing more can be sent
};

// The JSON body with its status; an error as OpenAI shapes it (with Retry-After on a 429, and
// logged when the server is at fault or refusing).
void respond_json(Exchange& ex, int status, const json::Value& body, HttpHeaders headers = {});
void respond_error(Exchange& ex, const ApiError& e);

struct HttpLimits {
  int64_t max_body_bytes = 0;
  double idle_timeout_s = 0;     // a kept-alive connection's wait for a request, a write's
  double request_timeout_s = 0;  // a request's headers and body, once its first byte is in
  int64_t max_connections = 0;   // past it a connection gets a 503 and is closed
};

class HttpServer {
 public:
  using Handler = std::function<void(const std::shared_ptr<Exchange>&)>;
  // The handler may throw ApiError (sent as the answer) or any exception (a 500).
  HttpServer(boost::asio::io_context& io, HttpLimits limits, DaemonMetrics& metrics, Handler handler);
  ~HttpServer();
  // Binds and starts accepting. Throws kvpr::Error when the address cannot be bound.
  void listen(const std::string& host, int port);
  void close();  // the listener; open connections go on
  void set_limits(const HttpLimits& limits);
  void begin_drain();  // connections close after their current answer
  int64_t connections() const;
  int64_t in_flight() const;  // held exchanges not yet answered to their last byte

  struct Shared;

 private:
  static void accept_next(std::shared_ptr<Shared> sh);
  std::shared_ptr<Shared> sh_;
};

}  // namespace kvpr
