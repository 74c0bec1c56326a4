#include "server/http_core.h"

#include <unistd.h>

#include <chrono>
#include <thread>
#include <utility>

#include "server/http_loop.h"

namespace shoal::server {

void HttpResponder::Send(proto::HttpResponse response) const {
  if (!mailbox_) return;
  internal::Mailbox::Item item;
  item.connection = connection_;
  item.sequence = sequence_;
  item.response = std::move(response);
  mailbox_->posted_unwritten->fetch_add(1);
  if (!mailbox_->Post(std::move(item))) mailbox_->posted_unwritten->fetch_sub(1);
}

void HttpResponder::SendLater(std::function<proto::HttpResponse()> make) const {
  if (!mailbox_) return;
  internal::Mailbox::Item item;
  item.connection = connection_;
  item.sequence = sequence_;
  item.make = std::move(make);
  mailbox_->posted_unwritten->fetch_add(1);
  if (!mailbox_->Post(std::move(item))) mailbox_->posted_unwritten->fetch_sub(1);
}

Status HttpCore::Validate(const HttpCoreOptions& options) {
  if (options.threads < 1)
    return InvalidArgument("HTTP threads must be at least 1; was " +
                           std::to_string(options.threads));
  if (options.port < 0 || options.port > 65535)
    return InvalidArgument("port must be in 0..65535; was " + std::to_string(options.port));
  if (options.max_body_bytes < 0)
    return InvalidArgument("max_body_bytes must be >= 0; was " +
                           std::to_string(options.max_body_bytes));
  if (options.max_header_bytes < 64)
    return InvalidArgument("max_header_bytes must be >= 64; was " +
                           std::to_string(options.max_header_bytes));
  if (options.max_connections < options.threads)
    return InvalidArgument("max_connections must be at least the number of threads (" +
                           std::to_string(options.threads) + "); was " +
                           std::to_string(options.max_connections));
  if (options.receiving_body_budget_bytes < options.max_body_bytes)
    return InvalidArgument("receiving_body_budget_bytes must be at least max_body_bytes (" +
                           std::to_string(options.max_body_bytes) + "); was " +
                           std::to_string(options.receiving_body_budget_bytes));
  const std::pair<const char*, int64_t> timeouts[] = {
      {"idle_timeout_ms", options.idle_timeout_ms},
      {"header_timeout_ms", options.header_timeout_ms},
      {"body_timeout_ms", options.body_timeout_ms},
      {"write_timeout_ms", options.write_timeout_ms}};
  for (const auto& timeout : timeouts) {
    if (timeout.second <= 0)
      return InvalidArgument(std::string(timeout.first) + " must be positive; was " +
                             std::to_string(timeout.second));
  }
  return Status::Ok();
}

StatusOr<std::unique_ptr<HttpCore>> HttpCore::Start(HttpCoreOptions options, HttpHandler* handler) {
  RETURN_IF_ERROR(Validate(options));
  ASSIGN_OR_RETURN(TcpListener listener, TcpListener::Listen(options.address, options.port));
  return Start(std::move(options), handler, std::move(listener));
}

StatusOr<std::unique_ptr<HttpCore>> HttpCore::Start(HttpCoreOptions options, HttpHandler* handler,
                                                    TcpListener listener) {
  if (!listener.valid()) return InvalidArgument("HttpCore needs a listening socket");
  options.port = listener.port();
  RETURN_IF_ERROR(Validate(options));
  std::unique_ptr<HttpCore> core(new HttpCore());
  core->options_ = options;
  // The counters exist before anything can fail: the destructor's Stop() reads them.
  core->connections_ = std::make_shared<std::atomic<int64_t>>(0);
  core->in_progress_ = std::make_shared<std::atomic<int64_t>>(0);
  core->posted_unwritten_ = std::make_shared<std::atomic<int64_t>>(0);
  core->receiving_body_bytes_ = std::make_shared<std::atomic<int64_t>>(0);
  core->port_ = listener.port();
  core->listen_fd_ = listener.Release();
  for (int i = 0; i < options.threads; ++i) {
    // The connection cap split evenly, the first loops taking the remainder.
    const int share =
        options.max_connections / options.threads + (i < options.max_connections % options.threads);
    auto loop = std::make_unique<internal::Loop>(
        i, core->options_, share, handler, core->listen_fd_, core->connections_, core->in_progress_,
        core->posted_unwritten_, core->receiving_body_bytes_);
    RETURN_IF_ERROR(loop->Init());
    core->loops_.push_back(std::move(loop));
  }
  core->accepting_ = true;
  for (auto& loop : core->loops_) loop->Start();
  return core;
}

HttpCore::~HttpCore() {
  Stop();
  if (listen_fd_ >= 0) close(listen_fd_);
}

void HttpCore::StopAccepting() {
  if (!accepting_.exchange(false)) return;
  for (auto& loop : loops_) {
    internal::Loop* l = loop.get();
    loop->RunTask([l] { l->StopAcceptingOnLoop(); });
  }
  close(listen_fd_);
  listen_fd_ = -1;
}

bool HttpCore::Drain(int64_t timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (in_progress_->load() > 0) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

void HttpCore::Stop() {
  if (stopped_.exchange(true)) return;
  StopAccepting();
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(options_.stop_flush_ms);
  while (posted_unwritten_->load() > 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  for (auto& loop : loops_) loop->Stop();
  for (auto& loop : loops_) loop->Join();
}

int64_t HttpCore::open_connections() const { return connections_ ? connections_->load() : 0; }
int64_t HttpCore::requests_in_progress() const { return in_progress_ ? in_progress_->load() : 0; }
int64_t HttpCore::receiving_body_bytes() const {
  return receiving_body_bytes_ ? receiving_body_bytes_->load() : 0;
}

}  // namespace shoal::server
