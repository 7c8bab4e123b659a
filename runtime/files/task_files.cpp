#include "files/task_files.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <fstream>
#include <map>
#include <random>
#include <set>

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "spindle/messages/error.hpp"
#include "spindle/messages/ids.hpp"
#include "spindle/messages/orchestration.hpp"
#include "files/file_counter.hpp"

namespace spindle {

namespace fs = std::filesystem;

namespace {

constexpr task_dir all_dirs[] = {task_dir::to_execute, task_dir::in_progress,
                                 task_dir::completed, task_dir::stale};

caf::error io_error(const std::string& what, int err = errno) {
  return make_error(errc::io_failure, what + ": " + std::strerror(err));
}

// rename(2) that never replaces an existing target (an empty directory at
// the target would otherwise be replaced silently).
int rename_noreplace(const fs::path& from, const fs::path& to) {
  return static_cast<int>(::syscall(SYS_renameat2, AT_FDCWD, from.c_str(),
                                    AT_FDCWD, to.c_str(), 1u /* NOREPLACE */));
}

// Names of the entries of `dir` that parse as task IDs. A missing
// directory has none.
std::vector<task_id> list_ids(const fs::path& dir) {
  std::vector<task_id> out;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr)
    return out;
  while (auto* e = ::readdir(d)) {
    if (e->d_name[0] == '.')
      continue;
    if (auto id = task_id::parse(e->d_name))
      out.push_back(std::move(*id));
  }
  ::closedir(d);
  return out;
}

std::vector<std::string> list_names(const fs::path& dir) {
  std::vector<std::string> out;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr)
    return out;
  while (auto* e = ::readdir(d)) {
    std::string name{e->d_name};
    if (name != "." && name != "..")
      out.push_back(std::move(name));
  }
  ::closedir(d);
  return out;
}

// Writes `content` to `path` via a temporary file and rename, so readers
// never see it half-written.
caf::error write_file_atomic(const fs::path& path, std::string_view content) {
  auto tmp = path;
  tmp += ".tmp." + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    return io_error("cannot create '" + tmp.string() + "'");
  size_t done = 0;
  while (done < content.size()) {
    auto n = ::write(fd, content.data() + done, content.size() - done);
    if (n < 0) {
      if (errno == EINTR)
        continue;
      auto err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      return io_error("cannot write '" + tmp.string() + "'", err);
    }
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    auto err = errno;
    ::unlink(tmp.c_str());
    return io_error("cannot create '" + path.string() + "'", err);
  }
  return caf::none;
}

std::string iso_now() {
  char buf[64];
  auto now = std::time(nullptr);
  std::tm tm{};
  ::localtime_r(&now, &tm);
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%S%z", &tm);
  return buf;
}

// The owner of an in-progress (or stale) task directory: the sidecar
// {id}.owner ("PID:START" on its first line), else the seed's marker
// {id}.{pid}.md.
std::optional<process_identity> read_owner(const fs::path& dir,
                                           const std::string& id) {
  std::ifstream in{dir / (id + ".owner")};
  std::string line;
  if (in && std::getline(in, line))
    if (auto who = process_identity::parse(line))
      return who;
  for (auto& name : list_names(dir)) {
    auto prefix = id + ".";
    if (name.size() <= prefix.size() + 3
        || name.compare(0, prefix.size(), prefix) != 0
        || name.compare(name.size() - 3, 3, ".md") != 0)
      continue;
    auto middle = name.substr(prefix.size(),
                              name.size() - prefix.size() - 3);
    if (middle.empty()
        || !std::all_of(middle.begin(), middle.end(),
                        [](char c) { return c >= '0' && c <= '9'; }))
      continue;
    if (auto who = process_identity::parse(middle))
      return who;
  }
  return std::nullopt;
}

