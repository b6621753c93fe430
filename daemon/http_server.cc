#include "daemon/http_server.h"

#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <deque>
#include <fcntl.h>
#include <optional>

#include <spdlog/spdlog.h>

#include "daemon/metrics.h"
#include "engine/base/error.h"

namespace kvpr {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;

class Session;

struct HttpServer::Shared {
  HttpLimits limits;
  DaemonMetrics& metrics;
  Handler handler;
  tcp::acceptor acceptor;
  net::steady_timer accept_backoff;  // accept() failed (no descriptors): the next try waits
  Clock::time_point accept_error_logged{};
  int64_t connections = 0;  // open sessions
  int64_t in_flight = 0;    // held exchanges until their answer's last byte
  bool draining = false;
  Shared(net::io_context& io, HttpLimits l, DaemonMetrics& m, Handler h)
      : limits(l), metrics(m), handler(std::move(h)), acceptor(io), accept_backoff(io) {}
};

void respond_json(Exchange& ex, int status, const json::Value& body, HttpHeaders headers) {
  ex.respond(status, body.dump() + "\n", "application/json", std::move(headers));
}

void respond_error(Exchange& ex, const ApiError& e) {
  HttpHeaders h;
  if (e.status == 429) h.emplace_back("Retry-After", "1");
  if (e.status == 401) h.emplace_back("WWW-Authenticate", "Bearer");
  if (e.status >= 500 || e.status == 429 || e.status == 413)
    spdlog::warn("{} {} -> {} {}", ex.request().method, ex.request().target, e.status, e.message);
  respond_json(ex, e.status, error_body(e), std::move(h));
}

namespace {

std::chrono::milliseconds seconds_of(double s) { return std::chrono::milliseconds(static_cast<int64_t>(s * 1000)); }

constexpr size_t kMaxHeaderBytes = 64 * 1024;
constexpr int64_t kHealthSlots = 16;  // connections past --max-connections that may ask /health
// Output queued for a client that does not read it fast enough (a stream of events, each written
// once the last has left): past this the connection is closed and its generation cancelled.
constexpr size_t kMaxQueuedBytes = 8u << 20;

std::string lower_trimmed(std::string_view v) {
  while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
  while (!v.empty() && (v.back() == ' ' || v.back() == '\t')) v.remove_suffix(1);
  std::string s(v);
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// RFC 9112 on a request's header: what makes its framing ambiguous or its target unknowable is
// refused (400, then the connection closes: the bytes after it cannot be trusted as a next
// request). Empty when the header is sound.
std::string framing_error(const http::request_parser<http::string_body>::value_type& h, size_t header_bytes) {
  if (header_bytes > kMaxHeaderBytes) return "431";
  int hosts = 0, lengths = 0;
  std::vector<std::string> codings;
  for (const auto& f : h) {
    if (f.name() == http::field::host) ++hosts;
    if (f.name() == http::field::content_length) ++lengths;
    if (f.name() == http::field::transfer_encoding) {
      std::string_view v = f.value();
      for (size_t p = 0; p <= v.size();) {
        size_t q = v.find(',', p);
        if (q == std::string_view::npos) q = v.size();
        if (std::string c = lower_trimmed(v.substr(p, q - p)); !c.empty()) codings.push_back(c);
        p = q + 1;
      }
    }
  }
  // §6.1: only chunked is understood, and it must be the one and last coding; §6.3: a request
  // whose final coding is not chunked has no determinable length.
  if (!codings.empty()) {
    if (h.version() < 11) return "Transfer-Encoding in an HTTP/1.0 request";
    if (codings.size() != 1 || codings[0] != "chunked")
      return "Transfer-Encoding '" + std::string(h[http::field::transfer_encoding]) + "' is not supported (only chunked)";
    if (lengths > 0) return "both Transfer-Encoding and Content-Length";
  }
  // §3.2: exactly one Host in HTTP/1.1, at most one in HTTP/1.0.
  if (hosts > 1) return "more than one Host header";
  if (hosts == 0 && h.version() >= 11) return "no Host header (HTTP/1.1 requires one)";
  return "";
}

// §3.2.2: an absolute-form target (http://host/path?q) names the same resource as its path.
std::string origin_form(const std::string& target) {
  const size_t scheme = target.find("://");
  if (scheme == std::string::npos || target.empty() || target[0] == '/') return target;
  const std::string s = lower_trimmed(target.substr(0, scheme));
  if (s != "http" && s != "https") return target;
  const size_t path = target.find_first_of("/?", scheme + 3);
  if (path == std::string::npos) return "/";
  return target[path] == '?' ? "/" + target.substr(path) : target.substr(path);
}

}  // namespace

class Session : public Exchange, public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket sock, std::shared_ptr<HttpServer::Shared> sh) : stream_(std::move(sock)), sh_(std::move(sh)) {
    ++sh_->connections;
  }
  ~Session() override { --sh_->connections; }

