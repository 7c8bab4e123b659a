// `spindle worker` against a real server: commands complete and fail
// tasks, heartbeats keep a long command's lease, a killed worker's task
// goes stale, a lost lease ends the command, stop requests, an unreachable
// server and bad arguments.

#include <chrono>
#include <fstream>
#include <thread>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "spindle/runtime/process.hpp"
#include "support.hpp"

using namespace spindle;
using namespace std::chrono;
using json = nlohmann::json;

namespace {

// A server and the calls the tests make to it.
struct served {
  test::server_process srv;
  httplib::Client cli{"127.0.0.1", srv.port()};

  std::string url() const {
    return "http://127.0.0.1:" + std::to_string(srv.port());
  }
  std::string create(const json& payload) {
    auto r = cli.Post("/v1/orchestrations", json{{"payload", payload}}.dump(),
                      "application/json");
    REQUIRE(r);
    REQUIRE(r->status == 201);
    return json::parse(r->body)["id"].get<std::string>();
  }
  json task(const std::string& id) {
    auto r = cli.Get("/v1/tasks/" + id);
    REQUIRE(r);
    REQUIRE(r->status == 200);
    return json::parse(r->body);
  }
  std::string state(const std::string& id) {
    return task(id)["state"].get<std::string>();
  }
  // Arguments of a worker named `name` against this server.
  std::vector<std::string> worker(const std::string& name,
                                  const std::vector<std::string>& flags,
                                  const std::vector<std::string>& command) {
    std::vector<std::string> argv{test::spindle_binary(), "worker",
                                  "--server", url(), "--name", name};
    argv.insert(argv.end(), flags.begin(), flags.end());
    argv.push_back("--");
    argv.insert(argv.end(), command.begin(), command.end());
    return argv;
  }
};

// Polls `done` every 20 ms for up to `limit`; true once it holds.
template <class Predicate>
bool eventually(Predicate done, milliseconds limit) {
  auto until = steady_clock::now() + limit;
  while (!done()) {
    if (steady_clock::now() >= until)
      return false;
    std::this_thread::sleep_for(milliseconds(20));
  }
  return true;
}

// True once process `pid` blocks `sig` (its SigBlk mask in /proc): the
// worker blocks its stop signals first thing and reads them from a
// signalfd, so a signal sent after this is handled, never fatal.
bool blocks_signal(pid_t pid, int sig) {
  std::ifstream status{"/proc/" + std::to_string(pid) + "/status"};
  std::string line;
  while (std::getline(status, line))
    if (line.rfind("SigBlk:", 0) == 0) {
      auto mask = std::stoull(line.substr(7), nullptr, 16);
      return (mask >> (sig - 1)) & 1u;
    }
  return false;
}

// The PID a command wrote into `file`, once it is there.
pid_t pid_in(const std::filesystem::path& file) {
  pid_t pid = 0;
  REQUIRE(eventually(
    [&] {
      std::ifstream in{file};
      return static_cast<bool>(in >> pid) && pid > 0;
    },
    seconds(10)));
  return pid;
}

bool gone(pid_t pid) {
  return !is_alive(process_identity{pid, 0});
}

// A new task and a worker whose command for it writes its PID to a file
// and sleeps for a long time; constructed once that command runs.
struct busy_worker {
  test::temp_dir dir;
  std::string task;
  std::unique_ptr<test::logged_process> worker;
  pid_t command = 0;

  busy_worker(served& s, const std::string& name,
              const std::vector<std::string>& flags)
    : task(s.create("sleep")) {
    auto pid_file = dir.path() / "pid";
    worker = std::make_unique<test::logged_process>(
      s.worker(name, flags, {"sh", "-c", "echo $$ > '" + pid_file.string()
                                           + "'; exec sleep 30"}));
    command = pid_in(pid_file);
  }
};

// A loopback port nothing listens on (bound, then released).
int closed_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

size_t count_of(const std::string& text, const std::string& part) {
  size_t n = 0;
  for (auto at = text.find(part); at != std::string::npos;
       at = text.find(part, at + 1))
    ++n;
  return n;
}

} // namespace

