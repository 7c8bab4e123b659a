// `spindle session run` (the built binary) and the session lock behind it:
// the three conflict policies, release however the command ends (exit,
// kill -9 of the command, SIGTERM/SIGINT/SIGHUP to spindle), takeover of
// stale locks (dead holder, reused PID), atomic acquisition under
// contention, and bad input.

#include <algorithm>
#include <atomic>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <thread>

#include <catch2/catch.hpp>

#include <signal.h>
#include <unistd.h>

#include "spindle/messages/error.hpp"
#include "files/session_lock.hpp"
#include "support.hpp"

using namespace spindle;
namespace fs = std::filesystem;

namespace {

std::vector<std::string> session_argv(const test::temp_dir& root,
                                      const std::string& policy,
                                      std::vector<std::string> command,
                                      const std::string& agent = "a") {
  std::vector<std::string> argv{test::spindle_binary(), "session", "run",
                                "--agent", agent, "--root", root.str()};
  if (!policy.empty()) {
    argv.push_back("--on-conflict");
    argv.push_back(policy);
  }
  argv.push_back("--");
  argv.insert(argv.end(), command.begin(), command.end());
  return argv;
}

fs::path lock_file(const test::temp_dir& root, const std::string& session) {
  return root.path() / "locks" / (session + ".lock");
}

std::string slurp(const fs::path& p) {
  std::ifstream in{p};
  return {std::istreambuf_iterator<char>{in}, std::istreambuf_iterator<char>{}};
}

void write_file(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream out{p};
  out << text;
}

// Waits (up to 10 s) for a file a background process creates.
bool wait_for_file(const fs::path& p) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < deadline) {
    if (fs::exists(p) && !slurp(p).empty())
      return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

std::map<std::string, std::string> snapshot(const fs::path& dir) {
  std::map<std::string, std::string> out;
  for (auto& e : fs::recursive_directory_iterator(dir))
    out[e.path().string()] = e.is_regular_file() ? slurp(e.path()) : "<dir>";
  return out;
}

// A background `spindle session run` holding session "a" until killed; the
// command writes its own PID to `pid_file` once it runs.
struct holder {
  holder(const test::temp_dir& root, const fs::path& pid_file)
    : proc(session_argv(root, "exit",
                        {"sh", "-c", "echo $$ > " + pid_file.string()
                                       + "; exec sleep 30"})) {
    REQUIRE(wait_for_file(pid_file));
    REQUIRE(fs::exists(lock_file(root, "a")));
    command_pid = std::stoi(slurp(pid_file));
    command = identify(command_pid).value_or(process_identity{});
  }
  // The command would outlive a SIGKILLed spindle and keep the test's
  // output pipe open: end it first.
  ~holder() {
    if (command.pid > 0 && is_alive(command))
      ::kill(command.pid, SIGKILL);
  }
  test::child proc;
  pid_t command_pid = 0;
  process_identity command;
};

} // namespace

TEST_CASE("session: run holds the lock (PID, time, name, start time) while "
          "the command runs, releases it after and exits with its status") {
  test::temp_dir root;
  auto r = test::run(session_argv(
    root, "", {"sh", "-c", "cat \"$0\"; echo \"session=$SPINDLE_SESSION\"; "
                           "exit 7",
               lock_file(root, "a").string()}));
  CHECK(r.exit_code == 7);
  auto out = test::lines(r.out);
  REQUIRE(out.size() == 5);
  auto pid = std::stoi(out[0]);
  CHECK(pid > 0);
  CHECK(out[1].size() >= 19); // ISO-8601 time
  CHECK(out[2] == "a");
  CHECK(std::stoull(out[3]) > 0); // start time
  CHECK(out[4] == "session=a");
  CHECK_FALSE(fs::exists(lock_file(root, "a")));
}

TEST_CASE("session: exit policy fails with 'ERROR: Session busy' and the "
          "holder while a live process holds the lock") {
  test::temp_dir root;
  holder busy{root, root.path() / "pid"};
  auto marker = root.path() / "ran";
  auto r = test::run(session_argv(root, "exit", {"touch", marker.string()}));
  CHECK(r.exit_code == 1);
  CHECK(r.err.find("ERROR: Session busy") != std::string::npos);
  CHECK(r.err.find("pid " + std::to_string(busy.proc.pid()))
        != std::string::npos);
  CHECK_FALSE(fs::exists(marker));
  CHECK(fs::exists(lock_file(root, "a")));
}