  void start() { do_read(); }
  void health_only() { health_only_ = true; }

  // Past --max-connections: a 503 and the connection closed, without reading a request.
  void refuse() {
    keep_alive_ = false;
    refusing_ = true;
    respond_error(*this, {503,
                          "the server has too many open connections (" + std::to_string(sh_->limits.max_connections) +
                              ", --max-connections); retry shortly",
                          "service_unavailable", ""});
  }

  // ---- Exchange
  const HttpRequest& request() const override { return request_; }

  void respond(int status, std::string body, std::string_view content_type, HttpHeaders headers) override {
    on_gone_ = nullptr;
    if (request_.method == "HEAD") {  // RFC 9110 §9.3.2: the headers a GET would have, no body
      auto res = std::make_shared<http::response<http::empty_body>>(static_cast<http::status>(status), 11);
      res->set(http::field::server, "kvprd");
      res->set(http::field::content_type, content_type);
      for (auto& [k, v] : headers) res->set(k, v);
      res->content_length(body.size());
      return write_response(res, status);
    }
    auto res = std::make_shared<http::response<http::string_body>>(static_cast<http::status>(status), 11);
    res->set(http::field::server, "kvprd");
    res->set(http::field::content_type, content_type);
    for (auto& [k, v] : headers) res->set(k, v);
    res->body() = std::move(body);
    res->prepare_payload();
    write_response(res, status);
  }

  template <class Response>
  void write_response(std::shared_ptr<Response> res, int status) {
    sh_->metrics.http_responses[status]++;
    if (sh_->draining) keep_alive_ = false;
    res->keep_alive(keep_alive_);
    auto self = shared_from_this();
    arm_write_timeout();
    http::async_write(stream_, *res, [self, res, status](beast::error_code ec, size_t) {
      self->end_hold();
      if (!ec && (status == 413 || self->refusing_)) {
        // The FIN goes now: a client that reads gets the answer and its end at once.
        beast::error_code sec;
        self->stream_.socket().shutdown(tcp::socket::shutdown_send, sec);
        return self->discard_then_close(status == 413 ? 5 : 1);
      }
      if (ec || !self->keep_alive_) return self->close();
      self->do_read();
    });
  }

  void hold(std::function<void()> on_gone) override {
    on_gone_ = std::move(on_gone);
    held_ = true;
    ++sh_->in_flight;
    watch_disconnect();
  }

  void start_events() override {
    sse_res_.emplace(http::status::ok, 11);
    sse_res_->set(http::field::server, "kvprd");
    sse_res_->set(http::field::content_type, "text/event-stream");
    sse_res_->set(http::field::cache_control, "no-cache");
    // An HTTP/1.0 client cannot read chunked coding (RFC 9112 §6.1): its stream is delimited by
    // the connection's close.
    close_delimited_ = request_.version < 11;
    if (close_delimited_) keep_alive_ = false;
    sse_res_->keep_alive(keep_alive_);
    sse_res_->chunked(!close_delimited_);
    sse_sr_.emplace(*sse_res_);
    sh_->metrics.http_responses[200]++;
    queue({Out::Header, {}});
  }
  void send_event(std::string payload, std::string_view name) override {
    queue({Out::Data, (name.empty() ? "" : "event: " + std::string(name) + "\n") + "data: " + payload + "\n\n"});
  }
  void end_events() override {
    on_gone_ = nullptr;
    queue({Out::Last, {}});
  }
  void close_after() override { keep_alive_ = false; }
  bool gone() const override { return closed_; }

 private:
  // A response's bytes (each write of a stream) must leave within --http-idle-timeout: a client
  // that stops reading is closed (its generation cancelled) instead of holding a connection, its
  // queued output and a drain.
  void arm_write_timeout() { stream_.expires_after(seconds_of(sh_->limits.idle_timeout_s)); }

