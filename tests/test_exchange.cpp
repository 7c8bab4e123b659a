// The exchange (send_message): D9 conflict policies under concurrency, the
// order of the write path, interrupted replies, provider failures, leases.

#include <atomic>
#include <future>
#include <mutex>
#include <set>
#include <thread>

#include <caf/all.hpp>
#include <catch2/catch.hpp>
#include <spdlog/spdlog.h>

#include "llm_doubles.hpp"
#include "net/io_pool.hpp"
#include "spindle/runtime/runtime.hpp"

using namespace spindle;
using namespace std::chrono_literals;

namespace {

runtime_options with_provider(std::shared_ptr<llm_provider> p) {
  runtime_options opts;
  opts.provider = std::move(p);
  return opts;
}

struct quiet_logs {
  quiet_logs() {
    spdlog::set_level(spdlog::level::warn);
  }
  ~quiet_logs() {
    spdlog::set_level(spdlog::level::info);
  }
};

exchange_request message(std::string thread, std::string content,
                         conflict_policy policy = conflict_policy::queue) {
  exchange_request r;
  r.thread_id = std::move(thread);
  r.content = std::move(content);
  r.on_conflict = policy;
  return r;
}

} // namespace

TEST_CASE("exchange: concurrent messages to one thread queue - turns strictly "
          "alternate user/assistant and none is lost") {
  quiet_logs quiet;
  for (size_t clients : {1, 2, 4, 8, 16}) {
    DYNAMIC_SECTION(clients << " concurrent senders") {
      runtime rt{with_provider(std::make_shared<test::echo_provider>(1ms))};
      REQUIRE(rt.add_turn("busy", make_user_turn("opening")));
      REQUIRE(rt.add_turn("busy", make_assistant_turn("welcome")));
      constexpr int per_client = 4;
      std::vector<std::thread> pool;
      std::atomic<int> errors{0};
      for (size_t c = 0; c < clients; ++c)
        pool.emplace_back([&, c] {
          for (int i = 0; i < per_client; ++i) {
            auto content = "m" + std::to_string(c) + "." + std::to_string(i);
            auto r = rt.send_message("busy", content);
            if (!r || r->thread_id != "busy" || r->reply != "echo: " + content)
              ++errors;
          }
        });
      for (auto& t : pool)
        t.join();
      REQUIRE(errors == 0);
      auto snap = rt.snapshot("busy");
      REQUIRE(snap->turns.size() == 2 + 2 * clients * per_client);
      std::set<std::string> users;
      for (size_t i = 0; i < snap->turns.size(); i += 2) {
        auto& u = snap->turns[i];
        auto& a = snap->turns[i + 1];
        REQUIRE(u.role == turn_role::user);
        REQUIRE(a.role == turn_role::assistant);
        if (i > 0) {
          // Each reply sits right after its own message.
          REQUIRE(a.content == "echo: " + u.content);
          users.insert(u.content);
        }
      }
      REQUIRE(users.size() == clients * per_client);
      REQUIRE(rt.count_threads() == 1u);
    }
  }
}

TEST_CASE("exchange: each queued message sees every earlier exchange of its "
          "thread in its history") {
  quiet_logs quiet;
  runtime rt{with_provider(std::make_shared<test::echo_provider>(1ms))};
  std::vector<std::future<caf::expected<exchange_result>>> results;
  for (int i = 0; i < 6; ++i)
    results.push_back(std::async(std::launch::async, [&rt, i] {
      exchange_request r = message("seq", "q" + std::to_string(i));
      r.build.max_turns = 100;
      return rt.send_message(std::move(r));
    }));
  std::set<uint64_t> loaded;
  for (auto& f : results) {
    auto r = f.get();
    REQUIRE(r);
    // turns after = history before + 2: nothing was skipped or doubled.
    REQUIRE(r->turns == r->history_turns + 2);
    loaded.insert(r->history_turns);
  }
  REQUIRE(loaded == std::set<uint64_t>{0, 2, 4, 6, 8, 10});
}

