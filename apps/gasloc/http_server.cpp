#include "http_server.hpp"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <optional>
#include <vector>

#include "gasloc/core/error.hpp"
#include "gasloc/core/interrupt.hpp"

namespace gasloc::app {

namespace {

using Clock = std::chrono::steady_clock;

constexpr int kPollMs = 200;  // how soon Ctrl+C is noticed

// The Host names always served: this host's own loopback names. The --addr address and the
// --allow-host names join them.
const std::vector<std::string> kLoopbackHostNames = {"127.0.0.1", "localhost", "[::1]"};

// One client. It waits for its request head (until `deadline` = connected + request timeout),
// then takes its answer (until `deadline` = answered + send deadline): both without blocking.
struct Connection {
  int fd = -1;
  Clock::time_point opened, deadline;
  std::string received;  // the request head so far
  bool answering = false;
  std::string answer;    // the whole response, once there is one
  size_t sent = 0;
};

const char* reason(int status) {
  switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 421: return "Misdirected Request";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    default: return "Error";
  }
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string trimmed(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t"), b = s.find_last_not_of(" \t");
  return a == std::string::npos ? std::string() : s.substr(a, b - a + 1);
}

// The values of every header line named `name` (lower case) in a request head.
std::vector<std::string> header_values(const std::string& head, const std::string& name) {
  std::vector<std::string> values;
  for (size_t at = head.find("\r\n"); at != std::string::npos;) {
    const size_t begin = at + 2, end = head.find("\r\n", begin);
    const std::string line = head.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
    const size_t colon = line.find(':');
    if (colon != std::string::npos && lower(trimmed(line.substr(0, colon))) == name)
      values.push_back(trimmed(line.substr(colon + 1)));
    at = end;
  }
  return values;
}

HttpResponse plain(int status, std::string text) { return {status, "text/plain; charset=utf-8", std::move(text) + "\n"}; }

// 400 or 421 when the Host header does not name this server: a page of another site whose name
// was made to resolve to 127.0.0.1 (DNS rebinding) sends its own name, and must not read the runs.
std::optional<HttpResponse> refuse_host(const std::string& head, const std::vector<std::string>& names) {
  const std::vector<std::string> hosts = header_values(head, "host");
  if (hosts.size() != 1) return plain(400, "a request needs exactly one Host header");
  if (host_is_allowed(hosts[0], names)) return std::nullopt;
  return plain(421, fmt::format("this dashboard does not answer to Host '{}', only to {}; to serve it under another "
                                "name, start gasloc dashboard with --allow-host NAME",
                                hosts[0], fmt::join(names, ", ")));
}

// The answer to a complete request head: "METHOD TARGET HTTP/x.y" on its first line.
HttpResponse answer(const std::string& head, const HttpHandler& handler, const std::vector<std::string>& host_names) {
  const std::string line = head.substr(0, head.find("\r\n"));
  const size_t a = line.find(' '), b = line.rfind(' ');
  if (a == std::string::npos || b == a || line.compare(b + 1, 5, "HTTP/") != 0) return plain(400, "bad request line");
  if (auto refused = refuse_host(head, host_names)) return *refused;
  const std::string method = line.substr(0, a), target = line.substr(a + 1, b - a - 1);
  if (method != "GET") return plain(405, "only GET is served");
  if (target.empty() || target[0] != '/') return plain(400, "the target must be a path");
  try {
    return handler(target);
  } catch (const std::exception& e) {  // one bad answer must not stop the dashboard
    return plain(500, e.what());
  }
}

// Sends what the socket takes now; true when the connection is done with (all sent, or the
// client went away: not an error of the server).
bool send_some(Connection& c) {
  while (c.sent < c.answer.size()) {
    const ssize_t n = ::send(c.fd, c.answer.data() + c.sent, c.answer.size() - c.sent, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return false;  // poll says when it takes more
    if (n <= 0) return true;
    c.sent += static_cast<size_t>(n);
  }
  return true;
}

// From now on the connection only takes its answer, for at most `send_deadline` in all.
bool start_answer(Connection& c, const HttpResponse& r, std::chrono::milliseconds send_deadline) {
  c.answer = fmt::format(
      "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nCache-Control: no-store\r\n"
      "X-Content-Type-Options: nosniff\r\nConnection: close\r\n\r\n",
      r.status, reason(r.status), r.content_type, r.body.size());
  c.answer += r.body;
  c.answering = true;
  c.deadline = Clock::now() + send_deadline;  // from now: making a large answer took time already
  c.received.clear();
  return send_some(c);
}

// The oldest connection still waiting for its request (a browser's idle pre-connection, or a
// client that stalled), else the oldest of all: the one to drop for a new one.
std::vector<Connection>::iterator oldest_idle(std::vector<Connection>& open) {
  return std::min_element(open.begin(), open.end(), [](const Connection& x, const Connection& y) {
    return std::pair(x.answering, x.opened) < std::pair(y.answering, y.opened);
  });
}

// Reads what a connection sent; true when it is done with (answered, closed or too large).
// A complete head is answered at once: the answer is sent from here on, within `send_deadline`.
bool serve_readable(Connection& c, const HttpHandler& handler, const std::vector<std::string>& host_names,
                    std::chrono::milliseconds send_deadline) {
  char buf[4096];
  const ssize_t n = ::recv(c.fd, buf, sizeof buf, 0);
  if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) return false;
  if (n <= 0) return true;
  c.received.append(buf, static_cast<size_t>(n));
  const size_t end = c.received.find("\r\n\r\n");
  if (end == std::string::npos && c.received.size() <= HttpServer::kMaxRequestBytes) return false;
  if (end == std::string::npos || end > HttpServer::kMaxRequestBytes)
    return start_answer(c, plain(431, "request head too large"), send_deadline);
  // A request body (only a non-GET has one) is never read: the answer is 405 either way.
  return start_answer(c, answer(c.received.substr(0, end), handler, host_names), send_deadline);
}

// Takes one new connection; past the cap it replaces the oldest idle one.
void accept_one(int listen_fd, std::vector<Connection>& open, Clock::time_point now, const HttpLimits& limits) {
  const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
  if (fd < 0) return;  // the client gave up already, or out of descriptors for now
  if (open.size() >= limits.max_connections) {
    const auto dropped = oldest_idle(open);
    ::close(dropped->fd);
    open.erase(dropped);
  }
  open.push_back({.fd = fd, .opened = now, .deadline = now + limits.request_timeout});
}

bool all_digits(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

}  // namespace

bool host_is_allowed(const std::string& host, const std::vector<std::string>& names) {
  const std::string h = lower(trimmed(host));
  // "[::1]:8080": the port follows the bracket; "localhost:8080": the colon.
  const size_t name_end = h.starts_with('[') ? h.find(']') + 1 : h.find(':');
  if (name_end == 0) return false;  // "[" without its "]"
  const std::string name = h.substr(0, name_end), rest = name_end < h.size() ? h.substr(name_end) : "";
  if (!rest.empty() && (rest[0] != ':' || !all_digits(rest.substr(1)))) return false;
  return std::find(names.begin(), names.end(), name) != names.end();
}

bool is_loopback(const std::string& addr) {
  in_addr a{};
  return ::inet_pton(AF_INET, addr.c_str(), &a) == 1 && (ntohl(a.s_addr) >> 24) == 127;
}

HttpServer::HttpServer(const std::string& addr, int port, const std::vector<std::string>& extra_hosts, HttpLimits limits)
    : host_names_(kLoopbackHostNames), limits_(limits) {
  for (const std::string& name : extra_hosts)
    if (name.empty() || name.find_first_of(":/[] \t") != std::string::npos)
      throw Error(fmt::format("'{}' is not a host name", name),
                  "give --allow-host a name or IPv4 address as the browser's address bar shows it, without port");
  for (const std::string& name : extra_hosts) host_names_.push_back(lower(name));
  if (std::find(host_names_.begin(), host_names_.end(), addr) == host_names_.end()) host_names_.push_back(addr);
  if (limits_.max_connections == 0) throw Error("an HTTP server needs room for one connection at least");
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
  if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0 || ::listen(listen_fd_, static_cast<int>(limits_.max_connections)) != 0) {
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
    for (const auto& c : open) fds.push_back({c.fd, static_cast<short>(c.answering ? POLLOUT : POLLIN), 0});
    if (::poll(fds.data(), fds.size(), kPollMs) < 0 && errno != EINTR)
      throw Error(fmt::format("poll failed: {}", std::strerror(errno)));
    const auto now = Clock::now();
    std::vector<Connection> still_open;
    for (size_t i = 0; i < open.size(); ++i) {
      Connection& c = open[i];
      const bool ready = fds[i + 1].revents != 0;
      const bool done =
          (ready && (c.answering ? send_some(c) : serve_readable(c, handler, host_names_, limits_.send_deadline))) ||
          now > c.deadline;
      if (done) ::close(c.fd);
      else still_open.push_back(std::move(c));
    }
    open = std::move(still_open);
    if (fds[0].revents & POLLIN) accept_one(listen_fd_, open, now, limits_);
  }
  for (const auto& c : open) ::close(c.fd);
}

}  // namespace gasloc::app
