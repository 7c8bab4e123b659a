// The OpenAI-compatible provider against fake servers on 127.0.0.1: the
// httplib one of fake_openai.hpp (requests recorded, scripted replies) and
// spindle_fake_upstream (many concurrent streams, timing, TLS).

#include <catch2/catch.hpp>

#include <atomic>
#include <condition_variable>
#include <future>
#include <mutex>
#include <optional>
#include <thread>

#include "fake_openai.hpp"
#include "spindle/messages/error.hpp"
#include "net/io_pool.hpp"
#include "spindle/runtime/openai_provider.hpp"
#include "support.hpp"

using namespace spindle;
using namespace std::chrono_literals;
using std::chrono::steady_clock;

using spindle::test::fake_upstream;

namespace {

std::vector<chat_message> hello_prompt() {
  return {{"system", "be brief", ""}, {"user", "hello", ""}};
}

std::shared_ptr<llm_provider> provider_for(const test::fake_openai& fake,
                                           std::string key = {}) {
  auto opts = fake.options();
  opts.api_key = std::move(key);
  opts.read_timeout = 2s;
  auto p = make_openai_provider(opts);
  REQUIRE(p);
  return *p;
}


std::shared_ptr<llm_provider>
provider_at(const std::string& url, std::shared_ptr<net::io_pool> loops = {},
            std::chrono::milliseconds read_timeout = 2s,
            std::string ca_file = {}) {
  openai_options opts;
  opts.base_url = url;
  opts.model = "test-model";
  opts.read_timeout = read_timeout;
  opts.loops = std::move(loops);
  opts.ca_file = std::move(ca_file);
  auto p = make_openai_provider(opts);
  REQUIRE(p);
  return *p;
}

std::vector<chat_message> asking(std::string question) {
  return {{"system", "be brief", ""}, {"user", std::move(question), ""}};
}

// What the asynchronous calls of a test did: each call's deltas with the
// time they came, and its end. A call's callbacks run on one loop thread;
// the test reads a record after waiting for its end.
class call_log {
public:
  struct record {
    std::vector<std::string> deltas;
    std::vector<steady_clock::time_point> delta_times;
    std::optional<caf::expected<completion>> result;
    steady_clock::time_point started;
    steady_clock::time_point ended;

    std::string joined() const {
      std::string out;
      for (auto& d : deltas)
        out += d;
      return out;
    }
  };

  explicit call_log(size_t calls) : records_(calls) {
  }

  /// Starts call `i` on `p`; its delta callback asks to stop after
  /// `keep` deltas. Returns what `start` returned. Thread-safe for
  /// different `i` (and free of Catch assertions, which are not).
  bool start(llm_provider& p, size_t i, std::vector<chat_message> messages,
             completion_options options = {}, size_t keep = SIZE_MAX) {
    auto& r = records_[i];
    r.started = steady_clock::now();
    auto on_delta = [&r, keep](std::string_view d) {
      r.deltas.emplace_back(d);
      r.delta_times.push_back(steady_clock::now());
      return r.deltas.size() < keep;
    };
    auto done = [this, &r](caf::expected<completion> result) {
      std::lock_guard<std::mutex> guard{mx_};
      r.result = std::move(result);
      r.ended = steady_clock::now();
      ++ended_;
      cv_.notify_all();
    };
    return p.start(std::move(messages), options, on_delta, done);
  }

  /// Waits until `n` calls ended (all by default).
  bool wait(std::chrono::milliseconds limit, size_t n = SIZE_MAX) {
    n = std::min(n, records_.size());
    std::unique_lock<std::mutex> guard{mx_};
    return cv_.wait_for(guard, limit, [&] { return ended_ >= n; });
  }

  size_t ended() {
    std::lock_guard<std::mutex> guard{mx_};
    return ended_;
  }

  const record& operator[](size_t i) const {
    return records_[i];
  }

