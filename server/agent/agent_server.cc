#include "server/agent/agent_server.h"

#include <errno.h>
#include <grp.h>
#include <poll.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "cairn/v1/agent.grpc.pb.h"
#include "common/grpc_health_server.h"
#include "common/grpc_metrics.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "common/unique_fd.h"
#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/resource_quota.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"
#include "grpcpp/server_posix.h"

#ifndef SO_PEERGROUPS
#define SO_PEERGROUPS 59
#endif

namespace cairn::agent {
namespace {

// A group name or number; -1 for "".
absl::StatusOr<gid_t> ResolveGroup(const std::string& name) {
  if (name.empty()) return static_cast<gid_t>(-1);
  uint32_t id = 0;
  if (absl::SimpleAtoi(name, &id)) return static_cast<gid_t>(id);
  std::vector<char> buf(1 << 16);
  struct group g;
  struct group* found = nullptr;
  if (getgrnam_r(name.c_str(), &g, buf.data(), buf.size(), &found) != 0 ||
      found == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("--socket-group '", name, "' is not a known group"));
  }
  return found->gr_gid;
}

absl::StatusOr<sockaddr_un> UnixAddress(const std::string& path) {
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(sa.sun_path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("unix socket path '", path, "' must have 1 to ",
                     sizeof(sa.sun_path) - 1, " bytes"));
  }
  std::memcpy(sa.sun_path, path.data(), path.size());
  return sa;
}

// Whether the process at the other end of `fd` may use the agent: the
// agent's own user, root, or a member (primary or supplementary) of
// `group` when one is configured.
bool PeerAllowed(int fd, gid_t group, ucred* cred) {
  socklen_t len = sizeof(*cred);
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, cred, &len) != 0) return false;
  if (cred->uid == geteuid() || cred->uid == 0) return true;
  if (group == static_cast<gid_t>(-1)) return false;
  if (cred->gid == group) return true;
  std::vector<gid_t> groups(64);
  socklen_t glen = static_cast<socklen_t>(groups.size() * sizeof(gid_t));
  if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups.data(), &glen) != 0) {
    if (errno != ERANGE) return false;
    groups.resize(glen / sizeof(gid_t) + 1);
    glen = static_cast<socklen_t>(groups.size() * sizeof(gid_t));
    if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups.data(), &glen) != 0) {
      return false;
    }
  }
  groups.resize(glen / sizeof(gid_t));
  for (gid_t g : groups) {
    if (g == group) return true;
  }
  return false;
}

// Connections over a cap held (answered) at once; more are closed.
constexpr size_t kMaxRefusedHeld = 256;

// Whether `fd` is still the socket recorded as `c`: once gRPC closes it,
// its number is free for the next socket or file, with another inode.
template <typename C>
bool Open(int fd, const C& c) {
  struct stat st;
  return fstat(fd, &st) == 0 && st.st_dev == c.dev && st.st_ino == c.ino;
}

}  // namespace

// The service of connections over a cap: every call is answered at once
// with RESOURCE_EXHAUSTED and why (its request is never read).
class AgentServer::Refusals final : public grpc::CallbackGenericService {
 public:
  // Calls on the connection at `fd` are refused saying `why`.
  void Set(int fd, std::string why) {
    absl::MutexLock l(&mu_);
    why_[absl::StrCat("fd:", fd)] = std::move(why);
  }

  grpc::ServerGenericBidiReactor* CreateReactor(
      grpc::GenericCallbackServerContext* ctx) override {
    std::string why = "cairn-agent: this connection is over a connection cap";
    {
      absl::MutexLock l(&mu_);
      // gRPC names a connection handed over by its fd ("fd:N").
      auto it = why_.find(ctx->peer());
      if (it != why_.end()) why = it->second;
    }
    return new Refuse(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, why));
  }

 private:
  class Refuse final : public grpc::ServerGenericBidiReactor {
   public:
    explicit Refuse(grpc::Status status) { Finish(std::move(status)); }
    void OnDone() override { delete this; }
  };

  absl::Mutex mu_;
  // By gRPC peer name; one entry per fd number at most.
  std::map<std::string, std::string> why_ ABSL_GUARDED_BY(mu_);
};

