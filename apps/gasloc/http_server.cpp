#include "http_server.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <vector>

#include "gasloc/core/error.hpp"
#include "gasloc/core/interrupt.hpp"

namespace gasloc::app {

namespace {

using Clock = std::chrono::steady_clock;

constexpr int kPollMs = 200;             // how soon Ctrl+C is noticed
constexpr size_t kMaxConnections = 64;   // more at once are closed unanswered
constexpr auto kRequestTimeout = std::chrono::seconds(10);  // to send a request's head
constexpr int kSendTimeoutS = 10;        // to take an answer

struct Connection {
  int fd = -1;
  std::string received;
  Clock::time_point opened;
};

const char* reason(int status) {
  switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    default: return "Error";
  }
}

// Connections are read without blocking (poll tells when); an answer is sent blocking, for at
// most kSendTimeoutS, so that a client that stops reading cannot hold the server for longer.
void set_blocking_with_send_timeout(int fd) {
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  timeval tv{kSendTimeoutS, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

// Sends the whole answer (blocking, bounded by the socket's send timeout); a client that went
// away is not an error of the server.
void send_response(int fd, const HttpResponse& r) {
  const std::string head = fmt::format(
      "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nCache-Control: no-store\r\n"
      "X-Content-Type-Options: nosniff\r\nConnection: close\r\n\r\n",
      r.status, reason(r.status), r.content_type, r.body.size());
  set_blocking_with_send_timeout(fd);
  for (const std::string* part : {&head, &r.body}) {
    size_t sent = 0;
    while (sent < part->size()) {
      const ssize_t n = ::send(fd, part->data() + sent, part->size() - sent, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return;
      sent += static_cast<size_t>(n);
    }
  }
}

HttpResponse plain(int status, std::string text) { return {status, "text/plain; charset=utf-8", std::move(text) + "\n"}; }

// The answer to a complete request head: "METHOD TARGET HTTP/x.y" on its first line.
HttpResponse answer(const std::string& head, const HttpHandler& handler) {
  const std::string line = head.substr(0, head.find("\r\n"));
  const size_t a = line.find(' '), b = line.rfind(' ');
  if (a == std::string::npos || b == a || line.compare(b + 1, 5, "HTTP/") != 0) return plain(400, "bad request line");
  const std::string method = line.substr(0, a), target = line.substr(a + 1, b - a - 1);
  if (method != "GET") return plain(405, "only GET is served");
  if (target.empty() || target[0] != '/') return plain(400, "the target must be a path");
  try {
    return handler(target);
  } catch (const std::exception& e) {  // one bad answer must not stop the dashboard
    return plain(500, e.what());
  }
}

// Reads what a connection sent; true when it is done with (answered, closed or too large).
bool serve_readable(Connection& c, const HttpHandler& handler) {
  char buf[4096];
  const ssize_t n = ::recv(c.fd, buf, sizeof buf, 0);
  if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) return false;
  if (n <= 0) return true;
  c.received.append(buf, static_cast<size_t>(n));
  const size_t end = c.received.find("\r\n\r\n");
  if (end == std::string::npos) {
    if (c.received.size() <= HttpServer::kMaxRequestBytes) return false;
    send_response(c.fd, plain(431, "request head too large"));
    return true;
  }
  if (end > HttpServer::kMaxRequestBytes) {
    send_response(c.fd, plain(431, "request head too large"));
    return true;
  }
  // A request body (only a non-GET has one) is never read: the answer is 405 either way.
  send_response(c.fd, answer(c.received.substr(0, end), handler));
  return true;
}

}  // namespace

bool is_loopback(const std::string& addr) {
  in_addr a{};
  return ::inet_pton(AF_INET, addr.c_str(), &a) == 1 && (ntohl(a.s_addr) >> 24) == 127;
}

HttpServer::HttpServer(const std::string& addr, int port) {
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  if (::inet_pton(AF_INET, addr.c_str(), &sa.sin_addr) != 1)
    throw Error(fmt::format("'{}' is not an IPv4 address", addr), "use --addr 127.0.0.1 (this host only) or an address of this host");
  if (port < 0 || port > 65535) throw Error(fmt::format("port {} is out of range", port), "use --port 1..65535, or 0 for a free one");
  sa.sin_port = htons(static_cast<uint16_t>(port));
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listen_fd_ < 0) throw Error(fmt::format("cannot open a socket: {}", std::strerror(errno)));
  const int one = 1;
  ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);  // restart at once after Ctrl+C
  if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0 || ::listen(listen_fd_, 16) != 0) {
    const int err = errno;
    ::close(listen_fd_);
    listen_fd_ = -1;
    if (err == EADDRINUSE)
      throw Error(fmt::format("port {} on {} is already in use", port, addr),
                  "pick another with --port, or --port 0 for a free one (it prints the URL)");
    if (err == EACCES) throw Error(fmt::format("not allowed to listen on port {}", port), "use a port above 1023, or --port 0");
    throw Error(fmt::format("cannot listen on {}:{}: {}", addr, port, std::strerror(err)),
                "check --addr is an address of this host");
  }
  socklen_t len = sizeof sa;
  ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&sa), &len);
  port_ = ntohs(sa.sin_port);
}

HttpServer::~HttpServer() {
  if (listen_fd_ >= 0) ::close(listen_fd_);
}

void HttpServer::serve(const HttpHandler& handler) {
  std::vector<Connection> open;
  while (!interrupt_requested()) {
    std::vector<pollfd> fds{{listen_fd_, POLLIN, 0}};
    for (const auto& c : open) fds.push_back({c.fd, POLLIN, 0});
    if (::poll(fds.data(), fds.size(), kPollMs) < 0 && errno != EINTR)
      throw Error(fmt::format("poll failed: {}", std::strerror(errno)));
    const auto now = Clock::now();
    std::vector<Connection> still_open;
    for (size_t i = 0; i < open.size(); ++i) {
      Connection& c = open[i];
      const bool done = (fds[i + 1].revents & (POLLIN | POLLHUP | POLLERR)) ? serve_readable(c, handler)
                                                                          : now - c.opened > kRequestTimeout;
      if (done) ::close(c.fd);
      else still_open.push_back(std::move(c));
    }
    open = std::move(still_open);
    if (!(fds[0].revents & POLLIN)) continue;
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) continue;  // the client gave up already, or out of descriptors for now
    if (open.size() >= kMaxConnections) {
      ::close(fd);
      continue;
    }
    open.push_back({fd, {}, now});
  }
  for (const auto& c : open) ::close(c.fd);
}

}  // namespace gasloc::app
