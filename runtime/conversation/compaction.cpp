// Compaction jobs (runtime/compaction.hpp, docs/threads.md "Compaction").

#include "conversation/compaction.hpp"

#include <caf/all.hpp>
#include <spdlog/spdlog.h>

#include "spindle/messages/clock.hpp"
#include "spindle/messages/error.hpp"
#include "spindle/messages/work.hpp"
#include "core/logging.hpp"

namespace spindle {

compactor::compactor(caf::actor_system& sys, thread_registry_actor registry,
                     std::shared_ptr<const thread_views> views,
                     std::shared_ptr<summarizer> impl,
                     std::shared_ptr<const token_counter> tokens,
                     options opts)
  : sys_(sys), registry_(std::move(registry)), views_(std::move(views)),
    impl_(std::move(impl)),
    tokens_(std::move(tokens)), opts_(opts),
    name_(impl_ ? impl_->name() : std::string{}) {
}

compaction_stats compactor::stats() const {
  compaction_stats out;
  out.started = started_.load();
  out.stored = stored_.load();
  out.failed = failed_.load();
  std::lock_guard<std::mutex> guard{mtx_};
  out.running = running_.size();
  return out;
}

void compactor::finish(const std::string& thread_id, outcome how) {
  if (how == outcome::stored)
    stored_.fetch_add(1);
  else
    failed_.fetch_add(1);
  std::lock_guard<std::mutex> guard{mtx_};
  running_.erase(thread_id);
}

void compactor::request(const std::string& thread_id, uint64_t summary_upto,
                        uint64_t upto) {
  if (!impl_ || upto < summary_upto + opts_.min_turns)
    return;
  // The turns to fold are read from the thread's published log, in place
  // and only those: never a copy of the thread. A thread that is not
  // resident (passivated meanwhile) is left for the next exchange, which
  // activates it and asks again.
  auto view = views_ ? views_->find(thread_id) : nullptr;
  if (!view)
    return;
  uint64_t from = view->summary ? view->summary->upto : 0;
  uint64_t size = view->turns->size();
  if (upto <= from || upto > size || upto < from + opts_.min_turns)
    return; // covered already, or cleared since the prompt was built
  // A long backlog (a thread stored before compaction existed, or one
  // whose jobs failed) is folded a bounded piece per exchange.
  upto = std::min<uint64_t>(upto, from + std::max<uint64_t>(
                                           opts_.max_turns_per_job,
                                           opts_.min_turns));
  {
    std::lock_guard<std::mutex> guard{mtx_};
    if (!running_.emplace(thread_id, caf::actor{}).second)
      return; // the running job's result is what the next prompt uses
  }
  started_.fetch_add(1);
  summary_input in;
  if (view->summary)
    in.previous = view->summary->content;
  view->turns->copy(static_cast<size_t>(from), static_cast<size_t>(upto),
                    in.turns);
  count_work(work_kind::turns_summarized, upto - from);
  auto epoch = view->epoch;
  view.reset();
  auto self_ptr = shared_from_this();
  auto fail = [self_ptr, thread_id](const std::string& what) {
    spdlog::warn(log_fields("compaction_failed",
                            {{"thread_id", thread_id}, {"error", what}}));
    self_ptr->finish(thread_id, outcome::failed);
  };
  // The job is an actor of the scheduler: it waits for the summarizer and
  // the store without holding a thread (a provider with an asynchronous
  // form answers on its event loop); only a summarizer that blocks and has
  // no such form gets a detached actor of its own.
  auto job = sys_.spawn([self_ptr, thread_id, from, upto, epoch, fail,
                         in = std::move(in)](
                          caf::event_based_actor* self) mutable
                        -> caf::behavior {
    auto me = caf::actor_cast<caf::actor>(self);
    auto deliver = [me](caf::expected<std::string> text) {
      if (text)
        caf::anon_send(me, summary_atom::value, std::move(*text));
      else
        caf::anon_send(me, summary_atom::value, text.error());
    };
    auto impl = self_ptr->impl_;
    if (!impl->blocking())
      deliver(impl->summarize(in));
    else if (!impl->start(in, deliver))
      self->spawn<caf::detached>(
        [impl, in = std::move(in), deliver](caf::event_based_actor*) {
          deliver(impl->summarize(in));
        });
    return {
      [self, self_ptr, thread_id, upto, epoch, from,
       fail](summary_atom, std::string& text) {
        auto& c = *self_ptr;
        thread_summary s;
        s.content = std::move(text);
        s.upto = upto;
        s.updated_ms = unix_time_ms();
        if (c.tokens_) {
          auto n = c.tokens_->count_text(std::string{summary_message_prefix}
                                         + s.content);
          s.tokens = static_cast<uint32_t>(
            std::min<size_t>(n, std::numeric_limits<uint32_t>::max()));
          s.token_encoding = static_cast<uint8_t>(c.tokens_->id());
        }
        self
          ->request(c.registry_, c.opts_.step_timeout, summary_atom::value,
                    thread_id, std::move(s), epoch)
          .then(
            [self, self_ptr, thread_id, from, upto](uint64_t) {
              spdlog::info(log_fields("compaction_stored",
                                      {{"thread_id", thread_id},
                                       {"from", from},
                                       {"upto", upto}}));
              self_ptr->finish(thread_id, outcome::stored);
              self->quit();
            },
            [self, fail](caf::error& err) {
              fail(describe(err));
              self->quit();
            });
      },
      [self, fail](summary_atom, caf::error& err) {
        fail(describe(err));
        self->quit();
      },
    };
  });
  std::lock_guard<std::mutex> guard{mtx_};
  if (auto i = running_.find(thread_id); i != running_.end() && !i->second)
    i->second = std::move(job); // unless it ended already
}

void compactor::stop_all() {
  std::vector<caf::actor> jobs;
  {
    std::lock_guard<std::mutex> guard{mtx_};
    for (auto& [id, job] : running_)
      if (job)
        jobs.push_back(job);
  }
  for (auto& job : jobs)
    caf::anon_send_exit(job, caf::exit_reason::user_shutdown);
}

} // namespace spindle