// Sync service: every call may block (waiting for staging space, for a
// commit, for peers) on gRPC's thread pool, never on a shared event loop.
class AgentServer::Service final : public v1::Agent::Service {
 public:
  explicit Service(Agent* agent) : agent_(agent) {}

  // A rank that gives up on a call (cancels it, or its process dies) stops
  // the waits for staging space made for it.
  grpc::Status BeginStage(grpc::ServerContext* ctx,
                          const v1::BeginStageRequest* req,
                          v1::BeginStageResponse* resp) override {
    return Reply(agent_->BeginStage(*req, [ctx] { return ctx->IsCancelled(); }),
                 resp);
  }
  grpc::Status StageBucket(grpc::ServerContext* ctx,
                           const v1::StageBucketRequest* req,
                           v1::StageBucketResponse* resp) override {
    return Reply(
        agent_->StageBucket(*req, [ctx] { return ctx->IsCancelled(); }), resp);
  }
  grpc::Status FinishStage(grpc::ServerContext*,
                           const v1::FinishStageRequest* req,
                           v1::FinishStageResponse*) override {
    return ToGrpcStatus(agent_->FinishStage(*req));
  }
  grpc::Status WaitSave(grpc::ServerContext*, const v1::WaitSaveRequest* req,
                        v1::WaitSaveResponse* resp) override {
    absl::StatusOr<v1::CheckpointRecord> r = agent_->WaitSave(*req);
    if (!r.ok()) return ToGrpcStatus(r.status());
    *resp->mutable_checkpoint() = std::move(*r);
    return grpc::Status::OK;
  }
  grpc::Status CancelSave(grpc::ServerContext*,
                          const v1::CancelSaveRequest* req,
                          v1::CancelSaveResponse*) override {
    return ToGrpcStatus(agent_->CancelSave(*req));
  }
  grpc::Status Load(grpc::ServerContext* ctx, const v1::AgentLoadRequest* req,
                    v1::AgentLoadResponse* resp) override {
    absl::StatusOr<v1::AgentLoadResponse> r = agent_->Load(*req);
    if (r.ok() && r->unserved_code() == 0 && ctx->IsCancelled()) {
      // The rank gave up on the load (cancelled it): it never releases the
      // segment it would have read, so release it here.
      (void)agent_->ReleaseLoad(r->load_id());
      return grpc::Status(grpc::StatusCode::CANCELLED,
                          "the rank cancelled the load");
    }
    return Reply(std::move(r), resp);
  }
  grpc::Status ReleaseLoad(grpc::ServerContext*,
                           const v1::ReleaseLoadRequest* req,
                           v1::ReleaseLoadResponse*) override {
    return ToGrpcStatus(agent_->ReleaseLoad(req->load_id()));
  }
  grpc::Status Status(grpc::ServerContext*, const v1::AgentStatusRequest*,
                      v1::AgentStatusResponse* resp) override {
    *resp = agent_->Status();
    return grpc::Status::OK;
  }

 private:
  template <typename T>
  static grpc::Status Reply(absl::StatusOr<T> r, T* resp) {
    if (!r.ok()) return ToGrpcStatus(r.status());
    *resp = std::move(*r);
    return grpc::Status::OK;
  }
  Agent* agent_;
};

