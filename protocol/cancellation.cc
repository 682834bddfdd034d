// Cancellation of a rank's save or load (see cancellation.h).
#include "protocol/cancellation.h"

#include <utility>

namespace cairn::protocol {

Cancellation::Cancellation(std::string reason) : reason_(std::move(reason)) {}

void Cancellation::Cancel() {
  absl::MutexLock lock(&mu_);
  cancelled_.store(true, std::memory_order_release);
  // A registered context outlives its registration (ScopedCall unregisters
  // under mu_ before the context is destroyed).
  for (grpc::ClientContext* context : calls_) context->TryCancel();
}

bool Cancellation::Reset() {
  absl::MutexLock lock(&mu_);
  return cancelled_.exchange(false, std::memory_order_acq_rel);
}

absl::Status Cancellation::status() const {
  return absl::CancelledError(reason_);
}

bool Cancellation::WaitFor(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  bool (*is_set)(std::atomic<bool>*) = [](std::atomic<bool>* flag) {
    return flag->load(std::memory_order_acquire);
  };
  return mu_.AwaitWithTimeout(absl::Condition(is_set, &cancelled_), timeout);
}

Cancellation::ScopedCall::ScopedCall(Cancellation* cancellation,
                                     grpc::ClientContext* context)
    : cancellation_(cancellation), context_(context) {
  if (cancellation_ == nullptr) return;
  absl::MutexLock lock(&cancellation_->mu_);
  cancellation_->calls_.insert(context_);
  if (cancellation_->cancelled()) context_->TryCancel();
}

Cancellation::ScopedCall::~ScopedCall() {
  if (cancellation_ == nullptr) return;
  absl::MutexLock lock(&cancellation_->mu_);
  cancellation_->calls_.erase(context_);
}

}  // namespace cairn::protocol