// Every task ID of every agent under the root, with its directory.
std::map<task_id, task_dir> scan_all_agents(const fs::path& root) {
  std::map<task_id, task_dir> out;
  auto comms = root / "ai_comms";
  for (auto& agent : list_names(comms)) {
    if (validate_agent_name(agent))
      continue;
    auto tasks = comms / agent / "tasks";
    for (auto where : all_dirs)
      for (auto& id : list_ids(tasks / std::string{to_string(where)}))
        out.emplace(std::move(id), where);
  }
  return out;
}

// Counts, for every task, its children and those not completed.
struct child_counts {
  size_t all = 0;
  size_t incomplete = 0;
};

std::map<task_id, child_counts>
count_children(const std::map<task_id, task_dir>& everything) {
  std::map<task_id, child_counts> out;
  for (auto& [id, where] : everything) {
    if (auto parent = id.parent()) {
      auto& c = out[*parent];
      ++c.all;
      if (where != task_dir::completed)
        ++c.incomplete;
    }
  }
  return out;
}

} // namespace

std::string_view to_string(task_dir x) {
  switch (x) {
    case task_dir::to_execute:
      return "to_execute";
    case task_dir::in_progress:
      return "in_progress";
    case task_dir::completed:
      return "completed";
    case task_dir::stale:
      return "stale";
  }
  return "unknown";
}

std::string_view state_name(task_dir x) {
  switch (x) {
    case task_dir::to_execute:
      return "pending";
    case task_dir::in_progress:
      return "running";
    case task_dir::completed:
      return "completed";
    case task_dir::stale:
      return "stale";
  }
  return "unknown";
}

task_files::task_files(fs::path root, std::string agent,
                       task_files_options options)
  : root_(std::move(root)), agent_(std::move(agent)), options_(options) {
}

caf::expected<task_files> task_files::open(fs::path root, std::string agent,
                                           task_files_options options) {
  if (auto err = validate_agent_name(agent))
    return err;
  return task_files{std::move(root), std::move(agent), options};
}

fs::path task_files::tasks_dir() const {
  return root_ / "ai_comms" / agent_ / "tasks";
}

fs::path task_files::dir_of(task_dir where) const {
  return tasks_dir() / std::string{to_string(where)};
}

std::optional<task_dir> task_files::locate(const task_id& id) const {
  auto name = id.to_string();
  for (auto where : all_dirs) {
    struct stat st{};
    if (::stat((dir_of(where) / name).c_str(), &st) == 0)
      return where;
  }
  return std::nullopt;
}

caf::expected<task_id> task_files::queue(std::string_view body,
                                         const std::optional<task_id>& parent) {
  std::error_code ec;
  auto staging_root = tasks_dir() / ".staging";
  fs::create_directories(staging_root, ec);
  if (ec)
    return make_error(errc::io_failure, "cannot create '"
                                          + staging_root.string()
                                          + "': " + ec.message());
  fs::create_directories(dir_of(task_dir::to_execute), ec);
  if (ec)
    return make_error(errc::io_failure,
                      "cannot create '" + dir_of(task_dir::to_execute).string()
                        + "': " + ec.message());
  auto prefix = parent ? parent->to_string()
                       : std::string{counter_keys::orchestration};
  auto text = claim_next_id(root_, prefix);
  if (!text)
    return text.error();
  auto id = task_id::parse(*text);
  if (!id)
    return id.error();
  auto staged = staging_root
                / (*text + "." + std::to_string(::getpid()) + "."
                   + std::to_string(std::random_device{}()));
  if (::mkdir(staged.c_str(), 0755) != 0)
    return io_error("cannot create '" + staged.string() + "'");
  std::string content{body};
  if (auto err = write_file_atomic(staged / (*text + ".md"), content)) {
    fs::remove_all(staged, ec);
    return err;
  }
  auto target = dir_of(task_dir::to_execute) / *text;
  if (rename_noreplace(staged, target) != 0) {
    auto err = errno;
    fs::remove_all(staged, ec);
    return io_error("cannot publish task '" + target.string() + "'", err);
  }
  return std::move(*id);
}