TEST_CASE("exchange: on_conflict=exit fails at once with conflict and "
          "stores nothing") {
  auto gate = std::make_shared<test::gated_provider>();
  runtime rt{with_provider(gate)};
  auto first = std::async(std::launch::async,
                          [&] { return rt.send_message("x", "first"); });
  test::gated_provider::opener open_on_exit{*gate};
  REQUIRE(gate->wait_for_waiting(1));
  auto start = std::chrono::steady_clock::now();
  auto second = rt.send_message(message("x", "second", conflict_policy::exit));
  REQUIRE(std::chrono::steady_clock::now() - start < 2s);
  REQUIRE_FALSE(second);
  REQUIRE(classify(second.error()) == errc::conflict);
  REQUIRE_THAT(describe(second.error()), Catch::Contains("busy"));
  gate->open();
  REQUIRE(first.get());
  auto snap = rt.snapshot("x");
  REQUIRE(snap->turns.size() == 2);
  REQUIRE(snap->turns[0].content == "first");
  // Once free, exit goes through.
  REQUIRE(rt.send_message(message("x", "third", conflict_policy::exit)));
  REQUIRE(rt.snapshot("x")->turns.size() == 4);
}

TEST_CASE("exchange: on_conflict=fork continues in a new thread copied from "
          "the busy one and names it") {
  auto gate = std::make_shared<test::gated_provider>();
  runtime rt{with_provider(gate)};
  REQUIRE(rt.add_turn("orig", make_user_turn("Who is Donald Trump?")));
  REQUIRE(rt.add_turn("orig", make_assistant_turn("A politician.")));
  auto first = std::async(std::launch::async,
                          [&] { return rt.send_message("orig", "first"); });
  test::gated_provider::opener open_on_exit{*gate};
  REQUIRE(gate->wait_for_waiting(1));
  auto second = std::async(std::launch::async, [&] {
    return rt.send_message(message("orig", "second", conflict_policy::fork));
  });
  REQUIRE(gate->wait_for_waiting(2));
  gate->open();
  auto a = first.get();
  auto b = second.get();
  REQUIRE(a);
  REQUIRE(b);
  REQUIRE(a->thread_id == "orig");
  REQUIRE(b->thread_id != "orig");
  REQUIRE(b->forked_from == "orig");
  REQUIRE(b->created);
  REQUIRE(validate_thread_id(b->thread_id) == caf::none);
  // The fork holds the committed copy (not the running exchange's turn)
  // plus its own exchange.
  auto fork = rt.snapshot(b->thread_id);
  REQUIRE(fork->turns.size() == 4);
  REQUIRE(fork->turns[0].content == "Who is Donald Trump?");
  REQUIRE(fork->turns[1].content == "A politician.");
  REQUIRE(fork->turns[2].content == "second");
  REQUIRE(fork->turns[3].content == "reply to: second");
  REQUIRE(b->history_turns == 2);
  auto orig = rt.snapshot("orig");
  REQUIRE(orig->turns.size() == 4);
  REQUIRE(orig->turns[2].content == "first");
  REQUIRE(rt.count_threads() == 2u);
}

TEST_CASE("exchange: on_conflict=fork on a free thread stays in it") {
  runtime rt;
  auto r = rt.send_message(message("free", "hi", conflict_policy::fork));
  REQUIRE(r);
  REQUIRE(r->thread_id == "free");
  REQUIRE(r->forked_from.empty());
  REQUIRE(rt.count_threads() == 1u);
}

TEST_CASE("exchange: many forks of one busy thread each get their own copy") {
  auto gate = std::make_shared<test::gated_provider>();
  runtime rt{with_provider(gate)};
  auto holder = std::async(std::launch::async,
                           [&] { return rt.send_message("hot", "hold"); });
  test::gated_provider::opener open_on_exit{*gate};
  REQUIRE(gate->wait_for_waiting(1));
  std::vector<std::future<caf::expected<exchange_result>>> forks;
  for (int i = 0; i < 8; ++i)
    forks.push_back(std::async(std::launch::async, [&rt, i] {
      return rt.send_message(
        message("hot", "f" + std::to_string(i), conflict_policy::fork));
    }));
  REQUIRE(gate->wait_for_waiting(9));
  gate->open();
  REQUIRE(holder.get());
  std::set<std::string> ids;
  for (auto& f : forks) {
    auto r = f.get();
    REQUIRE(r);
    REQUIRE(r->forked_from == "hot");
    ids.insert(r->thread_id);
    REQUIRE(rt.snapshot(r->thread_id)->turns.size() == 2);
  }
  REQUIRE(ids.size() == 8);
  REQUIRE(rt.count_threads() == 9u);
}

