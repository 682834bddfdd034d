#include "server/coordinator/coordinator_service.h"

#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "google/protobuf/arena.h"
#include "google/protobuf/descriptor.h"
#include "grpcpp/impl/codegen/server_callback_handlers.h"
#include "grpcpp/security/auth_context.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/proto_buffer_reader.h"
#include "grpcpp/support/proto_buffer_writer.h"
#include "proto/convert/load_answer.h"

// A PlanLoad answer goes out as its bytes: the plan's (shared with the load
// plan cache, not copied: the slice holds a reference) and the load round's.
namespace grpc {
template <>
class SerializationTraits<cairn::coordinator::PlanLoadAnswer, void> {
 public:
  static grpc::Status Serialize(const cairn::coordinator::PlanLoadAnswer& a,
                                grpc::ByteBuffer* buffer, bool* own_buffer) {
    using Plan = std::shared_ptr<const cairn::coordinator::EncodedLoadPlan>;
    std::vector<grpc::Slice> slices;
    if (!a.plan->bytes.empty()) {
      auto* held = new Plan(a.plan);
      slices.emplace_back(
          const_cast<char*>((*held)->bytes.data()), (*held)->bytes.size(),
          [](void* p) { delete static_cast<Plan*>(p); }, held);
    }
    std::string round;
    cairn::convert::AppendLoadRound(a.load_round, &round);
    if (!round.empty()) slices.emplace_back(round);
    grpc::ByteBuffer(slices.data(), slices.size()).Swap(buffer);
    *own_buffer = true;
    return grpc::Status::OK;
  }
  static grpc::Status Deserialize(grpc::ByteBuffer*,
                                  cairn::coordinator::PlanLoadAnswer*) {
    return grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                        "PlanLoad answers are only sent");
  }
};
}  // namespace grpc

namespace cairn::coordinator {
namespace {

template <typename T>
using Done = Coordinator::Done<T>;

// How a method answers: calls `done` exactly once, on any thread. Until
// then `gone` tells whether the caller has gone (the call was cancelled).
template <typename Req, typename Resp>
using Handler =
    std::function<void(Coordinator&, std::shared_ptr<const Req>, Done<Resp>,
                       const Coordinator::CallerGone& gone)>;

// A handler for a blocking library call: runs it on the worker pool.
template <typename Req, typename Resp>
Handler<Req, Resp> OnWorkers(
    std::function<absl::StatusOr<Resp>(Coordinator&, const Req&)> fn) {
  return [fn](Coordinator& c, std::shared_ptr<const Req> request,
              Done<Resp> done, const Coordinator::CallerGone&) {
    c.workers().Schedule(
        [&c, fn, request, done = std::move(done)] { done(fn(c, *request)); });
  };
}

template <typename Req, typename Resp>
Handler<Req, Resp> OnWorkersStatus(
    std::function<absl::Status(Coordinator&, const Req&)> fn) {
  return OnWorkers<Req, Resp>(
      [fn](Coordinator& c, const Req& r) -> absl::StatusOr<Resp> {
        absl::Status s = fn(c, r);
        if (!s.ok()) return s;
        return Resp();
      });
}

// What a call does and to which job, for authorization and audit.
struct Access {
  Action action = Action::kRead;
  std::string job;    // empty: no job (agent registry, a listing of all)
  std::string node;   // ForgetAgent's node, for audit lines
  int64_t step = -1;  // for audit lines; -1: none
  // Audit action name; empty: the call is not audited.
  absl::string_view audit;
  // A listing of every job: allowed to any authenticated caller, the answer
  // filtered to the jobs it may read.
  bool filtered = false;
};

}  // namespace

// Authorization and audit state shared by every method.
struct internal::ServiceGuard {
  const Authorizer* authorizer = nullptr;  // null: auth off
  metrics::Family<metrics::Counter>* audit_events = nullptr;
  metrics::Family<metrics::Counter>* auth_failures = nullptr;

