/// \file
/// The one load protocol: a rank's side of loading a committed checkpoint
/// into whatever layout the rank holds now (resharding from the layout that
/// saved it), below libcairn's Checkpointer and anything else that loads on
/// a rank's behalf. The caller says where each wanted chunk's bytes go
/// (LoadDestinations: spans into its buffers); the protocol fills them.
///
///   PlanLoad      for the destinations' chunks and bytes entries, a step or
///                 `latest` (resolved by cairnd once for the job's load
///                 round). The short form (the tensors' digest and the
///                 boxes) when the rank wants one box of each tensor; the
///                 full form when cairnd asks for it (resend_wanted). The
///                 answer's read columns are expanded, and checked to cover
///                 every wanted byte exactly once.
///   reads         exactly the planned byte ranges of each stored chunk,
///                 straight into the destinations, items in parallel on the
///                 caller's pool. A stored chunk read whole is checked
///                 against its crc32c here; one read in part as
///                 LoadProtocolOptions::partial_chunk_check says.
///   VerifyLoad    (kCollective) the crc32c terms of the chunks read in
///                 part, which cairnd combines over the ranks of the load
///                 round; the pieces it cannot verify are read whole and
///                 checked here, and so is every piece when cairnd cannot be
///                 asked. A rank whose load fails after PlanLoad took it into
///                 a round reports so at once (a VerifyLoad without pieces),
///                 so the other ranks do not wait for it.
///   bytes entries read whole, checked against their crc32c, and handed to
///                 the caller's strings.
///
/// Errors name the rank, the job and the step ("rank 3 loading job 'llama'
/// step 100: ..."), and the tensor (fqn) and object involved: DATA_LOSS for
/// a stored chunk or bytes entry that is missing, short or fails its
/// crc32c; FAILED_PRECONDITION when neither the object nor the step's
/// MANIFEST is where cairnd's storage URI points on this host; cairnd's
/// answer (INVALID_ARGUMENT for a dtype or shape that differs from the
/// checkpoint's, NOT_FOUND for a step or tensor it lacks) otherwise.
///
/// Cancellation (LoadProtocolOptions::cancellation, optional): Cancel() on
/// another thread stops the load wherever it is — PlanLoad or VerifyLoad
/// waiting for cairnd or the other ranks returns at once, no further item is
/// read (those being read finish) — with CANCELLED naming the rank, the job
/// and the step (or `latest` before cairnd resolved it). Nothing changes at
/// cairnd. The destinations then hold nothing (cancelled before reading),
/// every planned byte but with the chunks read in part unverified
/// (cancelled in VerifyLoad), or some chunks and not others (cancelled while
/// reading): only an OK load filled them.
///
/// Thread-compatible: one LoadProtocol per (job, rank), one Load at a time;
/// the reads of one Load run concurrently on the pool, each writing its own
/// bytes of the destinations.
///
/// Lifetime: the stub, the contact, the cancellation and the stores that
/// LoadProtocolOptions::store_for returns must outlive the LoadProtocol; a
/// Load's destinations (the buffers and the strings) must stay valid, and
/// untouched by the caller, until it returns. No call outlives a Load.
///
/// Example:
///   auto stub = v1::Coordinator::NewStub(NewCoordinatorChannel(address));
///   LoadProtocol protocol(stub.get(), {.job = "llama", .rank = r,
///                                      .world_size = w});
///   LoadDestinations dests;
///   CAIRN_RETURN_IF_ERROR(dests.AddTensor(
///       "model.wq", planner::DType::kBFloat16, {4096, 1000},
///       {{box, absl::MakeSpan(ptr, bytes)}}));
///   dests.AddBytes("rng", &rng_state);
///   CAIRN_ASSIGN_OR_RETURN(int64_t step,
///                          protocol.Load(std::nullopt, dests, pool));
#ifndef CAIRN_PROTOCOL_LOAD_PROTOCOL_H_
#define CAIRN_PROTOCOL_LOAD_PROTOCOL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "cairn/v1/cairn.grpc.pb.h"
#include "cairn/v1/cairn.pb.h"
#include "common/thread_pool.h"
#include "planner/box.h"
#include "planner/dtype.h"
#include "protocol/cancellation.h"
#include "protocol/coordinator_call.h"
#include "storage/shard_store.h"