  // ---- reading
  // A request is read as Beast's parser is meant to be used: bytes left over in buf_ after one
  // message are the next pipelined request; a kept-alive connection waits for its first byte up
  // to the idle timeout, then the whole request (headers and body) must come within the request
  // timeout; `Expect: 100-continue` is answered once the headers are in.
  void do_read() {
    parser_.emplace();
    parser_->body_limit(static_cast<uint64_t>(sh_->limits.max_body_bytes));
    parser_->header_limit(kMaxHeaderBytes + 4096);  // the exact limit: framing_error, on the bytes the header took
    if (buf_.size() > 0) return read_header();  // pipelined: the next request is here already
    stream_.expires_after(seconds_of(sh_->limits.idle_timeout_s));
    auto self = shared_from_this();
    stream_.async_read_some(buf_.prepare(64 * 1024), [self](beast::error_code ec, size_t n) {
      self->buf_.commit(n);
      if (ec) return self->close();  // the client closed, or was idle too long
      self->read_header();
    });
  }

  void read_header() {
    stream_.expires_after(seconds_of(sh_->limits.request_timeout_s));
    auto self = shared_from_this();
    http::async_read_header(stream_, buf_, *parser_, [self](beast::error_code ec, size_t header_bytes) {
      if (ec) return self->on_read(ec);
      if (const std::string why = framing_error(self->parser_->get(), header_bytes); !why.empty()) {
        self->keep_alive_ = false;
        self->refusing_ = true;  // what follows is read and dropped, so the client reads the 400
        self->request_.method = std::string(self->parser_->get().method_string());
        if (why == "431")
          return respond_error(*self, {431, "request headers larger than 64 KiB", "invalid_request_error", ""});
        return respond_error(*self, bad_request("malformed HTTP request: " + why));
      }
      if (beast::iequals(self->parser_->get()[http::field::expect], "100-continue") && !self->parser_->is_done()) {
        auto res = std::make_shared<http::response<http::empty_body>>(http::status::continue_, 11);
        return http::async_write(self->stream_, *res, [self, res](beast::error_code wec, size_t) {
          if (wec) return self->close();
          self->read_body();
        });
      }
      self->read_body();
    });
  }

  void read_body() {
    if (parser_->is_done()) return on_read({});
    auto self = shared_from_this();
    http::async_read(stream_, buf_, *parser_, [self](beast::error_code ec, size_t) { self->on_read(ec); });
  }

  void on_read(beast::error_code ec) {
    if (ec == http::error::end_of_stream || ec == net::error::eof || ec == net::error::operation_aborted) return close();
    if (ec == beast::error::timeout) {  // the stream has closed the socket: nothing can be sent
      spdlog::info("a request did not arrive whole within {}s (--http-request-timeout): connection closed",
                   sh_->limits.request_timeout_s);
      return close();
    }
    if (ec) {
      keep_alive_ = false;
      if (ec == http::error::body_limit)
        return respond_error(*this, {413, "request body larger than " + std::to_string(sh_->limits.max_body_bytes) + " bytes",
                                     "invalid_request_error", ""});
      if (ec == http::error::header_limit)
        return respond_error(*this, {431, "request headers larger than 64 KiB", "invalid_request_error", ""});
      if (ec == http::error::bad_transfer_encoding || ec == http::error::bad_content_length ||
          ec == http::error::bad_chunk || ec == http::error::bad_chunk_extension)
        return respond_error(*this, bad_request("malformed HTTP request: " + ec.message()));
      return respond_error(*this, bad_request(std::string("malformed HTTP request: ") + ec.message()));
    }
    http::request<http::string_body> req = parser_->release();
    keep_alive_ = req.keep_alive();
    request_.method = std::string(req.method_string());
    request_.version = req.version() < 11 ? 10 : 11;
    request_.target = std::string(req.target());
    const std::string origin = origin_form(request_.target);
    request_.path = origin.substr(0, origin.find('?'));
    request_.authorization = std::string(req[http::field::authorization]);
    request_.body = std::move(req.body());
    stream_.expires_never();
    if (health_only_ && request_.path != "/health") return refuse();
    if (health_only_) keep_alive_ = false;
    // A body is JSON or nothing (a form or text/plain POST, which a browser sends cross-site with
    // no preflight, never reaches a route).
    if (!request_.body.empty()) {
      const std::string_view ct = req[http::field::content_type];
      const std::string media = lower_trimmed(ct.substr(0, ct.find(';')));
      if (media != "application/json" && !(media.rfind("application/", 0) == 0 && media.size() > 17 &&
                                            media.compare(media.size() - 5, 5, "+json") == 0))
        return respond_error(*this, {415,
                                     ct.empty() ? std::string("a request body needs Content-Type: application/json")
                                                : "Content-Type '" + std::string(ct) + "' is not supported: send application/json",
                                     "invalid_request_error", ""});
    }
    try {
      sh_->handler(shared_from_this());
    } catch (const ApiError& e) {
      respond_error(*this, e);
    } catch (const std::exception& e) {
      respond_error(*this, {500, std::string("internal error: ") + e.what(), "server_error", ""});
    }
  }

