// `spindle session run`: runs a command under the agent's session lock
// (ROOT/locks/{session}.lock) with the seed's conflict policies: fork, exit,
// queue. The lock itself lives in the library (runtime/session_lock.hpp).

#include <cerrno>
#include <csignal>
#include <cstring>
#include <ctime>
#include <iostream>

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli.hpp"
#include "spindle/messages/error.hpp"
#include "spindle/messages/ids.hpp"
#include "files/file_counter.hpp"
#include "files/session_lock.hpp"
#include "files/task_files.hpp"

namespace spindle::cli {

namespace {

struct session_args {
  std::string agent;
  std::string session;
  std::string policy = "fork";
  std::string root;
  std::vector<std::string> command;
};

int usage_error(const std::string& text) {
  std::cerr << "spindle session run: " << text << "\n";
  return exit_code::usage;
}

// Quotes an argument for a POSIX shell.
std::string shell_quote(const std::string& arg) {
  if (!arg.empty()
      && arg.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuv"
                               "wxyz0123456789_-./=:,@+%")
           == std::string::npos)
    return arg;
  std::string out = "'";
  for (char c : arg) {
    if (c == '\'')
      out += "'\\''";
    else
      out += c;
  }
  return out + "'";
}

// Runs `command` as a child, forwarding SIGINT, SIGTERM and SIGHUP to it,
// and returns its exit status (128 + signal when a signal ended it).
// Signals are taken synchronously with sigwaitinfo, so no handler runs
// at an awkward moment and nothing is missed between fork and wait.
int run_child(const std::vector<std::string>& command,
              const std::string& session) {
  sigset_t wanted, previous;
  sigemptyset(&wanted);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGCHLD})
    sigaddset(&wanted, sig);
  sigprocmask(SIG_BLOCK, &wanted, &previous);
  std::cout << std::flush;
  std::cerr << std::flush;
  pid_t child = ::fork();
  if (child < 0) {
    std::cerr << "spindle session run: fork failed: " << std::strerror(errno)
              << "\n";
    sigprocmask(SIG_SETMASK, &previous, nullptr);
    return exit_code::failure;
  }
  if (child == 0) {
    sigprocmask(SIG_SETMASK, &previous, nullptr);
    ::setenv("SPINDLE_SESSION", session.c_str(), 1);
    std::vector<char*> argv;
    for (auto& arg : command)
      argv.push_back(const_cast<char*>(arg.c_str()));
    argv.push_back(nullptr);
    ::execvp(argv[0], argv.data());
    std::string msg = "spindle session run: cannot run '" + command[0]
                      + "': " + std::strerror(errno) + "\n";
    auto ignored = ::write(2, msg.data(), msg.size());
    (void) ignored;
    ::_exit(127);
  }
  int status = 0;
  while (true) {
    siginfo_t info{};
    int sig = ::sigwaitinfo(&wanted, &info);
    if (sig < 0) {
      if (errno == EINTR)
        continue;
      break;
    }
    if (sig == SIGCHLD) {
      auto done = ::waitpid(child, &status, WNOHANG);
      if (done == child)
        break;
      continue;
    }
    ::kill(child, sig);
  }
  sigprocmask(SIG_SETMASK, &previous, nullptr);
  if (WIFEXITED(status))
    return WEXITSTATUS(status);
  if (WIFSIGNALED(status))
    return 128 + WTERMSIG(status);
  return exit_code::failure;
}