  /// How many deltas of call `i` came strictly between `from` and `to`.
  size_t deltas_between(size_t i, steady_clock::time_point from,
                        steady_clock::time_point to) const {
    size_t n = 0;
    for (auto t : records_[i].delta_times)
      n += t > from && t < to;
    return n;
  }

private:
  std::vector<record> records_;
  std::mutex mx_;
  std::condition_variable cv_;
  size_t ended_ = 0;
};

std::chrono::milliseconds ms_between(steady_clock::time_point a,
                                     steady_clock::time_point b) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(b - a);
}

// A call started with a flow control: its deltas counted (the first one
// signalled), its end in `result`. The flow is passed, not kept.
struct flowed_call {
  std::atomic<size_t> deltas{0};
  std::promise<void> first;
  std::promise<caf::expected<completion>> ended;
  std::future<caf::expected<completion>> result = ended.get_future();

  bool start(llm_provider& p, std::string question,
             std::shared_ptr<flow_control> flow,
             std::chrono::milliseconds timeout = 120s) {
    completion_options options;
    options.flow = std::move(flow);
    options.timeout = timeout;
    return p.start(asking(std::move(question)), options,
                   [this](std::string_view) {
                     if (++deltas == 1)
                       first.set_value();
                     return true;
                   },
                   [this](caf::expected<completion> r) {
                     ended.set_value(std::move(r));
                   });
  }
};

} // namespace

TEST_CASE("openai provider: streams deltas in order and sends the exact "
          "messages array") {
  test::fake_openai fake;
  fake.set_replies({"Donald Trump has five children."});
  auto p = provider_for(fake, "sk-test");
  std::vector<std::string> deltas;
  auto r = p->complete(hello_prompt(), {}, [&](std::string_view d) {
    deltas.emplace_back(d);
    return true;
  });
  REQUIRE(r);
  CHECK(r->text == "Donald Trump has five children.");
  CHECK_FALSE(r->interrupted);
  CHECK(deltas.size() > 1);
  std::string joined;
  for (auto& d : deltas)
    joined += d;
  CHECK(joined == r->text);
  auto reqs = fake.requests();
  REQUIRE(reqs.size() == 1);
  CHECK(reqs[0]["model"] == "test-model");
  CHECK(reqs[0]["stream"] == true);
  CHECK(reqs[0]["messages"]
        == nlohmann::json::array({{{"role", "system"}, {"content", "be brief"}},
                                  {{"role", "user"}, {"content", "hello"}}}));
  CHECK(fake.auth_headers()[0] == "Bearer sk-test");
}

TEST_CASE("openai provider: a plain JSON completion is read as one delta") {
  test::fake_openai fake;
  fake.set_mode(test::fake_openai::mode::plain);
  fake.set_replies({"plain answer"});
  auto p = provider_for(fake);
  int calls = 0;
  auto r = p->complete(hello_prompt(), {}, [&](std::string_view d) {
    ++calls;
    CHECK(d == "plain answer");
    return true;
  });
  REQUIRE(r);
  CHECK(r->text == "plain answer");
  CHECK(calls == 1);
}

TEST_CASE("openai provider: an upstream error is upstream_failure carrying "
          "the upstream's message") {
  test::fake_openai fake;
  fake.set_mode(test::fake_openai::mode::error);
  auto r = provider_for(fake)->complete(hello_prompt(), {}, {});
  REQUIRE_FALSE(r);
  CHECK(classify(r.error()) == errc::upstream_failure);
  CHECK(describe(r.error()).find("500") != std::string::npos);
  CHECK(describe(r.error()).find("model is overloaded") != std::string::npos);
}

TEST_CASE("openai provider: an unreachable endpoint is upstream_failure") {
  openai_options opts;
  opts.base_url = "http://127.0.0.1:1";
  opts.model = "m";
  opts.connect_timeout = 1s;
  auto r = (*make_openai_provider(opts))->complete(hello_prompt(), {}, {});
  REQUIRE_FALSE(r);
  CHECK(classify(r.error()) == errc::upstream_failure);
  CHECK(describe(r.error()).find("cannot reach") != std::string::npos);
}