namespace cairn::protocol {

// How a load verifies the crc32c of a stored chunk that a rank needs only
// part of (resharding: rows saved, columns loaded). Whole chunks are always
// checked by the rank that reads them.
enum class PartialChunkCheck {
  // Read only the needed bytes and report their crc32c term to cairnd
  // (VerifyLoad), which combines the terms of every rank of the load round
  // into the chunk's checksum; the pieces it cannot verify are read whole
  // and checked here.
  kCollective,
  // Read such chunks whole and check them here: independent of other ranks,
  // but bytes read > bytes needed.
  kReadWhole,
  // Read only the needed bytes and leave such chunks unverified.
  kNone,
};

struct LoadProtocolOptions {
  // The job ([A-Za-z0-9._-]{1,128}), the rank and the world size the loads
  // are for. Required.
  std::string job;
  int rank = 0;
  int world_size = 1;
  // How long VerifyLoad may wait for the other ranks of the load round (a
  // backstop: cairnd's verify deadline answers first). Default: 65 minutes.
  absl::Duration collective_timeout = absl::Minutes(65);
  // Timeout of PlanLoad (and, capped at 30 s, of a failure report).
  // Default: 5 minutes.
  absl::Duration rpc_timeout = absl::Minutes(5);
  // Retries of PlanLoad/VerifyLoad that failed UNAVAILABLE or CANCELLED
  // (CallWithRetry) once cairnd has answered. Default: 16.
  int max_retries = 16;
  // Whether cairnd has answered on the stub's channel, and how long a call
  // may try to reach it until it has (CallWithRetry). Not owned; must
  // outlive the LoadProtocol. Default: none (every call retries max_retries
  // times).
  CoordinatorContact* contact = nullptr;
  // How chunks read in part are verified (see PartialChunkCheck). Only
  // kCollective joins the load round's verification; every load joins the
  // round itself (`latest` and world sizes are agreed there).
  // Default: kCollective.
  PartialChunkCheck partial_chunk_check = PartialChunkCheck::kCollective;
  // Options of the store opened for the plan's storage URI when store_for
  // is not set. Default: StoreOptions's defaults.
  storage::StoreOptions store;
  // The store of a plan's storage URI, for a caller that already holds one
  // (a Checkpointer shares its save protocol's store, so a "mem://" store
  // saved to is the one loaded from). The store must outlive the Load that
  // asked for it. Default: none (the protocol opens the URI with `store`
  // and keeps it for the next load of the same URI).
  std::function<absl::StatusOr<storage::ShardStore*>(const std::string& uri)>
      store_for;
  // Cancels the load in progress when another thread calls its Cancel()
  // (see above). Not owned; must outlive the LoadProtocol. The protocol
  // never resets it. Default: none (loads are not cancellable).
  Cancellation* cancellation = nullptr;
  // Test hook: runs after PlanLoad answered (with the step it resolved),
  // before any read (race tests hold a rank here). Default: none.
  std::function<void(int64_t step)> after_plan_load_for_test;
};

// OK when `data` is a buffer for `box` of tensor `fqn` (dtype, global
// shape): the box lies in the shape and the buffer holds exactly its bytes.
// INVALID_ARGUMENT naming the tensor and the chunk (or the box and the
// shape) otherwise. Also used by libcairn's StateDict.
absl::Status CheckChunkBuffer(absl::string_view fqn, planner::DType dtype,
                              const planner::Shape& global_shape,
                              const planner::ChunkBox& box,
                              absl::Span<const char> data);

// Where one wanted chunk of a tensor goes: its box in global coordinates and
// the caller's buffer for it (borrowed), row-major and contiguous, exactly
// Volume(box) * DTypeSize(dtype) bytes.
struct ChunkDestination {
  planner::ChunkBox box;
  absl::Span<char> data;
};

// Where a load puts what it reads: the chunks of each tensor this rank
// loads, and the strings its bytes entries replace. Tensors keep the order
// they were added in (the order of the full form of PlanLoad).
class LoadDestinations {
 public:
  struct Tensor {
    std::string fqn;
    planner::DType dtype = planner::DType::kUnspecified;
    planner::Shape global_shape;
    std::vector<ChunkDestination> chunks;  // may be empty: holds none of it
  };
  struct Bytes {
    std::string fqn;
    std::string* blob = nullptr;  // replaced by the stored bytes
  };