absl::StatusOr<std::unique_ptr<AgentServer>> AgentServer::Start(Spec spec) {
  if (spec.unix_socket.empty()) {
    return absl::InvalidArgumentError("agent needs --listen-unix PATH");
  }
  if ((spec.socket_mode & ~mode_t{0777}) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("--socket-mode ",
                                                   absl::Hex(spec.socket_mode),
                                                   " has bits beyond 0777"));
  }
  CAIRN_ASSIGN_OR_RETURN(const gid_t group, ResolveGroup(spec.socket_group));
  CAIRN_RETURN_IF_ERROR(UnixAddress(spec.unix_socket).status());
  std::unique_ptr<AgentServer> s(new AgentServer());
  s->group_ = group;
  spec.agent.shm_group = group;
  CAIRN_ASSIGN_OR_RETURN(s->agent_, Agent::Start(std::move(spec.agent)));
  s->service_ = std::make_unique<Service>(s->agent_.get());
  s->target_ = absl::StrCat("unix:", spec.unix_socket);
  // No listening port: connections are accepted below, checked, and handed
  // to gRPC one by one.
  if (spec.max_request_memory_bytes < (int64_t{16} << 20) ||
      spec.max_streams_per_connection < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the agent's request memory budget must be at least 16 MiB (not ",
        spec.max_request_memory_bytes,
        " bytes) and its streams per connection at least 1 (not ",
        spec.max_streams_per_connection, ")"));
  }
  if (spec.max_connections_per_uid < 1 || spec.max_connections < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("the agent's connection caps must be at least 1 (not ",
                     spec.max_connections_per_uid, " per uid and ",
                     spec.max_connections, " in all)"));
  }
  s->max_connections_per_uid_ = spec.max_connections_per_uid;
  s->max_connections_ = spec.max_connections;
  grpc::ServerBuilder builder;
  builder.SetMaxReceiveMessageSize(1 << 30);
  builder.SetMaxSendMessageSize(1 << 30);
  // Connections handed over with AddInsecureChannelFromFd draw on the
  // server's quota too.
  grpc::ResourceQuota quota("cairn-agent-requests");
  quota.Resize(static_cast<size_t>(spec.max_request_memory_bytes));
  builder.SetResourceQuota(quota);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS,
                             spec.max_streams_per_connection);
  builder.RegisterService(s->service_.get());
  std::vector<
      std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
      interceptors;
  interceptors.push_back(
      metrics::RpcMetricsInterceptorFactory(&s->agent_->metrics()));
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  s->server_ = builder.BuildAndStart();
  if (s->server_ == nullptr) {
    return absl::InternalError("cannot start the agent's gRPC server");
  }
  {
    // Small and short-lived: its connections are refused ones, each gone
    // within seconds, their requests never read.
    s->refusals_ = std::make_unique<Refusals>();
    grpc::ServerBuilder refusal;
    grpc::ResourceQuota refusal_quota("cairn-agent-refusals");
    refusal_quota.Resize(size_t{16} << 20);
    refusal.SetResourceQuota(refusal_quota);
    refusal.SetMaxReceiveMessageSize(4096);
    refusal.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, 16);
    refusal.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_MS, 2000);
    refusal.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_GRACE_MS, 1000);
    refusal.RegisterCallbackGenericService(s->refusals_.get());
    s->refusal_server_ = refusal.BuildAndStart();
    if (s->refusal_server_ == nullptr) {
      return absl::InternalError(
          "cannot start the agent's gRPC server for refused connections");
    }
  }
  CAIRN_RETURN_IF_ERROR(s->Listen(spec, group));
  s->acceptor_ = std::thread([p = s.get()] { p->AcceptLoop(); });
  if (!spec.health_listen.empty()) {
    CAIRN_ASSIGN_OR_RETURN(s->health_server_,
                           HealthOnlyServer::Start(spec.health_listen));
    s->health_server_->SetServing(true);
  }
  if (!spec.metrics_listen.empty()) {
    absl::StatusOr<std::unique_ptr<metrics::MetricsHttpServer>> http =
        metrics::MetricsHttpServer::Start(spec.metrics_listen,
                                          &s->agent_->metrics());
    if (!http.ok()) {
      return absl::Status(
          http.status().code(),
          absl::StrCat("--metrics-listen: ", http.status().message()));
    }
    s->metrics_http_ = std::move(*http);
  }
  return s;
}