  void AuditAuthFailure(absl::string_view reason, const std::string& method,
                        const std::string& peer, absl::string_view what,
                        absl::string_view message) const {
    auth_failures->Get({std::string(reason)})->Increment();
    CAIRN_LOG(warn, "audit: auth failure reason={} {} method={} peer={}: {}",
              std::string(reason), std::string(what), method, peer,
              std::string(message));
  }

  void Audit(const std::string& identity, const Access& a,
             const std::string& peer, absl::string_view outcome,
             const absl::Status& status) const {
    audit_events->Get({std::string(a.audit), std::string(outcome)})
        ->Increment();
    CAIRN_LOG(info,
              "audit: identity={} action={} job={} step={}{} outcome={} "
              "peer={}{}{}",
              identity, std::string(a.audit), a.job.empty() ? "-" : a.job,
              a.step < 0 ? std::string("-") : std::to_string(a.step),
              a.node.empty() ? "" : absl::StrCat(" node=", a.node),
              std::string(outcome), peer, status.ok() ? "" : ": ",
              status.ok() ? "" : status.ToString());
  }
};

namespace {

using Guard = internal::ServiceGuard;

// One method: how to classify its requests and how to answer them.
template <typename Req, typename Resp>
struct Method {
  Method(std::function<Access(const Req&)> access, Handler<Req, Resp> handler,
         std::function<void(const Principal&, Resp*)> filter = nullptr)
      : access(std::move(access)),
        handler(std::move(handler)),
        filter(std::move(filter)) {}