TEST_CASE("openai provider: the overall timeout stops a slow stream") {
  test::fake_openai fake;
  fake.set_mode(test::fake_openai::mode::slow);
  fake.set_replies({std::string(70, 'x')}); // 10 chunks, 200 ms apart
  completion_options opts;
  opts.timeout = 500ms;
  auto r = provider_for(fake)->complete(hello_prompt(), opts, {});
  REQUIRE_FALSE(r);
  CHECK(classify(r.error()) == errc::timeout);
}

TEST_CASE("openai provider: a delta callback returning false interrupts and "
          "keeps what arrived") {
  test::fake_openai fake;
  fake.set_replies({std::string(70, 'y')});
  int seen = 0;
  auto r = provider_for(fake)->complete(hello_prompt(), {}, [&](std::string_view) {
    return ++seen < 3;
  });
  REQUIRE(r);
  CHECK(r->interrupted);
  CHECK(r->text == std::string(21, 'y'));
}

TEST_CASE("openai provider: bad settings are refused up front") {
  openai_options opts;
  opts.base_url = "ftp://x";
  opts.model = "m";
  CHECK(classify(make_openai_provider(opts).error()) == errc::invalid_argument);
  opts.base_url = "http://x";
  opts.model = "";
  CHECK(classify(make_openai_provider(opts).error()) == errc::invalid_argument);
}

TEST_CASE("openai provider: a CA file that cannot be loaded is refused up "
          "front") {
  openai_options opts;
  opts.base_url = "https://127.0.0.1:1";
  opts.model = "m";
  opts.ca_file = "/nonexistent/ca.pem";
  auto p = make_openai_provider(opts);
  REQUIRE_FALSE(p);
  CHECK(classify(p.error()) == errc::invalid_argument);
  CHECK(describe(p.error()).find("/nonexistent/ca.pem") != std::string::npos);
}

TEST_CASE("openai provider: 500 concurrent streams on a 2-thread pool each "
          "get exactly their own reply, whole and in order") {
  // Each reply lasts 3 s, so all 500 are open at once on the upstream.
  fake_upstream up{{"--threads", "2", "--stream-seconds", "3", "--chunks",
                    "10"}};
  auto loops = net::make_io_pool(2);
  auto p = provider_at(up.url(), loops);
  constexpr size_t calls = 500;
  auto question = [](size_t i) {
    return "stream " + std::to_string(i) + " wants its own reply";
  };
  call_log log{calls};
  auto began = steady_clock::now();
  // Started from 4 threads at once.
  std::atomic<size_t> refused{0};
  std::vector<std::thread> starters;
  for (size_t t = 0; t < 4; ++t)
    starters.emplace_back([&, t] {
      for (size_t i = t; i < calls; i += 4)
        if (!log.start(*p, i, asking(question(i))))
          ++refused;
    });
  for (auto& t : starters)
    t.join();
  REQUIRE(refused == 0);
  REQUIRE(log.wait(60s));
  auto took = ms_between(began, steady_clock::now());

  size_t wrong = 0;
  for (size_t i = 0; i < calls; ++i) {
    auto& r = log[i];
    auto expected = "echo: " + question(i);
    bool right = r.result && *r.result && (*r.result)->text == expected
                 && !(*r.result)->interrupted && r.joined() == expected
                 && r.deltas.size() == 10;
    if (!right && wrong++ == 0) {
      INFO("call " << i << ": "
                   << (r.result && *r.result ? (*r.result)->text
                       : r.result ? describe(r.result->error())
                                  : std::string{"no end"})
                   << ", deltas joined '" << r.joined() << "' ("
                   << r.deltas.size() << ")");
      CHECK(right);
    }
  }
  CHECK(wrong == 0);
  // The upstream counts a stream completed once its last write finished,
  // which may be just after the client read that write and returned.
  auto stats = up.stats();
  for (int i = 0; i < 500 && stats["completed"] != calls; ++i) {
    std::this_thread::sleep_for(10ms);
    stats = up.stats();
  }
  INFO(stats.dump());
  CHECK(stats["requests"] == calls);
  CHECK(stats["completed"] == calls);
  CHECK(stats["aborted"] == 0);
  CHECK(stats["max_open"] == calls); // they ran side by side
  CHECK(took < 20s);
}

