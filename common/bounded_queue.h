// BoundedQueue<T>: hands values from one stage of a pipeline to the next
// (on another thread), holding at most `capacity` at once.
//
// Semantics:
//   - Push(v) waits while the queue is full; it returns false (dropping v)
//     once the consumer called Stop(), also when it was waiting.
//   - Pop() waits for a value; it returns nullopt once the producer called
//     Close() and every value pushed before has been popped.
//   - Stop() (the consumer gives up, e.g. on an error) drops the queued
//     values and makes every Push, waiting or later, return false.
//   - Values come out in the order they went in.
//
// Thread-safe. The producer must Close() on every way out (or the consumer
// waits forever), and the consumer must Stop() when it quits early (or the
// producer waits forever on a full queue).
//
// Example:
//   BoundedQueue<Item> queue(16);
//   group.Run([&] {
//     while (std::optional<Item> item = queue.Pop()) {
//       if (absl::Status s = Use(*std::move(item)); !s.ok()) {
//         queue.Stop();
//         return s;
//       }
//     }
//     return absl::OkStatus();
//   });
//   for (...) if (!queue.Push(Make())) break;  // the consumer failed
//   queue.Close();
//   CAIRN_RETURN_IF_ERROR(group.Wait());
#ifndef CAIRN_COMMON_BOUNDED_QUEUE_H_
#define CAIRN_COMMON_BOUNDED_QUEUE_H_

#include <cstddef>
#include <deque>
#include <optional>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace cairn {

template <typename T>
class BoundedQueue {
 public:
  // `capacity` >= 1.
  explicit BoundedQueue(size_t capacity)
      : capacity_(capacity < 1 ? 1 : capacity) {}
  BoundedQueue(const BoundedQueue&) = delete;
  BoundedQueue& operator=(const BoundedQueue&) = delete;

  bool Push(T value) {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(this, &BoundedQueue::HasRoomOrStopped));
    if (stopped_) return false;
    values_.push_back(std::move(value));
    return true;
  }

  std::optional<T> Pop() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(this, &BoundedQueue::HasValueOrClosed));
    if (values_.empty()) return std::nullopt;
    std::optional<T> value(std::move(values_.front()));
    values_.pop_front();
    return value;
  }

  void Close() {
    absl::MutexLock lock(&mu_);
    closed_ = true;
  }

  void Stop() {
    absl::MutexLock lock(&mu_);
    stopped_ = true;
    values_.clear();
  }

 private:
  bool HasRoomOrStopped() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopped_ || values_.size() < capacity_;
  }
  bool HasValueOrClosed() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return closed_ || !values_.empty();
  }

  const size_t capacity_;
  absl::Mutex mu_;
  std::deque<T> values_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace cairn

#endif  // CAIRN_COMMON_BOUNDED_QUEUE_H_