absl::Status AgentServer::Listen(const Spec& spec, gid_t group) {
  const std::string& path = spec.unix_socket;
  CAIRN_ASSIGN_OR_RETURN(sockaddr_un final_sa, UnixAddress(path));
  struct stat existing;
  if (lstat(path.c_str(), &existing) == 0 && !S_ISSOCK(existing.st_mode)) {
    // Only a socket (a previous agent's) is ever replaced.
    return absl::FailedPreconditionError(
        absl::StrCat(path,
                     " exists and is not a socket; choose another "
                     "--listen-unix"));
  }
  {
    // A live agent on this path keeps it; a dead one's socket is replaced.
    const UniqueFd probe(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    const bool live =
        connect(probe.get(), reinterpret_cast<sockaddr*>(&final_sa),
                sizeof(final_sa)) == 0;
    if (live) {
      return absl::FailedPreconditionError(
          absl::StrCat("another process is serving on ", path,
                       "; stop it or choose another --listen-unix"));
    }
  }
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "."
                          : slash == 0               ? "/"
                                                     : path.substr(0, slash);
  std::string tmp_dir = absl::StrCat(dir, "/.cairn-agent-XXXXXX");
  if (mkdtemp(tmp_dir.data()) == nullptr) {
    return absl::ErrnoToStatus(
        errno, absl::StrCat("creating a private directory in ", dir,
                            " for the socket ", path));
  }
  const std::string tmp_path = tmp_dir + "/s";
  absl::Status status;
  UniqueFd fd;
  absl::StatusOr<sockaddr_un> sa = UnixAddress(tmp_path);
  if (!sa.ok()) {
    status = absl::InvalidArgumentError(absl::StrCat(
        "socket path ", path, " is too long to be created safely (",
        sa.status().message(), ")"));
  } else {
    fd.Reset(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    struct stat st;
    if (!fd.valid() || bind(fd.get(), reinterpret_cast<const sockaddr*>(&*sa),
                            sizeof(*sa)) != 0) {
      status = absl::ErrnoToStatus(errno, absl::StrCat("binding ", tmp_path));
    } else if (group != static_cast<gid_t>(-1) &&
               chown(tmp_path.c_str(), static_cast<uid_t>(-1), group) != 0) {
      status = absl::ErrnoToStatus(
          errno, absl::StrCat("giving socket ", path, " to group ",
                              spec.socket_group));
    } else if (chmod(tmp_path.c_str(), spec.socket_mode) != 0 ||
               listen(fd.get(), 128) != 0) {
      status = absl::ErrnoToStatus(errno, absl::StrCat("socket ", tmp_path));
    } else if (rename(tmp_path.c_str(), path.c_str()) != 0) {
      status = absl::ErrnoToStatus(
          errno, absl::StrCat("moving the socket into place at ", path));
    } else if (stat(path.c_str(), &st) == 0) {
      socket_dev_ = st.st_dev;
      socket_ino_ = st.st_ino;
    }
  }
  if (!status.ok()) {
    fd.Reset();
    unlink(tmp_path.c_str());
  }
  rmdir(tmp_dir.c_str());
  if (!status.ok()) return status;
  listen_fd_ = std::move(fd);
  socket_path_ = path;
  wake_fd_.Reset(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake_fd_.valid()) return absl::ErrnoToStatus(errno, "eventfd");
  return absl::OkStatus();
}

void AgentServer::AcceptLoop() {
  absl::Time last_log = absl::InfinitePast();
  int64_t unlogged = 0;
  absl::Time last_over_cap_log = absl::InfinitePast();
  int64_t unlogged_over_cap = 0;
  while (true) {
    pollfd fds[2] = {{listen_fd_.get(), POLLIN, 0},
                     {wake_fd_.get(), POLLIN, 0}};
    const int n = poll(fds, 2, -1);
    if (n < 0 && errno != EINTR) {
      CAIRN_LOG(error, "agent socket {}: poll: {}", socket_path_,
                strerror(errno));
      return;
    }
    if (n > 0 && fds[1].revents != 0) return;  // Shutdown
    while (true) {
      UniqueFd fd(accept4(listen_fd_.get(), nullptr, nullptr,
                          SOCK_CLOEXEC | SOCK_NONBLOCK));
      if (!fd.valid()) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno == EMFILE || errno == ENFILE) {
          CAIRN_LOG(warn, "agent socket {}: accept: {}", socket_path_,
                    strerror(errno));
          absl::SleepFor(absl::Milliseconds(10));  // back off, then retry
        }
        break;
      }
      ucred cred{};
      if (!PeerAllowed(fd.get(), group_, &cred)) {
        ++refused_;
        ++unlogged;
        if (absl::Now() - last_log >= absl::Seconds(1)) {
          CAIRN_LOG(warn,
                    "agent socket {}: refused a connection from pid {} uid {} "
                    "gid {}: only uid {}, root{} are served ({} refused since "
                    "the last such line)",
                    socket_path_, cred.pid, cred.uid, cred.gid, geteuid(),
                    group_ == static_cast<gid_t>(-1)
                        ? std::string()
                        : absl::StrCat(" and group ", group_),
                    unlogged - 1);
          last_log = absl::Now();
          unlogged = 0;
        }
        continue;  // fd closed
      }
      if (const std::string why = OverCap(cred); !why.empty()) {
        ++over_cap_;
        ++unlogged_over_cap;
        if (absl::Now() - last_over_cap_log >= absl::Seconds(1)) {
          CAIRN_LOG(warn, "{} ({} more since the last such line)", why,
                    unlogged_over_cap - 1);
          last_over_cap_log = absl::Now();
          unlogged_over_cap = 0;
        }
        // Answered (for a while) rather than reset, so the rank learns why;
        // past a few hundred such at once, closed.
        for (auto it = refused_conns_.begin(); it != refused_conns_.end();) {
          it = Open(it->first, it->second) ? std::next(it)
                                           : refused_conns_.erase(it);
        }
        if (refused_conns_.size() >= kMaxRefusedHeld) continue;  // fd closed
        refusals_->Set(fd.get(), why);
        Hand(refusal_server_.get(), std::move(fd), cred.uid, &refused_conns_);
        continue;
      }
      Hand(server_.get(), std::move(fd), cred.uid, &conns_);
    }
  }
}