TEST_CASE("openai provider: a delta callback returning false mid-stream ends "
          "the call at once with the partial text, and the upstream sees the "
          "connection close") {
  // A piece every 100 ms for 10 s.
  fake_upstream up{{"--stream-seconds", "10", "--chunks", "100",
                    "--reply-bytes", "1000"}};
  auto p = provider_at(up.url());
  call_log log{1};
  REQUIRE(log.start(*p, 0, asking("stop me"), {}, 3));
  REQUIRE(log.wait(5s));
  auto& r = log[0];
  REQUIRE(r.result);
  REQUIRE(*r.result);
  CHECK((*r.result)->interrupted);
  CHECK(r.deltas.size() == 3);
  CHECK((*r.result)->text == r.joined());
  CHECK((*r.result)->text.size() == 30);
  CHECK((*r.result)->text.rfind("echo: stop me", 0) == 0);
  CHECK(ms_between(r.started, r.ended) < 2s);
  // Long before the stream would have ended, the upstream saw it abandoned.
  nlohmann::json stats;
  auto deadline = steady_clock::now() + 3s;
  do {
    stats = up.stats();
    if (stats["aborted"] == 1 && stats["open"] == 0)
      break;
    std::this_thread::sleep_for(20ms);
  } while (steady_clock::now() < deadline);
  INFO(stats.dump());
  CHECK(stats["aborted"] == 1);
  CHECK(stats["open"] == 0);
  CHECK(stats["completed"] == 0);
}

TEST_CASE("openai provider: read and overall timeouts end calls with "
          "timeout on the loop while another stream on the same loop keeps "
          "flowing") {
  // One piece, then silence for 10 s.
  fake_upstream stalling{{"--stream-seconds", "20", "--chunks", "2"}};
  // No answer for 20 s.
  fake_upstream silent{{"--first-byte-ms", "20000"}};
  // A piece every 100 ms for 20 s: never idle, never done in time.
  fake_upstream endless{{"--stream-seconds", "20", "--chunks", "200",
                         "--reply-bytes", "1000"}};
  // A piece every 100 ms for 2.5 s.
  fake_upstream steady{{"--stream-seconds", "2.5", "--chunks", "25"}};

  auto loop = net::make_io_pool(1); // every call on one thread
  auto to_stalling = provider_at(stalling.url(), loop, 400ms);
  auto to_silent = provider_at(silent.url(), loop, 400ms);
  auto to_endless = provider_at(endless.url(), loop);
  auto to_steady = provider_at(steady.url(), loop);

  enum { steady_call, stalling_call, silent_call, endless_call };
  call_log log{4};
  REQUIRE(log.start(*to_steady, steady_call, asking("keep flowing")));
  std::this_thread::sleep_for(200ms);
  completion_options short_call;
  short_call.timeout = 800ms;
  REQUIRE(log.start(*to_stalling, stalling_call, asking("stall")));
  REQUIRE(log.start(*to_silent, silent_call, asking("say nothing")));
  REQUIRE(
    log.start(*to_endless, endless_call, asking("never end"), short_call));
  REQUIRE(log.wait(10s));

  auto& flowing = log[steady_call];
  REQUIRE(flowing.result);
  REQUIRE(*flowing.result);
  CHECK((*flowing.result)->text == "echo: keep flowing");
  CHECK(flowing.deltas.size() == 18); // as many pieces as bytes

  for (int call : {stalling_call, silent_call, endless_call}) {
    auto& r = log[call];
    INFO("call " << call);
    REQUIRE(r.result);
    REQUIRE_FALSE(*r.result);
    CHECK(classify(r.result->error()) == errc::timeout);
    auto waited = ms_between(r.started, r.ended);
    CHECK(waited >= (call == endless_call ? 750ms : 350ms));
    CHECK(waited < 2s);
    // The loop kept serving the steady stream while this call waited.
    CHECK(r.ended < flowing.ended);
    CHECK(log.deltas_between(steady_call, r.started, r.ended) >= 2);
  }
  CHECK(log[stalling_call].deltas.size() == 1);
  CHECK(log[silent_call].deltas.empty());
  CHECK(log[endless_call].deltas.size() >= 4);
  CHECK(describe(log[silent_call].result->error())
          .find("sent nothing for 400 ms")
        != std::string::npos);
  CHECK(describe(log[endless_call].result->error()).find("within 800 ms")
        != std::string::npos);
}