TEST_CASE("exchange: a direct add_turn during an exchange lands after its "
          "assistant turn, never inside it") {
  auto gate = std::make_shared<test::gated_provider>();
  runtime rt{with_provider(gate)};
  auto ex = std::async(std::launch::async,
                       [&] { return rt.send_message("mix", "question"); });
  test::gated_provider::opener open_on_exit{*gate};
  REQUIRE(gate->wait_for_waiting(1));
  auto added = std::async(std::launch::async, [&] {
    return rt.add_turn("mix", make_system_turn("note from elsewhere"));
  });
  // Reads are served while the exchange runs: only the user turn so far.
  auto mid = rt.snapshot("mix");
  REQUIRE(mid->turns.size() == 1);
  REQUIRE(mid->in_exchange);
  REQUIRE(mid->committed == 0);
  gate->open();
  REQUIRE(ex.get());
  REQUIRE(added.get() == 3u);
  auto snap = rt.snapshot("mix");
  REQUIRE(snap->turns.size() == 3);
  REQUIRE(snap->turns[0].role == turn_role::user);
  REQUIRE(snap->turns[1].role == turn_role::assistant);
  REQUIRE(snap->turns[2].content == "note from elsewhere");
}

TEST_CASE("exchange: when the client goes away the partial reply is stored "
          "as an interrupted assistant turn") {
  auto provider = std::make_shared<test::scripted_provider>(
    "one two three four five six", 3);
  runtime rt{with_provider(provider)};
  int deltas = 0;
  auto r = rt.send_message("gone", "talk", "", conflict_policy::queue, 12,
                           [&](std::string_view) { return ++deltas < 2; });
  REQUIRE(r);
  REQUIRE(r->interrupted);
  REQUIRE(deltas == 2);
  auto snap = rt.snapshot("gone");
  REQUIRE(snap->turns.size() == 2);
  REQUIRE(snap->turns[1].interrupted);
  REQUIRE(snap->turns[1].content == r->reply);
  REQUIRE_THAT(std::string{"one two three four five six"},
               Catch::StartsWith(r->reply));
  REQUIRE(r->reply.size() < std::string{"one two three four five six"}.size());
  // A throwing callback counts as a client that went away.
  auto t = rt.send_message("gone", "again", "", conflict_policy::queue, 12,
                           [](std::string_view) -> bool {
                             throw std::runtime_error("socket closed");
                           });
  REQUIRE(t);
  REQUIRE(t->interrupted);
  // The thread is free again.
  REQUIRE(rt.send_message("gone", "still there?"));
}

TEST_CASE("exchange: a client that goes away while the reply waits for the "
          "user turn's commit gets what it was offered stored as the "
          "interrupted assistant turn") {
  // The provider is done before the user turn commits: its three pieces
  // wait, and the client refuses the second when they are replayed.
  auto provider = std::make_shared<test::instant_provider>(
    "one two three four five six", 3);
  runtime rt{with_provider(provider)};
  std::string heard;
  int offered = 0;
  auto r = rt.send_message("early", "talk", "", conflict_policy::queue, 12,
                           [&](std::string_view piece) {
                             heard += piece;
                             return ++offered < 2;
                           });
  REQUIRE(r);
  CHECK(r->interrupted);
  auto pieces = split_deltas("one two three four five six", 3);
  REQUIRE(pieces.size() == 3);
  CHECK(heard == pieces[0] + pieces[1]);
  CHECK(r->reply == heard);
  auto snap = rt.snapshot("early");
  REQUIRE(snap->turns.size() == 2);
  CHECK(snap->turns[1].interrupted);
  CHECK(snap->turns[1].content == heard);
}