TEST_CASE("session: fork policy runs at once under a unique fork session "
          "and says so - each fork lock is released after") {
  test::temp_dir root;
  holder busy{root, root.path() / "pid"};
  std::set<std::string> names;
  for (int i = 0; i < 3; ++i) {
    auto r = test::run(session_argv(
      root, "fork", {"sh", "-c", "echo $SPINDLE_SESSION; ls \"$0\"",
                     (root.path() / "locks").string()}));
    REQUIRE(r.exit_code == 0);
    auto out = test::lines(r.out);
    REQUIRE(out.size() >= 2);
    auto name = out[0];
    CHECK(name.rfind("a_fork_", 0) == 0);
    CHECK(names.insert(name).second);
    CHECK(r.err.find("fork session '" + name + "'") != std::string::npos);
    // While it ran, its own lock existed beside the busy one.
    CHECK(std::find(out.begin(), out.end(), name + ".lock") != out.end());
    CHECK_FALSE(fs::exists(lock_file(root, name)));
  }
  CHECK(fs::exists(lock_file(root, "a")));
  // Without a conflict, fork runs under the plain session name.
  auto r = test::run(session_argv(root, "fork", {"sh", "-c",
                                                 "echo $SPINDLE_SESSION"},
                                  "b"));
  CHECK(r.exit_code == 0);
  CHECK(test::lines(r.out) == std::vector<std::string>{"b"});
}

TEST_CASE("session: queue policy writes the command as a task and prints "
          "'Queued: ID' without running it") {
  test::temp_dir root;
  holder busy{root, root.path() / "pid"};
  auto marker = root.path() / "ran";
  auto r = test::run(session_argv(
    root, "queue", {"touch", marker.string(), "it's here"}));
  CHECK(r.exit_code == 0);
  CHECK(r.out == "Queued: 0001\n");
  CHECK_FALSE(fs::exists(marker));
  auto body = slurp(root.path() / "ai_comms" / "a" / "tasks" / "to_execute"
                    / "0001" / "0001.md");
  CHECK(body == "touch " + marker.string() + " 'it'\\''s here'\n");
  // Not busy: queue runs the command.
  busy.proc.kill(SIGTERM);
  busy.proc.wait();
  r = test::run(session_argv(root, "queue", {"touch", marker.string()}));
  CHECK(r.exit_code == 0);
  CHECK(fs::exists(marker));
}

TEST_CASE("session: the lock is released when the command is killed with "
          "kill -9") {
  test::temp_dir root;
  holder busy{root, root.path() / "pid"};
  ::kill(busy.command_pid, SIGKILL);
  CHECK(busy.proc.wait() == 128 + SIGKILL);
  CHECK_FALSE(fs::exists(lock_file(root, "a")));
  auto r = test::run(session_argv(root, "exit", {"true"}));
  CHECK(r.exit_code == 0);
}

TEST_CASE("session: SIGTERM, SIGINT and SIGHUP to spindle are forwarded to "
          "the command - the lock is released and the status passed on") {
  for (int sig : {SIGTERM, SIGINT, SIGHUP}) {
    DYNAMIC_SECTION("signal " << sig) {
      test::temp_dir root;
      holder busy{root, root.path() / "pid"};
      busy.proc.kill(sig);
      CHECK(busy.proc.wait() == 128 + sig);
      CHECK_FALSE(fs::exists(lock_file(root, "a")));
      // The command got the signal and is gone (spindle reaped it).
      CHECK_FALSE(is_alive(process_identity{busy.command_pid, 0}));
    }
  }
}

