/// \file
/// Cancellation: how another thread stops a rank's save or load wherever it
/// is. A Cancellation is a flag plus a registry of the gRPC calls in flight:
///
///   Cancel()        sets the flag, cancels every registered call
///                   (grpc::ClientContext::TryCancel) and wakes every
///                   WaitFor, so a rank parked in a collective call (BeginSave
///                   waiting for the other ranks, CommitSave, VerifyLoad)
///                   returns at once.
///   cancelled()     checked by the code that issues work (the planned
///                   writes, the reads) before each item: nothing new starts,
///                   what is in flight finishes.
///   Reset()         clears the flag: the owner of the operation consumes it
///                   when the operation ends.
///
/// CallWithRetry (coordinator_call.h) takes an optional Cancellation: it
/// registers each attempt's context, never retries a call cancelled by it,
/// and waits its backoff in WaitFor. SaveProtocolOptions::cancellation hands
/// one to the save protocol. Code that passes none (cairn-agent) behaves as
/// before.
///
/// Thread-safe: every method may be called concurrently.
///
/// Example:
///   Cancellation cancel("cancelled (Checkpointer::Cancel)");
///   // Thread A:                          // Thread B:
///   auto r = CallWithRetry(..., &cancel);  cancel.Cancel();
///   // r is CANCELLED: "cancelled (Checkpointer::Cancel)"
#ifndef CAIRN_CLIENT_PROTOCOL_CANCELLATION_H_
#define CAIRN_CLIENT_PROTOCOL_CANCELLATION_H_

#include <atomic>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/client_context.h"

namespace cairn::protocol {

class Cancellation {
 public:
  // `reason` is the message of status(): what cancelled the operation.
  explicit Cancellation(std::string reason);
  Cancellation(const Cancellation&) = delete;
  Cancellation& operator=(const Cancellation&) = delete;

  // Sets the flag, cancels every registered call and wakes every WaitFor.
  void Cancel();

  // Whether Cancel() was called since the last Reset().
  bool cancelled() const { return cancelled_.load(std::memory_order_acquire); }

  // Clears the flag; returns whether it was set.
  bool Reset();

  // CANCELLED with the reason given at construction.
  absl::Status status() const;

  // Waits `timeout` or until Cancel(); returns cancelled().
  bool WaitFor(absl::Duration timeout);

  // Registers `context` (of a call about to be made) for the scope: Cancel()
  // cancels it; if the flag is already set it is cancelled at once (gRPC
  // then fails the call CANCELLED as soon as it starts). A null
  // `cancellation` registers nothing.
  class ScopedCall {
   public:
    ScopedCall(Cancellation* cancellation, grpc::ClientContext* context);
    ~ScopedCall();
    ScopedCall(const ScopedCall&) = delete;
    ScopedCall& operator=(const ScopedCall&) = delete;

   private:
    Cancellation* const cancellation_;
    grpc::ClientContext* const context_;
  };

 private:
  // Constant after construction.
  const std::string reason_;

  std::atomic<bool> cancelled_{false};
  // State below is protected by mu_ (cancelled_ is also written under it, so
  // a call registers either before Cancel() cancels the registered calls or
  // after it set the flag).
  absl::Mutex mu_;
  absl::flat_hash_set<grpc::ClientContext*> calls_ ABSL_GUARDED_BY(mu_);
};

}  // namespace cairn::protocol

#endif  // CAIRN_CLIENT_PROTOCOL_CANCELLATION_H_