TEST_CASE("openai provider: https verifies the upstream's certificate: "
          "trusted through the CA option it streams, and untrusted or for "
          "another host it fails") {
  test::temp_dir dir;
  auto cert = dir.str() + "/cert.pem";
  auto key = dir.str() + "/key.pem";
  auto made = test::run({"openssl", "req", "-x509", "-newkey", "ec",
                         "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                         "-keyout", key, "-out", cert, "-days", "1", "-subj",
                         "/CN=spindle test upstream", "-addext",
                         "subjectAltName=IP:127.0.0.1"});
  INFO(made.err);
  REQUIRE(made.exit_code == 0);
  fake_upstream up{{"--tls-cert", cert, "--tls-key", key, "--chunks", "4"}};

  std::vector<std::string> deltas;
  auto trusted = provider_at(up.url("https"), {}, 2s, cert);
  auto r = trusted->complete(asking("over tls"), {}, [&](std::string_view d) {
    deltas.emplace_back(d);
    return true;
  });
  REQUIRE(r);
  CHECK(r->text == "echo: over tls");
  CHECK(deltas.size() == 4);

  auto untrusted = provider_at(up.url("https"));
  auto refused = untrusted->complete(asking("over tls"), {}, {});
  REQUIRE_FALSE(refused);
  CHECK(classify(refused.error()) == errc::upstream_failure);
  CHECK(describe(refused.error()).find("self-signed certificate")
        != std::string::npos);
  CHECK(describe(refused.error()).find(up.url("https")) != std::string::npos);

  auto by_name = provider_at(up.url("https", "localhost"), {}, 2s, cert);
  auto mismatch = by_name->complete(asking("over tls"), {}, {});
  REQUIRE_FALSE(mismatch);
  CHECK(classify(mismatch.error()) == errc::upstream_failure);
  CHECK(describe(mismatch.error()).find("hostname mismatch")
        != std::string::npos);
}

TEST_CASE("openai provider: destroying a provider with a pool of its own "
          "ends its calls with unavailable, while on a shared pool they go "
          "on") {
  fake_upstream up{{"--stream-seconds", "1", "--chunks", "10"}};
  call_log log{4};
  {
    auto own = provider_at(up.url());
    REQUIRE(log.start(*own, 0, asking("cut short")));
    REQUIRE(log.start(*own, 1, asking("cut short too")));
    std::this_thread::sleep_for(300ms); // both are streaming
  }
  REQUIRE(log.wait(0ms, 2));
  for (size_t i : {0, 1}) {
    REQUIRE(log[i].result);
    REQUIRE_FALSE(*log[i].result);
    CHECK(classify(log[i].result->error()) == errc::unavailable);
  }

  auto shared = net::make_io_pool(1);
  {
    auto p = provider_at(up.url(), shared);
    REQUIRE(log.start(*p, 2, asking("go on")));
    REQUIRE(log.start(*p, 3, asking("go on too")));
  }
  REQUIRE(log.wait(5s));
  for (size_t i : {2, 3}) {
    REQUIRE(log[i].result);
    REQUIRE(*log[i].result);
    CHECK((*log[i].result)->text.rfind("echo: go on", 0) == 0);
  }
}

TEST_CASE("openai provider: complete on a thread of the provider's loop "
          "fails at once instead of waiting for itself") {
  fake_upstream up{{"--chunks", "2"}};
  auto p = provider_at(up.url());
  std::promise<caf::expected<completion>> nested;
  p->start(asking("outer"), {}, {}, [&](caf::expected<completion>) {
    nested.set_value(p->complete(asking("inner"), {}, {}));
  });
  auto f = nested.get_future();
  REQUIRE(f.wait_for(5s) == std::future_status::ready);
  auto r = f.get();
  REQUIRE_FALSE(r);
  CHECK(classify(r.error()) == errc::unavailable);
}

