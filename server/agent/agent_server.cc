#include "server/agent/agent_server.h"

#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "cairn/v1/agent.grpc.pb.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"

namespace cairn::agent {

// Sync service: every call may block (waiting for staging space, for a
// commit, for peers) on gRPC's thread pool, never on a shared event loop.
class AgentServer::Service final : public v1::Agent::Service {
 public:
  explicit Service(Agent* agent) : agent_(agent) {}

  grpc::Status BeginStage(grpc::ServerContext*,
                          const v1::BeginStageRequest* req,
                          v1::BeginStageResponse* resp) override {
    return Reply(agent_->BeginStage(*req), resp);
  }
  grpc::Status StageBucket(grpc::ServerContext*,
                           const v1::StageBucketRequest* req,
                           v1::StageBucketResponse* resp) override {
    return Reply(agent_->StageBucket(*req), resp);
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
  grpc::Status Load(grpc::ServerContext*, const v1::AgentLoadRequest* req,
                    v1::AgentLoadResponse* resp) override {
    return Reply(agent_->Load(*req), resp);
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
  std::unique_ptr<AgentServer> s(new AgentServer());
  CAIRN_ASSIGN_OR_RETURN(s->agent_, Agent::Start(std::move(spec.agent)));
  s->service_ = std::make_unique<Service>(s->agent_.get());
  unlink(spec.unix_socket.c_str());  // a previous agent's socket
  s->target_ = absl::StrCat("unix:", spec.unix_socket);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(s->target_, grpc::InsecureServerCredentials());
  builder.SetMaxReceiveMessageSize(1 << 30);
  builder.SetMaxSendMessageSize(1 << 30);
  builder.RegisterService(s->service_.get());
  s->server_ = builder.BuildAndStart();
  if (s->server_ == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", s->target_));
  }
  return s;
}

AgentServer::~AgentServer() { Shutdown(); }

void AgentServer::Shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  if (server_) {
    server_->Shutdown(std::chrono::system_clock::now() +
                      std::chrono::seconds(2));
  }
}

void AgentServer::Wait() {
  if (server_) server_->Wait();
}

}  // namespace cairn::agent