TEST_CASE("exchange: cancel_exchange stops the running reply at once, "
          "stores what was generated as interrupted and frees the thread") {
  // Four pieces 1.5 s apart.
  auto loops = net::make_io_pool(1);
  runtime rt{with_provider(std::make_shared<offline_provider>(
    std::chrono::milliseconds(1500), loops))};
  CHECK_FALSE(rt.cancel_exchange("halt")); // nothing runs
  std::promise<void> first;
  std::atomic<int> pieces{0};
  std::promise<caf::expected<exchange_result>> ended;
  auto result = ended.get_future();
  exchange_request req;
  req.thread_id = "halt";
  req.content = "a long story, please";
  rt.send_message_async(
    req,
    [&](std::string_view) {
      if (++pieces == 1)
        first.set_value();
      return true;
    },
    [&](caf::expected<exchange_result> r) { ended.set_value(std::move(r)); });
  REQUIRE(first.get_future().wait_for(std::chrono::seconds(10))
          == std::future_status::ready);
  auto asked = std::chrono::steady_clock::now();
  REQUIRE(rt.cancel_exchange("halt"));
  REQUIRE(result.wait_for(std::chrono::seconds(10))
          == std::future_status::ready);
  // Ended at the cancel, not at the next piece 1.5 s later.
  CHECK(std::chrono::steady_clock::now() - asked
        < std::chrono::milliseconds(1000));
  auto r = result.get();
  REQUIRE(r);
  CHECK(r->cancelled);
  CHECK(r->interrupted);
  CHECK(pieces.load() == 1);
  auto snap = rt.snapshot("halt");
  REQUIRE(snap->turns.size() == 2);
  CHECK(snap->turns[1].interrupted);
  CHECK(snap->turns[1].content == r->reply);
  CHECK(!r->reply.empty());
  // Nothing runs on it now, and the next message proceeds (uncancelled).
  CHECK_FALSE(rt.cancel_exchange("halt"));
  auto next = rt.send_message("halt", "and now?");
  REQUIRE(next);
  CHECK_FALSE(next->cancelled);
  CHECK_FALSE(next->interrupted);
  CHECK(next->turns == 4);
}

TEST_CASE("exchange: a cancel that answered true always ends its reply as "
          "cancelled, however closely it races the reply's end") {
  // Instant replies, cancels sent without pause from the moment the
  // message starts until it ended: some land before the provider ends,
  // some after the reply settled, some in between. Four threads at once.
  runtime rt;
  constexpr int threads = 4;
  constexpr int rounds = 150;
  std::atomic<int> cancelled{0}, completed{0}, wrong{0};
  std::vector<std::thread> clients;
  for (int t = 0; t < threads; ++t)
    clients.emplace_back([&, t] {
      for (int i = 0; i < rounds; ++i) {
        auto id = "race-" + std::to_string(t) + "-" + std::to_string(i);
        std::promise<caf::expected<exchange_result>> ended;
        auto result = ended.get_future();
        exchange_request req;
        req.thread_id = id;
        req.content = "hello";
        std::atomic<bool> done{false};
        rt.send_message_async(
          req, [](std::string_view) { return true; },
          [&](caf::expected<exchange_result> r) {
            ended.set_value(std::move(r));
            done = true;
          });
        int answered_true = 0;
        while (!done)
          if (rt.cancel_exchange(id))
            ++answered_true;
        auto r = result.get();
        if (!r || answered_true > 1 || r->cancelled != (answered_true == 1)) {
          ++wrong;
          continue;
        }
        ++(r->cancelled ? cancelled : completed);
        // What was stored says the same.
        auto snap = rt.snapshot(id);
        if (!snap || snap->turns.size() != 2
            || snap->turns[1].interrupted != r->cancelled)
          ++wrong;
      }
    });
  for (auto& c : clients)
    c.join();
  INFO("cancelled " << cancelled << ", completed " << completed);
  CHECK(wrong == 0);
  CHECK(cancelled + completed == threads * rounds);
}

TEST_CASE("exchange: a provider failure keeps the user turn, returns "
          "upstream_failure and frees the thread") {
  auto failing = std::make_shared<test::failing_provider>();
  runtime rt{with_provider(failing)};
  auto r = rt.send_message("fail", "hello?");
  REQUIRE_FALSE(r);
  REQUIRE(classify(r.error()) == errc::upstream_failure);
  auto snap = rt.snapshot("fail");
  REQUIRE(snap->turns.size() == 1);
  REQUIRE(snap->turns[0].content == "hello?");
  REQUIRE_FALSE(snap->in_exchange);
  auto again = rt.send_message(message("fail", "retry", conflict_policy::exit));
  REQUIRE_FALSE(again);
  REQUIRE(classify(again.error()) == errc::upstream_failure); // not conflict
  REQUIRE(failing->calls == 2);
}