TEST_CASE("openai provider: a paused flow stops reading between pieces, "
          "the read timeout does not run out meanwhile, and a resume reads "
          "the rest") {
  // 200 pieces written at once: far more than one read takes.
  fake_upstream up{{"--chunks", "200", "--reply-bytes", "40000"}};
  auto p = provider_at(up.url(), {}, 300ms);
  auto flow = std::make_shared<flow_control>();
  flow->pause();
  flowed_call call;
  REQUIRE(call.start(*p, "pace me", flow));
  auto& deltas = call.deltas;
  auto& result = call.result;
  // What the first read brought comes (perhaps only the head), then the
  // provider waits.
  auto deadline = steady_clock::now() + 10s;
  while (flow->holds() == 0 && steady_clock::now() < deadline)
    std::this_thread::sleep_for(5ms);
  REQUIRE(flow->holds() == 1);
  auto seen = deltas.load();
  CHECK(seen < 200);
  // Three read timeouts later: still waiting, nothing more read.
  CHECK(result.wait_for(1s) == std::future_status::timeout);
  CHECK(deltas.load() == seen);
  flow->resume();
  REQUIRE(result.wait_for(10s) == std::future_status::ready);
  auto r = result.get();
  REQUIRE(r);
  CHECK(!r->interrupted);
  CHECK(r->text.size() == 40000);
  CHECK(deltas.load() == 200);
}

TEST_CASE("openai provider: a call paused for good still ends at its "
          "timeout, and lets its flow control go") {
  fake_upstream up{{"--chunks", "200", "--reply-bytes", "40000"}};
  auto p = provider_at(up.url());
  auto flow = std::make_shared<flow_control>();
  flow->pause();
  flowed_call call;
  REQUIRE(call.start(*p, "never resumed", flow, 500ms));
  auto& result = call.result;
  REQUIRE(result.wait_for(10s) == std::future_status::ready);
  auto r = result.get();
  REQUIRE(!r);
  CHECK(classify(r.error()) == errc::timeout);
  CHECK(flow->holds() == 1);
  // The call is gone: the continuation it left (which owned it) too.
  auto deadline = steady_clock::now() + 5s;
  while (flow.use_count() > 1 && steady_clock::now() < deadline)
    std::this_thread::sleep_for(5ms);
  CHECK(flow.use_count() == 1);
}

TEST_CASE("openai provider: a cancelled call ends at once as interrupted "
          "with what came, and the upstream sees its connection close") {
  // A piece every 100 ms for 10 s.
  fake_upstream up{{"--stream-seconds", "10", "--chunks", "100",
                    "--reply-bytes", "1000"}};
  auto p = provider_at(up.url());
  auto flow = std::make_shared<flow_control>();
  flowed_call call;
  REQUIRE(call.start(*p, "cut me off", flow));
  auto& result = call.result;
  REQUIRE(call.first.get_future().wait_for(10s) == std::future_status::ready);
  REQUIRE(flow->cancel());
  CHECK_FALSE(flow->cancel()); // once
  REQUIRE(result.wait_for(2s) == std::future_status::ready);
  auto r = result.get();
  REQUIRE(r);
  CHECK(r->interrupted);
  CHECK(!r->text.empty());
  CHECK(r->text.size() < 1000);
  CHECK(r->text.rfind("echo: ", 0) == 0);
  nlohmann::json stats;
  auto deadline = steady_clock::now() + 3s;
  do {
    stats = up.stats();
    if (stats["aborted"] == 1)
      break;
    std::this_thread::sleep_for(5ms);
  } while (steady_clock::now() < deadline);
  CHECK(stats["aborted"] == 1);
  // The call is gone, and with it the abort it left.
  deadline = steady_clock::now() + 5s;
  while (flow.use_count() > 1 && steady_clock::now() < deadline)
    std::this_thread::sleep_for(5ms);
  CHECK(flow.use_count() == 1);
}
