#include "daemon/server.h"

#include "daemon/http_server.h"
#include "daemon/metrics.h"
#include "daemon/routes.h"

namespace kvpr {

namespace {

HttpLimits http_limits(const DaemonConfig& cfg) {
  return {cfg.max_body_bytes, cfg.http_idle_timeout_s, cfg.http_request_timeout_s, cfg.max_connections};
}

}  // namespace

Server::Server(boost::asio::io_context& io, const DaemonConfig& cfg, WorkerPool& pool, const Tokenizer& tok,
               const ServedModel& served)
    : cfg_(cfg), metrics_(std::make_unique<DaemonMetrics>()) {
  // The routes are reached from the HTTP layer's handler only while the io_context runs, which
  // ends before this server is destroyed; pending callbacks hold the routes themselves.
  http_ = std::make_unique<HttpServer>(io, http_limits(cfg), *metrics_, [&routes = routes_](const std::shared_ptr<Exchange>& ex) {
    routes->handle(ex);
  });
  routes_ = std::make_shared<Routes>(cfg, pool, tok, served, *metrics_, *http_);
  if (cfg.health_port > 0) {
    // Probes send small GETs at once: short timeouts, a few connections, nothing else served.
    const HttpLimits probe{4096, 5, 5, 64};
    health_http_ = std::make_unique<HttpServer>(io, probe, *metrics_, [&routes = routes_](const std::shared_ptr<Exchange>& ex) {
      const std::string& path = ex->request().path;
      if (path != "/health" && path != "/metrics")
        throw ApiError{404, "no route " + path + " on the health port (it serves /health and /metrics)",
                       "invalid_request_error", ""};
      routes->handle(ex);
    });
  }
}

Server::~Server() { close(); }

void Server::listen() {
  http_->listen(cfg_.host, cfg_.port);
  if (health_http_) health_http_->listen(cfg_.host, cfg_.health_port);
}

void Server::begin_drain() {
  http_->begin_drain();
  routes_->begin_drain();
}

int64_t Server::in_flight_requests() const { return http_->in_flight(); }

void Server::close() {
  http_->close();
  if (health_http_) health_http_->close();
}

void Server::abandon_in_flight() { routes_->abandon_in_flight(); }

void Server::apply_config(const DaemonConfig& live) {
  cfg_ = live;
  http_->set_limits(http_limits(live));
  routes_->apply_config(live);
}

}  // namespace kvpr
