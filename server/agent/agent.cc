// The agent's lifecycle (Start: options, then its components: staging pool,
// memory tier, peer transport and the peer side, cairnd's channel, the
// persister; shutdown in the reverse order) and its status counters.
#include "server/agent/agent.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "protocol/coordinator_call.h"
#include "server/agent/transport/nccl/nccl_transport.h"
#include "server/agent/transport/tcp/tcp_transport.h"

namespace cairn::agent {

Agent::Agent(AgentOptions options)
    : options_(std::move(options)), tier_(options_.node_id) {}

absl::StatusOr<std::unique_ptr<Agent>> Agent::Start(AgentOptions options) {
  if (options.node_id < 0 || options.num_nodes < 1 ||
      options.node_id >= options.num_nodes) {
    return absl::InvalidArgumentError(
        absl::StrCat("agent node id ", options.node_id, " is out of range for ",
                     options.num_nodes, " nodes"));
  }
  if (options.replicas < 0 || options.replicas >= options.num_nodes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "agent node ", options.node_id, ": --replicas ", options.replicas,
        " must be < the number of nodes (", options.num_nodes,
        "): replicas never live on the same node"));
  }
  if (options.coordinator.empty()) {
    return absl::InvalidArgumentError("agent needs cairnd's address");
  }
  if (!options.resolve_peer) {
    options.resolve_peer = [](int node) -> absl::StatusOr<std::string> {
      return absl::NotFoundError(absl::StrCat("no address for node ", node));
    };
  }
  std::unique_ptr<Agent> a(new Agent(std::move(options)));
  StagingPool::Options pool;
  pool.node_id = a->options_.node_id;
  pool.budget_bytes = a->options_.staging_budget_bytes;
  pool.shm_group = a->options_.shm_group;
  pool.evict = [p = a.get()] { return p->tier_.EvictOldest(); };
  CAIRN_ASSIGN_OR_RETURN(a->pool_, StagingPool::Create(std::move(pool)));
  a->RegisterMetrics();

  TcpTransportOptions t;
  t.node_id = a->options_.node_id;
  t.listen_address = a->options_.peer_listen;
  t.resolve_peer = a->options_.resolve_peer;
  t.control_handler = [p = a.get()](int peer, uint64_t tag,
                                    const std::string& m) {
    PeerServer* server = p->serving_.load();
    if (server == nullptr) {
      CAIRN_LOG(warn,
                "node {}: control message from node {} before the "
                "agent serves peers: dropped",
                p->options_.node_id, peer);
      return;
    }
    server->Handle(peer, tag, m);
  };
  t.control_threads = 8;
  t.connect_timeout = a->options_.peer_connect_timeout;
  t.num_nodes = a->options_.num_nodes;
  t.peer_token = a->options_.peer_token;
  t.tls_ca_file = a->options_.peer_tls_ca_file;
  t.tls_cert_file = a->options_.peer_tls_cert_file;
  t.tls_key_file = a->options_.peer_tls_key_file;
  // Frames carry at most one transfer bucket (larger messages are split).
  t.max_frame_bytes = std::clamp<uint64_t>(a->options_.bucket_cap_bytes,
                                           kMinFrameBytes, uint64_t{1} << 30);
  // A peer's data messages waiting for their Recv: the replicas it pushes
  // (at most its staging budget, the same as this one's) and its answers
  // to this node's fetches (at most this budget, allocated before asking),
  // in messages of a bucket or a large item each.
  const uint64_t budget = a->options_.staging_budget_bytes;
  t.max_mailbox_bytes = std::max<uint64_t>(2 * budget, uint64_t{64} << 20);
  t.max_mailbox_messages = static_cast<int>(std::min<uint64_t>(
      65536 + 2 * budget / std::max<uint64_t>(a->options_.bucket_cap_bytes, 1),
      std::numeric_limits<int>::max()));
  t.max_connections_per_address = a->options_.peer_max_connections_per_address;
  t.max_connections = a->options_.peer_max_connections;
  switch (a->options_.transport) {
    case AgentOptions::TransportKind::kTcp: {
      CAIRN_ASSIGN_OR_RETURN(a->transport_, TcpTransport::Start(std::move(t)));
      break;
    }
    case AgentOptions::TransportKind::kNccl: {
      if (a->options_.device_link == nullptr) {
        return absl::FailedPreconditionError(absl::StrCat(
            "agent node ", a->options_.node_id,
            ": --transport=nccl needs a device link (a CUDA build with a "
            "GPU)"));
      }
      NcclTransportOptions n;
      n.control = std::move(t);
      n.max_message_bytes = a->options_.staging_budget_bytes;
      CAIRN_ASSIGN_OR_RETURN(
          a->transport_, NcclTransport::Start(
                             std::move(n), std::move(a->options_.device_link)));
      break;
    }
  }

  a->peers_ = std::make_unique<PeerClient>(*a->transport_, a->options_.node_id,
                                           a->options_.peer_timeout);
  PeerServer::Options serve;
  serve.node_id = a->options_.node_id;
  serve.peer_timeout = a->options_.peer_timeout;
  serve.received_bytes = a->persist_metrics_.replication_received_bytes;
  a->peer_server_ =
      std::make_unique<PeerServer>(serve, *a->transport_, a->tier_, *a->pool_);
  a->replicator_ =
      std::make_unique<Replicator>(*a->peers_, a->options_.bucket_cap_bytes);
  PeerLoader::Options load;
  load.node_id = a->options_.node_id;
  load.num_nodes = a->options_.num_nodes;
  load.bucket_cap_bytes = a->options_.bucket_cap_bytes;
  load.peer_timeout = a->options_.peer_timeout;
  a->loader_ =
      std::make_unique<PeerLoader>(load, *a->peers_, a->tier_, *a->pool_);
  a->serving_ = a->peer_server_.get();

  // One channel to cairnd for loads and for the save protocol.
  CAIRN_ASSIGN_OR_RETURN(a->channel_, protocol::NewCoordinatorChannel(
                                          a->options_.coordinator,
                                          a->options_.coordinator_security));
  a->coordinator_ = v1::Coordinator::NewStub(a->channel_);
  a->coordinator_contact_ = std::make_unique<protocol::CoordinatorContact>(
      a->channel_, a->options_.coordinator,
      a->options_.coordinator_first_contact_timeout);

  Persister::Options persist;
  persist.node_id = a->options_.node_id;
  persist.num_nodes = a->options_.num_nodes;
  persist.replicas = a->options_.replicas;
  persist.io_threads = a->options_.io_threads;
  persist.store = a->options_.store;
  persist.metrics = a->persist_metrics_;
  a->persister_ = std::make_unique<Persister>(
      persist, a->coordinator_.get(), a->coordinator_contact_.get(), a->tier_,
      [r = a->replicator_.get()](const ItemSet& set, int peer) {
        return r->Push(set, peer);
      });
  if (a->options_.holdings_report_interval > absl::ZeroDuration()) {
    HoldingsReporter::Options report;
    report.node_id = a->options_.node_id;
    report.num_nodes = a->options_.num_nodes;
    report.interval = a->options_.holdings_report_interval;
    report.budget_bytes = [p = a->pool_.get()] { return p->budget(); };
    report.used_bytes = [p = a->pool_.get()] { return p->stats().used_bytes; };
    report.persist = [p = a->persister_.get()](const v1::PersistOrder& o) {
      return p->WriteHeld(o.job(), o.step(), o.rank());
    };
    report.replicate = [p = a.get()](const v1::ReplicateOrder& o) {
      std::shared_ptr<const ItemSet> set =
          p->tier_.FindSet(o.job(), o.step(), o.rank());
      if (set == nullptr) {
        return absl::NotFoundError(absl::StrCat(
            "node ", p->options_.node_id, " holds no shards of ",
            internal::Where(o.job(), o.step(), o.rank()), " to replicate"));
      }
      return p->replicator_->Push(*set, o.to_node());
    };
    a->reporter_ = std::make_unique<HoldingsReporter>(
        std::move(report), a->coordinator_.get(), a->tier_);
  }
  return a;
}