  // A tensor this rank loads `chunks` of (none: it holds nothing of it; it
  // is still named, so that the load checks it against the checkpoint).
  // INVALID_ARGUMENT naming the tensor for a dtype without a size, a box
  // outside `global_shape`, a buffer that is not exactly the chunk's size,
  // or a name already added; nothing is added then.
  absl::Status AddTensor(std::string fqn, planner::DType dtype,
                         planner::Shape global_shape,
                         std::vector<ChunkDestination> chunks);
  // A bytes entry; `*blob` (borrowed) is replaced by its stored bytes.
  // INVALID_ARGUMENT naming the entry for a null blob or a name already
  // added.
  absl::Status AddBytes(std::string fqn, std::string* blob);

  const std::vector<Tensor>& tensors() const { return tensors_; }
  const std::vector<Bytes>& bytes() const { return bytes_; }

 private:
  absl::Status CheckNewName(const std::string& fqn) const;

  std::vector<Tensor> tensors_;
  std::vector<Bytes> bytes_;
  absl::flat_hash_set<std::string> names_;
};

// What one Load did, for logs and benchmarks.
struct LoadStats {
  uint64_t bytes = 0;                     // payload bytes delivered
  uint64_t bytes_storage = 0;             // bytes read from storage
  int64_t items = 0;                      // read items of the plan
  int64_t chunks_verified_by_cairnd = 0;  // partly read, combined
  int64_t chunks_verified_locally = 0;    // partly read, read whole
  absl::Duration plan_time;               // PlanLoad
  absl::Duration io_time;                 // reads, checks and VerifyLoad
};

class LoadProtocol {
 public:
  // `stub` (a Coordinator stub, see NewCoordinatorChannel) is not owned and
  // must outlive this object.
  LoadProtocol(v1::Coordinator::Stub* stub, LoadProtocolOptions options);
  LoadProtocol(const LoadProtocol&) = delete;
  LoadProtocol& operator=(const LoadProtocol&) = delete;

  const LoadProtocolOptions& options() const { return options_; }

  // "rank 3 loading job 'llama' step 100", or "... job 'llama' latest" for
  // `step` nullopt: how a load's errors start before cairnd resolved the
  // step.
  std::string Where(std::optional<int64_t> step) const;

  // Fills every chunk and bytes entry of `dests` from checkpoint `step`
  // (nullopt: the job's newest committed step, as cairnd resolves it for the
  // load round), reading on `pool`. Returns the step loaded, or an error as
  // the file comment says. Cancelled before any call: CANCELLED with
  // Where(step), and no call is made.
  absl::StatusOr<int64_t> Load(std::optional<int64_t> step,
                               const LoadDestinations& dests, ThreadPool& pool);

  // What the last Load did (also one that failed: as far as it got).
  const LoadStats& last_stats() const { return stats_; }

 private:
  // The store of `uri`: options_.store_for's, or one opened here (cached).
  absl::StatusOr<storage::ShardStore*> StoreFor(const std::string& uri);
  // Reads plan's read items into `dests` (dests[i]: where request.wanted(i)
  // goes; null: an empty box) and verifies them, VerifyLoad included.
  absl::Status ReadItems(const v1::PlanLoadRequest& request,
                         const v1::PlanLoadResponse& plan,
                         const std::vector<const ChunkDestination*>& dests,
                         ThreadPool& pool);
  absl::Status ReadBytesEntries(const v1::PlanLoadResponse& plan,
                                const LoadDestinations& dests);
  // Whether a load reports its partly read chunks to cairnd (VerifyLoad in
  // the load round PlanLoad joined).
  bool JoinsLoadCollective() const;
  // This rank's VerifyLoad request for `plan`'s round, without pieces.
  v1::VerifyLoadRequest LoadReport(const v1::PlanLoadResponse& plan) const;
  // Tells the load round this rank is done (its load failed), so the other
  // ranks are answered without its pieces. Synchronous: cairnd answers a
  // report without pieces at once, and nothing is left running.
  void ReportLoadFailure(const v1::VerifyLoadRequest& request);
  bool cancelled() const;
  // CANCELLED: "<where>: <the cancellation's reason>".
  absl::Status Cancelled(absl::string_view where) const;

  // Constant after construction.
  v1::Coordinator::Stub* const stub_;
  const LoadProtocolOptions options_;

  LoadStats stats_;
  std::string store_uri_;
  std::unique_ptr<storage::ShardStore> store_;
};

}  // namespace cairn::protocol

#endif  // CAIRN_PROTOCOL_LOAD_PROTOCOL_H_