caf::expected<std::optional<claimed_task>>
task_files::claim_next(const process_identity& worker) {
  auto pending = list_ids(dir_of(task_dir::to_execute));
  if (pending.empty())
    return std::optional<claimed_task>{};
  auto counts = count_children(scan_all_agents(root_));
  std::vector<task_id> candidates;
  for (auto& id : pending) {
    auto c = counts.find(id);
    if (c == counts.end() || c->second.incomplete == 0)
      candidates.push_back(std::move(id));
  }
  std::sort(candidates.begin(), candidates.end(), claimed_before);
  std::error_code ec;
  fs::create_directories(dir_of(task_dir::in_progress), ec);
  if (ec)
    return make_error(errc::io_failure,
                      "cannot create '" + dir_of(task_dir::in_progress).string()
                        + "': " + ec.message());
  for (auto& id : candidates) {
    auto name = id.to_string();
    auto from = dir_of(task_dir::to_execute) / name;
    auto to = dir_of(task_dir::in_progress) / name;
    if (rename_noreplace(from, to) != 0) {
      if (errno == ENOENT || errno == EEXIST || errno == ENOTEMPTY)
        continue; // another claimer won this one
      return io_error("cannot claim '" + from.string() + "'");
    }
    // The claim is ours. Record the owner first: a task in progress with
    // an owner record can be judged stale; one without waits out a grace
    // period.
    auto record = worker.to_string() + "\n" + iso_now() + "\n";
    if (auto err = write_file_atomic(to / (name + ".owner"), record))
      return err;
    auto plain = to / (name + ".md");
    auto marked = to / (name + "." + std::to_string(worker.pid) + ".md");
    if (::rename(plain.c_str(), marked.c_str()) != 0) {
      if (errno != ENOENT)
        return io_error("cannot mark '" + plain.string() + "'");
      marked = to; // queued without a task file: hand out the directory
    }
    return std::optional<claimed_task>{claimed_task{std::move(id), marked,
                                                    worker}};
  }
  return std::optional<claimed_task>{};
}

namespace {

caf::error not_there(const task_files& files, const task_id& id,
                     std::string_view wanted) {
  auto where = files.locate(id);
  if (!where)
    return make_error(errc::not_found, "task " + id.to_string()
                                         + " does not exist for agent '"
                                         + files.agent() + "'");
  return make_error(errc::conflict,
                    "task " + id.to_string() + " is in "
                      + std::string{to_string(*where)} + ", not in "
                      + std::string{wanted});
}

} // namespace

caf::error task_files::complete(const task_id& id) {
  auto name = id.to_string();
  std::error_code ec;
  fs::create_directories(dir_of(task_dir::completed), ec);
  auto from = dir_of(task_dir::in_progress) / name;
  if (rename_noreplace(from, dir_of(task_dir::completed) / name) != 0) {
    if (errno == ENOENT)
      return not_there(*this, id, "in_progress");
    return io_error("cannot complete '" + from.string() + "'");
  }
  return caf::none;
}

caf::error task_files::requeue(const task_id& id) {
  auto name = id.to_string();
  auto dir = dir_of(task_dir::stale) / name;
  struct stat st{};
  if (::stat(dir.c_str(), &st) != 0)
    return not_there(*this, id, "stale");
  // Put the task file back under its plain name and keep the dead owner's
  // record under a name of its own: nothing is deleted (D11).
  auto owner = read_owner(dir, name);
  for (auto& entry : list_names(dir)) {
    auto prefix = name + ".";
    if (entry.size() > prefix.size() + 3
        && entry.compare(0, prefix.size(), prefix) == 0
        && entry.compare(entry.size() - 3, 3, ".md") == 0
        && entry != name + ".md") {
      auto middle = entry.substr(prefix.size(),
                                 entry.size() - prefix.size() - 3);
      if (std::all_of(middle.begin(), middle.end(),
                      [](char c) { return c >= '0' && c <= '9'; }))
        rename_noreplace(dir / entry, dir / (name + ".md"));
    }
  }
  if (owner) {
    auto kept = dir
                / (name + ".owner." + std::to_string(owner->pid) + "."
                   + std::to_string(owner->start_time));
    rename_noreplace(dir / (name + ".owner"), kept);
  }
  std::error_code ec;
  fs::create_directories(dir_of(task_dir::to_execute), ec);
  if (rename_noreplace(dir, dir_of(task_dir::to_execute) / name) != 0) {
    if (errno == ENOENT)
      return not_there(*this, id, "stale");
    return io_error("cannot requeue '" + dir.string() + "'");
  }
  return caf::none;
}

