#include "server/agent/transport/nccl/nccl_transport.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/little_endian.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace cairn::agent {
namespace internal {
namespace {

constexpr uint32_t kAnnounceMagic = 0x414e5243;  // "CRNA"
// Inline messages: control tag kNcclInlineTag, payload tag (u64) | bytes.
constexpr uint64_t kNcclInlineTag = kNcclTagBase | 4;
constexpr size_t kMaxAbandoned = 1 << 16;

}  // namespace

std::string EncodeAnnounce(const Announce& a) {
  std::string s;
  s.reserve(kAnnounceBytes);
  little_endian::Append32(&s, kAnnounceMagic);
  little_endian::Append32(&s, 0);
  little_endian::Append64(&s, a.tag);
  little_endian::Append64(&s, a.length);
  little_endian::Append64(&s, a.seq);
  return s;
}

absl::StatusOr<Announce> DecodeAnnounce(absl::string_view frame) {
  if (frame.size() != kAnnounceBytes ||
      little_endian::Load32(frame.data()) != kAnnounceMagic) {
    return absl::InvalidArgumentError(absl::StrCat(
        "nccl transport: malformed announce of ", frame.size(), " bytes"));
  }
  Announce a;
  a.tag = little_endian::Load64(frame.data() + 8);
  a.length = little_endian::Load64(frame.data() + 16);
  a.seq = little_endian::Load64(frame.data() + 24);
  if (a.tag & kControlTagBit) {
    return absl::InvalidArgumentError(
        absl::StrCat("nccl transport: announce of control tag ", a.tag));
  }
  return a;
}

}  // namespace internal

using internal::Announce;
using internal::kNcclAnnounceTag;
using internal::kNcclInitIdsTag;
using internal::kNcclInitRequestTag;
using internal::kNcclInlineTag;

NcclTransport::NcclTransport(NcclTransportOptions options,
                             std::unique_ptr<DeviceLink> link)
    : options_(std::move(options)),
      node_(options_.control.node_id),
      num_nodes_(options_.control.num_nodes),
      link_(std::move(link)) {}

absl::StatusOr<std::unique_ptr<NcclTransport>> NcclTransport::Start(
    NcclTransportOptions options, std::unique_ptr<DeviceLink> link) {
  if (link == nullptr) {
    return absl::InvalidArgumentError("nccl transport: no device link");
  }
  if (options.handler_threads < 1) {
    return absl::InvalidArgumentError(
        "nccl transport: handler_threads must be >= 1");
  }
  std::unique_ptr<NcclTransport> t(
      new NcclTransport(std::move(options), std::move(link)));
  t->handlers_ = std::make_unique<ThreadPool>(t->options_.handler_threads);
  TcpTransportOptions control = t->options_.control;
  // The control transport's threads only file announces and hand the rest
  // to handlers_: they never block on a device call.
  control.control_threads = 2;
  control.control_handler = [p = t.get()](int peer, uint64_t tag,
                                          std::string payload) {
    p->OnControl(peer, tag, std::move(payload));
  };
  CAIRN_ASSIGN_OR_RETURN(t->control_, TcpTransport::Start(std::move(control)));
  t->up_pump_.thread = std::thread([p = t.get()] { p->PumpLoop(true); });
  t->down_pump_.thread = std::thread([p = t.get()] { p->PumpLoop(false); });
  return t;
}

NcclTransport::~NcclTransport() {
  control_.reset();  // no more OnControl
  handlers_.reset();
  for (Pump* p : {&up_pump_, &down_pump_}) {
    {
      absl::MutexLock l(&p->mu);
      p->stopping = true;
    }
    p->thread.join();
  }
  std::thread init;
  {
    absl::MutexLock l(&init_mu_);
    stopping_ = true;
    init.swap(init_thread_);
  }
  if (init.joinable()) init.join();
}