  std::string name;  // full name, for messages
  std::function<Access(const Req&)> access;
  Handler<Req, Resp> handler;
  // For Access::filtered: drops what `principal` may not read.
  std::function<void(const Principal&, Resp*)> filter;
  // Parse, authorize and handle on the worker pool (the handler runs there,
  // inline), not on gRPC's thread: for large requests that wait for a
  // worker, which then wait as their wire bytes, not as parsed messages
  // (~4x larger: 3072 PlanLoads of a 70B model are ~0.4 GB on the wire).
  bool parse_on_workers = false;
};

// Authenticates the caller of `method` and checks `access` against its roles
// (anyone when auth is off): the caller, or the status to end the call with,
// audited.
absl::StatusOr<Caller> Authorize(const Guard& guard,
                                 grpc::CallbackServerContext* context,
                                 const std::string& method,
                                 const Access& access) {
  if (guard.authorizer == nullptr) return Caller();
  absl::string_view authorization;
  const auto& md = context->client_metadata();
  if (auto it = md.find("authorization"); it != md.end()) {
    authorization = absl::string_view(it->second.data(), it->second.size());
  }
  absl::string_view reason;
  std::shared_ptr<const grpc::AuthContext> auth_context =
      context->auth_context();
  absl::StatusOr<Caller> caller = guard.authorizer->Authenticate(
      authorization, auth_context.get(), &reason);
  if (!caller.ok()) {
    guard.AuditAuthFailure(reason, method, context->peer(), "identity=-",
                           caller.status().message());
    return caller.status();
  }
  if (access.filtered || caller->principal->Allows(access.action, access.job)) {
    return caller;
  }
  const std::string& identity = caller->principal->name;
  const Role needed = RequiredRole(access.action);
  absl::Status denied = absl::PermissionDeniedError(absl::StrCat(
      "identity ", identity, " (role ", RoleName(caller->principal->MaxRole()),
      ") may not ", ActionPhrase(access.action),
      access.job.empty()
          ? absl::StrCat(" (needs role ", RoleName(needed), " on job glob '*')")
          : absl::StrCat(" of job '", access.job, "' (needs role ",
                         RoleName(needed), ")")));
  guard.AuditAuthFailure(
      "permission_denied", method, context->peer(),
      absl::StrCat("identity=", identity, " action=", ActionName(access.action),
                   " job=", access.job.empty() ? "-" : access.job),
      denied.message());
  if (!access.audit.empty()) {
    guard.Audit(identity, access, context->peer(), "denied", denied);
  }
  return denied;
}

// One call of method `m`: parses the request (INVALID_ARGUMENT when `bytes`
// are not a `Req`), authorizes it, runs the handler, and serializes its answer
// into `out`; the reactor finishes the call.
template <typename Req, typename Resp>
void Serve(Coordinator* c, const Guard* guard,
           std::shared_ptr<const Method<Req, Resp>> m,
           grpc::CallbackServerContext* context,
           grpc::ServerUnaryReactor* reactor, grpc::ByteBuffer* out,
           grpc::ByteBuffer& bytes) {
  // The request is parsed onto an arena that lives as long as it does: its
  // sub-messages (a VerifyLoad request of 3,000 pieces has 9,000) are carved
  // from a few blocks and freed at once, not allocated and freed one by one.
  struct OnArena {
    google::protobuf::Arena arena;
    Req* message = google::protobuf::Arena::CreateMessage<Req>(&arena);
  };
  auto held = std::make_shared<OnArena>();
  std::shared_ptr<Req> request(held, held->message);
  bool parsed = false;
  {
    grpc::ProtoBufferReader reader(&bytes);
    parsed = reader.status().ok() && request->ParseFromZeroCopyStream(&reader);
  }
  if (!parsed) {
    reactor->Finish(grpc::Status(
        grpc::StatusCode::INVALID_ARGUMENT,
        absl::StrCat("malformed request to ", m->name, ": ", bytes.Length(),
                     " bytes that are not a valid ",
                     Req::descriptor()->full_name())));
    return;
  }
  // The last reference to the wire bytes (RawHandler cleared gRPC's): a
  // call parked until every rank is in holds none of them.
  bytes.Clear();
  auto access = std::make_shared<const Access>(m->access(*request));
  absl::StatusOr<Caller> caller = Authorize(*guard, context, m->name, *access);
  if (!caller.ok()) {
    reactor->Finish(ToGrpcStatus(caller.status()));
    return;
  }
  // `context` lives until the reactor finishes, after `done`.
  const Coordinator::CallerGone gone = [context] {
    return context->IsCancelled();
  };
  m->handler(
      *c, std::move(request),
      [reactor, out, guard, access, m, caller = *std::move(caller),
       peer = context->peer()](absl::StatusOr<Resp> result) {
        if (!access->audit.empty()) {
          guard->Audit(caller.principal != nullptr ? caller.principal->name
                                                   : std::string("anonymous"),
                       *access, peer, result.ok() ? "ok" : "failed",
                       result.status());
        }
        if (!result.ok()) {
          reactor->Finish(ToGrpcStatus(result.status()));
          return;
        }
        if (access->filtered && caller.principal != nullptr && m->filter) {
          m->filter(*caller.principal, &*result);
        }
        bool own = false;
        reactor->Finish(
            grpc::SerializationTraits<Resp>::Serialize(*result, out, &own));
      },
      gone);
}

// The raw gRPC handler of one method: Serve on gRPC's thread, or on a worker
// (Method::parse_on_workers).
template <typename Req, typename Resp>
grpc::internal::MethodHandler* RawHandler(Coordinator* c, const Guard* guard,
                                          Method<Req, Resp> method) {
  auto m = std::make_shared<const Method<Req, Resp>>(std::move(method));
  return new grpc::internal::CallbackUnaryHandler<grpc::ByteBuffer,
                                                  grpc::ByteBuffer>(
      [c, guard, m](grpc::CallbackServerContext* context,
                    const grpc::ByteBuffer* in, grpc::ByteBuffer* out) {
        grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
        // `bytes` shares the request's slices. gRPC keeps its request
        // buffer until the call finishes, so BeginSave, CommitSave and
        // VerifyLoad calls parked for the last rank would hold their wire
        // bytes (1.8 GB of BeginSave requests at 16k ranks of a 70B
        // model); nothing reads it after this handler, so it is cleared.
        grpc::ByteBuffer bytes(*in);
        const_cast<grpc::ByteBuffer*>(in)->Clear();
        if (!m->parse_on_workers) {
          Serve(c, guard, m, context, reactor, out, bytes);
          return reactor;
        }
        // `context` and `out` live until the reactor finishes.
        c->workers().Schedule(
            [c, guard, m, context, reactor, out, bytes]() mutable {
              Serve(c, guard, m, context, reactor, out, bytes);
            });
        return reactor;
      });
}

// Access of calls on one job.
template <typename Req>
std::function<Access(const Req&)> OnJob(Action action) {
  return [action](const Req& r) {
    Access a;
    a.action = action;
    a.job = r.job();
    return a;
  };
}

template <typename Req>
std::function<Access(const Req&)> NoJob(Action action,
                                        absl::string_view audit = {}) {
  return [action, audit](const Req&) {
    Access a;
    a.action = action;
    a.audit = audit;
    return a;
  };
}

}  // namespace

void CoordinatorService::AuditEarlyAuthFailure(
    absl::string_view reason, absl::string_view method,
    absl::string_view message) const {
  // The peer's address is not known before the call is matched.
  guard_->AuditAuthFailure(reason, std::string(method), "-", "identity=-",
                           message);
}

CoordinatorService::CoordinatorService(Coordinator* coordinator,
                                       const Authorizer* authorizer)
    : guard_(std::make_unique<internal::ServiceGuard>()) {
  guard_->authorizer = authorizer;
  guard_->audit_events = coordinator->metrics().AddCounterFamily(
      "cairn_audit_events_total",
      "Audited calls (delete, gc, abort, abort_own, forget_agent) by "
      "outcome: ok, failed (the call's own error) or denied.",
      {"action", "outcome"});
  guard_->auth_failures = coordinator->metrics().AddCounterFamily(
      "cairn_auth_failures_total",
      "Calls refused by authentication (no_credentials, malformed, "
      "unknown_token, unknown_certificate) or authorization "
      "(permission_denied).",
      {"reason"});
  const Guard* guard = guard_.get();
  const google::protobuf::ServiceDescriptor* service =
      v1::BeginSaveRequest::descriptor()->file()->FindServiceByName(
          "Coordinator");
  auto name = [&](const std::string& m) {
    return absl::StrCat(service->full_name(), "/", m);
  };
  auto add = [&](const std::string& method, auto m) {
    m.name = name(method);
    MarkMethodRawCallback(service->FindMethodByName(method)->index(),
                          RawHandler(coordinator, guard, std::move(m)));
  };
  using v1::AbortSaveRequest;
  using v1::AbortSaveResponse;
  using v1::BeginSaveRequest;
  using v1::BeginSaveResponse;
  using v1::CommitSaveRequest;
  using v1::CommitSaveResponse;
  using v1::DeleteCheckpointRequest;
  using v1::DeleteCheckpointResponse;
  using v1::ForgetAgentRequest;
  using v1::ForgetAgentResponse;
  using v1::GarbageCollectRequest;
  using v1::GarbageCollectResponse;
  using v1::GetCheckpointRequest;
  using v1::GetCheckpointResponse;
  using v1::GetJobPolicyRequest;
  using v1::GetJobPolicyResponse;
  using v1::ListAgentsRequest;
  using v1::ListAgentsResponse;
  using v1::ListCheckpointsRequest;
  using v1::ListCheckpointsResponse;
  using v1::PersistCheckpointRequest;
  using v1::PersistCheckpointResponse;
  using v1::PlanLoadRequest;
  using v1::PlanLoadResponse;
  using v1::RegisterAgentRequest;
  using v1::RegisterAgentResponse;
  using v1::ReportHoldingsRequest;
  using v1::ReportHoldingsResponse;
  using v1::SetJobPolicyRequest;
  using v1::SetJobPolicyResponse;
  using v1::VerifyLoadRequest;
  using v1::VerifyLoadResponse;

  // BeginSave and CommitSave park without a thread until every rank is in.
  add("BeginSave",
      Method<BeginSaveRequest, BeginSaveResponse>{
          OnJob<BeginSaveRequest>(Action::kSave),
          [](Coordinator& c, const std::shared_ptr<const BeginSaveRequest>& r,
             Done<BeginSaveResponse> done,
             const Coordinator::CallerGone& gone) {
            c.BeginSave(*r, std::move(done), gone);
          }});
  add("CommitSave",
      Method<CommitSaveRequest, CommitSaveResponse>{
          OnJob<CommitSaveRequest>(Action::kSave),
          [](Coordinator& c, const std::shared_ptr<const CommitSaveRequest>& r,
             Done<CommitSaveResponse> done, const Coordinator::CallerGone&) {
            c.CommitSave(*r, std::move(done));
          }});
  // A process aborts a save it is part of (the coordinator checks its
  // incarnation): a writer's right. Without an incarnation it aborts the
  // save whoever runs it: an admin's.
  add("AbortSave", Method<AbortSaveRequest, AbortSaveResponse>{
                       [](const AbortSaveRequest& r) {
                         Access a;
                         const bool own = r.incarnation() != 0;
                         a.action = own ? Action::kSave : Action::kAbort;
                         a.audit = own ? "abort_own" : "abort";
                         a.job = r.job();
                         a.step = r.step();
                         return a;
                       },
                       OnWorkersStatus<AbortSaveRequest, AbortSaveResponse>(
                           [](Coordinator& c, const AbortSaveRequest& r) {
                             return c.AbortSave(r);
                           })});
  // Answered with its wire bytes (PlanLoadAnswer), not a message. Every
  // rank of a load asks at once and waits for a worker: parsed there.
  Method<PlanLoadRequest, PlanLoadAnswer> plan_load{
      OnJob<PlanLoadRequest>(Action::kRead),
      [](Coordinator& c, const std::shared_ptr<const PlanLoadRequest>& r,
         const Done<PlanLoadAnswer>& done,
         const Coordinator::CallerGone&) { done(c.PlanLoadEncoded(*r)); }};
  plan_load.parse_on_workers = true;
  add("PlanLoad", std::move(plan_load));
  // VerifyLoad may read the manifest first: it starts on a worker (parsed
  // there, as PlanLoad); the call then parks without a thread until every
  // rank of the load has reported.
  Method<VerifyLoadRequest, VerifyLoadResponse> verify_load{
      OnJob<VerifyLoadRequest>(Action::kRead),
      [](Coordinator& c, const std::shared_ptr<const VerifyLoadRequest>& r,
         Done<VerifyLoadResponse> done, const Coordinator::CallerGone&) {
        c.VerifyLoad(*r, std::move(done));
      }};
  verify_load.parse_on_workers = true;
  add("VerifyLoad", std::move(verify_load));
  add("ListCheckpoints",
      Method<ListCheckpointsRequest, ListCheckpointsResponse>{
          [](const ListCheckpointsRequest& r) {
            Access a;
            a.job = r.job();
            a.filtered = r.job().empty();
            return a;
          },
          OnWorkers<ListCheckpointsRequest, ListCheckpointsResponse>(
              [](Coordinator& c, const ListCheckpointsRequest& r) {
                return c.ListCheckpoints(r);
              }),
          [](const Principal& p, ListCheckpointsResponse* resp) {
            auto* list = resp->mutable_checkpoints();
            list->erase(std::remove_if(list->begin(), list->end(),
                                       [&p](const v1::CheckpointRecord& r) {
                                         return !p.Allows(Action::kRead,
                                                          r.job());
                                       }),
                        list->end());
          }});
  add("GetCheckpoint",
      Method<GetCheckpointRequest, GetCheckpointResponse>{
          OnJob<GetCheckpointRequest>(Action::kRead),
          OnWorkers<GetCheckpointRequest, GetCheckpointResponse>(
              [](Coordinator& c, const GetCheckpointRequest& r) {
                return c.GetCheckpoint(r);
              })});
  add("DeleteCheckpoint",
      Method<DeleteCheckpointRequest, DeleteCheckpointResponse>{
          [](const DeleteCheckpointRequest& r) {
            Access a;
            a.action = Action::kDelete;
            a.audit = "delete";
            a.job = r.job();
            a.step = r.step();
            return a;
          },
          OnWorkersStatus<DeleteCheckpointRequest, DeleteCheckpointResponse>(
              [](Coordinator& c, const DeleteCheckpointRequest& r) {
                return c.DeleteCheckpoint(r);
              })});
  // A dry run only lists what would go: a read.
  add("GarbageCollect",
      Method<GarbageCollectRequest, GarbageCollectResponse>{
          [](const GarbageCollectRequest& r) {
            Access a;
            a.action = r.dry_run() ? Action::kRead : Action::kGarbageCollect;
            if (!r.dry_run()) a.audit = "gc";
            a.job = r.job();
            return a;
          },
          OnWorkers<GarbageCollectRequest, GarbageCollectResponse>(
              [](Coordinator& c, const GarbageCollectRequest& r) {
                return c.GarbageCollect(r);
              })});
  // The agent registry writes the catalog: on a worker.
  add("RegisterAgent",
      Method<RegisterAgentRequest, RegisterAgentResponse>{
          NoJob<RegisterAgentRequest>(Action::kRegisterAgent),
          OnWorkers<RegisterAgentRequest, RegisterAgentResponse>(
              [](Coordinator& c, const RegisterAgentRequest& r) {
                return c.agents().Register(r);
              })});
  add("ListAgents",
      Method<ListAgentsRequest, ListAgentsResponse>{
          NoJob<ListAgentsRequest>(Action::kListAgents),
          [](Coordinator& c, const std::shared_ptr<const ListAgentsRequest>&,
             const Done<ListAgentsResponse>& done,
             const Coordinator::CallerGone&) { done(c.agents().List()); }});
  add("ForgetAgent", Method<ForgetAgentRequest, ForgetAgentResponse>{
                         [](const ForgetAgentRequest& r) {
                           Access a;
                           a.action = Action::kForgetAgent;
                           a.audit = "forget_agent";
                           a.node = r.node_name();
                           return a;
                         },
                         OnWorkers<ForgetAgentRequest, ForgetAgentResponse>(
                             [](Coordinator& c, const ForgetAgentRequest& r) {
                               return c.agents().Forget(r);
                             })});
  // Multi-tier saves: a job's policy (an admin's), and the agents' reports.
  add("SetJobPolicy", Method<SetJobPolicyRequest, SetJobPolicyResponse>{
                          [](const SetJobPolicyRequest& r) {
                            Access a;
                            a.action = Action::kSetPolicy;
                            a.audit = r.clear() ? "clear_policy" : "set_policy";
                            a.job = r.policy().job();
                            return a;
                          },
                          OnWorkers<SetJobPolicyRequest, SetJobPolicyResponse>(
                              [](Coordinator& c, const SetJobPolicyRequest& r) {
                                return c.SetJobPolicy(r);
                              })});
  add("GetJobPolicy", Method<GetJobPolicyRequest, GetJobPolicyResponse>{
                          OnJob<GetJobPolicyRequest>(Action::kRead),
                          OnWorkers<GetJobPolicyRequest, GetJobPolicyResponse>(
                              [](Coordinator& c, const GetJobPolicyRequest& r) {
                                return c.GetJobPolicy(r);
                              })});
  // Parks until the checkpoint is on storage (with `wait`).
  add("PersistCheckpoint",
      Method<PersistCheckpointRequest, PersistCheckpointResponse>{
          [](const PersistCheckpointRequest& r) {
            Access a;
            a.action = Action::kPersist;
            a.audit = "persist";
            a.job = r.job();
            a.step = r.step();
            return a;
          },
          [](Coordinator& c,
             const std::shared_ptr<const PersistCheckpointRequest>& r,
             Done<PersistCheckpointResponse> done,
             const Coordinator::CallerGone&) {
            c.workers().Schedule([&c, r, done = std::move(done)]() mutable {
              c.PersistCheckpoint(*r, std::move(done));
            });
          }});
  add("ReportHoldings",
      Method<ReportHoldingsRequest, ReportHoldingsResponse>{
          NoJob<ReportHoldingsRequest>(Action::kRegisterAgent),
          OnWorkers<ReportHoldingsRequest, ReportHoldingsResponse>(
              [](Coordinator& c, const ReportHoldingsRequest& r) {
                return c.ReportHoldings(r);
              })});
}

CoordinatorService::~CoordinatorService() = default;

}  // namespace cairn::coordinator
