// Checks that the generated cairn.v1 messages round-trip through the wire
// format and that the service is generated with every documented method.
#include <string>

#include "cairn/v1/cairn.grpc.pb.h"
#include "cairn/v1/cairn.pb.h"
#include "gtest/gtest.h"

namespace cairn {
namespace {

TEST(ProtoTest, ManifestRoundTripsThroughWireFormat) {
  v1::Manifest m;
  m.set_format_version(1);
  m.set_job("llama-70b");
  m.set_step(1200);
  m.set_world_size(8);
  v1::ManifestTensor* t = m.add_tensors();
  t->mutable_entry()->set_fqn("model.wq");
  t->mutable_entry()->set_dtype(v1::DTYPE_BFLOAT16);
  t->mutable_entry()->add_global_shape(4096);
  t->mutable_entry()->add_global_shape(1000);
  v1::StoredChunk* c = t->add_chunks();
  c->mutable_box()->add_offsets(0);
  c->mutable_box()->add_sizes(2048);
  c->mutable_location()->set_object_key("data/rank-00003.bin");
  c->mutable_location()->set_offset(4096);
  c->set_crc32c(0xdeadbeef);

  std::string wire;
  ASSERT_TRUE(m.SerializeToString(&wire));
  v1::Manifest back;
  ASSERT_TRUE(back.ParseFromString(wire));
  EXPECT_EQ(back.job(), "llama-70b");
  EXPECT_EQ(back.step(), 1200);
  ASSERT_EQ(back.tensors_size(), 1);
  EXPECT_EQ(back.tensors(0).entry().dtype(), v1::DTYPE_BFLOAT16);
  EXPECT_EQ(back.tensors(0).chunks(0).crc32c(), 0xdeadbeefu);
  EXPECT_EQ(back.tensors(0).chunks(0).location().object_key(),
            "data/rank-00003.bin");
}

TEST(ProtoTest, PlacementOneofKeepsOnlyTheLastKind) {
  v1::Placement p;
  p.set_shard_dim(1);
  EXPECT_EQ(p.kind_case(), v1::Placement::kShardDim);
  p.set_replicate(true);
  EXPECT_EQ(p.kind_case(), v1::Placement::kReplicate);
  EXPECT_EQ(p.shard_dim(), 0);
}

TEST(ProtoTest, CoordinatorServiceHasEveryMethod) {
  const auto* service = v1::Coordinator::service_full_name();
  EXPECT_STREQ(service, "cairn.v1.Coordinator");
  const google::protobuf::ServiceDescriptor* d =
      v1::DType_descriptor()->file()->FindServiceByName("Coordinator");
  ASSERT_NE(d, nullptr);
  for (const char* m :
       {"BeginSave", "CommitSave", "AbortSave", "PlanLoad", "ListCheckpoints",
        "GetCheckpoint", "DeleteCheckpoint"}) {
    EXPECT_NE(d->FindMethodByName(m), nullptr) << m;
  }
}

}  // namespace
}  // namespace cairn