void NcclTransport::OnControl(int peer, uint64_t tag, std::string payload) {
  if (tag == kNcclAnnounceTag) {
    absl::StatusOr<Announce> a = internal::DecodeAnnounce(payload);
    if (!a.ok()) {
      CAIRN_LOG(warn, "node {}: from node {}: {}", node_, peer,
                a.status().ToString());
      return;
    }
    // Messages from lower nodes came on "up", from higher ones on "down".
    Pump& p = peer < node_ ? up_pump_ : down_pump_;
    absl::MutexLock l(&p.mu);
    p.pending[{peer, a->seq}] = *a;
    return;
  }
  if (tag == kNcclInlineTag) {
    if (payload.size() < 8) {
      CAIRN_LOG(warn, "node {}: malformed inline message from node {}", node_,
                peer);
      return;
    }
    const uint64_t inner = little_endian::Load64(payload.data());
    Deliver(peer, inner, absl::OkStatus(), payload.substr(8));
    return;
  }
  if (tag == kNcclInitRequestTag) {
    if (node_ == 0) StartInit();
    return;
  }
  if (tag == kNcclInitIdsTag) {
    if (payload.size() < 4) return;
    const uint32_t n = little_endian::Load32(payload.data());
    if (n > payload.size() - 4) return;
    std::string up = payload.substr(4, n);
    std::string down = payload.substr(4 + n);
    {
      absl::MutexLock l(&init_mu_);
      if (up == up_id_ && down == down_id_) return;
      up_id_ = std::move(up);
      down_id_ = std::move(down);
      if (!init_running_) init_done_ = false;  // node 0 made new ids
    }
    StartInit();
    return;
  }
  if (tag >= internal::kNcclTagBase) return;  // reserved, unknown
  if (!options_.control.control_handler) return;
  handlers_->Schedule(
      [this, peer, tag, payload = std::move(payload)]() mutable {
        options_.control.control_handler(peer, tag, std::move(payload));
      });
}

void NcclTransport::StartInit() {
  absl::MutexLock l(&init_mu_);
  if (stopping_ || init_running_ || init_done_) return;
  if (node_ != 0 && up_id_.empty()) return;  // waits for node 0's ids
  init_running_ = true;
  if (init_thread_.joinable()) init_thread_.join();  // a finished attempt
  init_thread_ = std::thread([this] { InitThread(); });
}

void NcclTransport::InitThread() {
  std::string up, down;
  absl::Status s;
  if (node_ == 0) {
    absl::StatusOr<std::string> u = link_->NewUniqueId();
    absl::StatusOr<std::string> d = link_->NewUniqueId();
    if (!u.ok() || !d.ok()) {
      s = u.ok() ? d.status() : u.status();
    } else {
      up = *u;
      down = *d;
      {
        absl::MutexLock l(&init_mu_);
        up_id_ = up;
        down_id_ = down;
      }
      std::string ids;
      little_endian::Append32(&ids, static_cast<uint32_t>(up.size()));
      ids += up;
      ids += down;
      for (int n = 1; n < num_nodes_; ++n) {
        absl::Status sent = control_->Send(n, kNcclInitIdsTag, ids);
        if (!sent.ok()) {
          CAIRN_LOG(warn, "node 0: nccl ids not delivered to node {}: {}", n,
                    sent.ToString());
        }
      }
    }
  } else {
    absl::MutexLock l(&init_mu_);
    up = up_id_;
    down = down_id_;
  }
  if (s.ok()) {
    s = link_->Init(num_nodes_, node_, up, down, options_.init_timeout);
  }
  if (!s.ok()) {
    CAIRN_LOG(warn, "node {}: joining the nccl communicators failed: {}", node_,
              s.ToString());
  }
  absl::MutexLock l(&init_mu_);
  init_status_ = s;
  init_done_ = true;
  init_running_ = false;
}