std::string AgentServer::OverCap(const ucred& cred) {
  auto count = [&] {
    int from_uid = 0;
    for (const auto& [fd, c] : conns_) from_uid += c.uid == cred.uid ? 1 : 0;
    return from_uid;
  };
  int from_uid = count();
  if (from_uid < max_connections_per_uid_ &&
      static_cast<int>(conns_.size()) < max_connections_) {
    return "";
  }
  // Entries of connections gRPC has closed since stay until an fd number is
  // reused: count only the open ones.
  for (auto it = conns_.begin(); it != conns_.end();) {
    it = Open(it->first, it->second) ? std::next(it) : conns_.erase(it);
  }
  from_uid = count();
  if (from_uid >= max_connections_per_uid_) {
    return absl::StrCat("agent socket ", socket_path_,
                        ": refused a connection from pid ", cred.pid, " uid ",
                        cred.uid, ": uid ", cred.uid, " has ", from_uid,
                        " connections open, the most one uid may have "
                        "(--max-connections-per-uid ",
                        max_connections_per_uid_, ")");
  }
  if (static_cast<int>(conns_.size()) >= max_connections_) {
    return absl::StrCat("agent socket ", socket_path_,
                        ": refused a connection from pid ", cred.pid, " uid ",
                        cred.uid, ": ", conns_.size(),
                        " connections are open, the most the agent takes "
                        "(--max-connections ",
                        max_connections_, ")");
  }
  return "";
}

void AgentServer::Hand(grpc::Server* server, UniqueFd fd, uid_t uid,
                       std::map<int, Conn>* conns) {
  struct stat st;
  if (fstat(fd.get(), &st) != 0) return;  // fd closed
  // Recorded before gRPC has it: it may close it at once.
  (*conns)[fd.get()] = Conn{st.st_dev, st.st_ino, uid};
  // gRPC owns the descriptor from here on.
  grpc::AddInsecureChannelFromFd(server, fd.Release());
}

AgentServer::~AgentServer() { Shutdown(); }

void AgentServer::Shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  if (health_server_) {
    // Draining: probes and balancers see NOT_SERVING while it lasts.
    health_server_->SetServing(false);
  }
  if (acceptor_.joinable()) {
    const uint64_t one = 1;
    (void)!write(wake_fd_.get(), &one, sizeof(one));
    acceptor_.join();
  }
  if (listen_fd_.valid()) {
    listen_fd_.Reset();
    // Remove the socket file unless a newer agent has replaced it.
    struct stat st;
    if (stat(socket_path_.c_str(), &st) == 0 && st.st_dev == socket_dev_ &&
        st.st_ino == socket_ino_) {
      unlink(socket_path_.c_str());
    }
  }
  wake_fd_.Reset();
  if (server_) {
    server_->Shutdown(std::chrono::system_clock::now() +
                      std::chrono::seconds(2));
  }
  if (refusal_server_) {
    refusal_server_->Shutdown(std::chrono::system_clock::now());
  }
  if (health_server_) {
    health_server_->Shutdown(absl::Seconds(1));
  }
}

void AgentServer::Wait() {
  if (server_) server_->Wait();
}

}  // namespace cairn::agent