TEST_CASE("exchange: a provider timeout is reported as timeout") {
  runtime rt{
    with_provider(std::make_shared<test::failing_provider>(errc::timeout))};
  auto r = rt.send_message("slow", "hello?");
  REQUIRE_FALSE(r);
  REQUIRE(classify(r.error()) == errc::timeout);
  REQUIRE(rt.snapshot("slow")->turns.size() == 1);
}

TEST_CASE("exchange: bad requests are refused before any thread exists") {
  runtime rt;
  auto expect = [&](exchange_request req, errc code, const std::string& field) {
    auto r = rt.send_message(std::move(req));
    REQUIRE_FALSE(r);
    REQUIRE(classify(r.error()) == code);
    REQUIRE_THAT(describe(r.error()), Catch::Contains(field));
  };
  expect(message("../etc", "hi"), errc::invalid_id, "thread_id");
  expect(message("ok", ""), errc::invalid_argument, "message");
  auto bad_user = message("ok", "hi");
  bad_user.user_id = "a b";
  expect(bad_user, errc::invalid_id, "user_id");
  auto small = message("ok", "hi");
  small.build.max_turns = 1;
  expect(small, errc::invalid_argument, "max_turns");
  REQUIRE(rt.count_threads() == 0u);
}

TEST_CASE("exchange: the prompt's history is read before the message is "
          "stored, so the message appears once, last") {
  auto provider = std::make_shared<test::scripted_provider>("ok");
  runtime rt{with_provider(provider)};
  REQUIRE(rt.send_message("once", "first question"));
  REQUIRE(rt.send_message("once", "second question"));
  auto p = provider->prompts().back();
  int seen = 0;
  for (auto& m : p)
    if (m.content.find("second question") != std::string::npos)
      ++seen;
  REQUIRE(seen == 1);
  REQUIRE(p.back().content == "second question");
}

TEST_CASE("exchange: an exchange is stored in long-term memory with the "
          "user's and thread's tags") {
  runtime rt;
  REQUIRE(rt.send_message("mem-a", "My favourite colour is teal.", "alice"));
  auto mine = rt.retrieve_memory("alice", "mem-b", "favourite colour");
  REQUIRE(mine);
  REQUIRE_THAT(mine->text, Catch::Contains("teal"));
  auto theirs = rt.retrieve_memory("bob", "mem-a", "favourite colour");
  REQUIRE(theirs);
  REQUIRE(theirs->text.empty());
  auto anonymous = rt.retrieve_memory("", "mem-a", "favourite colour");
  REQUIRE(anonymous->text.empty());
  // The next message of alice (any thread) gets it in its prompt.
  auto next = rt.send_message("mem-c", "what is my favourite colour", "alice");
  REQUIRE(next);
  REQUIRE_THAT(next->reply, Catch::Contains("long-term memory yes"));
}

TEST_CASE("thread lease: a holder that terminates without ending its "
          "exchange releases the thread") {
  runtime rt;
  REQUIRE(rt.add_turn("lease", make_user_turn("x")));
  auto ref = rt.call<thread_ref>(rt.thread_registry(), 5s,
                                 caf::get_atom::value, std::string{"lease"});
  REQUIRE(ref);
  {
    caf::scoped_actor holder{rt.system()};
    uint64_t lease = 0;
    holder->request(ref->handle, 5s, exchange_begin_atom::value,
                    conflict_policy::exit)
      .receive([&](uint64_t l) { lease = l; }, [](caf::error&) {});
    REQUIRE(lease != 0);
    REQUIRE(rt.snapshot("lease")->in_exchange);
    // A stale lease is refused.
    holder->request(ref->handle, 5s, caf::add_atom::value,
                    make_user_turn("y"), lease + 1)
      .receive([](uint64_t) { FAIL("a wrong lease was accepted"); },
               [](caf::error& err) {
                 REQUIRE(classify(err) == errc::conflict);
               });
  } // the holder terminates here
  auto r = rt.send_message(message("lease", "free again?",
                                   conflict_policy::queue));
  REQUIRE(r);
  REQUIRE(rt.snapshot("lease")->turns.size() == 3);
}

