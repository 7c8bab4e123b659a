#pragma once

#include <atomic>
#include <cstddef>
#include <memory>
#include <thread>
#include <vector>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>

// spindle's event loops: a few threads, each running its own Asio
// io_context. The HTTP server's connections and the OpenAI-compatible
// provider's upstream calls live on them; nothing on a loop blocks
// (docs/architecture.md, "Serving"). One io_context per thread means a
// connection's handlers always run on one thread, without strands; the
// context still locks, since other threads post to it.

namespace spindle::net {

/// A fixed set of event loops. Constructed running; `stop()` (or the
/// destructor) stops every loop and joins its thread. Thread-safe.
class io_pool {
public:
  /// Starts `threads` loops (at least one).
  explicit io_pool(size_t threads);
  ~io_pool();
  io_pool(const io_pool&) = delete;
  io_pool& operator=(const io_pool&) = delete;

  /// The next loop in round-robin order, for a new connection or call.
  boost::asio::io_context& next() noexcept;

  /// Loop `i` (0 <= i < size()).
  boost::asio::io_context& at(size_t i) noexcept {
    return *loops_[i]->ctx;
  }

  size_t size() const noexcept {
    return loops_.size();
  }

  /// True when the calling thread is one of this pool's loops.
  bool on_loop_thread() const noexcept;

  /// Stops every loop and joins their threads; idempotent. Must not be
  /// called from a loop thread.
  void stop();

private:
  struct loop {
    std::unique_ptr<boost::asio::io_context> ctx;
    std::unique_ptr<boost::asio::executor_work_guard<
      boost::asio::io_context::executor_type>>
      work;
    std::thread thread;
  };
  std::vector<std::unique_ptr<loop>> loops_;
  std::atomic<size_t> next_{0};
  std::atomic<bool> stopped_{false};
};

/// A shared pool, for the server and the providers of one process.
std::shared_ptr<io_pool> make_io_pool(size_t threads);

} // namespace spindle::net