int session_run(const session_args& args) {
  // Validate everything before the disk is touched (D10).
  if (auto err = validate_agent_name(args.agent))
    return usage_error("--agent: " + describe(err));
  auto session = args.session.empty() ? args.agent : args.session;
  if (auto err = validate_session_name(session))
    return usage_error("--session: " + describe(err));
  if (args.policy != "fork" && args.policy != "exit" && args.policy != "queue")
    return usage_error("--on-conflict: '" + args.policy
                       + "' is not one of fork, exit, queue");
  if (args.command.empty())
    return usage_error("no command given (spindle session run ... -- CMD)");
  std::filesystem::path root = args.root.empty() ? default_root()
                                                 : std::filesystem::path{
                                                     args.root};
  struct stat st{};
  if (::stat(root.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    return usage_error("--root: '" + root.string() + "' is not a directory");

  session_holder holder;
  auto lock = session_lock::acquire(root, session, &holder);
  if (!lock && classify(lock.error()) != errc::conflict) {
    std::cerr << "spindle session run: " << describe(lock.error()) << "\n";
    return exit_code::failure;
  }
  if (!lock) {
    if (args.policy == "exit") {
      std::cerr << "ERROR: Session busy: '" << session << "' is held by "
                << holder.describe() << "\n";
      return exit_code::failure;
    }
    if (args.policy == "queue") {
      auto files = task_files::open(root, args.agent);
      std::string body;
      for (auto& arg : args.command)
        body += (body.empty() ? "" : " ") + shell_quote(arg);
      auto id = files ? files->queue(body + "\n")
                      : caf::expected<task_id>{files.error()};
      if (!id) {
        std::cerr << "spindle session run: cannot queue: "
                  << describe(id.error()) << "\n";
        return exit_code::failure;
      }
      std::cout << "Queued: " << id->to_string() << "\n" << std::flush;
      return exit_code::ok;
    }
    // fork: a parallel session under a unique name.
    for (int attempt = 0; attempt < 100 && !lock; ++attempt) {
      auto suffix = "_fork_" + std::to_string(::getpid()) + "_"
                    + std::to_string(std::time(nullptr))
                    + (attempt > 0 ? "_" + std::to_string(attempt) : "");
      // Session names are at most 64 characters; shorten the base, not the
      // part that makes the name unique.
      auto fork_name = session.substr(0, 64 - suffix.size()) + suffix;
      lock = session_lock::acquire(root, fork_name);
      if (!lock && classify(lock.error()) != errc::conflict) {
        std::cerr << "spindle session run: " << describe(lock.error())
                  << "\n";
        return exit_code::failure;
      }
    }
    if (!lock) {
      std::cerr << "spindle session run: no free fork session name\n";
      return exit_code::failure;
    }
    std::cerr << "spindle session run: session '" << session
              << "' is busy (held by " << holder.describe()
              << "); running as fork session '" << lock->session() << "'\n";
  }
  auto status = run_child(args.command, lock->session());
  lock->release();
  return status;
}

} // namespace

void add_session(CLI::App& app, registry& commands) {
  auto* session = app.add_subcommand(
    "session", "Run commands under an agent's session lock "
               "(ROOT/locks/SESSION.lock).");
  session->require_subcommand(1);
  auto args = std::make_shared<session_args>();
  auto* run = session->add_subcommand(
    "run", "Take the session lock, run CMD, release the lock however CMD "
           "ends (SIGINT, SIGTERM and SIGHUP are forwarded to CMD), and exit "
           "with CMD's status (128+N if signal N ended it). When another live "
           "process holds the lock: fork runs CMD under a unique fork session "
           "(default), exit prints 'ERROR: Session busy' and exits 1, queue "
           "writes CMD as a task to to_execute/ and prints 'Queued: ID'. A "
           "lock whose holder is dead (or whose PID was reused) is taken "
           "over.");
  run->add_option("--agent", args->agent, "agent type")->required();
  run->add_option("--session", args->session,
                  "session name (default: the agent name)");
  run->add_option("--on-conflict", args->policy,
                  "fork (default), exit or queue");
  run->add_option("--root", args->root,
                  "root directory holding locks/ and ai_comms/ (default "
                  "$AI_ROOT, else the current directory)");
  run->add_option("command", args->command, "CMD [ARGS...] after --")
    ->required();
  commands.on(run, [args] { return session_run(*args); });
}

} // namespace spindle::cli