TEST_CASE("worker: commands complete tasks with their output as the result") {
  served s;
  std::vector<json> payloads{json{{"n", 1}}, json("text"), json{1, 2, 3}};
  std::vector<std::string> ids;
  for (auto& p : payloads)
    ids.push_back(s.create(p));
  auto r = test::run(s.worker("echoer", {"--lease-s", "2", "--wait-s", "1",
                                         "--max-tasks", "3"},
                              {"sh", "-c", "cat; echo"}));
  INFO(r.err);
  CHECK(r.exit_code == 0);
  CHECK(r.out.empty());
  for (size_t i = 0; i < ids.size(); ++i) {
    auto t = s.task(ids[i]);
    INFO(t.dump());
    CHECK(t["state"] == "completed");
    CHECK(t["worker"] == "echoer");
    CHECK(t["result"] == payloads[i]);
    CHECK(r.err.find("task " + ids[i] + " completed (exit 0") != std::string::npos);
  }
  // Output that is not JSON is the result as a string, without its
  // trailing newline; the environment names the task, payload and lease.
  auto id = s.create(json{{"k", "v"}});
  auto env = test::run(s.worker(
    "env-reader", {"--once", "--lease-s", "2", "--wait-s", "1"},
    {"sh", "-c",
     "printf '%s|%s|%s|%s\\n' \"$SPINDLE_TASK_ID\" \"$SPINDLE_TASK_PAYLOAD\" "
     "\"$SPINDLE_WORKER\" \"${#SPINDLE_LEASE}\""}));
  INFO(env.err);
  CHECK(env.exit_code == 0);
  CHECK(s.task(id)["result"] == id + "|{\"k\":\"v\"}|env-reader|32");
}

TEST_CASE("worker: a failing command fails the task with its exit status "
          "or signal and the end of its stderr") {
  served s;
  struct failing {
    std::vector<std::string> command;
    json expected;         // fields of the reason
    std::string stderr_has; // a part of the reason's stderr
  };
  std::vector<failing> cases{
    {{"sh", "-c", "echo partial; echo oops >&2; exit 3"},
     {{"exit_status", 3}, {"stderr", "oops\n"}}, "oops"},
    {{"sh", "-c", "kill -9 $$"}, {{"signal", 9}, {"stderr", ""}}, ""},
    {{"/nonexistent/command"}, {{"exit_status", 127}},
     "cannot run '/nonexistent/command'"},
    {{"sh", "-c", "head -c 5000 /dev/zero | tr '\\0' x"},
     {{"exit_status", 0},
      {"error", "the command printed more than 1000 bytes (--max-output)"}},
     ""},
  };
  for (auto& c : cases) {
    INFO(c.command.back());
    auto id = s.create("job");
    auto r = test::run(s.worker("failer", {"--once", "--lease-s", "2",
                                           "--wait-s", "1", "--max-output",
                                           "1000"},
                                c.command));
    INFO(r.err);
    CHECK(r.exit_code == 0);
    auto t = s.task(id);
    INFO(t.dump());
    CHECK(t["state"] == "failed");
    for (auto& [field, value] : c.expected.items())
      CHECK(t["reason"][field] == value);
    CHECK(t["reason"]["stderr"].get<std::string>().find(c.stderr_has)
          != std::string::npos);
    CHECK(r.err.find("task " + id + " failed") != std::string::npos);
  }
}

TEST_CASE("worker: the task of a SIGKILLed worker becomes stale when its "
          "lease ends and its command is ended") {
  served s;
  busy_worker busy{s, "doomed", {"--lease-s", "2", "--wait-s", "1"}};
  auto& worker = *busy.worker;
  auto id = busy.task;
  REQUIRE(s.state(id) == "running");
  // Heartbeats hold the lease past its first length.
  std::this_thread::sleep_for(milliseconds(2500));
  REQUIRE(s.state(id) == "running");
  worker.kill(SIGKILL);
  auto killed = steady_clock::now();
  REQUIRE(worker.wait_for(seconds(5)) == -1);
  CHECK(eventually([&] { return s.state(id) == "stale"; }, seconds(5)));
  auto took = steady_clock::now() - killed;
  CHECK(took <= milliseconds(3000)); // the lease (2 s) and a margin
  auto t = s.task(id);
  CHECK(t["stale"]["worker"] == "doomed");
  // The command does not run on for nobody.
  CHECK(eventually([&] { return gone(busy.command); }, seconds(5)));
}

