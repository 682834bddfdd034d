// The cairn-agent library: one per node. Ranks of the node hand their state
// to it (staging), it persists on their behalf through cairnd's save protocol,
// keeps the latest checkpoint in memory (tier 0), replicates tier 0 to peer
// agents (tier 1) and serves loads from memory, resharding point to point.
//
// Save path (per rank):
//   BeginStage  reserve staging space within the budget (evicting old tier 0
//               and replicas, else waiting for persists to drain), hand the
//               rank a shared-memory segment and an offset per item;
//   (rank)      memcpy host tensors into the segment — all training waits for;
//   FinishStage copy GPU items (DeviceCopier), then persist on a thread:
//               crc32c of every item, then the save protocol
//               (protocol: BeginSave / write / CommitSave) over the
//               items in the segment — the same protocol as direct mode, so a
//               checkpoint is committed exactly when every rank's agent has
//               committed. The training process may exit right after
//               FinishStage: the agent owns the bytes.
//   committed   the set becomes this rank's tier 0 (older ones are released)
//               and is pushed to `replicas` peers: nodes node+1..node+r (mod
//               num_nodes), never this node. The push is bucketed with the
//               planner's transfer schedule (one data message per bucket);
//               peers verify every item's crc32c and keep the replica keyed
//               (job, step, source rank).
// Streaming save (a rank's save larger than the whole staging budget, when
//   the rank allows it): BeginStage reserves nothing and starts the persist
//   thread at once, which calls BeginSave and orders cairnd's plan for this
//   rank into a byte stream (object by object, writes by offset, items split
//   into pieces of at most one bucket). The rank then loops StageBucket: it
//   hands back the bucket it filled and gets the next one (bucket_bytes,
//   at most half the budget so the rank fills one while the agent writes the
//   other; allocating it is the only wait). The persist thread appends every
//   filled bucket to the plan's objects (zero padding, crc32c per item
//   across pieces) and frees it; after FinishStage and every object Closed
//   (durable) it calls CommitSave. A rank that stops calling for
//   stream_idle_timeout (killed mid-stream) or any failure aborts the save
//   (AbortSave): it never commits, the previous checkpoint stays latest.
//   A streamed save keeps nothing in memory: no tier 0, no replicas (loads
//   of it come from storage).
// Cancel (CancelSave, the rank's AgentCheckpointer::Cancel): a set still
//   being staged is dropped and its space freed (nothing was sent to cairnd
//   for it); a streaming save fails; a persist's save protocol is cancelled
//   as direct mode's (protocol/cancellation.h): it stops wherever it
//   is and is aborted at cairnd, so the other ranks fail at once, unless
//   every rank has committed. A BeginStage or StageBucket whose rank gave up
//   on the call stops waiting for space.
// Load path: resolve the step with cairnd, fetch its manifest, ask every
//   reachable agent what it holds for (job, step) (Inventory), build the
//   planner's TransferPlan from those holders to the loading rank's wanted
//   boxes (each destination byte moved once, from one holder), copy local
//   pieces and Fetch remote ones (one message per planned bucket). Holders
//   verify each source chunk's crc32c against the manifest before sending;
//   the transport checksums the wire. Any failure is returned as an error and
//   the client falls back to storage.
//
// Components (each with its own lock and tests; the Agent composes them and
// holds only the sets being staged): StagingPool (the budget), MemoryTier
// (tier 0 and replicas), Persister (persists and streams saves; its
// StreamingSave is a save larger than the budget), PeerClient, PeerServer,
// Replicator and PeerLoader (the peer side, over one Transport).
//
// Thread-safe: every public method may be called concurrently.
#ifndef CAIRN_SERVER_AGENT_AGENT_H_
#define CAIRN_SERVER_AGENT_AGENT_H_

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cairn/v1/agent.pb.h"
#include "cairn/v1/cairn.grpc.pb.h"
#include "common/copier/device_copier.h"
#include "common/metrics.h"
#include "common/shm/shm_segment.h"
#include "common/thread_pool.h"
#include "protocol/client_security.h"
#include "protocol/coordinator_call.h"
#include "server/agent/holdings_reporter.h"
#include "server/agent/items.h"
#include "server/agent/memory_tier.h"
#include "server/agent/peer_client.h"
#include "server/agent/peer_loader.h"
#include "server/agent/peer_server.h"
#include "server/agent/persister.h"
#include "server/agent/replicator.h"
#include "server/agent/staging_pool.h"
#include "server/agent/transport/nccl/device_link.h"
#include "server/agent/transport/transport.h"