Agent::~Agent() {
  if (reporter_ != nullptr) reporter_->Stop();
  // Persists push replicas through the transport: they end first.
  if (persister_ != nullptr) persister_->Stop();
  // The transport's threads call the peer server: stop them next.
  serving_ = nullptr;
  transport_.reset();
  if (loader_ != nullptr) loader_->Clear();
  tier_.Clear();
  absl::MutexLock l(&mu_);
  staging_.clear();
}

v1::AgentStatusResponse Agent::Status() {
  v1::AgentStatusResponse r;
  r.set_node_id(options_.node_id);
  r.set_budget_bytes(pool_->budget());
  const StagingPool::Stats pool = pool_->stats();
  r.set_used_bytes(pool.used_bytes);
  r.set_peak_used_bytes(pool.peak_used_bytes);
  r.set_streamed_buckets(streamed_buckets_.load());
  const MemoryTier::Counts held = tier_.counts();
  r.set_tier0_sets(held.tier0_sets);
  r.set_replica_sets(held.replica_sets);
  r.set_memory_sets(held.memory_sets);
  r.set_memory_bytes(held.memory_bytes);
  const Persister::Counts persisted = persister_->counts();
  r.set_commits(persisted.commits);
  r.set_replicas_pushed(persisted.replicas_pushed);
  r.set_streamed_saves(persisted.streamed_saves);
  return r;
}

}  // namespace cairn::agent
