// A small HTTP/1.1 server for `gasloc dashboard`: POSIX sockets, one thread, GET only. Each
// connection sends one request (its head at most kMaxRequestBytes), gets one answer and is
// closed. Nothing blocks: poll() reads requests and sends answers of all connections piecewise,
// so a client that reads its answer slowly holds up nobody, and each phase has a deadline
// (HttpLimits). Past the connection cap the oldest connection still waiting for its request is
// dropped, so that idle pre-connections never lock a browser out. A request whose Host is not
// one of this server's names is refused (DNS rebinding). Not meant to face the internet: it
// listens on loopback unless told not to.
#pragma once
#include <chrono>
#include <functional>
#include <string>
#include <vector>

namespace gasloc::app {

struct HttpResponse {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
};

// Answers the path of a GET request ("/", "/data.json?x=1": the query is kept).
using HttpHandler = std::function<HttpResponse(const std::string& path)>;

struct HttpLimits {
  std::chrono::milliseconds request_timeout{10'000};  // from connecting to a request's whole head
  std::chrono::milliseconds send_deadline{10'000};    // to take the whole answer, however slowly read
  size_t max_connections = 64;                        // past it the oldest waiting one is dropped
};

class HttpServer {
 public:
  static constexpr size_t kMaxRequestBytes = 16 * 1024;

  // Listens on addr:port (an IPv4 address; port 0: a free one the system picks). Requests are
  // served when their Host (any port) is 127.0.0.1, localhost, [::1], `addr` or one of
  // `extra_hosts` (names or addresses, no port). Throws gasloc::Error when the address is not
  // one, the port is taken or not allowed, or an extra host is not a bare name.
  HttpServer(const std::string& addr, int port, const std::vector<std::string>& extra_hosts = {},
             HttpLimits limits = {});
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  int port() const { return port_; }

  // Serves until gasloc::interrupt_requested() (Ctrl+C or SIGTERM: the caller installs the handler).
  void serve(const HttpHandler& handler);

 private:
  int listen_fd_ = -1;
  int port_ = 0;
  std::vector<std::string> host_names_;  // lower case, IPv6 in brackets
  HttpLimits limits_;
};

// Whether an IPv4 address is a loopback one (127.0.0.0/8): reachable from this host only.
bool is_loopback(const std::string& addr);

// Whether a request's Host header value ("localhost:8080", "[::1]") names one of `names`
// (lower case, without port): the name compared without case, the port, if any, digits.
bool host_is_allowed(const std::string& host, const std::vector<std::string>& names);

}  // namespace gasloc::app