namespace cairn::agent {

struct AgentOptions {
  // This node's id in [0, num_nodes). Required.
  int node_id = -1;
  // Number of agents (nodes) in the cluster. Default: 1.
  int num_nodes = 1;
  // cairnd's address. Required.
  std::string coordinator;
  // TLS and token for the calls to cairnd. Default: none.
  protocol::ClientSecurity coordinator_security;
  // How long a save's call to cairnd may try to reach a cairnd that never
  // answered this agent (then UNAVAILABLE naming the address); once it has
  // answered, a restart is retried as in libcairn (CallWithRetry).
  // Default: 5 s (protocol::kDefaultFirstContactTimeout).
  absl::Duration coordinator_first_contact_timeout =
      protocol::kDefaultFirstContactTimeout;
  // Bytes of staging + tier 0 + replica memory this agent may hold.
  // Default: 1 GiB.
  uint64_t staging_budget_bytes = uint64_t{1} << 30;
  // Peer agents each committed tier 0 is replicated to (< num_nodes).
  // Default: 0.
  int replicas = 0;
  // Peer transport listen address. Default: 127.0.0.1:0.
  std::string peer_listen = "127.0.0.1:0";
  // The peer transport (cairn-agent --transport): kTcp moves bulk bytes over
  // TCP sockets; kNccl stages them into GPU memory and moves them with
  // ncclSend/ncclRecv through `device_link` (required then), its control
  // messages over TCP on peer_listen. Every agent of a cluster must use the
  // same. Default: kTcp.
  enum class TransportKind { kTcp, kNccl };
  TransportKind transport = TransportKind::kTcp;
  std::unique_ptr<DeviceLink> device_link;
  // Shared secret every peer agent must present when it connects (see
  // TcpTransportOptions::peer_token; also nccl's control). Default: empty (none
  // required).
  std::string peer_token;
  // Mutual TLS of the peer transport (TcpTransportOptions::tls_*; also
  // nccl's control): PEM CA bundle, this node's certificate and key. All
  // three or none. Default: none.
  std::string peer_tls_ca_file;
  std::string peer_tls_cert_file;
  std::string peer_tls_key_file;
  // Returns node n's peer address. Required when num_nodes > 1.
  std::function<absl::StatusOr<std::string>(int node)> resolve_peer;
  // How long BeginStage waits for staging space by default. Default: 10 min.
  absl::Duration wait_for_space = absl::Minutes(10);
  // How long connecting to a peer may retry (a lost node costs a load at
  // most this much before its holders are skipped). Default: 1 s.
  absl::Duration peer_connect_timeout = absl::Seconds(1);
  // Peer port connections open at once from one IP address, and in all
  // (TcpTransportOptions::max_connections_per_address, max_connections; 0
  // in all: max_pending_connections + 2 x num_nodes). Default: 16, 0.
  int peer_max_connections_per_address = 16;
  int peer_max_connections = 0;
  // Timeout of a peer exchange (push, inventory, fetch). Default: 30 s.
  absl::Duration peer_timeout = absl::Seconds(30);
  // Transfer-plan bucket cap for replication and peer load; also the largest
  // peer frame this agent accepts (bigger messages are split). Default:
  // 32 MiB.
  uint64_t bucket_cap_bytes = uint64_t{32} << 20;
  // Bucket size of streaming saves: min(this, budget / 2), 4 KiB granules.
  // Default: 64 MiB.
  uint64_t stream_bucket_bytes = uint64_t{64} << 20;
  // A streaming save whose rank makes no call for this long while the agent
  // waits on it is aborted. Default: 60 s.
  absl::Duration stream_idle_timeout = absl::Seconds(60);
  // Copier for GPU items (cuda); null rejects GPU items FAILED_PRECONDITION.
  std::unique_ptr<copier::DeviceCopier> device_copier;
  // Group owning the shared-memory segments ranks map (staging, loads);
  // they are 0660 for it. -1: segments are 0600 (the agent's user only).
  // AgentServer sets it to its socket group. Default: -1.
  gid_t shm_group = static_cast<gid_t>(-1);
  // Parallel object writes of one rank's persist, and the options of the
  // store it writes to. Default: 4 threads, StoreOptions's defaults.
  int io_threads = 4;
  storage::StoreOptions store;
  // How often the agent tells cairnd what it holds in memory (its
  // heartbeat for memory checkpoints; HoldingsReporter). Zero: never (an
  // agent that holds no memory checkpoint). Default: 1 s.
  absl::Duration holdings_report_interval = absl::Seconds(1);
};

class Agent {
 public:
  static absl::StatusOr<std::unique_ptr<Agent>> Start(AgentOptions options);
  // Stops the transport and waits for in-flight persists.
  ~Agent();
  Agent(const Agent&) = delete;
  Agent& operator=(const Agent&) = delete;