caf::expected<std::vector<stale_task>> task_files::detect_stale() {
  std::vector<stale_task> out;
  auto running = list_ids(dir_of(task_dir::in_progress));
  std::sort(running.begin(), running.end());
  for (auto& id : running) {
    auto name = id.to_string();
    auto dir = dir_of(task_dir::in_progress) / name;
    auto owner = read_owner(dir, name);
    std::string reason;
    if (owner) {
      if (is_alive(*owner))
        continue;
      if (owner->start_time != 0 && process_start_time(owner->pid))
        reason = "pid " + std::to_string(owner->pid)
                 + " now belongs to another process";
      else
        reason = "pid " + std::to_string(owner->pid) + " is gone";
    } else {
      struct stat st{};
      if (::stat(dir.c_str(), &st) != 0)
        continue; // completed meanwhile
      // The file's time stamp comes from the kernel's coarse clock, which
      // may be a second ahead of time(): an age below zero is zero.
      auto age = std::chrono::seconds(
        std::max<std::time_t>(0, std::time(nullptr) - st.st_ctime));
      if (age < options_.unowned_grace)
        continue; // its claimer may be writing the owner record right now
      reason = "no owner was ever recorded";
    }
    std::error_code ec;
    fs::create_directories(dir_of(task_dir::stale), ec);
    if (rename_noreplace(dir, dir_of(task_dir::stale) / name) != 0) {
      if (errno == ENOENT)
        continue; // completed (or taken care of) meanwhile
      return io_error("cannot move '" + dir.string() + "' to stale");
    }
    out.push_back(stale_task{std::move(id), owner, std::move(reason)});
  }
  return out;
}

caf::expected<std::vector<task_file_entry>> task_files::list() const {
  auto everything = scan_all_agents(root_);
  auto counts = count_children(everything);
  std::vector<task_file_entry> out;
  for (auto where : all_dirs) {
    for (auto& id : list_ids(dir_of(where))) {
      task_file_entry e;
      e.dir = dir_of(where) / id.to_string();
      e.where = where;
      if (auto c = counts.find(id); c != counts.end()) {
        e.children = c->second.all;
        e.incomplete_children = c->second.incomplete;
      }
      e.executable = where == task_dir::to_execute && e.incomplete_children == 0;
      if (where == task_dir::in_progress || where == task_dir::stale)
        e.owner = read_owner(e.dir, id.to_string());
      e.id = std::move(id);
      out.push_back(std::move(e));
    }
  }
  std::sort(out.begin(), out.end(),
            [](const task_file_entry& x, const task_file_entry& y) {
              return x.id < y.id;
            });
  return out;
}

std::string to_json(const std::vector<task_file_entry>& tasks) {
  auto arr = nlohmann::json::array();
  for (auto& t : tasks) {
    nlohmann::json j;
    j["id"] = t.id.to_string();
    auto parent = t.id.parent();
    j["parent"] = parent ? nlohmann::json(parent->to_string())
                         : nlohmann::json(nullptr);
    j["depth"] = t.id.depth();
    j["state"] = std::string{state_name(t.where)};
    j["dir"] = std::string{to_string(t.where)};
    j["executable"] = t.executable;
    j["children"] = t.children;
    j["incomplete_children"] = t.incomplete_children;
    if (t.owner)
      j["owner"] = {{"pid", t.owner->pid},
                    {"start_time", t.owner->start_time}};
    else
      j["owner"] = nullptr;
    arr.push_back(std::move(j));
  }
  return arr.dump(2);
}

} // namespace spindle