TEST_CASE("thread lease: a queued exchange whose requester terminated "
          "before its turn releases the thread") {
  runtime_options opts;
  opts.conversation.queue_timeout = 10s;
  runtime rt{opts};
  REQUIRE(rt.add_turn("queued", make_user_turn("x")));
  auto ref = rt.call<thread_ref>(rt.thread_registry(), 5s,
                                 caf::get_atom::value, std::string{"queued"});
  REQUIRE(ref);
  caf::scoped_actor first{rt.system()};
  uint64_t lease = 0;
  first->request(ref->handle, 5s, exchange_begin_atom::value,
                 conflict_policy::exit)
    .receive([&](uint64_t l) { lease = l; }, [](caf::error&) {});
  REQUIRE(lease != 0);
  {
    // Queues behind the first exchange, then terminates without waiting.
    caf::scoped_actor second{rt.system()};
    second->send(ref->handle, exchange_begin_atom::value,
                 conflict_policy::queue);
    bool queued = false;
    for (int i = 0; i < 2000 && !queued; ++i) {
      auto snap = rt.snapshot("queued");
      queued = snap && snap->queued == 1;
      if (!queued)
        std::this_thread::sleep_for(1ms);
    }
    REQUIRE(queued);
  }
  // Ending the first exchange grants the thread to the terminated
  // requester, which must not keep it.
  first->request(ref->handle, 5s, exchange_end_atom::value, lease)
    .receive([](uint64_t) {}, [](caf::error& err) { FAIL(describe(err)); });
  auto r = rt.send_message(message("queued", "free again?",
                                   conflict_policy::queue));
  REQUIRE(r);
  auto snap = rt.snapshot("queued");
  REQUIRE(snap);
  CHECK_FALSE(snap->in_exchange);
  CHECK(snap->turns.size() == 3);
}

TEST_CASE("exchange: stopping the runtime answers a waiting exchange") {
  auto gate = std::make_shared<test::gated_provider>();
  auto rt = std::make_unique<runtime>(with_provider(gate));
  auto first = std::async(std::launch::async,
                          [&] { return rt->send_message("stop", "one"); });
  test::gated_provider::opener open_on_exit{*gate};
  REQUIRE(gate->wait_for_waiting(1));
  auto queued = std::async(std::launch::async,
                           [&] { return rt->send_message("stop", "two"); });
  // Wait until the second message queues at the thread.
  bool queued_seen = false;
  for (int i = 0; i < 2000 && !queued_seen; ++i) {
    auto snap = rt->snapshot("stop");
    queued_seen = snap && snap->queued == 1;
    if (!queued_seen)
      std::this_thread::sleep_for(1ms);
  }
  REQUIRE(queued_seen);
  // CAF's actor system must be destroyed on a thread that used it last (it
  // keeps a thread-local reference to its logger), so the main thread stops
  // the runtime and a helper opens the gate once the queued message is
  // answered.
  std::atomic<bool> answered_first{false};
  std::thread opener{[&] {
    answered_first = queued.wait_for(10s) == std::future_status::ready;
    gate->open();
  }};
  rt->stop();
  opener.join();
  REQUIRE(answered_first); // while the first was still in the provider
  auto b = queued.get();
  REQUIRE_FALSE(b);
  REQUIRE(classify(b.error()) == errc::unavailable);
  auto a = first.get();
  REQUIRE_FALSE(a); // its thread stopped before the reply could be stored
}

TEST_CASE("exchange: a live thread that sent messages does not keep the "
          "runtime from stopping") {
  auto rt = std::make_unique<runtime>();
  std::promise<void> sent;
  std::promise<void> release;
  auto released = release.get_future().share();
  std::thread client{[&rt, &sent, released] {
    auto r = rt->send_message("t", "hi");
    sent.set_value();
    released.wait(); // stays alive while the runtime stops
  }};
  sent.get_future().wait();
  std::atomic<bool> stopped{false}, had_to_release{false};
  std::thread watchdog{[&] {
    for (int i = 0; i < 1000 && !stopped; ++i)
      std::this_thread::sleep_for(10ms);
    had_to_release = !stopped;
    release.set_value();
  }};
  rt.reset(); // on the thread that made it
  stopped = true;
  watchdog.join();
  client.join();
  REQUIRE_FALSE(had_to_release);
}