  // After a 413 the client may still be sending its body: read and drop it for a while so it
  // gets to read the response instead of a reset connection.
  void discard_then_close(int seconds) {
    stream_.expires_after(std::chrono::seconds(seconds));
    discard_.resize(64 * 1024);
    auto self = shared_from_this();
    stream_.async_read_some(net::buffer(discard_), [self, seconds](beast::error_code ec, size_t n) {
      self->discarded_ += n;
      if (ec || self->discarded_ > (64u << 20)) return self->close();
      self->discard_then_close(seconds);
    });
  }

  void close() {
    if (closed_) return;
    closed_ = true;
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
    stream_.socket().close(ec);
    if (auto gone = std::move(on_gone_)) {
      on_gone_ = nullptr;
      gone();
    }
    end_hold();
  }

  void end_hold() {
    if (!held_) return;
    held_ = false;
    --sh_->in_flight;
  }

  // ---- streaming (server-sent events over chunked transfer encoding)
  struct Out {
    enum Kind { Header, Data, Last } kind;
    std::string data;
  };

  void queue(Out o) {
    if (closed_) return;
    // A backlog past the cap (not one large event: a prompt's logprobs with echo can be several
    // MiB alone) is a client that stopped reading: its generation is cancelled.
    if (!out_.empty() && queued_bytes_ > kMaxQueuedBytes) {
      spdlog::warn("{} {}: the client read too slowly ({} bytes queued); connection closed", request_.method,
                   request_.target, queued_bytes_);
      out_.clear();
      return close();
    }
    queued_bytes_ += o.data.size();
    out_.push_back(std::move(o));
    write_next();
  }

  void write_next() {
    if (writing_ || out_.empty() || closed_) return;
    writing_ = true;
    auto self = shared_from_this();
    auto done = [self](beast::error_code ec, size_t) {
      self->writing_ = false;
      if (self->out_.empty()) return;  // closed (and cleared) meanwhile
      const Out::Kind k = self->out_.front().kind;
      self->queued_bytes_ -= self->out_.front().data.size();
      self->out_.pop_front();
      if (ec) return self->close();  // the client went away: close() tells the handler
      if (k == Out::Last) {
        self->sse_sr_.reset();
        self->sse_res_.reset();
        self->end_hold();
        if (!self->keep_alive_ || self->sh_->draining) return self->close();
        return self->do_read();
      }
      self->write_next();
    };
    Out& o = out_.front();
    arm_write_timeout();
    if (o.kind == Out::Header) http::async_write_header(stream_, *sse_sr_, done);
    else if (close_delimited_ && o.kind == Out::Data) net::async_write(stream_, net::buffer(o.data), done);
    else if (close_delimited_) net::async_write(stream_, net::buffer(o.data), done);  // nothing: the close ends it
    else if (o.kind == Out::Data) net::async_write(stream_, http::make_chunk(net::buffer(o.data)), done);
    else net::async_write(stream_, http::make_chunk_last(), done);
  }

