// Several `spindle serve` nodes on one PostgreSQL database
// (docs/cluster.md): any node serves any thread, forwarding to the one
// that holds its lease; two messages to a thread through two nodes never
// interleave; a node killed outright has its threads served by the others
// within its lease, having lost nothing it acknowledged; a node paused past
// its lease has its late writes refused by the fence and serves again
// through the new owner. Runs only on the PostgreSQL run
// (tests/CMakeLists.txt).

#include <atomic>
#include <chrono>
#include <csignal>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include <arpa/inet.h>
#include <poll.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "spindle/runtime/runtime.hpp"
#include "support.hpp"
#include "tenant_client.hpp"

using namespace spindle;
using namespace spindle::test;
using namespace std::chrono_literals;
using json = nlohmann::json;

namespace {

// A TCP relay between one node and PostgreSQL: `cut()` closes every
// connection through it and refuses new ones, as a broken network would
// (the node sees its statements fail); `mend()` lets them through again.
class relay {
public:
  relay(std::string host, int port) : host_(std::move(host)), to_(port) {
    listener_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(listener_ >= 0);
    int one = 1;
    ::setsockopt(listener_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(listener_, reinterpret_cast<sockaddr*>(&addr),
                   sizeof(addr))
            == 0);
    socklen_t len = sizeof(addr);
    ::getsockname(listener_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    REQUIRE(::listen(listener_, 64) == 0);
    pump_ = std::thread{[this] { run(); }};
  }

  ~relay() {
    stop_ = true;
    ::shutdown(listener_, SHUT_RDWR);
    pump_.join();
    ::close(listener_);
    for (auto& [a, b] : pairs_) {
      ::close(a);
      ::close(b);
    }
  }

  int port() const noexcept {
    return port_;
  }

  void cut() {
    cut_ = true;
  }
  void mend() {
    cut_ = false;
  }

private:
  void run() {
    std::vector<char> buf(64 * 1024);
    while (!stop_) {
      std::vector<pollfd> fds{{listener_, POLLIN, 0}};
      for (auto& [a, b] : pairs_) {
        fds.push_back({a, POLLIN, 0});
        fds.push_back({b, POLLIN, 0});
      }
      ::poll(fds.data(), fds.size(), 50);
      if (cut_) {
        for (auto& [a, b] : pairs_) {
          ::close(a);
          ::close(b);
        }
        pairs_.clear();
      }
      if (fds[0].revents & POLLIN) {
        int in = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
        if (in >= 0 && cut_) {
          ::close(in);
        } else if (in >= 0) {
          int out = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
          sockaddr_in to{};
          to.sin_family = AF_INET;
          to.sin_port = htons(static_cast<uint16_t>(to_));
          ::inet_pton(AF_INET, host_.c_str(), &to.sin_addr);
          if (::connect(out, reinterpret_cast<sockaddr*>(&to), sizeof(to))
              == 0) {
            pairs_.emplace_back(in, out);
          } else {
            ::close(in);
            ::close(out);
          }
        }
      }
      if (cut_)
        continue;
      // Pump what arrived; a pair whose side closed is dropped.
      std::vector<size_t> dead;
      for (size_t i = 0; i < pairs_.size() && 1 + 2 * i + 1 < fds.size();
           ++i) {
        auto [a, b] = pairs_[i];
        for (int side = 0; side < 2; ++side) {
          auto& f = fds[1 + 2 * i + side];
          if (!(f.revents & (POLLIN | POLLHUP | POLLERR)))
            continue;
          int from = side == 0 ? a : b, to = side == 0 ? b : a;
          auto n = ::recv(from, buf.data(), buf.size(), 0);
          if (n <= 0 || !send_all(to, std::string(buf.data(),
                                                   static_cast<size_t>(n)))) {
            dead.push_back(i);
            break;
          }
        }
      }
      for (auto it = dead.rbegin(); it != dead.rend(); ++it) {
        ::close(pairs_[*it].first);
        ::close(pairs_[*it].second);
        pairs_.erase(pairs_.begin() + static_cast<ptrdiff_t>(*it));
      }
    }
  }

  std::string host_;
  int to_;
  int port_ = 0;
  int listener_ = -1;
  std::atomic<bool> stop_{false};
  std::atomic<bool> cut_{false};
  std::vector<std::pair<int, int>> pairs_;
  std::thread pump_;
};

// `url` with its port replaced by `port`.
std::string via_port(const std::string& url, int port) {
  auto at = url.rfind('@');
  auto colon = url.find(':', at);
  auto slash = url.find('/', colon);
  REQUIRE(at != std::string::npos);
  REQUIRE(colon != std::string::npos);
  REQUIRE(slash != std::string::npos);
  return url.substr(0, colon + 1) + std::to_string(port) + url.substr(slash);
}

int port_of(const std::string& url) {
  auto at = url.rfind('@');
  auto colon = url.find(':', at);
  return std::stoi(url.substr(colon + 1));
}

std::unique_ptr<httplib::Client> client_of(int port) {
  auto cli = std::make_unique<httplib::Client>("127.0.0.1", port);
  cli->set_connection_timeout(2s);
  cli->set_read_timeout(30s);
  return cli;
}

// The history of `thread`, every turn, through `port`.
json history(int port, const std::string& thread) {
  auto cli = client_of(port);
  auto r = cli->Get(("/v1/threads/" + thread + "/history?max_turns=100000")
                      .c_str());
  REQUIRE(r);
  INFO(r->body);
  REQUIRE(r->status == 200);
  return json::parse(r->body)["turns"];
}

// Sends `content` to `thread` through `cli`: the status (0: no answer).
int send_message(httplib::Client& cli, const std::string& thread,
                 const std::string& content) {
  auto r = cli.Post(("/v1/threads/" + thread + "/messages").c_str(),
                    json{{"content", content}}.dump(), "application/json");
  return r ? r->status : 0;
}

std::string quoted_in_reply(const std::string& content) {
  return "Your message: \"" + content + "\"";
}

// Every user turn of `turns` is followed at once by the assistant turn
// that answers it (the offline provider quotes the message), and every
// acknowledged message is there exactly once. With `orphans_allowed`, a
// user turn may stand without its reply (its node was killed before the
// reply was stored; its client got no answer).
void check_pairs(const json& turns, const std::set<std::string>& acked,
                 const std::string& thread, bool orphans_allowed) {
  std::map<std::string, int> seen;
  for (size_t i = 0; i < turns.size(); ++i) {
    auto role = turns[i]["role"].get<std::string>();
    auto content = turns[i]["content"].get<std::string>();
    if (role == "assistant") {
      INFO(thread << ": turn " << i << " is an assistant turn after another "
                  "assistant turn, or first");
      REQUIRE(i > 0);
      REQUIRE(turns[i - 1]["role"] == "user");
      continue;
    }
    REQUIRE(role == "user");
    bool answered = i + 1 < turns.size() && turns[i + 1]["role"] == "assistant";
    if (answered) {
      auto reply = turns[i + 1]["content"].get<std::string>();
      INFO(thread << ": turn " << i + 1 << " does not answer turn " << i
                  << " ('" << content << "'): " << reply);
      REQUIRE(reply.find(quoted_in_reply(content)) != std::string::npos);
      ++seen[content];
    } else {
      INFO(thread << ": message '" << content << "' has no reply");
      REQUIRE(orphans_allowed);
      REQUIRE(acked.count(content) == 0);
    }
  }
  for (auto& content : acked) {
    INFO(thread << ": acknowledged message '" << content << "'");
    CHECK(seen[content] == 1);
  }
}

} // namespace

TEST_CASE("GET /v1/cluster lists every node with its state and threads",
          "[postgres]") {
  cluster c{2};
  auto a = client_of(c.node(0).port());
  REQUIRE(send_message(*a, "listed", "hi") == 200);
  auto r = c.node(1).port();
  auto b = client_of(r);
  auto got = b->Get("/v1/cluster");
  REQUIRE(got);
  REQUIRE(got->status == 200);
  auto body = json::parse(got->body);
  CHECK(body["clustered"] == true);
  CHECK(body["node"] == "node1");
  REQUIRE(body["nodes"].size() == 2);
  for (auto& n : body["nodes"]) {
    CHECK(n["state"] == "serving");
    CHECK(n["lease_left_ms"].get<int64_t>() > 0);
    CHECK(n["advertise"].get<std::string>().rfind("http://127.0.0.1:", 0)
          == 0);
  }
  CHECK(body["nodes"][0]["name"] == "node0");
  CHECK(body["nodes"][0]["threads"] == 1);
  CHECK(body["nodes"][1]["threads"] == 0);
  CHECK(c.owner("listed") == "node0");
  // A clean stop lets go of everything at once.
  REQUIRE(c.node(0).stop(SIGTERM) == 0);
  body = json::parse(b->Get("/v1/cluster")->body);
  CHECK(body["nodes"][0]["state"] == "stopped");
  CHECK(body["nodes"][0]["threads"] == 0);
  CHECK(c.owner("listed").empty());
}

TEST_CASE("a node name held by a running node is refused, and a clean "
          "stop frees it",
          "[postgres]") {
  cluster c{1};
  auto port = free_port();
  temp_dir dir;
  std::vector<std::string> argv{spindle_binary(), "serve", "--store",
                                c.store().url(), "--port",
                                std::to_string(port), "--node-name", "node0",
                                "--node-lease-ms", cluster::lease_ms,
                                "--data", dir.str()};
  auto start = std::chrono::steady_clock::now();
  auto refused = run(argv, "");
  auto waited = std::chrono::steady_clock::now() - start;
  INFO(refused.err);
  CHECK(refused.exit_code == 1);
  CHECK(refused.err.find("node name 'node0' is held by a running node")
        != std::string::npos);
  // It waited for the lease to run out, then gave up.
  CHECK(waited >= 2s);
  REQUIRE(c.node(0).stop(SIGTERM) == 0);
  server_process again{{"--store", c.store().url(), "--port",
                        std::to_string(port), "--node-name", "node0",
                        "--node-lease-ms", cluster::lease_ms, "--data",
                        dir.str()}};
  auto cli = client_of(again.port());
  auto body = json::parse(cli->Get("/v1/cluster")->body);
  CHECK(body["nodes"][0]["incarnation"] == 2);
}

TEST_CASE("three nodes serve eight shared threads to 48 clients: exact "
          "turn counts, replies never interleaved, one owner each",
          "[postgres]") {
  cluster c{3};
  constexpr size_t clients = 48, messages = 20, threads = 8;
  std::vector<std::string> names;
  for (size_t t = 0; t < threads; ++t)
    names.push_back("shared-" + std::to_string(t));
  std::mutex mtx;
  std::map<std::string, std::set<std::string>> acked;
  std::atomic<size_t> failures{0};
  std::string first_failure;
  std::atomic<bool> loading{true};
  // Meanwhile: no lease is ever held by a node whose own lease ran out.
  std::atomic<size_t> samples{0}, stale{0};
  std::thread sampler{[&] {
    while (loading) {
      auto n = c.store().query(
        "SELECT count(*) FROM thread_leases l LEFT JOIN cluster_nodes n "
        "ON n.name = l.node AND n.incarnation = l.incarnation "
        "WHERE l.node IS NOT NULL AND (n.name IS NULL "
        "OR n.expires_at <= clock_timestamp());");
      ++samples;
      if (n != "0")
        ++stale;
      std::this_thread::sleep_for(20ms);
    }
  }};
  // httplib's first request makes its function-local statics; libhttplib
  // is not built with TSan, which cannot see their guard: made here, by
  // one thread, before the clients start.
  REQUIRE(send_message(*client_of(c.node(0).port()), "warm-up", "hi") == 200);
  std::vector<std::thread> workers;
  for (size_t w = 0; w < clients; ++w)
    workers.emplace_back([&, w] {
      auto cli = client_of(c.node(w % c.size()).port());
      for (size_t k = 0; k < messages; ++k) {
        auto& thread = names[(w + k) % threads];
        auto content = "c" + std::to_string(w) + " m" + std::to_string(k);
        auto r = cli->Post(("/v1/threads/" + thread + "/messages").c_str(),
                           json{{"content", content}}.dump(),
                           "application/json");
        std::lock_guard<std::mutex> guard{mtx};
        if (r && r->status == 200) {
          acked[thread].insert(content);
          continue;
        }
        if (failures++ == 0)
          first_failure = r ? std::to_string(r->status) + " " + r->body
                            : httplib::to_string(r.error());
      }
    });
  for (auto& w : workers)
    w.join();
  loading = false;
  sampler.join();
  INFO("first failure: " << first_failure);
  REQUIRE(failures == 0);
  CHECK(samples > 0);
  CHECK(stale == 0);
  size_t total = 0;
  for (size_t t = 0; t < threads; ++t) {
    // Read through a node that may not own it: forwarded, the same.
    auto turns = history(c.node(t % c.size()).port(), names[t]);
    CHECK(turns.size() == 2 * acked[names[t]].size());
    check_pairs(turns, acked[names[t]], names[t], false);
    total += acked[names[t]].size();
    // One row, one owner.
    CHECK(!c.owner(names[t]).empty());
  }
  CHECK(total == clients * messages);
  // Requests reached nodes that did not own their thread, and were
  // forwarded to the owner.
  CHECK(c.forwarded() > 0);
}

TEST_CASE("the first messages of new threads reach two nodes at the same "
          "instant: each thread gets one owner, and no message is refused",
          "[postgres]") {
  cluster c{2};
  constexpr size_t fresh = 60;
  // httplib's first request makes its function-local statics; libhttplib
  // is not built with TSan, which cannot see their guard: made here, by
  // one thread, before the pairs race.
  REQUIRE(send_message(*client_of(c.node(0).port()), "warm-up", "hi") == 200);
  std::atomic<size_t> failures{0};
  std::mutex mtx;
  std::string first_failure;
  for (size_t t = 0; t < fresh; ++t) {
    auto thread = "race-" + std::to_string(t);
    // Both requests leave together; whichever node loses the race for the
    // lease forwards to the winner instead of refusing.
    std::atomic<int> ready{0};
    std::vector<std::thread> pair;
    for (size_t n = 0; n < 2; ++n)
      pair.emplace_back([&, n] {
        auto cli = client_of(c.node(n).port());
        ++ready;
        while (ready < 2)
          std::this_thread::yield();
        auto r = cli->Post(("/v1/threads/" + thread + "/messages").c_str(),
                           json{{"content", "from node" + std::to_string(n)}}
                             .dump(),
                           "application/json");
        if (r && r->status == 200)
          return;
        std::lock_guard<std::mutex> guard{mtx};
        if (failures++ == 0)
          first_failure = thread + ": "
                          + (r ? std::to_string(r->status) + " " + r->body
                               : httplib::to_string(r.error()));
      });
    for (auto& p : pair)
      p.join();
  }
  INFO("first failure: " << first_failure);
  REQUIRE(failures == 0);
  for (size_t t = 0; t < fresh; ++t) {
    auto thread = "race-" + std::to_string(t);
    auto turns = history(c.node(t % 2).port(), thread);
    CHECK(turns.size() == 4);
    check_pairs(turns, {"from node0", "from node1"}, thread, false);
    auto owner = c.owner(thread);
    CHECK((owner == "node0" || owner == "node1"));
  }
}

TEST_CASE("kill -9 of the node owning most threads: its threads are served "
          "elsewhere within 10 s, no acknowledged turn is lost",
          "[postgres]") {
  cluster c{3};
  constexpr size_t threads = 8;
  std::vector<std::string> names;
  for (size_t t = 0; t < threads; ++t)
    names.push_back("kt-" + std::to_string(t));
  // node0 takes most threads: six through it, two through node1.
  for (size_t t = 0; t < threads; ++t) {
    auto cli = client_of(c.node(t < 6 ? 0 : 1).port());
    auto r = cli->Post(("/v1/threads/" + names[t] + "/messages").c_str(),
                       R"({"content":"hello"})", "application/json");
    REQUIRE(r);
    REQUIRE(r->status == 200);
  }
  for (size_t t = 0; t < 6; ++t)
    REQUIRE(c.owner(names[t]) == "node0");
  // IDs: each one handed out after another was answered, on any node, is
  // larger (docs/ids.md), before the kill and after it.
  auto ctx_id = [&](size_t node) -> uint64_t {
    auto cli = client_of(c.node(node).port());
    auto r = cli->Post("/v1/ids", R"({"kind":"context"})", "application/json");
    REQUIRE(r);
    INFO(r->body);
    REQUIRE(r->status == 200);
    auto id = json::parse(r->body)["id"].get<std::string>();
    REQUIRE(id.rfind("ctx-", 0) == 0);
    return std::stoull(id.substr(4));
  };
  std::vector<uint64_t> ids;
  for (size_t i : {0, 1, 2, 0, 2, 1})
    ids.push_back(ctx_id(i));
  std::mutex mtx;
  std::map<std::string, std::set<std::string>> acked;
  for (auto& n : names)
    acked[n].insert("hello");
  std::atomic<bool> killed{false};
  std::atomic<bool> stop{false};
  // Each client writes to its thread through every node in turn, and on
  // a failure tries the next node (as a client behind a load balancer).
  std::vector<std::thread> workers;
  std::vector<std::chrono::steady_clock::time_point> served_after(threads);
  std::chrono::steady_clock::time_point kill_time;
  for (size_t t = 0; t < threads; ++t)
    workers.emplace_back([&, t] {
      size_t via = t % 3;
      for (size_t k = 0; !stop; ++k) {
        for (size_t attempt = 0; !stop; ++attempt) {
          // A message whose node died before it answered may have its
          // user turn stored: each attempt says which it is.
          auto content = names[t] + " m" + std::to_string(k) + " a"
                         + std::to_string(attempt);
          if (via == 0 && killed)
            via = 1;
          auto cli = client_of(c.node(via).port());
          cli->set_read_timeout(10s);
          auto r = cli->Post(("/v1/threads/" + names[t] + "/messages").c_str(),
                             json{{"content", content}}.dump(),
                             "application/json");
          if (r && r->status == 200) {
            std::lock_guard<std::mutex> guard{mtx};
            acked[names[t]].insert(content);
            if (killed && served_after[t] == decltype(kill_time){})
              served_after[t] = std::chrono::steady_clock::now();
            break;
          }
          via = 1 + (via % 2); // node1 or node2
          std::this_thread::sleep_for(50ms);
        }
        via = (via + 1) % 3;
      }
    });
  std::this_thread::sleep_for(1500ms);
  {
    std::lock_guard<std::mutex> guard{mtx};
    kill_time = std::chrono::steady_clock::now();
    killed = true;
  }
  c.node(0).stop(SIGKILL);
  // Every thread is served again within 10 s of the kill.
  auto deadline = kill_time + 15s;
  for (;;) {
    {
      std::lock_guard<std::mutex> guard{mtx};
      bool all = true;
      for (auto& when : served_after)
        all = all && when != decltype(kill_time){};
      if (all || std::chrono::steady_clock::now() > deadline)
        break;
    }
    std::this_thread::sleep_for(50ms);
  }
  std::this_thread::sleep_for(500ms);
  stop = true;
  for (auto& w : workers)
    w.join();
  for (size_t i : {1, 2, 2, 1})
    ids.push_back(ctx_id(i));
  for (size_t i = 1; i < ids.size(); ++i) {
    INFO("ID " << i << " of " << ids.size());
    CHECK(ids[i] > ids[i - 1]);
  }
  for (size_t t = 0; t < threads; ++t) {
    INFO(names[t]);
    REQUIRE(served_after[t] != decltype(kill_time){});
    auto took = served_after[t] - kill_time;
    CHECK(took < 10s);
    auto turns = history(c.node(1).port(), names[t]);
    check_pairs(turns, acked[names[t]], names[t], true);
    CHECK(c.owner(names[t]) != "node0");
  }
}

TEST_CASE("a node paused past its lease: its late write is refused by the "
          "fence, and it serves the thread again through the new owner",
          "[postgres]") {
  // Replies stream slowly (4 pieces, a second each): node0 is paused in
  // the middle of one.
  cluster c{2, {"--llm-delta-delay-ms", "1000"}};
  auto a = client_of(c.node(0).port());
  auto b = client_of(c.node(1).port());
  REQUIRE(send_message(*a, "paused", "one") == 200);
  REQUIRE(c.owner("paused") == "node0");
  // A message through node0 whose reply takes about four seconds...
  std::atomic<int> late_status{-1};
  std::thread slow{[&] {
    auto cli = client_of(c.node(0).port());
    cli->set_read_timeout(20s);
    auto r = cli->Post("/v1/threads/paused/messages",
                       R"({"content":"late"})", "application/json");
    late_status = r ? r->status : 0;
  }};
  // ...is caught by the pause, past node0's lease, once its user turn is
  // stored.
  auto stored_late = [&] {
    for (auto& t : history(c.node(0).port(), "paused"))
      if (t["content"] == "late")
        return true;
    return false;
  };
  for (int i = 0; i < 100 && !stored_late(); ++i)
    std::this_thread::sleep_for(20ms);
  ::kill(c.node(0).pid(), SIGSTOP);
  std::this_thread::sleep_for(3500ms);
  auto r = b->Post("/v1/threads/paused/messages", R"({"content":"two"})",
                   "application/json");
  REQUIRE(r);
  INFO(r->body);
  REQUIRE(r->status == 200);
  CHECK(c.owner("paused") == "node1");
  ::kill(c.node(0).pid(), SIGCONT);
  slow.join();
  // Refused once node0 ran again: its assistant turn was fenced.
  CHECK(late_status != 200);
  // node0 serves the thread again, through node1.
  std::this_thread::sleep_for(1s);
  r = a->Post("/v1/threads/paused/messages", R"({"content":"three"})",
              "application/json");
  REQUIRE(r);
  INFO(r->body);
  CHECK(r->status == 200);
  CHECK(c.owner("paused") == "node1");
  auto turns = history(c.node(0).port(), "paused");
  // "late"'s user turn was stored before the pause; its reply never was.
  check_pairs(turns, {"one", "two", "three"}, "paused", true);
  std::vector<std::string> order;
  for (auto& t : turns)
    if (t["role"] == "user")
      order.push_back(t["content"]);
  CHECK(order == std::vector<std::string>{"one", "late", "two", "three"});
  CHECK(c.node(0).log().find("renews its lease again; threads it held "
                             "before are loaded afresh")
        != std::string::npos);
}

TEST_CASE("a node cut off from PostgreSQL stops serving its threads within "
          "one lease, another takes them over, and mended it serves again",
          "[postgres]") {
  cluster c{1};
  auto url = c.store().url();
  relay r{"127.0.0.1", port_of(url)};
  c.add("cutoff", via_port(url, r.port()));
  auto& cut = c.node(1);
  auto a = client_of(cut.port());
  auto b = client_of(c.node(0).port());
  REQUIRE(send_message(*a, "severed", "one") == 200);
  REQUIRE(c.owner("severed") == "cutoff");
  REQUIRE(a->Get("/healthz")->status == 200);
  auto cut_at = std::chrono::steady_clock::now();
  r.cut();
  // Within one lease (2 s) and a tick: no more answers for its threads,
  // and /healthz says why.
  std::this_thread::sleep_for(2500ms);
  auto health = a->Get("/healthz");
  REQUIRE(health);
  CHECK(health->status == 503);
  CHECK(json::parse(health->body)["status"] == "cut_off");
  auto refused = a->Get("/v1/threads/severed/history");
  REQUIRE(refused);
  CHECK(refused->status == 503);
  CHECK(json::parse(refused->body)["error"]["code"] == "not_owner");
  // The other node takes the thread once the lease ran out.
  int taken = 0;
  std::string answer;
  while (std::chrono::steady_clock::now() - cut_at < 10s) {
    auto res = b->Post("/v1/threads/severed/messages", R"({"content":"two"})",
                       "application/json");
    taken = res ? res->status : 0;
    answer = res ? res->body : httplib::to_string(res.error());
    if (taken == 200)
      break;
    std::this_thread::sleep_for(100ms);
  }
  INFO(answer);
  REQUIRE(taken == 200);
  CHECK(std::chrono::steady_clock::now() - cut_at < 10s);
  CHECK(c.owner("severed") == "node0");
  CHECK(cut.log().find("lost its lease") != std::string::npos);
  // Mended: it renews, and serves the thread through its new owner.
  r.mend();
  std::this_thread::sleep_for(2s);
  CHECK(a->Get("/healthz")->status == 200);
  auto again = a->Post("/v1/threads/severed/messages",
                       R"({"content":"three"})", "application/json");
  REQUIRE(again);
  INFO(again->body);
  CHECK(again->status == 200);
  auto turns = history(c.node(0).port(), "severed");
  check_pairs(turns, {"one", "two", "three"}, "severed", false);
}

TEST_CASE("the scheduler seat's holder cut off from PostgreSQL stops "
          "scheduling within one lease, another node takes the seat with "
          "every stored task, and mended it forwards to the new holder",
          "[postgres]") {
  cluster c{0};
  auto url = c.store().url();
  relay r{"127.0.0.1", port_of(url)};
  c.add("cutoff", via_port(url, r.port())); // first: it takes the seat
  c.add("node1");
  auto& cut = c.node(0);
  auto a = client_of(cut.port());
  auto b = client_of(c.node(1).port());
  REQUIRE(json::parse(b->Get("/v1/cluster")->body)["scheduler"] == "cutoff");
  // Through node1, forwarded to the seat.
  auto root = post_json(*b, "/v1/orchestrations", {{"payload", "root"}});
  REQUIRE(root.first == 201);
  auto id = root.second["id"].get<std::string>();
  auto leaf = post_json(*b, "/v1/tasks/" + id + "/subtasks",
                        {{"payload", "leaf"}});
  REQUIRE(leaf.first == 201);
  auto claimed = post_json(*b, "/v1/tasks/claim",
                           {{"worker", "w"}, {"lease_s", 60}});
  REQUIRE(claimed.first == 200);
  REQUIRE(claimed.second["id"] == leaf.second["id"]);

  auto cut_at = std::chrono::steady_clock::now();
  r.cut();
  std::this_thread::sleep_for(2500ms);
  // Its lease ran out: it schedules nothing, and forwards nowhere yet or
  // to the new holder.
  auto refused = a->Get(("/v1/tasks/" + id).c_str());
  REQUIRE(refused);
  CHECK(refused->status == 503);
  // node1 takes the seat and loads what committed: the running task lost
  // its worker with the old scheduler.
  int status = 0;
  json task;
  while (std::chrono::steady_clock::now() - cut_at < 10s) {
    auto got = b->Get(("/v1/tasks/" + leaf.second["id"].get<std::string>())
                        .c_str());
    status = got ? got->status : 0;
    if (status == 200) {
      task = json::parse(got->body);
      break;
    }
    std::this_thread::sleep_for(100ms);
  }
  REQUIRE(status == 200);
  CHECK(std::chrono::steady_clock::now() - cut_at < 10s);
  CHECK(task["state"] == "stale");
  CHECK(json::parse(b->Get("/v1/cluster")->body)["scheduler"] == "node1");
  CHECK(cut.log().find("gives up the scheduler seat") != std::string::npos);
  // Mended: it renews, finds the seat taken, and forwards to node1.
  r.mend();
  auto until = std::chrono::steady_clock::now() + 10s;
  int through = 0;
  while (std::chrono::steady_clock::now() < until) {
    auto got = a->Get(("/v1/tasks/" + id).c_str());
    through = got ? got->status : 0;
    if (through == 200)
      break;
    std::this_thread::sleep_for(100ms);
  }
  CHECK(through == 200);
  // Logged just after the answer went out.
  until = std::chrono::steady_clock::now() + 5s;
  while (c.forwarded(0, "node1") < 1 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(50ms);
  CHECK(c.forwarded(0, "node1") >= 1);
  auto leaf_id = leaf.second["id"].get<std::string>();
  auto requeued = post_json(*a, "/v1/tasks/" + leaf_id + "/requeue",
                            json::object());
  CHECK(requeued.first == 200);
}

TEST_CASE("two nodes append and fold one journal at once: every turn "
          "stays, each thread's history exact",
          "[postgres]") {
  test_store store;
  REQUIRE(store.on_postgres());
  auto opts = [&] {
    runtime_options o;
    store.apply(o.storage);
    o.conversation.memory = false;
    o.storage.fold_every = 7; // folds all the time, on both nodes
    return o;
  };
  constexpr size_t writers = 4, turns = 150;
  {
    runtime a{opts()}, b{opts()};
    std::atomic<size_t> failed{0};
    std::vector<std::thread> threads;
    for (size_t w = 0; w < 2 * writers; ++w)
      threads.emplace_back([&, w] {
        auto& rt = w % 2 == 0 ? a : b;
        auto id = "fold-" + std::to_string(w);
        for (size_t i = 0; i < turns; ++i)
          if (!rt.add_turn(id, make_user_turn(id + " " + std::to_string(i))))
            ++failed;
      });
    for (auto& t : threads)
      t.join();
    REQUIRE(failed == 0);
  }
  runtime reader{opts()};
  for (size_t w = 0; w < 2 * writers; ++w) {
    auto id = "fold-" + std::to_string(w);
    auto h = reader.history(id, 100000);
    REQUIRE(h);
    REQUIRE(h->size() == turns);
    for (size_t i = 0; i < turns; ++i)
      CHECK((*h)[i].content == id + " " + std::to_string(i));
  }
}

TEST_CASE("a bad node name or advertised URL stops spindle serve with exit "
          "code 2 and says what is wrong",
          "[postgres]") {
  test_store store;
  REQUIRE(store.on_postgres());
  temp_dir dir;
  auto serve = [&](std::vector<std::string> extra) {
    std::vector<std::string> argv{spindle_binary(), "serve", "--store",
                                  store.url(), "--port", "0", "--data",
                                  dir.str()};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return run(argv, "");
  };
  auto bad_name = serve({"--node-name", "no spaces"});
  CHECK(bad_name.exit_code == 2);
  CHECK(bad_name.err.find("may hold only letters, digits") != std::string::npos);
  auto bad_url = serve({"--node-name", "n", "--advertise", "https://x:1"});
  CHECK(bad_url.exit_code == 2);
  CHECK(bad_url.err.find("must be http://host:port") != std::string::npos);
  // Refused before anything touched the database: not even migrated.
  CHECK(store.query("SELECT count(*) FROM pg_tables "
                    "WHERE tablename = 'cluster_nodes';")
        == "0");
}

TEST_CASE("a streamed reply forwarded to the owner reaches the client piece "
          "by piece, its first event long before its end",
          "[postgres]") {
  // Four pieces, 400 ms apart.
  cluster c{2, {"--llm-delta-delay-ms", "400"}};
  auto a = client_of(c.node(0).port());
  REQUIRE(send_message(*a, "streamed", "one") == 200);
  REQUIRE(c.owner("streamed") == "node0");
  int fd = connect_to(c.node(1).port());
  REQUIRE(fd >= 0);
  fd_guard guard{{fd}};
  std::string body = R"({"content":"two"})";
  REQUIRE(send_all(fd, "POST /v1/threads/streamed/messages/stream HTTP/1.1\r\n"
                       "Host: x\r\nContent-Type: application/json\r\n"
                       "Connection: close\r\nContent-Length: "
                         + std::to_string(body.size()) + "\r\n\r\n" + body));
  auto start = std::chrono::steady_clock::now();
  std::string got;
  std::chrono::steady_clock::duration first_delta{};
  char buf[4096];
  for (;;) {
    auto n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0)
      break;
    got.append(buf, static_cast<size_t>(n));
    if (first_delta == decltype(first_delta){}
        && got.find("event: delta") != std::string::npos)
      first_delta = std::chrono::steady_clock::now() - start;
  }
  auto whole = std::chrono::steady_clock::now() - start;
  INFO(got);
  REQUIRE(got.rfind("HTTP/1.1 200", 0) == 0);
  CHECK(got.find("text/event-stream") != std::string::npos);
  CHECK(got.find("event: done") != std::string::npos);
  REQUIRE(first_delta != decltype(first_delta){});
  // The pieces came as the owner made them, not gathered at its end.
  CHECK(whole - first_delta >= 800ms);
  // Logged just after the stream ended.
  auto until = std::chrono::steady_clock::now() + 5s;
  while (c.forwarded(1, "node0") < 1 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(50ms);
  CHECK(c.forwarded(1, "node0") == 1);
}

TEST_CASE("a subscription to one thread's events or to task events is "
          "served by the node where they happen, whichever node it reaches",
          "[postgres]") {
  cluster c{2};
  // node0 started first: it holds the scheduler seat, and here the thread.
  auto a = client_of(c.node(0).port());
  auto b = client_of(c.node(1).port());
  REQUIRE(send_message(*a, "watched", "one") == 200);
  REQUIRE(c.owner("watched") == "node0");
  auto seat = json::parse(b->Get("/v1/cluster")->body)["scheduler"];
  REQUIRE(seat == "node0");

  // Both subscriptions reach node1 and are forwarded to node0.
  sse_client thread_events{c.node(1).port(), "/v1/events?thread=watched"};
  sse_client task_events{c.node(1).port(), "/v1/events?types=task"};
  REQUIRE(thread_events.wait_status(10s) == 200);
  REQUIRE(task_events.wait_status(10s) == 200);
  REQUIRE(send_message(*b, "watched", "two") == 200);
  auto made = post_json(*b, "/v1/orchestrations", {{"payload", "root"}});
  REQUIRE(made.first == 201);
  auto id = made.second["id"].get<std::string>();

  // The user and assistant turns of "two", and the orchestration's root.
  REQUIRE(thread_events.wait_for(2, 10s));
  REQUIRE(task_events.wait_for(1, 10s));
  for (auto& e : thread_events.events()) {
    CHECK(e.type == "thread.turn_appended");
    CHECK(e.data["thread"] == "watched");
  }
  CHECK(task_events.events()[0].type == "task.created");
  CHECK(task_events.events()[0].data["task"] == id);
  // node1 could not have seen either (it owns neither the thread nor the
  // seat): the subscriptions were forwarded, as the message and the
  // orchestration were. Each is logged once it ends.
  thread_events.close();
  task_events.close();
  auto until = std::chrono::steady_clock::now() + 10s;
  while (c.forwarded(1, "node0") < 4 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(50ms);
  CHECK(c.forwarded(1, "node0") == 4);
}

TEST_CASE("tenants across two nodes: each key sees only its tenant on every "
          "node, and a revocation on one node reaches the other within the "
          "bound",
          "[postgres]") {
  const std::string admin = "cluster-admin-token-0123456789";
  cluster c{2, {"--admin-token", admin}};
  auto call = [](int port, const std::string& token, const std::string& method,
                 const std::string& path, const json& body = nullptr) {
    httplib::Client cli{"127.0.0.1", port};
    cli.set_read_timeout(30, 0);
    httplib::Headers h{{"Authorization", "Bearer " + token}};
    auto r = method == "GET" ? cli.Get(path.c_str(), h)
             : method == "DELETE"
               ? cli.Delete(path.c_str(), h)
               : cli.Post(path.c_str(), h, body.dump(), "application/json");
    REQUIRE(r);
    return std::make_pair(r->status, r->body);
  };
  auto p0 = c.node(0).port();
  auto p1 = c.node(1).port();
  std::map<std::string, std::string> key_of;
  std::map<std::string, std::string> key_id_of;
  for (auto* name : {"a", "b"}) {
    auto t = call(p0, admin, "POST", "/v1/tenants", {{"name", name}});
    REQUIRE(t.first == 201);
    auto id = json::parse(t.second)["id"].get<std::string>();
    // Keys made on one node work on the other.
    auto k = call(p1, admin, "POST", "/v1/tenants/" + id + "/keys",
                  json::object());
    REQUIRE(k.first == 201);
    key_of[name] = json::parse(k.second)["key"].get<std::string>();
    key_id_of[name] = json::parse(k.second)["id"].get<std::string>();
  }
  // The same client ID in both tenants, written through both nodes: two
  // threads, each owned by some node under its qualified ID.
  REQUIRE(call(p0, key_of["a"], "POST", "/v1/threads/support-1/messages",
               {{"content", "secret of a"}})
            .first
          == 200);
  REQUIRE(call(p1, key_of["b"], "POST", "/v1/threads/support-1/messages",
               {{"content", "secret of b"}})
            .first
          == 200);
  for (auto port : {p0, p1}) {
    auto a = call(port, key_of["a"], "GET", "/v1/threads/support-1/history");
    REQUIRE(a.first == 200);
    CHECK(a.second.find("secret of a") != std::string::npos);
    CHECK(a.second.find("secret of b") == std::string::npos);
    auto b = call(port, key_of["b"], "GET", "/v1/threads/support-1/history");
    REQUIRE(b.first == 200);
    CHECK(b.second.find("secret of b") != std::string::npos);
    CHECK(b.second.find("secret of a") == std::string::npos);
    auto list = call(port, key_of["a"], "GET", "/v1/threads");
    CHECK(json::parse(list.second)["data"].size() == 1);
  }
  // Orchestration too: created through one node, claimed through the
  // other, each tenant's by its own key only.
  auto made = call(p1, key_of["a"], "POST", "/v1/orchestrations",
                   {{"payload", "of a"}});
  REQUIRE(made.first == 201);
  auto orchestration = json::parse(made.second)["id"].get<std::string>();
  CHECK(call(p0, key_of["b"], "GET", "/v1/orchestrations/" + orchestration)
          .first
        == 404);
  CHECK(call(p0, key_of["b"], "POST", "/v1/tasks/claim", {{"worker", "w"}})
          .first
        == 204);
  auto claimed = call(p0, key_of["a"], "POST", "/v1/tasks/claim",
                      {{"worker", "w"}});
  REQUIRE(claimed.first == 200);
  CHECK(json::parse(claimed.second)["id"] == orchestration);
  // Revoked on node 0: refused there at once, on node 1 within the bound.
  CHECK(call(p1, key_of["a"], "GET", "/v1/threads").first == 200);
  auto revoked_at = std::chrono::steady_clock::now();
  REQUIRE(call(p0, admin, "DELETE", "/v1/keys/" + key_id_of["a"]).first
          == 200);
  CHECK(call(p0, key_of["a"], "GET", "/v1/threads").first == 401);
  for (;;) {
    auto got = call(p1, key_of["a"], "GET", "/v1/threads");
    if (got.first == 401)
      break;
    REQUIRE(got.first == 200);
    REQUIRE(std::chrono::steady_clock::now() - revoked_at < 5s);
    std::this_thread::sleep_for(20ms);
  }
  auto took = std::chrono::duration_cast<std::chrono::milliseconds>(
    std::chrono::steady_clock::now() - revoked_at);
  INFO("the revocation reached node1 after " << took.count() << " ms");
  CHECK(took < 1500ms);
  CHECK(call(p1, key_of["b"], "GET", "/v1/threads").first == 200);
}

TEST_CASE("tenants across two nodes: randomized isolation: 50 tenants with "
          "two end users each, 10,000 requests through either node with IDs "
          "of other tenants and end users: no foreign byte, and a foreign "
          "ID answers as a missing one",
          "[postgres]") {
  cluster c{2, {"--admin-token", test::tenants_admin_token}};
  std::vector<int> ports{c.node(0).port(), c.node(1).port()};
  auto world = test::isolation_world(ports, 50);
  constexpr int requests = 10000;
  auto compared = test::isolation_requests(ports, world, requests, 4242);
  CHECK(compared > requests / 3);
}

TEST_CASE("a listing on a node that writes nothing shows the threads "
          "another node made a moment before",
          "[postgres]") {
  cluster c{2};
  auto a = client_of(c.node(0).port());
  auto b = client_of(c.node(1).port());
  // Node 1 makes one thread first: its last version is then older than
  // everything node 0 makes afterwards.
  REQUIRE(send_message(*b, "early", "hi") == 200);
  std::this_thread::sleep_for(50ms);
  std::set<std::string> made{"early"};
  for (int i = 0; i < 5; ++i) {
    auto id = "later-" + std::to_string(i);
    REQUIRE(send_message(*a, id, "hi") == 200);
    made.insert(id);
    // Each at once, on the node that wrote nothing since.
    auto got = b->Get("/v1/threads?limit=100");
    REQUIRE(got);
    REQUIRE(got->status == 200);
    std::set<std::string> listed;
    auto page = json::parse(got->body);
    for (auto& t : page["data"])
      listed.insert(t["thread_id"].get<std::string>());
    INFO(got->body);
    CHECK(listed == made);
  }
}

TEST_CASE("limits across two nodes: each node holds a tenant to its share, "
          "and the share grows when a node leaves, within the documented "
          "bound",
          "[postgres]") {
  // 20 requests a minute for the implicit tenant: 10 a node while two
  // serve (docs/limits.md, "In a cluster").
  cluster c{2, {"--requests-per-min", "20"}};
  // `n` completions through `port`: how many were admitted (the others
  // 429 rate_limited); an admitted one tells the node's share, `limit`.
  auto ask = [](int port, int n, const std::string& limit) {
    auto cli = client_of(port);
    int admitted = 0;
    for (int i = 0; i < n; ++i) {
      auto r = cli->Post("/v1/chat/completions",
                         json{{"model", "m"},
                              {"messages",
                               {{{"role", "user"}, {"content", "hi"}}}}}
                           .dump(),
                         "application/json");
      REQUIRE(r);
      INFO(r->body);
      if (r->status == 200) {
        ++admitted;
        CHECK(r->get_header_value("x-ratelimit-limit-requests") == limit);
      } else {
        REQUIRE(r->status == 429);
        CHECK(r->body.find("rate_limited") != std::string::npos);
        CHECK(r->has_header("Retry-After"));
      }
    }
    return admitted;
  };
  auto limit_on = [](int port) {
    auto cli = client_of(port);
    auto r = cli->Get("/v1/limits");
    REQUIRE(r);
    REQUIRE(r->status == 200);
    return json::parse(r->body)["limits"]["requests_per_min"].get<int>();
  };
  auto p0 = c.node(0).port();
  auto p1 = c.node(1).port();
  // Each node counts the others at its heartbeat (1 s): the first to
  // start sees the second within one.
  auto settle = std::chrono::steady_clock::now() + 10s;
  while (limit_on(p0) != 10 || limit_on(p1) != 10) {
    REQUIRE(std::chrono::steady_clock::now() < settle);
    std::this_thread::sleep_for(100ms);
  }
  CHECK(ask(p0, 15, "10") == 10);
  CHECK(ask(p1, 15, "10") == 10);
  // Node 1 leaves: node 0 holds all 20 after its next heartbeat; the 10
  // it admitted stay in its window, so it admits 10 more: 30 in the
  // minute over the cluster, the limit plus the share of the node that
  // left (the bound for a change of membership).
  REQUIRE(c.node(1).stop(SIGTERM) == 0);
  auto deadline = std::chrono::steady_clock::now() + 10s;
  while (limit_on(p0) != 20) {
    REQUIRE(std::chrono::steady_clock::now() < deadline);
    std::this_thread::sleep_for(100ms);
  }
  CHECK(ask(p0, 15, "20") == 10);
}