TEST_CASE("session: a lock whose holder is dead or whose PID was reused is "
          "taken over") {
  test::temp_dir root;
  SECTION("dead holder") {
    write_file(lock_file(root, "a"),
               std::to_string(test::dead_pid())
                 + "\n2025-01-01T00:00:00+0000\na\n12345\n");
  }
  SECTION("a seed lock: bare PID, dead") {
    write_file(lock_file(root, "a"),
               std::to_string(test::dead_pid()) + "\n2025-01-01\ndefault\n");
  }
  SECTION("PID reused by another process (other start time)") {
    auto me = self_identity();
    write_file(lock_file(root, "a"),
               std::to_string(me.pid) + "\n2025-01-01T00:00:00+0000\na\n"
                 + std::to_string(me.start_time + 3) + "\n");
  }
  auto r = test::run(session_argv(root, "exit", {"sh", "-c", "head -1 \"$0\"",
                                                 lock_file(root, "a").string()}));
  CHECK(r.exit_code == 0);
  CHECK(r.err.empty());
  CHECK(std::stoi(r.out) != ::getpid());
  CHECK_FALSE(fs::exists(lock_file(root, "a")));
}

TEST_CASE("session: a live seed-style lock (bare PID) counts as busy") {
  test::temp_dir root;
  write_file(lock_file(root, "a"),
             std::to_string(::getpid()) + "\n2025-01-01\ndefault\n");
  auto r = test::run(session_argv(root, "exit", {"true"}));
  CHECK(r.exit_code == 1);
  CHECK(r.err.find("ERROR: Session busy") != std::string::npos);
}

TEST_CASE("session lock: of many concurrent acquirers exactly one wins, "
          "also when they all find the same stale lock") {
  for (bool stale_first : {false, true}) {
    for (size_t threads : {2, 4, 8, 16}) {
      DYNAMIC_SECTION((stale_first ? "stale lock, " : "no lock, ")
                      << threads << " threads") {
        for (int round = 0; round < 20; ++round) {
          test::temp_dir root;
          if (stale_first)
            write_file(lock_file(root, "s"),
                       std::to_string(test::dead_pid()) + "\nt\ns\n1\n");
          std::atomic<int> winners{0}, busy{0}, errors{0};
          std::atomic<bool> go{false};
          std::vector<std::optional<session_lock>> held(threads);
          std::vector<std::thread> ts;
          for (size_t t = 0; t < threads; ++t)
            ts.emplace_back([&, t] {
              while (!go.load())
                std::this_thread::yield();
              auto lock = session_lock::acquire(root.path(), "s");
              if (lock) {
                ++winners;
                held[t].emplace(std::move(*lock));
              } else if (classify(lock.error()) == errc::conflict) {
                ++busy;
              } else {
                ++errors;
              }
            });
          go = true;
          for (auto& t : ts)
            t.join();
          REQUIRE(errors == 0);
          REQUIRE(winners == 1);
          REQUIRE(busy == static_cast<int>(threads) - 1);
          held.clear(); // releases
          REQUIRE_FALSE(fs::exists(lock_file(root, "s")));
        }
      }
    }
  }
}

TEST_CASE("session: invalid agents, sessions and policies exit 2 and touch "
          "nothing") {
  test::temp_dir root;
  write_file(root.path() / "keep", "x");
  auto before = snapshot(root.path());
  auto marker = root.path() / "ran";
  for (std::string agent : {"../a", "a/b", ".a", "", "-a"}) {
    INFO("agent '" << agent << "'");
    auto r = test::run(session_argv(root, "exit", {"touch", marker.string()},
                                    agent));
    CHECK(r.exit_code == 2);
    CHECK_FALSE(r.err.empty());
  }
  auto r = test::run(session_argv(root, "later", {"touch", marker.string()}));
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("--on-conflict") != std::string::npos);
  r = test::run({test::spindle_binary(), "session", "run", "--agent", "a",
                 "--session", "../../etc", "--root", root.str(), "--", "touch",
                 marker.string()});
  CHECK(r.exit_code == 2);
  r = test::run({test::spindle_binary(), "session", "run", "--agent", "a",
                 "--root", root.str()});
  CHECK(r.exit_code == 2); // no command
  CHECK_FALSE(fs::exists(marker));
  CHECK(snapshot(root.path()) == before);
}

TEST_CASE("session: a command that cannot be run exits 127 and releases the "
          "lock") {
  test::temp_dir root;
  auto r = test::run(session_argv(root, "exit", {"/nonexistent/command"}));
  CHECK(r.exit_code == 127);
  CHECK(r.err.find("cannot run") != std::string::npos);
  CHECK_FALSE(fs::exists(lock_file(root, "a")));
}
