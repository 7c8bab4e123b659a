// The file protocol's records (docs/ids.md, docs/orchestration.md): what
// another process, a seed script or a crash may leave in a counter file,
// a claim file's name and contents, a task's owner record and a session
// lock file. Each exec writes the input into a scratch root and runs the
// real readers on it.
//
// Invariants: a "PID:START" identity prints back as itself; a counter
// holding a hybrid value hands out that value; a parsed lock names a
// PID; taking a lock over a garbled or dead one leaves a lock that reads
// back as ours.

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <unistd.h>

#include "fuzz.hpp"
#include "spindle/messages/hybrid36.hpp"
#include "files/file_counter.hpp"
#include "spindle/runtime/process.hpp"
#include "files/session_lock.hpp"
#include "files/task_files.hpp"

using namespace spindle;
using spindle::fuzz::check;
namespace fs = std::filesystem;

namespace {

const fs::path& scratch() {
  static const fs::path root = [] {
    auto tmpl = (fs::temp_directory_path() / "spindle-fuzz-XXXXXX").string();
    check(::mkdtemp(tmpl.data()) != nullptr, "a scratch directory");
    std::atexit([] { std::error_code ec; fs::remove_all(scratch(), ec); });
    return fs::path{tmpl};
  }();
  return root;
}

void write(const fs::path& file, std::string_view content) {
  std::ofstream out{file, std::ios::binary | std::ios::trunc};
  out.write(content.data(), static_cast<std::streamsize>(content.size()));
}

void fresh(const fs::path& dir) {
  std::error_code ec;
  fs::remove_all(dir, ec);
  fs::create_directories(dir);
}

std::string_view trimmed(std::string_view s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r'
                        || s.back() == ' ' || s.back() == '\t'))
    s.remove_suffix(1);
  return s;
}

// The input's first line, when it can be part of a file name.
std::optional<std::string> name_part(std::string_view input) {
  auto line = input.substr(0, input.find('\n'));
  if (line.empty() || line.size() > 128
      || line.find_first_of(std::string_view{"/\0", 2}) != line.npos)
    return std::nullopt;
  return std::string{line};
}

void identity(std::string_view input) {
  auto who = process_identity::parse(std::string{input});
  if (!who)
    return;
  check(who->pid > 0, "a parsed PID is positive");
  check(input.find_first_not_of("0123456789:") == std::string_view::npos,
        "an identity is digits and one colon, no sign or blank");
  check(process_identity::parse(who->to_string()).has_value()
          && process_identity::parse(who->to_string())->pid == who->pid
          && process_identity::parse(who->to_string())->start_time
               == who->start_time,
        "an identity round-trips");
}

void counter(std::string_view input) {
  // An empty counter is a writer between its open and its write: readers
  // wait for it, which is not what this target measures.
  if (trimmed(input).empty())
    return;
  auto root = scratch() / "counter";
  auto dir = counters_dir(root);
  fresh(dir);
  bool claimed_file = false;
  if (input[0] & 1) {
    write(dir / "global.NextId", input);
  } else if (auto part = name_part(input)) {
    write(dir / ("global.NextId.claimed." + *part), input);
    claimed_file = true;
  } else {
    return;
  }
  claim_options opts;
  opts.timeout = std::chrono::milliseconds(10);
  opts.stale_grace = std::chrono::milliseconds(0);
  auto id = claim_next_id(root, "global", opts);
  if (!id)
    return;
  auto value = hybrid36::parse(*id);
  check(value && *value >= 1, "a claimed ID is hybrid base36, not 0000");
  if (!claimed_file)
    if (auto held = hybrid36::parse(trimmed(input)))
      check(*value == std::max<uint64_t>(*held, 1),
            "a counter hands out the value it holds");
}

void owner(std::string_view input) {
  auto root = scratch() / "tasks";
  auto files = task_files::open(root, "agent");
  check(static_cast<bool>(files), "a valid agent opens");
  auto dir = files->dir_of(task_dir::in_progress) / "0001";
  fresh(dir);
  write(dir / "0001.owner", input);
  if (auto part = name_part(input))
    write(dir / ("0001." + *part + ".md"), "task");
  else
    write(dir / "0001.md", "task");
  auto all = files->list();
  check(static_cast<bool>(all) && all->size() == 1, "the task is listed");
  if (auto& who = all->front().owner)
    check(who->pid > 0, "an owner is a positive PID");
}

void lock(std::string_view input) {
  auto root = scratch() / "locks";
  fresh(locks_dir(root));
  auto file = locks_dir(root) / "s.lock";
  write(file, input);
  if (auto holder = session_lock::read(file)) {
    check(holder->who.pid > 0, "a lock names a positive PID");
    // Line 1 the PID, line 4 its start time: digits, no sign or blank.
    std::vector<std::string_view> lines;
    for (auto rest = input; !rest.empty() && lines.size() < 4;) {
      auto nl = rest.find('\n');
      lines.push_back(rest.substr(0, nl));
      rest = nl == rest.npos ? std::string_view{} : rest.substr(nl + 1);
    }
    auto text = std::string{lines[0]};
    if (lines.size() == 4 && !lines[3].empty())
      text += ":" + std::string{lines[3]};
    check(text.find_first_not_of("0123456789:") == std::string::npos,
          "a holder's PID and start time are digits");
    check(!holder->describe().empty(), "a holder describes itself");
  }
  auto me = self_identity();
  session_holder busy;
  if (auto held = session_lock::acquire(root, "s", &busy, me)) {
    auto now = session_lock::read(file);
    check(now && now->who.pid == me.pid && now->who.start_time == me.start_time,
          "a taken lock reads back as ours");
  }
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto input = fuzz::text(data, size);
  identity(input);
  counter(input);
  owner(input);
  lock(input);
  return 0;
}