absl::Status NcclTransport::EnsureInit() {
  bool ask_node0 = false;
  {
    absl::MutexLock l(&init_mu_);
    if (init_done_ && init_status_.ok()) return absl::OkStatus();
    if (init_done_ && !init_running_) {
      init_done_ = false;  // retry after a failed attempt
      if (node_ != 0) up_id_.clear(), down_id_.clear();
    }
    ask_node0 = node_ != 0 && up_id_.empty();
  }
  if (ask_node0) {
    absl::Status s = control_->Send(0, kNcclInitRequestTag, "");
    if (!s.ok()) {
      return absl::UnavailableError(absl::StrCat(
          "nccl transport: node ", node_,
          " cannot ask node 0 for the communicator ids: ", s.message()));
    }
  }
  StartInit();
  // The init attempt is bounded by itself: node 0 hands the ids to every
  // other node (each control send bounded by connect_timeout), then the
  // link waits init_timeout for the others to join. Wait that long plus
  // one init_timeout of slack, so a slow attempt reports its own reason
  // (which nodes joined) rather than this backstop's.
  const absl::Duration wait =
      options_.init_timeout * 2 +
      options_.control.connect_timeout * (num_nodes_ - 1);
  absl::MutexLock l(&init_mu_);
  auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(init_mu_) {
    return init_done_ || stopping_;
  };
  if (!init_mu_.AwaitWithTimeout(absl::Condition(&done), wait)) {
    return absl::DeadlineExceededError(absl::StrCat(
        "nccl transport: node ", node_, " did not join the communicators of ",
        num_nodes_, " nodes within ", absl::FormatDuration(wait)));
  }
  if (stopping_) return absl::UnavailableError("nccl transport is stopping");
  return init_status_;
}

absl::Status NcclTransport::Send(int peer, uint64_t tag,
                                 absl::Span<const char> data) {
  if (peer < 0 || peer >= num_nodes_ || peer == node_) {
    return absl::InvalidArgumentError(
        absl::StrCat("nccl transport: node ", node_, " cannot send to node ",
                     peer, " (", num_nodes_, " nodes)"));
  }
  if (tag & kControlTagBit) return control_->Send(peer, tag, data);
  if (data.size() <= kInlineBytes) {
    std::string m;
    m.reserve(8 + data.size());
    little_endian::Append64(&m, tag);
    m.append(data.data(), data.size());
    return control_->Send(peer, kNcclInlineTag, m);
  }
  CAIRN_RETURN_IF_ERROR(EnsureInit());
  Direction& d = DirectionTo(peer);
  absl::MutexLock l(&d.mu);
  Announce a;
  a.tag = tag;
  a.length = data.size();
  a.seq = d.sent[peer];
  CAIRN_RETURN_IF_ERROR(
      control_->Send(peer, kNcclAnnounceTag, internal::EncodeAnnounce(a)));
  ++d.sent[peer];
  absl::Status s = link_->Send(peer, data, options_.transfer_timeout);
  if (!s.ok()) {
    return Annotate(s, absl::StrCat("nccl transport: node ", node_, " sending ",
                                    data.size(), " bytes (tag ", tag, ") to ",
                                    PeerName(peer)));
  }
  absl::MutexLock ml(&mu_);
  ++device_sent_;
  return absl::OkStatus();
}

void NcclTransport::PumpLoop(bool up) {
  Pump& p = up ? up_pump_ : down_pump_;
  Direction& d = up ? up_ : down_;
  while (true) {
    int peer = -1;
    Announce a;
    {
      absl::MutexLock l(&p.mu);
      auto ready = [&p, &peer]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(p.mu) {
        if (p.stopping) return true;
        for (const auto& [key, ann] : p.pending) {
          if (key.second == p.next_seq[key.first]) {
            peer = key.first;
            return true;
          }
        }
        return false;
      };
      p.mu.Await(absl::Condition(&ready));
      if (p.stopping) return;
      auto it = p.pending.find({peer, p.next_seq[peer]});
      a = it->second;
      p.pending.erase(it);
      ++p.next_seq[peer];
    }
    absl::Status s = EnsureInit();
    std::string payload;
    if (s.ok() && a.length > options_.max_message_bytes) {
      s = absl::ResourceExhaustedError(absl::StrCat(
          "nccl transport: node ", peer, " announced a message of ", a.length,
          " bytes (tag ", a.tag, "), more than the limit of ",
          options_.max_message_bytes));
    }
    if (s.ok()) {
      payload.resize(a.length);
      absl::MutexLock l(&d.mu);
      s = link_->Recv(peer, absl::MakeSpan(payload), options_.transfer_timeout);
      if (!s.ok()) {
        s = Annotate(s, absl::StrCat("nccl transport: node ", node_,
                                     " receiving ", a.length, " bytes (tag ",
                                     a.tag, ") from ", PeerName(peer)));
      }
    }
    if (!s.ok()) {
      CAIRN_LOG(warn, "node {}: device message from node {}: {}", node_, peer,
                s.ToString());
      payload.clear();
    } else {
      absl::MutexLock l(&mu_);
      ++device_received_;
    }
    Deliver(peer, a.tag, s, std::move(payload));
  }
}