  // While a request is held, notice a client that disconnects (readable with nothing to read).
  void watch_disconnect() {
    auto self = shared_from_this();
    stream_.socket().async_wait(tcp::socket::wait_read, [self](beast::error_code ec) {
      if (ec || self->closed_ || !self->on_gone_) return;
      char c;
      const ssize_t r = ::recv(self->stream_.socket().native_handle(), &c, 1, MSG_PEEK | MSG_DONTWAIT);
      if (r == 0) return self->close();  // orderly shutdown by the client
      if (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return self->close();
      // Data of a pipelined request: not a disconnect.
    });
  }

  beast::tcp_stream stream_;
  std::shared_ptr<HttpServer::Shared> sh_;
  beast::flat_buffer buf_;
  std::optional<http::request_parser<http::string_body>> parser_;
  HttpRequest request_;
  bool keep_alive_ = true;
  bool refusing_ = false;
  bool held_ = false;  // in sh_->in_flight
  bool closed_ = false;
  bool writing_ = false;
  bool close_delimited_ = false;  // an HTTP/1.0 stream: no chunks, the close ends it
  bool health_only_ = false;      // past --max-connections: answers /health, 503 to the rest
  size_t queued_bytes_ = 0;       // of out_
  std::function<void()> on_gone_;
  std::optional<http::response<http::empty_body>> sse_res_;
  std::optional<http::response_serializer<http::empty_body>> sse_sr_;
  std::deque<Out> out_;
  std::vector<char> discard_;
  size_t discarded_ = 0;
};

HttpServer::HttpServer(net::io_context& io, HttpLimits limits, DaemonMetrics& metrics, Handler handler)
    : sh_(std::make_shared<Shared>(io, limits, metrics, std::move(handler))) {}

HttpServer::~HttpServer() { close(); }

void HttpServer::listen(const std::string& host, int port) {
  beast::error_code ec;
  auto addr = net::ip::make_address(host, ec);
  KVPR_CHECK(!ec, "bad --host '", host, "': ", ec.message());
  tcp::endpoint ep(addr, static_cast<unsigned short>(port));
  sh_->acceptor.open(ep.protocol(), ec);
  if (!ec) sh_->acceptor.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) sh_->acceptor.bind(ep, ec);
  if (!ec) sh_->acceptor.listen(net::socket_base::max_listen_connections, ec);
  KVPR_CHECK(!ec, "cannot listen on ", host, ":", port, ": ", ec.message());
  ::fcntl(sh_->acceptor.native_handle(), F_SETFD, FD_CLOEXEC);  // not inherited by workers
  accept_next(sh_);
}

// Each pending accept holds the shared state; closing the acceptor ends the chain (no cycle).
// accept() failing (out of descriptors: EMFILE, ENFILE; out of memory) would fail again at once:
// the next try waits 100 ms, so the loop neither spins nor stops serving the connections it has.
// Accepted sockets are close-on-exec (workers never inherit a client's connection).
void HttpServer::accept_next(std::shared_ptr<Shared> sh) {
  sh->acceptor.async_accept([sh](beast::error_code e, tcp::socket sock) {
    if (e == net::error::operation_aborted || !sh->acceptor.is_open()) return;
    if (e) {
      if (Clock::now() - sh->accept_error_logged > std::chrono::seconds(10)) {
        sh->accept_error_logged = Clock::now();
        spdlog::warn("accept failed: {} (retrying every 100 ms; logged every 10 s)", e.message());
      }
      sh->accept_backoff.expires_after(std::chrono::milliseconds(100));
      sh->accept_backoff.async_wait([sh](beast::error_code ec) {
        if (!ec) accept_next(sh);
      });
      return;
    }
    ::fcntl(sock.native_handle(), F_SETFD, FD_CLOEXEC);
    auto session = std::make_shared<Session>(std::move(sock), sh);
    // Past --max-connections a few more are read, for /health alone (a liveness probe must not
    // see a busy daemon as dead); past those, a 503 without reading.
    if (sh->connections > sh->limits.max_connections + kHealthSlots) {
      session->refuse();
    } else {
      if (sh->connections > sh->limits.max_connections) session->health_only();
      session->start();
    }
    accept_next(sh);
  });
}

void HttpServer::close() {
  beast::error_code ec;
  sh_->acceptor.close(ec);
  sh_->accept_backoff.cancel();
}

void HttpServer::set_limits(const HttpLimits& limits) { sh_->limits = limits; }
void HttpServer::begin_drain() { sh_->draining = true; }
int64_t HttpServer::connections() const { return sh_->connections; }
int64_t HttpServer::in_flight() const { return sh_->in_flight; }

}  // namespace kvpr