TEST_CASE("worker: heartbeats keep a long command's task past several lease "
          "lengths until it completes") {
  served s;
  auto id = s.create(json{{"long", true}});
  auto started = steady_clock::now();
  test::logged_process worker{s.worker(
    "patient", {"--once", "--lease-s", "1", "--wait-s", "1"},
    {"sh", "-c", "sleep 3.5; cat"})};
  std::optional<int> code;
  while (!(code = worker.wait_for(milliseconds(100)))) {
    auto state = s.state(id);
    REQUIRE(state != "stale");
    REQUIRE(steady_clock::now() - started < seconds(20));
  }
  INFO(worker.log());
  CHECK(*code == 0);
  CHECK(steady_clock::now() - started >= milliseconds(3500));
  auto t = s.task(id);
  CHECK(t["state"] == "completed");
  CHECK(t["result"] == json{{"long", true}});
}

TEST_CASE("worker: --once with nothing to do exits with the nothing code "
          "after wait_s") {
  served s;
  auto started = steady_clock::now();
  auto r = test::run(s.worker("idle", {"--once", "--wait-s", "1"},
                              {"sh", "-c", "cat"}));
  auto took = steady_clock::now() - started;
  INFO(r.err);
  CHECK(r.exit_code == 3);
  CHECK(r.out.empty());
  CHECK(took >= milliseconds(950));
  CHECK(took < milliseconds(5000));
}

TEST_CASE("worker: a lost lease ends the command and reports nothing") {
  served s;
  busy_worker busy{s, "frozen", {"--once", "--lease-s", "1", "--wait-s", "1"}};
  auto& worker = *busy.worker;
  auto id = busy.task;
  // The worker cannot heartbeat while it is stopped: the lease ends.
  worker.kill(SIGSTOP);
  REQUIRE(eventually([&] { return s.state(id) == "stale"; }, seconds(5)));
  worker.kill(SIGCONT);
  auto code = worker.wait_for(seconds(10));
  INFO(worker.log());
  REQUIRE(code);
  CHECK(*code == 0);
  CHECK(worker.log().find("the lease is lost") != std::string::npos);
  CHECK(eventually([&] { return gone(busy.command); }, seconds(2)));
  auto t = s.task(id);
  CHECK(t["state"] == "stale");
  CHECK_FALSE(t.contains("result"));
}

