#include "net/io_pool.hpp"

#include <pthread.h>

#include <string>

namespace spindle::net {

namespace {

thread_local const io_pool* current_pool = nullptr;

} // namespace

io_pool::io_pool(size_t threads) {
  threads = std::max<size_t>(threads, 1);
  loops_.reserve(threads);
  for (size_t i = 0; i < threads; ++i) {
    auto l = std::make_unique<loop>();
    // One thread runs each context (a hint to Asio's scheduler; it still
    // locks, as handlers are posted from other threads).
    l->ctx = std::make_unique<boost::asio::io_context>(1);
    l->work = std::make_unique<boost::asio::executor_work_guard<
      boost::asio::io_context::executor_type>>(l->ctx->get_executor());
    loops_.push_back(std::move(l));
  }
  for (size_t i = 0; i < threads; ++i) {
    auto* l = loops_[i].get();
    l->thread = std::thread{[this, l, i] {
      current_pool = this;
      auto name = "spindle-io-" + std::to_string(i);
      pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
      l->ctx->run();
    }};
  }
}

io_pool::~io_pool() {
  stop();
}

boost::asio::io_context& io_pool::next() noexcept {
  auto i = next_.fetch_add(1, std::memory_order_relaxed);
  return *loops_[i % loops_.size()]->ctx;
}

bool io_pool::on_loop_thread() const noexcept {
  return current_pool == this;
}

void io_pool::stop() {
  if (stopped_.exchange(true))
    return;
  for (auto& l : loops_) {
    l->work.reset();
    l->ctx->stop();
  }
  for (auto& l : loops_)
    if (l->thread.joinable())
      l->thread.join();
}

std::shared_ptr<io_pool> make_io_pool(size_t threads) {
  return std::make_shared<io_pool>(threads);
}

} // namespace spindle::net
