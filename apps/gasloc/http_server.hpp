// A small HTTP/1.1 server for `gasloc dashboard`: POSIX sockets, one thread, GET only. Each
// connection sends one request (its head at most kMaxRequestBytes), gets one answer and is
// closed; poll() serves several connections at once, so a browser's idle pre-connections never
// hold up the others. Not meant to face the internet: it listens on loopback unless told not to.
#pragma once
#include <functional>
#include <string>

namespace gasloc::app {

struct HttpResponse {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
};

// Answers the path of a GET request ("/", "/data.json?x=1": the query is kept).
using HttpHandler = std::function<HttpResponse(const std::string& path)>;

class HttpServer {
 public:
  static constexpr size_t kMaxRequestBytes = 16 * 1024;

  // Listens on addr:port (an IPv4 address; port 0: a free one the system picks). Throws
  // gasloc::Error when the address is not one, or the port is taken or not allowed.
  HttpServer(const std::string& addr, int port);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  int port() const { return port_; }

  // Serves until gasloc::interrupt_requested() (Ctrl+C or SIGTERM: the caller installs the handler).
  void serve(const HttpHandler& handler);

 private:
  int listen_fd_ = -1;
  int port_ = 0;
};

// Whether an IPv4 address is a loopback one (127.0.0.0/8): reachable from this host only.
bool is_loopback(const std::string& addr);

}  // namespace gasloc::app