TEST_CASE("exchange: stopping the runtime ends streaming exchanges at once, "
          "each answered unavailable") {
  // An asynchronous provider that takes 30 s per reply: the exchanges hold
  // no thread while it streams, and a stop must not wait for it.
  auto loops = net::make_io_pool(1);
  runtime_options opts;
  opts.provider = std::make_shared<offline_provider>(10s, loops);
  auto rt = std::make_unique<runtime>(opts);
  constexpr int n = 20;
  std::vector<std::promise<caf::expected<exchange_result>>> results(n);
  for (int i = 0; i < n; ++i) {
    exchange_request req;
    req.thread_id = "halt-" + std::to_string(i);
    req.content = "a long answer please";
    rt->send_message_async(std::move(req), {},
                           [&results, i](caf::expected<exchange_result> r) {
                             results[i].set_value(std::move(r));
                           });
  }
  // Every exchange reaches the provider (its user turn is stored).
  for (int i = 0; i < n; ++i) {
    bool stored = false;
    for (int k = 0; k < 2000 && !stored; ++k) {
      auto h = rt->history("halt-" + std::to_string(i));
      stored = h && h->size() == 1;
      if (!stored)
        std::this_thread::sleep_for(1ms);
    }
    REQUIRE(stored);
  }
  auto start = std::chrono::steady_clock::now();
  rt->stop();
  CHECK(std::chrono::steady_clock::now() - start < 2s);
  for (auto& p : results) {
    auto r = p.get_future().get();
    REQUIRE_FALSE(r);
    CHECK(classify(r.error()) == errc::unavailable);
  }
  loops->stop();
}

TEST_CASE("exchange: a provider that never ends is given up after the reply "
          "timeout, as a timeout, and the thread is released") {
  auto loops = net::make_io_pool(1);
  runtime_options opts;
  opts.provider = std::make_shared<offline_provider>(60s, loops);
  opts.conversation.reply_timeout = 200ms;
  runtime rt{opts};
  auto start = std::chrono::steady_clock::now();
  auto r = rt.send_message("never-ends", "hello");
  REQUIRE_FALSE(r);
  CHECK(classify(r.error()) == errc::timeout);
  CHECK(std::chrono::steady_clock::now() - start < 5s);
  // The user turn stays; the thread takes the next message.
  auto h = rt.history("never-ends");
  REQUIRE(h);
  CHECK(h->size() == 1);
  auto snap = rt.snapshot("never-ends");
  REQUIRE(snap);
  CHECK_FALSE(snap->in_exchange);
  rt.stop();
  loops->stop();
}

TEST_CASE("exchange: callbacks come in order - held, deltas, the reply, then "
          "the end once the memory entry is stored") {
  runtime rt;
  std::mutex mx;
  std::vector<std::string> seen;
  std::promise<caf::expected<exchange_result>> ended;
  exchange_request req;
  req.thread_id = "order";
  req.user_id = "orderly";
  req.content = "My lucky number is 7139.";
  exchange_callbacks cb;
  auto note = [&](std::string what) {
    std::lock_guard<std::mutex> guard{mx};
    seen.push_back(std::move(what));
  };
  cb.on_held = [&](const exchange_result& r) {
    note("held:" + r.thread_id);
  };
  cb.on_delta = [&](std::string_view) {
    note("delta");
    return true;
  };
  std::string replied;
  cb.on_reply = [&](const exchange_result& r) {
    note("reply");
    replied = r.reply;
  };
  cb.done = [&](caf::expected<exchange_result> r) {
    note("done");
    ended.set_value(std::move(r));
  };
  rt.start_exchange(std::move(req), std::move(cb));
  auto r = ended.get_future().get();
  REQUIRE(r);
  std::lock_guard<std::mutex> guard{mx};
  REQUIRE(seen.size() >= 4);
  CHECK(seen.front() == "held:order");
  CHECK(seen[seen.size() - 2] == "reply");
  CHECK(seen.back() == "done");
  for (size_t i = 1; i + 2 < seen.size(); ++i)
    CHECK(seen[i] == "delta");
  CHECK(replied == r->reply);
  CHECK(r->turns == 2);
  // `done` came after the memory entry was stored: it is there at once.
  auto mem = rt.retrieve_memory("orderly", "elsewhere", "lucky number");
  REQUIRE(mem);
  CHECK_THAT(mem->text, Catch::Contains("7139"));
}