TEST_CASE("worker: SIGTERM lets the running command finish and a second "
          "one ends it") {
  served s;
  SECTION("one SIGTERM: the task completes and the worker exits 0") {
    auto id = s.create("finish me");
    test::logged_process worker{s.worker("graceful",
                                         {"--lease-s", "2", "--wait-s", "1"},
                                         {"sh", "-c", "sleep 1.5; cat"})};
    REQUIRE(eventually([&] { return s.state(id) == "running"; },
                       seconds(10)));
    worker.kill(SIGTERM);
    auto code = worker.wait_for(seconds(10));
    INFO(worker.log());
    REQUIRE(code);
    CHECK(*code == 0);
    auto t = s.task(id);
    CHECK(t["state"] == "completed");
    CHECK(t["result"] == "finish me");
    // The server marks the task running when it answers the claim; a
    // worker slow to read that answer (a loaded machine) sees the signal
    // first and says so, and runs the task all the same.
    auto log = worker.log();
    CHECK((log.find("stopping after task " + id) != std::string::npos
           || log.find("task " + id
                       + " was claimed before the stop request came")
                != std::string::npos));
  }
  SECTION("two SIGTERMs: the command is ended and the task fails") {
    busy_worker busy{s, "hasty", {"--lease-s", "2", "--wait-s", "1"}};
    auto& worker = *busy.worker;
    auto id = busy.task;
    worker.kill(SIGTERM);
    std::this_thread::sleep_for(milliseconds(200));
    worker.kill(SIGTERM);
    auto code = worker.wait_for(seconds(10));
    INFO(worker.log());
    REQUIRE(code);
    CHECK(*code == 0);
    CHECK(gone(busy.command));
    auto t = s.task(id);
    CHECK(t["state"] == "failed");
    CHECK(t["reason"]["signal"] == SIGTERM);
    CHECK(t["reason"]["error"]
          == "the worker was stopped and ended the command");
  }
  SECTION("SIGTERM while a claim waits: the worker exits 0 when it ends") {
    // The signal must come after the worker started (a sanitizer build
    // on a loaded machine takes seconds to) and sent its claim: it comes
    // once the worker blocks SIGTERM, and 500 ms later, well inside the
    // claim's 5 s wait.
    test::logged_process worker{s.worker("waiting",
                                         {"--lease-s", "2", "--wait-s", "5"},
                                         {"cat"})};
    REQUIRE(eventually([&] { return blocks_signal(worker.pid(), SIGTERM); },
                       milliseconds(30000)));
    std::this_thread::sleep_for(milliseconds(500));
    auto signalled = steady_clock::now();
    worker.kill(SIGTERM);
    auto code = worker.wait_for(seconds(10));
    INFO(worker.log());
    REQUIRE(code);
    CHECK(*code == 0);
    CHECK(steady_clock::now() - signalled < milliseconds(5500));
    CHECK(worker.log().find("waiting for the claim under way")
          != std::string::npos);
  }
}

TEST_CASE("worker: an unreachable server is retried with backoff and a "
          "clear line") {
  auto url = "http://127.0.0.1:" + std::to_string(closed_port());
  test::logged_process worker{{test::spindle_binary(), "worker", "--server",
                               url, "--name", "lonely", "--", "cat"}};
  std::this_thread::sleep_for(milliseconds(2500));
  worker.kill(SIGTERM);
  auto code = worker.wait_for(seconds(2));
  auto log = worker.log();
  INFO(log);
  REQUIRE(code);
  CHECK(*code == 0);
  auto tries = count_of(log, "cannot reach " + url);
  CHECK(tries >= 2);
  CHECK(tries <= 5); // 0.5 s, 1 s, 2 s, ...: no spinning
  CHECK(log.find("retrying in") != std::string::npos);
}

TEST_CASE("worker: bad arguments exit 2 and a refused token exits 1") {
  for (auto& argv : std::vector<std::vector<std::string>>{
         {"worker", "--server", "http://127.0.0.1:1", "--name", "w"},
         {"worker", "--server", "ftp://x", "--name", "w", "--", "cat"},
         {"worker", "--server", "http://127.0.0.1:1", "--name", "a b", "--",
          "cat"},
         {"worker", "--server", "http://127.0.0.1:1", "--name", "w",
          "--lease-s", "0", "--", "cat"},
         {"worker", "--server", "http://127.0.0.1:1", "--name", "w",
          "--wait-s", "61", "--", "cat"}}) {
    argv.insert(argv.begin(), test::spindle_binary());
    INFO(argv[3] + " " + argv.back());
    auto r = test::run(argv);
    CHECK(r.exit_code == 2);
    CHECK_FALSE(r.err.empty());
  }
  test::server_process srv{{"--token", "secret"}};
  auto url = "http://127.0.0.1:" + std::to_string(srv.port());
  auto r = test::run({test::spindle_binary(), "worker", "--server", url,
                      "--name", "w", "--once", "--", "cat"});
  CHECK(r.exit_code == 1);
  CHECK(r.err.find("401") != std::string::npos);
  CHECK(r.err.find("--token") != std::string::npos);
  auto ok = test::run({test::spindle_binary(), "worker", "--server", url,
                       "--name", "w", "--once", "--wait-s", "0", "--", "cat"},
                      "", {{"SPINDLE_TOKEN", "secret"}});
  CHECK(ok.exit_code == 3);
}
