// A multithreaded program that embeds the runtime: request threads call it
// at once, some blocking, some asynchronously, as a server's handlers
// would. Each request thread keeps one conversation; at the end every
// conversation holds every message and its reply, in order.
//
// Build and run: see docs/examples/README.md.

#include <atomic>
#include <cstdlib>
#include <iostream>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include <spindle/runtime/runtime.hpp>
#include <spindle/version.hpp>

int main() {
  constexpr int request_threads = 8;
  constexpr int messages_each = 20;

  // In memory: nothing survives the process. Give a data directory
  // (`opts.storage.data_dir`) to keep conversations across restarts.
  spindle::runtime_options opts;
  auto started = spindle::runtime::start(opts);
  if (!started) {
    std::cerr << "cannot start: " << spindle::describe(started.error()) << "\n";
    return 1;
  }
  spindle::runtime& rt = **started;
  std::cout << "spindle " << spindle::version_string << "\n";

  std::atomic<int> failures{0};

  std::vector<std::thread> threads;
  for (int t = 0; t < request_threads; ++t) {
    threads.emplace_back([&, t] {
      std::string thread_id = "example-" + std::to_string(t);
      std::string user = "user-" + std::to_string(t % 3);
      for (int i = 0; i < messages_each; ++i) {
        std::string text = "message " + std::to_string(i) + " on " + thread_id;
        if (t % 2 == 0) {
          // Blocking: waits for the whole reply (at most the runtime's
          // default timeout).
          auto result = rt.send_message(thread_id, text, user);
          if (!result || result->reply.empty())
            ++failures;
          continue;
        }
        // Asynchronous: returns at once; the callback runs on a runtime
        // thread, exactly once, and must not block. This thread waits for
        // it before its next message, as a chat client waits for a reply.
        spindle::exchange_request request;
        request.thread_id = thread_id;
        request.content = text;
        request.user_id = user;
        std::promise<void> replied;
        auto answered = replied.get_future();
        rt.send_message_async(
          std::move(request), {},
          [&](caf::expected<spindle::exchange_result> result) {
            if (!result || result->reply.empty())
              ++failures;
            replied.set_value();
          });
        answered.wait();
      }
    });
  }
  for (auto& th : threads)
    th.join();

  // Every conversation holds its messages and replies, alternating, in
  // the order they were sent.
  for (int t = 0; t < request_threads; ++t) {
    std::string thread_id = "example-" + std::to_string(t);
    auto turns = rt.history(thread_id, 1000);
    if (!turns || turns->size() != 2 * messages_each) {
      std::cerr << thread_id << ": wrong history\n";
      return 1;
    }
    for (int i = 0; i < messages_each; ++i) {
      const auto& asked = (*turns)[2 * i];
      const auto& answered = (*turns)[2 * i + 1];
      std::string text = "message " + std::to_string(i) + " on " + thread_id;
      if (asked.role != spindle::turn_role::user || asked.content != text
          || answered.role != spindle::turn_role::assistant) {
        std::cerr << thread_id << ": turn " << 2 * i << " out of order\n";
        return 1;
      }
    }
  }
  if (failures > 0) {
    std::cerr << failures << " messages failed\n";
    return 1;
  }
  std::cout << "embedded_server: " << request_threads * messages_each
            << " messages on " << request_threads
            << " threads, blocking and async, all stored in order\n";
  rt.stop();
  return EXIT_SUCCESS;
}