std::string NcclTransport::PeerName(int peer) const {
  if (options_.control.resolve_peer) {
    absl::StatusOr<std::string> address = options_.control.resolve_peer(peer);
    if (address.ok()) return absl::StrCat("node ", peer, " (", *address, ")");
  }
  return absl::StrCat("node ", peer);
}

void NcclTransport::Deliver(int peer, uint64_t tag, absl::Status status,
                            std::string payload) {
  absl::MutexLock l(&mu_);
  const auto key = std::make_pair(peer, tag);
  if (abandoned_.erase(key) > 0) return;  // its Recv gave up
  mailbox_[key] = Message{std::move(status), std::move(payload)};
}

absl::StatusOr<std::string> NcclTransport::RecvMessage(int peer, uint64_t tag,
                                                       absl::Duration timeout) {
  if (peer < 0 || peer >= num_nodes_ || peer == node_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "nccl transport: node ", node_, " cannot receive from node ", peer));
  }
  const auto key = std::make_pair(peer, tag);
  absl::MutexLock l(&mu_);
  auto here = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return mailbox_.count(key) > 0;
  };
  if (!mu_.AwaitWithTimeout(absl::Condition(&here), timeout)) {
    abandoned_.insert(key);
    abandoned_order_.push_back(key);
    while (abandoned_order_.size() > internal::kMaxAbandoned) {
      abandoned_.erase(abandoned_order_.front());
      abandoned_order_.pop_front();
    }
    return absl::DeadlineExceededError(
        absl::StrCat("nccl transport: no message with tag ", tag, " from node ",
                     peer, " within ", absl::FormatDuration(timeout)));
  }
  auto it = mailbox_.find(key);
  Message m = std::move(it->second);
  mailbox_.erase(it);
  if (!m.status.ok()) return m.status;
  return std::move(m.payload);
}

absl::Status NcclTransport::Recv(int peer, uint64_t tag, absl::Span<char> out,
                                 absl::Duration timeout) {
  CAIRN_ASSIGN_OR_RETURN(std::string m, RecvMessage(peer, tag, timeout));
  if (m.size() != out.size()) {
    return absl::DataLossError(
        absl::StrCat("nccl transport: message with tag ", tag, " from node ",
                     peer, " has ", m.size(), " bytes, expected ", out.size()));
  }
  if (!m.empty()) std::memcpy(out.data(), m.data(), m.size());
  return absl::OkStatus();
}

void NcclTransport::Abandon(int peer, uint64_t tag) {
  absl::MutexLock l(&mu_);
  const auto key = std::make_pair(peer, tag);
  if (mailbox_.erase(key) > 0) return;
  abandoned_.insert(key);
  abandoned_order_.push_back(key);
  while (abandoned_order_.size() > internal::kMaxAbandoned) {
    abandoned_.erase(abandoned_order_.front());
    abandoned_order_.pop_front();
  }
}

size_t NcclTransport::mailbox_size() {
  absl::MutexLock l(&mu_);
  return mailbox_.size();
}

uint64_t NcclTransport::device_messages_sent() {
  absl::MutexLock l(&mu_);
  return device_sent_;
}

uint64_t NcclTransport::device_messages_received() {
  absl::MutexLock l(&mu_);
  return device_received_;
}

}  // namespace cairn::agent