  // `caller_gone` (optional): whether the rank gave up on the call (its RPC
  // was cancelled); a wait for staging space then ends CANCELLED, and space
  // reserved for it is freed.
  absl::StatusOr<v1::BeginStageResponse> BeginStage(
      const v1::BeginStageRequest& request,
      const std::function<bool()>& caller_gone = nullptr);
  absl::StatusOr<v1::StageBucketResponse> StageBucket(
      const v1::StageBucketRequest& request,
      const std::function<bool()>& caller_gone = nullptr);
  absl::Status FinishStage(const v1::FinishStageRequest& request);
  absl::StatusOr<v1::CheckpointRecord> WaitSave(
      const v1::WaitSaveRequest& request);
  // The rank cancelled its save (AgentCheckpointer::Cancel): a staged set is
  // dropped, a streaming save fails, a persist stops (its save protocol is
  // cancelled: aborted at cairnd once joined there, unless every rank has
  // committed). WaitSave then reports the outcome. OK when there is no such
  // save (done, never staged, or another process's: `incarnation`).
  absl::Status CancelSave(const v1::CancelSaveRequest& request);
  absl::StatusOr<v1::AgentLoadResponse> Load(
      const v1::AgentLoadRequest& request);
  absl::Status ReleaseLoad(uint64_t load_id);
  v1::AgentStatusResponse Status();

  int peer_port() const { return transport_->port(); }
  // Re-reads the peer TLS files for new peer connections (SIGHUP).
  absl::Status ReloadPeerTls() { return transport_->ReloadTls(); }
  size_t peer_mailbox_size_for_test() { return transport_->mailbox_size(); }
  Transport& peer_transport_for_test() { return *transport_; }
  const AgentOptions& options() const { return options_; }
  // This agent's Prometheus metrics (cairn-agent serves them on
  // --metrics-listen; docs/operations.md "Metrics" lists them).
  metrics::Registry& metrics() { return *metrics_; }

 private:
  explicit Agent(AgentOptions options);
  // OK once `bytes` of staging fit the budget beside the pinned memory
  // checkpoints (waiting up to a few report intervals for cairnd's drops);
  // RESOURCE_EXHAUSTED naming `where`, the budget and what is pinned.
  absl::Status AwaitRoomBesidePinned(const std::string& where, uint64_t bytes);

  // Metrics (agent_metrics.cc): registered in Start, once pool_ exists.
  void RegisterMetrics();
  // Declared first: destroyed last (scrape callbacks read the members).
  std::unique_ptr<metrics::Registry> metrics_ =
      std::make_unique<metrics::Registry>();
  Persister::Metrics persist_metrics_;

  // Constant after construction.
  AgentOptions options_;
  std::unique_ptr<StagingPool> pool_;
  // Tier 0 and peers' replicas; evicted by pool_ when it needs room.
  MemoryTier tier_;
  std::unique_ptr<Transport> transport_;
  // The peer side, over transport_: calls to peers, what this agent serves
  // them (set once transport_ exists; control messages that come before
  // are dropped: the peer's call times out), replication and loads from
  // memory.
  std::unique_ptr<PeerClient> peers_;
  std::unique_ptr<PeerServer> peer_server_;
  std::atomic<PeerServer*> serving_{nullptr};
  std::unique_ptr<Replicator> replicator_;
  std::unique_ptr<PeerLoader> loader_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Coordinator::Stub> coordinator_;
  // Whether cairnd has answered on channel_ (the save protocols' retries).
  std::unique_ptr<protocol::CoordinatorContact> coordinator_contact_;
  // Persists and streams the saves handed over (after coordinator_).
  std::unique_ptr<Persister> persister_;
  // Reports tier_ to cairnd; stopped first.
  std::unique_ptr<HoldingsReporter> reporter_;

  std::atomic<uint64_t> next_id_{1};
  // Buckets streaming saves have handed out (AgentStatusResponse).
  std::atomic<int64_t> streamed_buckets_{0};

  absl::Mutex mu_;
  // Sets being staged by their ranks (BeginStage until FinishStage), by
  // save id.
  std::map<uint64_t, std::shared_ptr<ItemSet>> staging_ ABSL_GUARDED_BY(mu_);
};

}  // namespace cairn::agent

#endif  // CAIRN_SERVER_AGENT_AGENT_H_
