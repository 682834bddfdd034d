#include "common/task_group.h"

#include <algorithm>
#include <deque>
#include <utility>

#include "absl/strings/str_cat.h"

namespace cairn {

struct TaskGroup::State {
  struct Task {
    size_t index;
    std::string context;
    std::function<absl::Status()> fn;
  };

  explicit State(bool cancel_on_error) : cancel_on_error(cancel_on_error) {}

  // Records the outcome of task `index`. Returns the tasks dropped by a
  // cancellation, to be destroyed outside the lock.
  std::deque<Task> Record(size_t index, const std::string& context,
                          absl::Status s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (s.ok()) return {};
    if (!context.empty()) {
      s = absl::Status(s.code(), absl::StrCat(context, ": ", s.message()));
    }
    if (first.ok()) first = s;
    errors.emplace_back(index, std::move(s));
    if (!cancel_on_error) return {};
    cancelled = true;
    return std::exchange(queue, {});
  }

  // Constant after construction.
  const bool cancel_on_error;

  mutable absl::Mutex mu;
  std::deque<Task> queue ABSL_GUARDED_BY(mu);  // not started yet
  int running ABSL_GUARDED_BY(mu) = 0;
  size_t next_index ABSL_GUARDED_BY(mu) = 0;
  bool cancelled ABSL_GUARDED_BY(mu) = false;
  absl::Status first ABSL_GUARDED_BY(mu);
  std::vector<std::pair<size_t, absl::Status>> errors ABSL_GUARDED_BY(mu);
};

TaskGroup::TaskGroup(ThreadPool* pool) : TaskGroup(Options{pool}) {}

TaskGroup::TaskGroup(const Options& options)
    : options_(options),
      state_(std::make_shared<State>(options.cancel_on_error)) {}

TaskGroup::~TaskGroup() { Wait().IgnoreError(); }

bool TaskGroup::RunOne(const std::shared_ptr<State>& state) {
  State::Task task;
  {
    absl::MutexLock lock(&state->mu);
    if (state->queue.empty()) return false;
    task = std::move(state->queue.front());
    state->queue.pop_front();
    ++state->running;
  }
  absl::Status s = task.fn();
  task.fn = nullptr;  // its captures die before Wait() can return
  std::deque<State::Task> dropped;
  absl::MutexLock lock(&state->mu);
  dropped = state->Record(task.index, task.context, std::move(s));
  --state->running;
  // `dropped` is destroyed after the lock is released (declared before it).
  return true;
}

void TaskGroup::Run(std::string context, std::function<absl::Status()> fn) {
  if (options_.pool == nullptr && !options_.thread_per_task) {
    RunInline(context, fn);
    return;
  }
  {
    absl::MutexLock lock(&state_->mu);
    if (state_->cancelled) return;
    state_->queue.push_back(
        State::Task{state_->next_index++, std::move(context), std::move(fn)});
  }
  if (options_.thread_per_task) {
    absl::MutexLock lock(&threads_mu_);
    threads_.emplace_back([state = state_] { RunOne(state); });
  } else {
    options_.pool->Schedule([state = state_] { RunOne(state); });
  }
}

void TaskGroup::RunInline(const std::string& context,
                          const std::function<absl::Status()>& fn) {
  size_t index;
  {
    absl::MutexLock lock(&state_->mu);
    if (state_->cancelled) return;
    index = state_->next_index++;
    ++state_->running;  // so that a concurrent Wait() waits for it too
  }
  absl::Status s = fn();
  std::deque<State::Task> dropped;
  absl::MutexLock lock(&state_->mu);
  dropped = state_->Record(index, context, std::move(s));
  --state_->running;
}

absl::Status TaskGroup::Wait() {
  // Caller runs: take the tasks no other thread has started yet.
  while (RunOne(state_)) {
  }
  {
    absl::MutexLock lock(&state_->mu);
    // A task may queue more tasks (into this group) while it runs: wait for
    // the running ones, and run whatever they queue here too.
    while (true) {
      state_->mu.Await(absl::Condition(
          +[](State* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu) {
            return s->running == 0 || !s->queue.empty();
          },
          state_.get()));
      if (state_->queue.empty()) break;
      state_->mu.Unlock();
      while (RunOne(state_)) {
      }
      state_->mu.Lock();
    }
  }
  // Threads of thread_per_task tasks: every task has finished, so each
  // thread is done or about to find an empty queue.
  while (true) {
    std::vector<std::thread> threads;
    {
      absl::MutexLock lock(&threads_mu_);
      threads.swap(threads_);
    }
    if (threads.empty()) break;
    for (std::thread& t : threads) t.join();
  }
  return status();
}

absl::Status TaskGroup::status() const {
  absl::MutexLock lock(&state_->mu);
  return state_->first;
}

std::vector<absl::Status> TaskGroup::AllErrors() const {
  std::vector<std::pair<size_t, absl::Status>> errors;
  {
    absl::MutexLock lock(&state_->mu);
    errors = state_->errors;
  }
  std::sort(errors.begin(), errors.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<absl::Status> out;
  out.reserve(errors.size());
  for (auto& e : errors) out.push_back(std::move(e.second));
  return out;
}

bool TaskGroup::cancelled() const {
  absl::MutexLock lock(&state_->mu);
  return state_->cancelled;
}

absl::Status RunAll(ThreadPool* pool,
                    std::vector<std::function<absl::Status()>> fns) {
  TaskGroup group(pool);
  for (auto& fn : fns) group.Run(std::move(fn));
  return group.Wait();
}

}  // namespace cairn
